"""Where a request's CPU goes with one worker and with two: the supervisor (the audit collector,
the limit relay, metrics) and the workers, in microseconds of CPU per request.

bench/ratios.py gives "2 workers / 1 worker per core-second" as one figure; this splits it by
process, so the shared parts' cost per request is read off directly (issue 29's item 5). A
third gateway of one worker runs on the load client's core (the second worker's core on a
2-core machine, shared with the client and the upstream): what a request costs a worker
there, without any sharing of sandgate's own; and the first gateway again at c5, the load
each of two workers sees of c10 (fewer ready connections per event-loop wakeup). The gateways run throughout (idle while another
is measured); each round measures each of them, in an order reversed every other round, with
the CPU of each of a gateway's processes taken over the load client's measured window.

Run: `.venv/bin/python bench/worker_split.py [--rounds 5] [--duration 5] [--mode int|plain]
[--markdown out.md]`. Loopback only; every process and temporary folder is removed on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import workers  # noqa: E402
from run import CLIENT_CORE, PROXY_CORE, UPSTREAM_IP, Bench, Service  # noqa: E402


@dataclass
class Gateway:
    count: int
    where: str  # which core(s) it runs on
    service: Service
    pid: int  # the supervisor with two workers; the one process with one
    client_args: list[str]
    concurrency: int = 10
    # per round: (requests/s, µs per request of the supervisor, of the limit relay, of the workers)
    rounds: list[tuple[float, float, float, float]] = field(default_factory=list)
    # per round: each worker's share of a core (how the load split, and how busy each was)
    shares: list[list[float]] = field(default_factory=list)


def measure_once(b: Bench, gw: Gateway, key: str) -> None:
    with workers.under_test(b, gw.service):
        label = f"{gw.count} worker(s), {gw.where}"
        row = workers.load_row(b, key, label, gw.client_args, concurrency=gw.concurrency)
    parts = row.cpu.proxy_parts
    if row.errors or not row.value or not parts:
        print(f"  {gw.count} worker(s), {gw.where}: failed ({row.errors} errors)", file=sys.stderr)
        gw.rounds.append((0.0, 0.0, 0.0, 0.0))
        gw.shares.append([])
        return
    supervisor = relay = work = 0.0
    shares = []
    for pid, (name, pct) in parts.items():
        if gw.count > 1 and pid == gw.pid:
            supervisor += pct
        elif name.startswith("redis"):
            relay += pct  # the limit relay: the supervisor's redis-server (no `redis:` configured)
        else:
            work += pct
            shares.append(pct)
    per_request = 1e6 / 100 / row.value  # µs per request for 1 % of a core
    gw.rounds.append((row.value, supervisor * per_request, relay * per_request, work * per_request))
    gw.shares.append(sorted(shares))


def report(gateways: list[Gateway], args: argparse.Namespace) -> str:
    one, two, shared, half = gateways
    lines = [
        f"# Per-request CPU by process, 1 and 2 workers ({args.mode} c10)",
        "",
        f"- {args.rounds} rounds of {args.duration:g} s loads; `bench/worker_split.py --mode {args.mode}`",
        "- µs of CPU per request; 1 worker pinned to the proxy's core, 2 workers on both cores (not",
        "  pinned each: either may run on the load client's core), 1 worker pinned to the load",
        "  client's core (shared with the client and the upstream), and the first 1-worker gateway",
        "  again at c5 (the load each of two workers sees)",
        "",
        "| round | 1 worker: req/s, µs/req | 2 workers: req/s | supervisor | limit relay | workers "
        "| each worker, % of a core | 2 / 1 per core-second | 1 worker on the client's core: µs/req "
        "| 1 worker at c5: µs/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios, shared_cost, half_cost = [], [], []
    rows = zip(one.rounds, two.rounds, shared.rounds, half.rounds, two.shares, strict=True)
    for i, (a, c, s, h, each) in enumerate(rows, 1):
        ratio = a[3] / sum(c[1:]) if a[0] and c[0] else None
        if ratio is not None:
            ratios.append(ratio)
        if a[0] and s[0]:
            shared_cost.append(s[3] / a[3])
        if a[0] and h[0]:
            half_cost.append(h[3] / a[3])
        lines.append(
            f"| {i} | {a[0]:,.0f}, {a[3]:.0f} | {c[0]:,.0f} | {c[1]:.1f} | {c[2]:.1f} | {c[3]:.0f} "
            f"| {', '.join(f'{x:.0f}' for x in each) or '–'} "
            f"| {'–' if ratio is None else f'{ratio:.2f}×'} | {s[3]:.0f} | {h[3]:.0f} |"
        )

    def mid(values: list[float], digits: int = 0) -> str:
        return f"{statistics.median(values):.{digits}f}" if values else "–"

    def costs(gw: Gateway, part: int) -> list[float]:
        return [r[part] for r in gw.rounds if r[0]]

    lines += [
        "",
        f"Medians: 1 worker {mid(costs(one, 3))} µs/req; 2 workers: supervisor {mid(costs(two, 1), 1)}, "
        f"limit relay {mid(costs(two, 2), 1)}, workers {mid(costs(two, 3))} µs/req; 2 workers / 1 per "
        f"core-second {mid(ratios, 2)}×; 1 worker on the client's core / on its own "
        f"{mid(shared_cost, 2)}× the CPU per request; 1 worker at c5 / at c10 {mid(half_cost, 2)}×.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description="per-request CPU by process, 1 and 2 workers (loopback only)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per load (default 5)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--mode", choices=["int", "plain"], default="int")
    p.add_argument("--markdown", type=Path)
    args = p.parse_args()
    args.quick, args.retry_disturbed, args.upstream, args.alt = False, 0, "nginx", None
    with contextlib.ExitStack() as stack:
        b = workers.new_bench(stack, args, "sgbench-split-")
        http_port, tls_port = stack.enter_context(workers.upstream(b, "upstream", UPSTREAM_IP, ()))
        b.http_port, b.tls_port = http_port, tls_port
        rules, cred = workers.bench_rules(b, "rules-10")
        gateways = []
        for name, count, where in (
            ("sandgate-w1", 1, "its own core"),
            ("sandgate-w2", 2, "both cores"),
            ("sandgate-w1-shared", 1, "the client's core"),
        ):
            core = CLIENT_CORE if where == "the client's core" else PROXY_CORE
            service = workers.gateway_service(b, name, rules, cred, count, core=core)
            sg, gw = stack.enter_context(service)
            if args.mode == "int":
                client = workers.tls_args(gw.proxy, f"https://api.test:{tls_port}/", gw.ca, gw.cred)
            else:
                client = ["--address", gw.proxy, "--url", f"http://api.test:{http_port}/", "--proxy"]
                client += ["--auth", gw.cred]
            gateways.append(Gateway(count, where, sg, gw.pid, client))
        # The first again at half the load: what each of two workers sees of c10.
        first = gateways[0]
        gateways.append(Gateway(1, "its own core", first.service, first.pid, first.client_args, 5))
        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
            for gw in gateways if r % 2 == 0 else reversed(gateways):
                measure_once(b, gw, f"w{gw.count}-{r}")
        text = report(gateways, args)
    sys.stdout.write(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
