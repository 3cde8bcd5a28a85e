"""Profile one sandgate gateway process under load with py-spy; top frames by self time.

Run: `.venv/bin/python bench/profile.py [--duration 15] [--modes plain,int,pass-new,int-new]
[--rate 200] [--repeat 1] [--no-spy] [--keep DIR] [--svg DIR]` (py-spy: `.venv/bin/pip install py-spy`;
needs ptrace, so root or CAP_SYS_PTRACE).

It starts the benchmark upstream (bench/upstream.py) and one sandgate gateway with one worker
(`SANDGATE_WORKERS=1`, 10 tenants from bench/tenantgen.py, the same config as bench/run.py), on
loopback, pinned like bench/run.py (gateway on core 0, client and upstream on core 1). For each
mode it drives bench/loadclient.py at concurrency 10 while `py-spy record --format raw
--function` samples the gateway, then prints the request rate and the top frames by self time
(samples of the thread holding the GIL: Python work, whichever thread does it),
each labelled mitmproxy / sandgate / stdlib / other (third-party), and the share of samples
spent inside sandgate code at all (inclusive).

Modes: `plain` plain HTTP via the proxy, keep-alive; `int` intercepted HTTPS keep-alive (CONNECT,
then TLS to the gateway's leaf certificate); `pass-new` a new CONNECT tunnel per request, TLS
passed through to the upstream; `int-new` a new CONNECT + intercepted TLS handshake per request.
With `--svg DIR` each mode's samples are also drawn as a flame graph, `DIR/MODE.svg`
(bench/flamegraph.py, no extra dependency; bench/flamegraphs/ holds the committed ones).
With `--no-spy` only the rates are measured (py-spy's sampling costs the gateway a little).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(BENCH))

import flamegraph  # noqa: E402
import tenantgen  # noqa: E402
from flamegraph import FRAME as _FRAME  # noqa: E402
from flamegraph import category, short  # noqa: E402
from run import (  # noqa: E402
    BIN,
    CLIENT_CORE,
    PROXY_CORE,
    PROXY_IP,
    UPSTREAM_IP,
    BenchError,
    pinned,
    service,
)
from support.pki import TestPKI  # noqa: E402
from support.ports import free_port  # noqa: E402

MODES = ("plain", "int", "pass-new", "int-new")
TOP = 15


@dataclass
class Profile:
    """Samples of one mode: self counts per frame and how many stacks touch sandgate."""

    samples: int = 0
    self_counts: Counter[str] = field(default_factory=Counter)
    category_self: Counter[str] = field(default_factory=Counter)
    sandgate_inclusive: int = 0
    inclusive: Counter[str] = field(default_factory=Counter)  # sandgate frames, inclusive


# Frames of sandgate that only wrap mitmproxy's own work (the command, the event loop's
# back-pressure hook, the guarded HTTP layer): left out of "inside sandgate code".
_WRAPPERS = (
    "proxy/cli/",
    "proxy/mitm/backpressure.py",
    "(proxy/addons/heads.py",
    "_GuardedHttpLayer._handle_event",
    "_GuardedHttp1Server.read_headers",
    "_GuardedStream._guarded",
    "(sandgate:",
)


def parse_raw(text: str) -> Profile:
    """Aggregate py-spy's raw (collapsed) output: `frame;frame;...;leaf count` per line."""
    p = Profile()
    for line in text.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = [f for f in stack.split(";") if _FRAME.match(f)]
        if not frames:
            continue
        p.samples += count
        leaf = frames[-1]
        m = _FRAME.match(leaf)
        assert m is not None
        p.self_counts[leaf] += count
        p.category_self[category(m["file"])] += count
        own = {
            f
            for f in frames
            if category(_FRAME.match(f)["file"]) == "sandgate"  # type: ignore[index]
            and not any(w in f for w in _WRAPPERS)
        }
        if own:
            p.sandgate_inclusive += count
        for f in own:
            p.inclusive[f] += count
    return p


def report(mode: str, p: Profile) -> str:
    if not p.samples:
        return f"### {mode}: no samples\n"
    out = [
        f"samples {p.samples}; self time by category: "
        + ", ".join(f"{k} {100 * v / p.samples:.0f} %" for k, v in p.category_self.most_common())
        + f"; inside sandgate hooks (inclusive) {100 * p.sandgate_inclusive / p.samples:.0f} %",
        "",
        "| # | self % | category | frame |",
        "|---|---|---|---|",
    ]
    for i, (frame, n) in enumerate(p.self_counts.most_common(TOP), 1):
        m = _FRAME.match(frame)
        cat = category(m["file"]) if m else "?"
        out.append(f"| {i} | {100 * n / p.samples:.1f} | {cat} | `{short(frame)}` |")
    out += ["", "sandgate frames by inclusive time (hooks and what they call):", ""]
    out += ["| # | incl. % | frame |", "|---|---|---|"]
    for i, (frame, n) in enumerate(p.inclusive.most_common(TOP), 1):
        out.append(f"| {i} | {100 * n / p.samples:.1f} | `{short(frame)}` |")
    return "\n".join(out) + "\n"


def client_args(
    mode: str, proxy: str, cred: str, http_port: int, tls_port: int, gw_ca: str, ca: str
) -> list[str]:
    if mode == "plain":
        return ["--address", proxy, "--url", f"http://api.test:{http_port}/", "--proxy", "--auth", cred]
    if mode in ("int", "int-new"):
        extra = ["--new-conn"] if mode == "int-new" else []
        url = f"https://api.test:{tls_port}/"
        return ["--address", proxy, "--url", url, "--connect", "--auth", cred, "--cafile", gw_ca, *extra]
    if mode == "pass-new":
        url = f"https://pass.api.test:{tls_port}/"
        return ["--address", proxy, "--url", url, "--connect", "--auth", cred, "--cafile", ca, "--new-conn"]
    raise ValueError(mode)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process (every thread) has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive(args: list[str], duration: float, concurrency: int, pid: int | None = None) -> dict[str, object]:
    """Run the load client; with `pid`, add `cpu_us`: that process's CPU per recorded request (µs).

    CPU per request is what a cut changes; req/s on a shared machine also moves with whatever
    else runs on the gateway's core. The CPU is read at the client's measure-start and
    measure-end marks, so it covers exactly the recorded window.
    """
    argv = pinned(CLIENT_CORE, [sys.executable, str(BENCH / "loadclient.py"), *args])
    argv += ["--concurrency", str(concurrency), "--duration", str(duration), "--warmup", "1", "--marks"]
    marks: dict[str, float] = {}
    errors: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None and proc.stdout is not None
        for line in proc.stderr:
            if line.startswith("measure-") and pid is not None:
                marks[line.strip()] = cpu_seconds(pid)
            else:
                errors.append(line)
        out = proc.stdout.read()
        rc = proc.wait(timeout=duration + 120)
    if rc != 0:
        raise BenchError(f"load client failed: {''.join(errors).strip()[-500:]}")
    result: dict[str, object] = json.loads(out)
    if "measure-start" in marks and "measure-end" in marks:
        used = marks["measure-end"] - marks["measure-start"]
        done = int(result["requests"])  # type: ignore[call-overload]
        result["cpu_us"] = 1e6 * used / done if done else 0.0
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--repeat", type=int, default=1, help="rate-only runs per mode (median reported)")
    ap.add_argument("--rate-seconds", type=float, default=5.0, help="length of each rate-only run")
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--no-spy", action="store_true", help="measure rates only")
    ap.add_argument(
        "--all-threads",
        action="store_true",
        help="sample every running thread, not only the one holding the GIL (py-spy --gil)",
    )
    ap.add_argument("--keep", type=Path, help="write py-spy raw output and the report here")
    ap.add_argument(
        "--svg", type=Path, help="write a flame graph per mode here (MODE.svg, bench/flamegraph.py)"
    )
    args = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the gateway and the upstream are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m}")
    spy = str(BIN / "py-spy")
    if not args.no_spy and not Path(spy).exists():
        print("py-spy missing: .venv/bin/pip install py-spy (or use --no-spy)", file=sys.stderr)
        return 2
    for folder in (args.keep, args.svg):
        if folder:
            folder.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sgbench-profile-")))
        (tmp / "pki").mkdir()
        pki = stack.enter_context(
            TestPKI(names=("api.test", "*.api.test", UPSTREAM_IP), directory=tmp / "pki")
        )
        up_argv = [sys.executable, str(BENCH / "upstream.py"), "--host", UPSTREAM_IP]
        up_argv += ["--cert", str(pki.cert_file), "--key", str(pki.key_file)]
        up = stack.enter_context(service("upstream", pinned(CLIENT_CORE, up_argv), tmp, stdout_pipe=True))
        ports = up.read_json_line(15)
        http_port, tls_port = int(ports["http_port"]), int(ports["tls_port"])
        rules = tmp / "rules"
        t = tenantgen.write_rules_dir(rules, 10, http_port=http_port, tls_port=tls_port)
        cred = f"{t.sandbox}:{t.token}"
        port = free_port(PROXY_IP)
        config = {
            "listeners": [{"host": PROXY_IP, "port": port}],
            "rules_dir": str(rules),
            "state_dir": str(tmp / "state"),
            "resolver": {"hosts": {tenantgen.BENCH_HOST: [UPSTREAM_IP], tenantgen.PASS_HOST: [UPSTREAM_IP]}},
            "address_guard": {"reachable_by_name": ["127.0.0.0/8"]},
            "upstream": {"trusted_ca": str(pki.ca_file)},
            "log": {"level": "warning"},
        }
        cfg = tmp / "sandgate.yaml"
        cfg.write_text(json.dumps(config))
        os.environ["SANDGATE_WORKERS"] = "1"
        sg_argv = pinned(PROXY_CORE, [str(BIN / "sandgate"), "run", "--config", str(cfg)])
        sg = stack.enter_context(service("sandgate", sg_argv, tmp))
        sg.wait_listening(port, 120)
        gw_ca = str(tmp / "state" / "ca" / "mitmproxy-ca-cert.pem")
        proxy = f"{PROXY_IP}:{port}"
        for mode in modes:
            cargs = client_args(mode, proxy, cred, http_port, tls_port, gw_ca, str(pki.ca_file))
            rates: list[float] = []
            costs: list[float] = []
            for _ in range(args.repeat):
                r = drive(cargs, args.rate_seconds, args.concurrency, sg.proc.pid)
                rates.append(float(r["rps"]))  # type: ignore[arg-type]
                costs.append(float(r.get("cpu_us", 0.0)))  # type: ignore[arg-type]
                if r["errors"]:
                    print(f"{mode}: {r['errors']} errors, first {r['first_error']}", file=sys.stderr)
            head = (
                f"## {mode} (c{args.concurrency}): "
                + (f"median {statistics.median(rates):,.0f}/s of " + ", ".join(f"{x:,.0f}" for x in rates))
                + (
                    f"; gateway CPU per request median {statistics.median(costs):,.0f} µs of "
                    + ", ".join(f"{x:,.0f}" for x in costs)
                )
            )
            if not args.no_spy:
                raw = tmp / f"{mode}.raw"
                spy_argv = [spy, "record", "--format", "raw", "--function", "--nonblocking"]
                spy_argv += ["--rate", str(args.rate), "--duration", str(int(args.duration) + 1)]
                # Only the thread running Python code: py-spy's idle detection counts threads
                # waiting on a lock or in select() as busy on some VMs.
                spy_argv += [] if args.all_threads else ["--gil"]
                spy_argv += ["--pid", str(sg.proc.pid), "--output", str(raw)]
                spy_proc = subprocess.Popen(
                    spy_argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
                )
                time.sleep(0.5)
                r = drive(cargs, args.duration, args.concurrency)
                _, err = spy_proc.communicate(timeout=args.duration + 60)
                text = raw.read_text() if raw.exists() else ""
                if not text:
                    print(f"py-spy produced nothing: {err.strip()[-300:]}", file=sys.stderr)
                head += f"; under py-spy {float(r['rps']):,.0f}/s"  # type: ignore[arg-type]
                if args.keep:
                    (args.keep / f"{mode}.raw").write_text(text)
                if args.svg:
                    title = f"sandgate, 1 worker, {mode} c{args.concurrency}, {float(r['rps']):,.0f}/s under py-spy"  # type: ignore[arg-type]
                    (args.svg / f"{mode}.svg").write_text(flamegraph.render(text, title))
                lines += [head, "", report(mode, parse_raw(text))]
            else:
                lines += [head, ""]
            print(lines[-3] if not args.no_spy else lines[-2], file=sys.stderr, flush=True)
        if sg.proc.poll() is not None:
            lines.append(f"the gateway died: {sg.failure()}")
    out = "\n".join(lines)
    print(out)
    if args.keep:
        (args.keep / "report.md").write_text(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
