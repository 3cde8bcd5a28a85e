"""Issue 29 item 2's ceiling: a lean HTTP/1.1 layer with no sandgate work, against bare mitmdump
and today's 1-worker sandgate, intercepted HTTPS keep-alive, in interleaved rounds.

The spike is bench/lean_layer_spike.py loaded into the same mitmdump command as the bare row
(`mitmdump -s bench/lean_layer_spike.py`): inside every intercepted CONNECT tunnel it replaces
mitmproxy's HttpLayer with a minimal layer that parses with mitmproxy's HTTP/1 functions,
forwards and keeps the connection alive, doing none of sandgate's work (no decision, no
credential injection, no scrubbing, no audit). What it reaches is therefore the most a full lean
path could reach. Item 2 is kept only if a full lean path makes >= 1.6x the 1-worker sandgate
row and >= 2x bare mitmdump at c10: if the ceiling itself is below that, the item does not pay.

Rows (bench/ratios.py's machinery, set-up and pinning: every proxy on core 0, started first and
idle; client and nginx upstream on core 1; every row run once per round, the order reversed
every other round; medians over rounds with the lowest and highest): bare mitmdump intercepted
c10 and c1 (ratios.py's md-int10 / md-int1), the spike c10 and c1, sandgate 1 worker c10 and
c1 (ratios.py's sg1-int10 / sg1-int1), and as a reference the client straight to nginx (HTTPS
c10, no proxy: a proxied row that nears it is limited by the client, not the proxy; then its
req/s per core-second, i.e. its CPU per request, is the figure to compare). Ratios are taken per
round, then the median.

Run: `.venv/bin/python bench/lean_spike_bench.py [--rounds 3] [--duration 5] [--markdown out.md]`.
Loopback only; every process and temporary directory is removed on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import ratios  # noqa: E402
import run  # noqa: E402
import workers  # noqa: E402
from ratios import Measure, _load, mitmdump_service  # noqa: E402
from run import UPSTREAM_IP, Bench  # noqa: E402

SPIKE = BENCH / "lean_layer_spike.py"
MARK = "lean-layer-spike: serving an intercepted tunnel"  # bench/lean_layer_spike.py prints it


@dataclass(frozen=True)
class Ratio:
    label: str
    over: str
    under: str
    target: float | None
    per_core: bool = False


RATIOS = [
    Ratio("spike / sandgate 1 worker, c10", "spike-int10", "sg1-int10", 1.6),
    Ratio("spike / sandgate 1 worker, c1", "spike-int1", "sg1-int1", None),
    Ratio("spike / bare mitmdump, c10", "spike-int10", "md-int10", 2.0),
    Ratio("spike / bare mitmdump, c1", "spike-int1", "md-int1", None),
    Ratio("sandgate 1 worker / bare mitmdump, c10 (reference)", "sg1-int10", "md-int10", None),
    Ratio("sandgate 1 worker / bare mitmdump, c1 (reference)", "sg1-int1", "md-int1", None),
    Ratio("spike / sandgate 1 worker, c10, per core-second", "spike-int10", "sg1-int10", None, True),
    Ratio("spike / bare mitmdump, c10, per core-second", "spike-int10", "md-int10", None, True),
]


@contextlib.contextmanager
def proxies(b: Bench) -> Iterator[list[Measure]]:
    """Start bare mitmdump, the spike and a 1-worker sandgate (idle until their rows run)."""
    t = b.tls_port
    direct = [
        "--address",
        f"{UPSTREAM_IP}:{t}",
        "--url",
        f"https://api.test:{t}/",
        "--cafile",
        str(b.pki.ca_file),
    ]
    # Reference: no proxy, the client and nginx on core 1. A proxied row near it is client-bound.
    ms: list[Measure] = [
        Measure("direct-int10", "direct → nginx, HTTPS keep-alive c10 (no proxy)", None, _load(direct))
    ]  # type: ignore[arg-type]
    with contextlib.ExitStack() as stack:
        md, tls = mitmdump_service(b, stack, "mitmdump")
        ms += [
            Measure("md-int10", "bare mitmdump, intercepted HTTPS c10", md, _load(tls)),
            Measure("md-int1", "bare mitmdump, intercepted HTTPS c1", md, _load(tls, concurrency=1)),
        ]
        sp, tls = mitmdump_service(b, stack, "mitmdump-spike", ["-s", str(SPIKE)])
        # The spike must really serve the tunnel: a few requests, then its mark on stderr.
        run.run_client(b, [*tls, "--concurrency", "1", "--requests", "3"], duration=10)
        if MARK not in sp.err_path.read_text():
            raise run.BenchError(f"the spike did not take the tunnel: {sp.err_path.read_text()[-500:]}")
        b.notes.append("checked: the spike served the intercepted tunnel (its mark on stderr)")
        ms += [
            Measure("spike-int10", "lean layer spike (mitmdump -s), intercepted HTTPS c10", sp, _load(tls)),
            Measure(
                "spike-int1",
                "lean layer spike (mitmdump -s), intercepted HTTPS c1",
                sp,
                _load(tls, concurrency=1),
            ),
        ]
        rules, cred = workers.bench_rules(b, "rules-10")
        sg, gw = stack.enter_context(workers.gateway_service(b, "sandgate-w1", rules, cred, 1))
        tls = workers.tls_args(gw.proxy, f"https://api.test:{b.tls_port}/", gw.ca, gw.cred)
        ms += [
            Measure("sg1-int10", "sandgate, 1 worker, intercepted HTTPS c10", sg, _load(tls)),
            Measure("sg1-int1", "sandgate, 1 worker, intercepted HTTPS c1", sg, _load(tls, concurrency=1)),
        ]
        yield ms


def _span(values: list[float], fmt: str) -> str:
    if not values:
        return "–"
    mid = statistics.median(values)
    return f"{mid:{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def report(b: Bench, ms: list[Measure], rounds: int, started: float) -> str:
    by_key = {m.key: m for m in ms}
    load = os.getloadavg()
    lines = [
        "# Lean HTTP/1.1 layer spike (issue 29 item 2): the ceiling, in interleaved rounds",
        "",
        f"- {rounds} rounds of {b.duration:g} s loads; row order reversed every other round; every proxy "
        "running (idle) throughout, pinned to core 0; client and upstream on core 1",
        f"- whole run: {time.monotonic() - started:.0f} s; load average at the end "
        f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}",
        "",
        "## Ratios (per round, then the median; lowest–highest in brackets)",
        "",
        "| ratio | per round | median (min–max) | target | met |",
        "|---|---|---:|---:|---|",
    ]
    for ratio in RATIOS:
        over, under = by_key[ratio.over], by_key[ratio.under]
        ups, downs = (over.per_core, under.per_core) if ratio.per_core else (over.values, under.values)
        per = [o / u for o, u in zip(ups, downs, strict=True) if o is not None and u is not None and u > 0]
        mid = statistics.median(per) if per else None
        met = "–" if mid is None or ratio.target is None else ("yes" if mid >= ratio.target else "no")
        target = f"≥ {ratio.target}×" if ratio.target is not None else "–"
        shown = ", ".join(f"{x:.2f}" for x in per) or "–"
        lines.append(f"| {ratio.label} | {shown} | {_span(per, '.2f')}× | {target} | {met} |")
    lines += [
        "",
        "## Rows",
        "",
        "| row | req/s per round | req/s median (min–max) | req/s per core-second of the proxy's CPU, "
        "median (min–max) | the proxy's CPU, % of a core, per round | others' CPU, % of a core, per round |",
        "|---|---|---:|---:|---|---|",
    ]
    for m in ms:
        shown = ", ".join("failed" if v is None else f"{v:,.0f}" for v in m.values)
        vals = [v for v in m.values if v is not None]
        core = [v for v in m.per_core if v is not None]
        busy = ", ".join(f"{x:.0f}" for x in m.others)
        pairs = zip(m.values, m.per_core, strict=True)
        own = ", ".join("–" if not (v and c) else f"{100 * v / c:.0f}" for v, c in pairs)
        lines.append(
            f"| {m.label} | {shown} | {_span(vals, ',.0f')} | {_span(core, ',.0f')} | {own} | {busy} |"
        )
    notes = [r.note for r in b.rows if r.note]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in [*b.notes, *notes]]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(
        description="lean HTTP/1.1 layer spike vs mitmdump and sandgate (loopback only)"
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per load (default 5)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--upstream", choices=["nginx", "python"], default="nginx")
    args = p.parse_args()
    args.quick = False
    args.no_install = True
    args.retry_disturbed = 0  # the rounds are the repeats
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        b = workers.new_bench(stack, args, "sgbench-leanspike-")
        b.http_port, b.tls_port = stack.enter_context(workers.upstream(b, "upstream", UPSTREAM_IP, ()))
        ms = stack.enter_context(proxies(b))
        ratios.measure(b, ms, args.rounds)
        text = report(b, ms, args.rounds, started)
    sys.stdout.write(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


assert ratios.Measure is Measure  # the same machinery as bench/ratios.py

if __name__ == "__main__":
    raise SystemExit(main())
