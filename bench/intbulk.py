"""Intercepted bulk (issue 29 item 4): one large download through intercepted HTTPS, sandgate
with one worker against bare mitmdump, in interleaved rounds.

Run: `.venv/bin/python bench/intbulk.py [--rounds 5] [--downloads 5] [--size 10485760]
[--spy DIR] [--upstream nginx|python] [--client loadclient|curl] [--alt DIR]` (about a minute; `--spy` needs py-spy:
`.venv/bin/pip install py-spy`, and root or CAP_SYS_PTRACE).

Both proxies start first and wait idle, pinned as in bench/workers.py (proxy on core 0; client
and upstream on core 1). Each round downloads `--size` bytes (`GET /bulk/<n>`) `--downloads`
times through each proxy (CONNECT, TLS terminated by the proxy, re-encrypted to the upstream),
in an order reversed every other round; a round's figure per proxy is the median of its
downloads, and the ratio sandgate / mitmdump is taken per round. The CPU column is the proxy's
CPU seconds per GB (10^9 bytes) over the round's downloads: on a shared machine it moves less
than MB/s. With `--spy DIR`, after the rounds py-spy records each proxy during 60 more downloads
and writes `DIR/intbulk-PROXY.raw` (collapsed stacks) and `DIR/intbulk-PROXY.svg` (bench/flamegraph.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from profile import cpu_seconds, parse_raw, report  # noqa: E402

import flamegraph  # noqa: E402
import run  # noqa: E402
import workers  # noqa: E402
from run import BIN, PROXY_IP, UPSTREAM_IP, service  # noqa: E402
from support.ports import free_port  # noqa: E402


def curl_argv(args: list[str], size: int) -> list[str]:
    """The same download with curl (C, OpenSSL): a client that reads faster than Python's."""
    flags = [a for a in args if a != "--connect"]  # the one option without a value
    opts = dict(zip(flags[::2], flags[1::2], strict=True))
    url = opts["--url"]
    if "--connect-to" in opts:  # bare mitmdump resolves the name itself: ask for the address
        url = url.replace(url.split("/")[2], opts["--connect-to"])
    argv = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{speed_download}"]
    argv += ["--proxy", f"http://{opts['--address']}", "--cacert", opts["--cafile"]]
    if "--auth" in opts:
        argv += ["--proxy-user", opts["--auth"]]
    return run.pinned(run.CLIENT_CORE, [*argv, f"{url.rstrip('/')}/bulk/{size}"])


def one_download(b: run.Bench, args: list[str], size: int) -> float:
    """MB/s (10^6 bytes) of one download, with bench/loadclient.py or curl."""
    if b.args.client == "curl":
        cp = subprocess.run(curl_argv(args, size), capture_output=True, text=True, timeout=120)
        status, got, speed = ([*cp.stdout.split(), "", "", ""])[:3]
        if cp.returncode or status != "200" or got != str(size):
            raise run.BenchError(f"curl failed: {cp.stdout} {cp.stderr.strip()[-300:]}")
        return float(speed) / 1e6
    r = run.run_client(b, [*args, "--bulk", str(size)], duration=0)
    if r["errors"]:
        raise run.BenchError(f"download failed: {r['first_error']}")
    return float(r["mbps"])


def downloads(b: run.Bench, args: list[str], pid: int, size: int, n: int) -> tuple[float, float]:
    """Median MB/s of n downloads, and the proxy's CPU seconds per GB over them."""
    speeds: list[float] = []
    before = cpu_seconds(pid)
    for _ in range(n):
        speeds.append(one_download(b, args, size))
    used = cpu_seconds(pid) - before
    return statistics.median(speeds), used / (n * size / 1e9)


def spy(b: run.Bench, name: str, args: list[str], pid: int, size: int, out: Path) -> str:
    """py-spy one proxy during 60 downloads; its collapsed stacks and an SVG in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    raw = out / f"intbulk-{name}.raw"
    argv = [str(BIN / "py-spy"), "record", "--format", "raw", "--function", "--nonblocking", "--gil"]
    argv += ["--rate", "200", "--pid", str(pid), "--output", str(raw)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)
    downloads(b, args, pid, size, 60)
    proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    proc.wait(timeout=60)
    text = raw.read_text() if raw.exists() else ""
    title = f"{name}, intercepted bulk, 60 downloads of {size:,} bytes ({b.args.client})"
    (out / f"intbulk-{name}.svg").write_text(flamegraph.render(text, title))
    return f"## {name} under py-spy (samples at 200/s: CPU with the GIL held)\n\n" + report(
        name, parse_raw(text)
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--downloads", type=int, default=5, help="downloads per proxy per round")
    p.add_argument("--size", type=int, default=10 * 1024 * 1024)
    p.add_argument("--spy", type=Path, help="py-spy the gateway afterwards; raw stacks and SVG here")
    p.add_argument("--upstream", choices=["nginx", "python"], default="nginx")
    p.add_argument(
        "--alt",
        type=Path,
        help="also a gateway importing `sandgate` from this folder (a folder with a `sandgate` link "
        "to a changed copy of the repository): an interleaved A/B of a change",
    )
    p.add_argument("--client", choices=["loadclient", "curl"], default="loadclient")
    p.add_argument(
        "--mitmdump-set",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="an extra mitmdump option, e.g. stream_large_bodies=1 (repeatable)",
    )
    args = p.parse_args()
    args.quick, args.warmup, args.retry_disturbed, args.duration = False, 0.0, 0, 0.0
    with contextlib.ExitStack() as stack:
        b = workers.new_bench(stack, args, "sgbench-intbulk-")
        b.http_port, b.tls_port = stack.enter_context(workers.upstream(b, "upstream", UPSTREAM_IP, ()))
        t = b.tls_port
        port = free_port(PROXY_IP)
        confdir = b.tmp / "mitmdump-conf"
        extra = [a for o in args.mitmdump_set for a in ("--set", o)]
        md = stack.enter_context(service("mitmdump", run._mitmdump_argv(b, port, confdir, extra), b.tmp))
        md.wait_listening(port, 60)
        md_args = workers.tls_args(
            f"{PROXY_IP}:{port}",
            f"https://api.test:{t}/",
            str(confdir / "mitmproxy-ca-cert.pem"),
            None,
            f"{UPSTREAM_IP}:{t}",
        )
        rules, cred = workers.bench_rules(b, "rules-10")
        sg, gw = stack.enter_context(workers.gateway_service(b, "sandgate-w1", rules, cred, 1))
        sg_args = workers.tls_args(gw.proxy, f"https://api.test:{t}/", gw.ca, gw.cred)
        rows = [("mitmdump", md.proc.pid, md_args), ("sandgate", sg.proc.pid, sg_args)]
        if args.alt:
            # The same gateway with its `sandgate` package taken from another tree (an A/B).
            os.environ["PYTHONPATH"] = str(args.alt)
            try:
                alt, agw = stack.enter_context(workers.gateway_service(b, "sandgate-alt", rules, cred, 1))
            finally:
                del os.environ["PYTHONPATH"]
            alt_args = workers.tls_args(agw.proxy, f"https://api.test:{t}/", agw.ca, agw.cred)
            rows.append(("sandgate-alt", alt.proc.pid, alt_args))
        for _, pid, a in rows:  # leaf certificates and connections made outside the rounds
            downloads(b, a, pid, args.size, 2)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in rows}
        for r in range(args.rounds):
            for name, pid, a in rows if r % 2 == 0 else reversed(rows):
                results[name].append(downloads(b, a, pid, args.size, args.downloads))
        print(
            f"# intercepted bulk, {args.size:,} bytes, {args.rounds} rounds x {args.downloads} downloads",
            end="",
        )
        print(f", client {args.client}\n")
        print("| proxy | MB/s per round | median | CPU s/GB per round | median |")
        print("|---|---|---:|---|---:|")
        for name, vals in results.items():
            speeds, cpus = [v[0] for v in vals], [v[1] for v in vals]
            print(
                f"| {name} | {', '.join(f'{x:.0f}' for x in speeds)} | {statistics.median(speeds):.0f} "
                f"| {', '.join(f'{x:.2f}' for x in cpus)} | {statistics.median(cpus):.2f} |"
            )
        print()
        for name in results:
            if name == "mitmdump":
                continue
            pairs = zip(results[name], results["mitmdump"], strict=True)
            ratios = [s[0] / m[0] for s, m in pairs]
            print(f"{name} / mitmdump per round: {', '.join(f'{x:.2f}' for x in ratios)}", end="")
            print(f"; median {statistics.median(ratios):.2f}x")
        if args.spy:
            for name, pid, a in rows:
                print("\n" + spy(b, name, a, pid, args.size, args.spy))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
