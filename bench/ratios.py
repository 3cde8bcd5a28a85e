"""Issue 14's ratios, measured in interleaved rounds so that a slow minute on a shared machine
falls on both sides of each ratio.

bench/workers.py measures each proxy's rows in one block, one proxy after the other; on the
project's shared 2-core VMs a row's throughput moves by ±30 % from one minute to the next, so
a ratio of two rows measured minutes apart is mostly that noise. Here every proxy starts first
(all idle, pinned as in workers.py), then each round runs every row once, in an order rotated
by one each round, and each ratio is taken per round from rows measured seconds apart. The
report gives each ratio's median over the rounds with its lowest and highest, and each row's
median.

Run: `.venv/bin/python bench/ratios.py [--rounds 3] [--duration 5] [--markdown out.md] [--alt DIR]
[--rows KEY,...]` (`--alt`: an A/B against another tree, see its help).
Loopback only; every process and temporary directory is removed on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import peers  # noqa: E402
import run  # noqa: E402
import tenantgen  # noqa: E402
import workers  # noqa: E402
from run import PROXY_IP, UPSTREAM_IP, Bench, Service, service  # noqa: E402
from support.ports import free_port  # noqa: E402


@dataclass(frozen=True)
class Ratio:
    label: str
    over: str  # row key (numerator)
    under: str  # row key (denominator)
    target: float | None
    per_core: bool = False  # rates per core-second of the proxy's CPU, not per second


RATIOS = [
    Ratio("2 workers / 1 worker, intercepted HTTPS c10", "sg2-int10", "sg1-int10", 1.8),
    Ratio("2 workers / 1 worker, plain HTTP c10", "sg2-plain", "sg1-plain", 1.8),
    # What the workers' sharing costs, whatever cores the machine leaves them: 1.0 is linear.
    Ratio(
        "2 workers / 1 worker, intercepted HTTPS c10, per core-second", "sg2-int10", "sg1-int10", None, True
    ),
    Ratio("2 workers / 1 worker, plain HTTP c10, per core-second", "sg2-plain", "sg1-plain", None, True),
    Ratio("1 worker / bare mitmdump, intercepted HTTPS c10", "sg1-int10", "md-int10", 1.5),
    # Issue 29: the lean HTTP/1.1 path against mitmproxy's general path, both 1 worker.
    Ratio("lean path / general path, intercepted HTTPS c10 (1 worker)", "lean-int10", "general-int10", 1.6),
    Ratio("lean path / general path, intercepted HTTPS c1 (1 worker)", "lean-int1", "general-int1", None),
    Ratio(
        "lean path / general path, intercepted HTTPS c10, per core-second",
        "lean-int10",
        "general-int10",
        None,
        True,
    ),
    Ratio("lean path (1 worker) / bare mitmdump, intercepted HTTPS c10", "lean-int10", "md-int10", 2.0),
    Ratio("1 worker / bare mitmdump, intercepted HTTPS c1", "sg1-int1", "md-int1", 1.5),
    Ratio("2-core gateway / one-core Node proxy, intercepted HTTPS c10", "sg2-int10", "node-int10", 1.0),
    Ratio("Rego tenant / allowlist only, intercepted HTTPS c10 (1 worker)", "rego-int10", "sg1-int10", 0.85),
    Ratio("passthrough new connections/s / squid's (1 worker)", "sg1-newconn", "squid-newconn", 0.9),
    Ratio("passthrough bulk MB/s / squid's (1 worker)", "sg1-bulk", "squid-bulk", 1.0),
    # With --alt DIR: this tree against another (an A/B of a change), per core-second.
    Ratio(
        "this tree / --alt tree, intercepted HTTPS c10, per core-second", "sg1-int10", "alt-int10", None, True
    ),
    Ratio(
        "this tree / --alt tree, new passed-through tunnels, per core-second",
        "sg1-newconn",
        "alt-newconn",
        None,
        True,
    ),
    Ratio("--alt tree passthrough new connections/s / squid's", "alt-newconn", "squid-newconn", None),
]


@dataclass
class Measure:
    """One row to run every round: its key, label, the proxy it loads, how to run it."""

    key: str
    label: str
    proxy: Service
    run: Callable[[Bench, str, str], run.Row]
    helpers: tuple[int, ...] = ()
    values: list[float | None] = field(default_factory=list)
    # per round: the row's rate per core-second of the proxy's CPU (its processes, summed)
    per_core: list[float | None] = field(default_factory=list)
    # per round: % of a core that processes outside the benchmark used (the machine's load)
    others: list[float] = field(default_factory=list)


def _load(args: list[str], **kw: Any) -> Callable[[Bench, str, str], run.Row]:
    return lambda b, key, label: workers.load_row(b, key, label, args, **kw)


def _bulk(args: list[str]) -> Callable[[Bench, str, str], run.Row]:
    return lambda b, key, label: run.bulk_row(b, key, label, args)


def mitmdump_service(
    b: Bench, stack: contextlib.ExitStack, name: str, extra: list[str] | None = None
) -> tuple[Service, list[str]]:
    """A bare mitmdump (with `extra` arguments) listening, and the load client's arguments for
    intercepted HTTPS through it."""
    port = free_port(PROXY_IP)
    confdir = b.tmp / f"{name}-conf"
    md = stack.enter_context(service(name, run._mitmdump_argv(b, port, confdir, extra or []), b.tmp))
    md.wait_listening(port, 60)
    tls = workers.tls_args(
        f"{PROXY_IP}:{port}",
        f"https://api.test:{b.tls_port}/",
        str(confdir / "mitmproxy-ca-cert.pem"),
        None,
        f"{UPSTREAM_IP}:{b.tls_port}",
    )
    return md, tls


@contextlib.contextmanager
def proxies(b: Bench) -> Iterator[list[Measure]]:
    """Start every proxy (idle until its rows run) and list the rows to measure."""
    h, t = b.http_port, b.tls_port
    ms: list[Measure] = []
    with contextlib.ExitStack() as stack:
        md, tls = mitmdump_service(b, stack, "mitmdump")
        ms += [
            Measure("md-int10", "bare mitmdump, intercepted HTTPS c10", md, _load(tls)),
            Measure("md-int1", "bare mitmdump, intercepted HTTPS c1", md, _load(tls, concurrency=1)),
        ]

        rules, cred = workers.bench_rules(b, "rules-10")
        for n in (1, 2):
            sg, gw = stack.enter_context(workers.gateway_service(b, f"sandgate-w{n}", rules, cred, n))
            plain = ["--address", gw.proxy, "--url", f"http://api.test:{h}/", "--proxy", "--auth", gw.cred]
            tls = workers.tls_args(gw.proxy, f"https://api.test:{t}/", gw.ca, gw.cred)
            ms += [
                Measure(f"sg{n}-int10", f"sandgate, {n} worker(s), intercepted HTTPS c10", sg, _load(tls)),
                Measure(f"sg{n}-plain", f"sandgate, {n} worker(s), plain HTTP c10", sg, _load(plain)),
            ]
            if n == 1:
                tunnel = workers.tls_args(
                    gw.proxy, f"https://pass.api.test:{t}/", str(b.pki.ca_file), gw.cred
                )
                ms += [
                    Measure(
                        "sg1-int1", "sandgate, 1 worker, intercepted HTTPS c1", sg, _load(tls, concurrency=1)
                    ),
                    Measure(
                        "sg1-newconn",
                        "sandgate, 1 worker, new CONNECT tunnel per request, passed through",
                        sg,
                        _load([*tunnel, "--new-conn"], unit="conn/s"),
                    ),
                    Measure(
                        "sg1-bulk",
                        "sandgate, 1 worker, 100 MB through a passed-through tunnel",
                        sg,
                        _bulk(tunnel),
                    ),
                ]

        ms += _path_rows(b, stack, rules, cred)
        if b.args.alt:
            ms += _alt_rows(b, stack, rules, cred)
        rules, cred = workers.rego_rules(b)
        sg, gw = stack.enter_context(workers.gateway_service(b, "sandgate-rego", rules, cred, 1))
        workers.rego_denies(b, gw)
        tls = workers.tls_args(gw.proxy, f"https://api.test:{t}/", gw.ca, gw.cred)
        ms.append(
            Measure("rego-int10", "sandgate, 1 worker, Rego tenant, intercepted HTTPS c10", sg, _load(tls))
        )

        try:
            port = free_port(PROXY_IP)
            hosts = {tenantgen.BENCH_HOST: UPSTREAM_IP, tenantgen.PASS_HOST: UPSTREAM_IP}
            sq = peers.start_squid(b.tmp, port, hosts, [h, t], workers.core_prefix(run.PROXY_CORE))
            stack.callback(sq.stop)
            sq.wait_listening(port, 30)
            tunnel = workers.tls_args(f"{PROXY_IP}:{port}", f"https://pass.api.test:{t}/", str(b.pki.ca_file))
            ms += [
                Measure(
                    "squid-newconn",
                    "squid, new CONNECT tunnel per request",
                    sq,
                    _load([*tunnel, "--new-conn"], unit="conn/s"),
                ),
                Measure("squid-bulk", "squid, 100 MB through a tunnel", sq, _bulk(tunnel)),
            ]
        except peers.Unavailable as e:
            b.notes.append(f"squid not available: {e}")

        try:
            port = free_port(PROXY_IP)
            node = peers.start_node_proxy(
                b.tmp,
                port,
                [f"{UPSTREAM_IP}:{t}"],
                b.pki.ca_file,
                workers.core_prefix(run.PROXY_CORE),
                install=not b.args.no_install,
            )
            stack.callback(node.stop)
            node.proxy.wait_listening(port, 30)
            tls = workers.tls_args(f"{PROXY_IP}:{port}", f"https://{UPSTREAM_IP}:{t}/", str(node.ca_cert))
            # Its leaf certificate is made on the first CONNECT: not in any measured window.
            run.run_client(b, [*tls, "--concurrency", "1", "--requests", "3"], duration=10)
            ms.append(
                Measure(
                    "node-int10",
                    "Node srt-proxy, intercepted HTTPS c10",
                    node.proxy,
                    _load(tls),
                    helpers=(node.decider.proc.pid,),
                )
            )
        except peers.Unavailable as e:
            b.notes.append(f"Node proxy not available: {e}")
        yield ms


def _path_rows(b: Bench, stack: contextlib.ExitStack, rules: Path, cred: str) -> list[Measure]:
    """One 1-worker gateway on each intercepted HTTP/1.1 path (`$SANDGATE_HTTP1_PATH`, whatever
    the default): intercepted c10 and c1 on each."""
    t = b.tls_port
    ms: list[Measure] = []
    for path in ("general", "lean"):
        os.environ["SANDGATE_HTTP1_PATH"] = path
        try:
            sg, gw = stack.enter_context(workers.gateway_service(b, f"sandgate-{path}", rules, cred, 1))
        finally:
            del os.environ["SANDGATE_HTTP1_PATH"]
        tls = workers.tls_args(gw.proxy, f"https://api.test:{t}/", gw.ca, gw.cred)
        ms += [
            Measure(
                f"{path}-int10", f"sandgate, 1 worker, {path} path, intercepted HTTPS c10", sg, _load(tls)
            ),
            Measure(
                f"{path}-int1",
                f"sandgate, 1 worker, {path} path, intercepted HTTPS c1",
                sg,
                _load(tls, concurrency=1),
            ),
        ]
    return ms


def _alt_rows(b: Bench, stack: contextlib.ExitStack, rules: Path, cred: str) -> list[Measure]:
    """One worker importing `sandgate` from `--alt` (a folder with a `sandgate` link to another
    tree): its intercepted c10 and new-tunnel rows, for an A/B in the same rounds."""
    t = b.tls_port
    os.environ["PYTHONPATH"] = str(b.args.alt)
    try:
        sg, gw = stack.enter_context(workers.gateway_service(b, "sandgate-alt", rules, cred, 1))
    finally:
        del os.environ["PYTHONPATH"]
    tls = workers.tls_args(gw.proxy, f"https://api.test:{t}/", gw.ca, gw.cred)
    tunnel = workers.tls_args(gw.proxy, f"https://pass.api.test:{t}/", str(b.pki.ca_file), gw.cred)
    return [
        Measure("alt-int10", "--alt tree, 1 worker, intercepted HTTPS c10", sg, _load(tls)),
        Measure(
            "alt-newconn",
            "--alt tree, 1 worker, new CONNECT tunnel per request, passed through",
            sg,
            _load([*tunnel, "--new-conn"], unit="conn/s"),
        ),
    ]


def measure(b: Bench, ms: list[Measure], rounds: int) -> None:
    for r in range(rounds):
        # Rotated, not reversed: reversing every other round ran the first and last rows twice
        # in a row at each round's turn (a warm second run), which favoured them over the
        # middle rows (an A/A of one tree in the middle read 0.92x); rotated, no row follows
        # itself and each takes each place in turn.
        shift = r % len(ms) if ms else 0
        order = ms[shift:] + ms[:shift]
        print(f"round {r + 1} of {rounds}", file=sys.stderr, flush=True)
        for m in order:
            with workers.under_test(b, m.proxy, m.helpers):
                row = m.run(b, m.key, m.label)
            value = row.value if not row.errors else None
            m.values.append(value)
            busy = row.cpu.proxy
            m.per_core.append(value / (busy / 100) if value is not None and busy else None)
            m.others.append(row.cpu.others)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def report(b: Bench, ms: list[Measure], rounds: int, started: float) -> str:
    by_key = {m.key: m for m in ms}
    lines = [
        "# sandgate: issue 14's ratios in interleaved rounds",
        "",
        f"- {rounds} rounds of {b.duration:g} s loads (1 s warm-up); row order rotated by one each round; "
        "every proxy running (idle) throughout, pinned as in bench/workers.py",
        f"- whole run: {time.monotonic() - started:.0f} s",
        "",
        "## Ratios (per round, then the median)",
        "",
        "| ratio | per round | median | target | met |",
        "|---|---|---:|---:|---|",
    ]
    for ratio in RATIOS:
        over, under = by_key.get(ratio.over), by_key.get(ratio.under)
        if over is None or under is None:
            lines.append(f"| {ratio.label} | not measured | – | {ratio.target}× | – |")
            continue
        ups, downs = (over.per_core, under.per_core) if ratio.per_core else (over.values, under.values)
        pairs = zip(ups, downs, strict=True)
        per = [o / u for o, u in pairs if o is not None and u is not None and u > 0]
        mid = _median(per)
        shown = ", ".join(f"{x:.2f}" for x in per) or "–"
        met = "–" if mid is None or ratio.target is None else ("yes" if mid >= ratio.target else "no")
        target = f"≥ {ratio.target}×" if ratio.target is not None else "–"
        lines.append(
            f"| {ratio.label} | {shown} | {'–' if mid is None else f'{mid:.2f}×'} | {target} | {met} |"
        )
    lines += [
        "",
        "## Rows (median over the rounds)",
        "",
        "| row | per round | median | per core-second of the proxy's CPU (median) |",
        "|---|---|---:|---:|",
    ]
    for m in ms:
        unit = next((r.unit for r in b.rows if r.key == m.key), "")
        shown = ", ".join("failed" if v is None else f"{v:,.0f}" for v in m.values)
        mid = _median([v for v in m.values if v is not None])
        core = _median([v for v in m.per_core if v is not None])
        lines.append(
            f"| {m.label} | {shown} | {'–' if mid is None else f'{mid:,.0f} {unit}'} "
            f"| {'–' if core is None else f'{core:,.0f}'} |"
        )
    lines += ["", "## Notes", ""] + [f"- {n}" for n in b.notes]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description="issue 14's ratios in interleaved rounds (loopback only)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per load (default 5)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--no-install", action="store_true", help="do not npm-install the Node proxy if missing")
    p.add_argument("--upstream", choices=["nginx", "python"], default="nginx")
    p.add_argument(
        "--alt",
        type=Path,
        help="also a 1-worker gateway importing `sandgate` from this folder (a folder with a "
        "`sandgate` link to another tree): an interleaved A/B of a change",
    )
    p.add_argument(
        "--rows",
        help="measure only these row keys (comma-separated, e.g. sg1-newconn,squid-newconn,alt-newconn); "
        "every proxy still starts",
    )
    args = p.parse_args()
    args.quick = False
    args.retry_disturbed = 0  # the rounds are the repeats
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        b = workers.new_bench(stack, args, "sgbench-ratios-")
        b.http_port, b.tls_port = stack.enter_context(workers.upstream(b, "upstream", UPSTREAM_IP, ()))
        ms = stack.enter_context(proxies(b))
        if args.rows:
            wanted = set(args.rows.split(","))
            ms = [m for m in ms if m.key in wanted]
        measure(b, ms, args.rounds)
        text = report(b, ms, args.rounds, started)
    sys.stdout.write(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
