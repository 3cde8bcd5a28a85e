"""Cost of the metrics instrumentation per decision (µs): the calls a request makes.

    .venv/bin/python bench/metrics.py [--n 200000]

One request that is allowed and proxied makes: decision_seconds (one decide), decision (one
record), upstream_seconds (one response); a credential adds `injected`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from sandgate.proxy.metrics import Metrics


def per_call_us(fn: Callable[[], None], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200_000)
    n = parser.parse_args().n
    m = Metrics()
    rows: dict[str, Callable[[], None]] = {
        "decision (cached label child)": lambda: m.decision("t1", "allowed", "request", "allow"),
        "decision_seconds (histogram)": lambda: m.decision_seconds(0.0003),
        "upstream_seconds (histogram)": lambda: m.upstream_seconds(0.004),
        "injected (one credential)": lambda: m.injected("t1", ("github",)),
        "baseline (empty lambda)": lambda: None,
    }
    results = {name: min(per_call_us(fn, n) for _ in range(3)) for name, fn in rows.items()}
    base = results["baseline (empty lambda)"]
    for name, us in results.items():
        print(f"{name:34s} {us:6.3f} µs/call  ({us - base:6.3f} net)")
    per_request = sum(results[k] - base for k in list(results)[:3])
    print(f"{'per allowed, proxied request':34s} {per_request:6.3f} µs")


if __name__ == "__main__":
    main()
