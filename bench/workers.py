"""Workers matrix (issue 14): bare mitmdump, sandgate with 1 and N workers, squid and the Node
sandbox proxy, in one run, on one machine, with one client; the issue's ratios at the end.

Run: `.venv/bin/python bench/workers.py [--quick] [--markdown out.md] [--json out.json]`
(as root for the transparent rows). See bench/README.md ("bench/workers.py") for each row.
Everything runs on loopback (the transparent rows in network namespaces made here); every
process and temporary directory is removed on exit, error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import nginx_upstream  # noqa: E402
import peers  # noqa: E402
import run  # noqa: E402
import tenantgen  # noqa: E402
import yaml  # noqa: E402
from run import (  # noqa: E402
    BIN,
    CLIENT_CORE,
    NOT_AVAILABLE,
    PROXY_CORE,
    PROXY_IP,
    UPSTREAM_IP,
    Bench,
    BenchError,
    Row,
    Service,
    bulk_row,
    nagle_row,
    pinned,
    service,
)
from support.netns import NetnsLab  # noqa: E402
from support.pki import TestPKI  # noqa: E402
from support.ports import free_port, free_port_run  # noqa: E402

from sandgate.proxy.worker_role import worker_for  # noqa: E402

CORES = os.cpu_count() or 1
STARTED = time.monotonic()
RETRY_BUDGET = 300.0  # seconds into the run after which a disturbed row is not run again


def new_bench(stack: contextlib.ExitStack, args: argparse.Namespace, prefix: str) -> Bench:
    """A Bench in a temporary folder with its test PKI, both removed when `stack` closes."""
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    tmp.chmod(0o711)  # squid's own user reaches its folder inside
    (tmp / "pki").mkdir()
    pki = stack.enter_context(TestPKI(names=("api.test", "*.api.test", UPSTREAM_IP), directory=tmp / "pki"))
    return Bench(args, tmp, pki)


def load_row(b: Bench, key: str, label: str, client_args: list[str], **kw: Any) -> Row:
    """bench/run.py's load_row, with no more retries once the run is RETRY_BUDGET s old, so a
    busy machine does not push the whole run past ten minutes."""
    if time.monotonic() - STARTED > RETRY_BUDGET and b.args.retry_disturbed:
        b.args.retry_disturbed = 0
        b.notes.append(f"no disturbed row was run again after {RETRY_BUDGET:.0f} s into the run")
    return run.load_row(b, key, label, client_args, **kw)


QUICK_SECONDS = 2.0
DEFAULT_SECONDS = 6.0


def all_cores(argv: list[str]) -> list[str]:
    """A proxy with N workers gets every core (so it shares core 1 with the client)."""
    return ["taskset", "-c", f"0-{CORES - 1}", *argv] if run.PIN else argv


def core_prefix(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if run.PIN else []


def workers_flag() -> bool:
    """Whether this sandgate has `run --workers` (issue 14's supervisor)."""
    cp = subprocess.run([str(BIN / "sandgate"), "run", "--help"], capture_output=True, text=True, check=False)
    return "--workers" in cp.stdout


def unavailable(
    b: Bench, key: str, label: str, why: str, *, unit: str = "req/s", concurrency: int = 10
) -> None:
    b.rows.append(Row(key, label, concurrency, unit, note=f"{NOT_AVAILABLE}: {why}"))


@contextlib.contextmanager
def under_test(b: Bench, s: Service, helpers: tuple[int, ...] = ()) -> Iterator[None]:
    b.proxy, b.proxy_helpers = s, set(helpers)
    try:
        yield
    finally:
        b.proxy, b.proxy_helpers = None, set()


def tls_args(
    proxy: str, url: str, ca: str, cred: str | None = None, connect_to: str | None = None
) -> list[str]:
    args = ["--address", proxy, "--url", url, "--connect", "--cafile", ca]
    if cred:
        args += ["--auth", cred]
    if connect_to:
        args += ["--connect-to", connect_to]
    return args


# -- the upstream ----------------------------------------------------------------------------------


@contextlib.contextmanager
def upstream(b: Bench, name: str, host: str, prefix: tuple[str, ...]) -> Iterator[tuple[int, int]]:
    """The upstream on core 1 (nginx, or bench/upstream.py with `--upstream python`): its
    (plain, TLS) ports; its processes count as the benchmark's own."""
    if b.args.upstream == "nginx":
        http_port, tls_port = free_port(), free_port()
        s = nginx_upstream.start(
            b.tmp,
            host,
            http_port,
            tls_port,
            b.pki.cert_file,
            b.pki.key_file,
            [*prefix, *core_prefix(CLIENT_CORE)],
            name,
        )
        mine: set[int] = set()
        try:
            _wait_port(s, host, tls_port)
            mine = {s.proc.pid, *run.descendants(s.proc.pid)}
            b.pids |= mine
            yield http_port, tls_port
        finally:
            b.pids -= mine
            if s.proc.poll() is not None:
                b.notes.append(f"{name} died during the run: {s.failure()}")
            s.stop()
        return
    argv = [*prefix, *pinned(CLIENT_CORE, [sys.executable, str(BENCH / "upstream.py"), "--host", host])]
    argv += ["--cert", str(b.pki.cert_file), "--key", str(b.pki.key_file)]
    with service(name, argv, b.tmp, stdout_pipe=True) as up:
        ports = up.read_json_line(15)
        b.pids.add(up.proc.pid)
        try:
            yield int(ports["http_port"]), int(ports["tls_port"])
        finally:
            b.pids.discard(up.proc.pid)
            if up.proc.poll() is not None:
                b.notes.append(f"{name} died during the run: {up.failure()}")


def _wait_port(s: Service, host: str, port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if s.proc.poll() is not None:
            raise BenchError(f"{s.name} exited: {s.failure()}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        if time.monotonic() > deadline:
            raise BenchError(f"{s.name} not listening on {host}:{port}: {s.failure()}")
        time.sleep(0.05)


# -- the ceiling ---------------------------------------------------------------------------------


def phase_direct(b: Bench) -> None:
    """Client straight to the upstream, both on core 1: the most any proxied row can show."""
    print("direct to upstream (the client's ceiling)", file=sys.stderr)
    h, t = b.http_port, b.tls_port
    plain = ["--address", f"{UPSTREAM_IP}:{h}", "--url", f"http://api.test:{h}/"]
    tls = [
        "--address",
        f"{UPSTREAM_IP}:{t}",
        "--url",
        f"https://api.test:{t}/",
        "--cafile",
        str(b.pki.ca_file),
    ]
    load_row(
        b, "direct-plain", "direct → upstream, plain HTTP (reference: client + upstream on core 1)", plain
    )
    load_row(
        b, "direct-tls", "direct → upstream, HTTPS keep-alive (reference: client + upstream on core 1)", tls
    )


# -- bare mitmdump -------------------------------------------------------------------------------


def phase_mitmdump(b: Bench) -> None:
    print("bare mitmdump (intercepting)", file=sys.stderr)
    port = free_port(PROXY_IP)
    confdir = b.tmp / "mitmdump-conf"
    h, t = b.http_port, b.tls_port
    with service("mitmdump", run._mitmdump_argv(b, port, confdir, []), b.tmp) as md, under_test(b, md):
        b.notes.append(f"bare mitmdump ready in {md.wait_listening(port, 60):.1f} s")
        proxy = f"{PROXY_IP}:{port}"
        tls = tls_args(
            proxy,
            f"https://api.test:{t}/",
            str(confdir / "mitmproxy-ca-cert.pem"),
            None,
            f"{UPSTREAM_IP}:{t}",
        )
        plain = ["--address", proxy, "--url", f"http://{UPSTREAM_IP}:{h}/", "--proxy"]
        load_row(b, "md-plain", "bare mitmdump, plain HTTP", plain)
        load_row(b, "md-int10", "bare mitmdump, intercepted HTTPS", tls)
        load_row(b, "md-int1", "bare mitmdump, intercepted HTTPS", tls, concurrency=1)
        load_row(
            b,
            "md-newint",
            "bare mitmdump, new intercepted connection per request",
            [*tls, "--new-conn"],
            unit="conn/s",
        )
        run._stderr_note(b, md)

    print("bare mitmdump, TLS passed through (ignore_hosts=.*)", file=sys.stderr)
    port = free_port(PROXY_IP)
    argv = run._mitmdump_argv(b, port, confdir, ["--set", "ignore_hosts=.*"])
    with service("mitmdump-passthrough", argv, b.tmp) as md, under_test(b, md):
        md.wait_listening(port, 60)
        tunnel = tls_args(
            f"{PROXY_IP}:{port}",
            f"https://pass.api.test:{t}/",
            str(b.pki.ca_file),
            None,
            f"{UPSTREAM_IP}:{t}",
        )
        load_row(
            b,
            "md-newconn",
            "bare mitmdump + ignore_hosts, new CONNECT tunnel per request",
            [*tunnel, "--new-conn"],
            unit="conn/s",
        )
        bulk_row(b, "md-bulk", "bare mitmdump + ignore_hosts, 100 MB through a tunnel", tunnel)
        run._stderr_note(b, md)


def phase_splice(b: Bench) -> None:
    """bench/splice_proxy.py on the proxy core: what passthrough outside mitmproxy's layers
    could reach (no policy, no audit: a ceiling, not a peer)."""
    print("minimal asyncio CONNECT splice (bench/splice_proxy.py)", file=sys.stderr)
    cred = "bench:splice"
    argv = pinned(
        PROXY_CORE,
        [
            sys.executable,
            str(BENCH / "splice_proxy.py"),
            "--listen",
            f"{PROXY_IP}:0",
            "--auth",
            cred,
            "--map",
            f"{tenantgen.PASS_HOST}={UPSTREAM_IP}",
        ],
    )
    with service("splice", argv, b.tmp, stdout_pipe=True) as sp, under_test(b, sp):
        port = int(sp.read_json_line(15)["port"])
        tunnel = tls_args(
            f"{PROXY_IP}:{port}", f"https://pass.api.test:{b.tls_port}/", str(b.pki.ca_file), cred
        )
        load_row(
            b,
            "splice-newconn",
            "minimal asyncio CONNECT splice, new CONNECT tunnel per request",
            [*tunnel, "--new-conn"],
            unit="conn/s",
            compare="md-newconn",
        )
        bulk_row(
            b,
            "splice-bulk",
            "minimal asyncio CONNECT splice, 100 MB through a tunnel",
            tunnel,
            compare="md-bulk",
        )
        run._stderr_note(b, sp)


# -- sandgate ----------------------------------------------------------------------------------


@dataclass
class Gateway:
    """A sandgate under test: its address, the client credential and the CA it intercepts with."""

    proxy: str
    cred: str
    ca: str
    pid: int  # the gateway process (the supervisor, with N workers)


def _wait_workers(sg: Service, workers: int, timeout: float = 60.0) -> None:
    """With N workers, wait until the supervisor has N children (the port opens with the first)."""
    if workers <= 1:
        return
    deadline = time.monotonic() + timeout
    while len(run.descendants(sg.proc.pid)) < workers:
        if sg.proc.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"{sg.name}: {workers} workers did not start: {sg.failure()}")
        time.sleep(0.1)
    time.sleep(1.0)  # the last one to bind its listener


@contextlib.contextmanager
def gateway_service(
    b: Bench, name: str, rules: Path, cred: str, workers: int | None, *, core: int = PROXY_CORE
) -> Iterator[tuple[Service, Gateway]]:
    """A sandgate gateway (`--workers N` when given) on a free port, checked to enforce; one
    worker runs pinned to `core` (the proxy's own unless said), several on all cores."""
    port = free_port(PROXY_IP)
    cfg = run._sandgate_config(b, name, rules, port)
    argv = [str(BIN / "sandgate"), "run", "--config", str(cfg)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    argv = all_cores(argv) if (workers or 1) > 1 else pinned(core, argv)
    with service(name, argv, b.tmp) as sg:
        ready = sg.wait_listening(port, 120)
        _wait_workers(sg, workers or 1)
        b.notes.append(f"{name}: ready in {ready:.1f} s")
        with under_test(b, sg):
            run._sanity(b, port, cred)
        ca = str(b.tmp / f"{name}-state" / "ca" / "mitmproxy-ca-cert.pem")
        yield sg, Gateway(f"{PROXY_IP}:{port}", cred, ca, sg.proc.pid)
        run._stderr_note(b, sg)


@contextlib.contextmanager
def sandgate(b: Bench, name: str, rules: Path, cred: str, workers: int | None) -> Iterator[Gateway]:
    """A sandgate gateway, the proxy under test while it runs."""
    with gateway_service(b, name, rules, cred, workers) as (sg, gw), under_test(b, sg):
        yield gw


def gateway_rows(b: Bench, key: str, what: str, gw: Gateway, *, nagle: bool) -> None:
    h, t = b.http_port, b.tls_port
    plain = ["--address", gw.proxy, "--url", f"http://api.test:{h}/", "--proxy", "--auth", gw.cred]
    tls = tls_args(gw.proxy, f"https://api.test:{t}/", gw.ca, gw.cred)
    tunnel = tls_args(gw.proxy, f"https://pass.api.test:{t}/", str(b.pki.ca_file), gw.cred)
    load_row(b, f"{key}-plain", f"{what}, plain HTTP", plain, compare="md-plain")
    load_row(b, f"{key}-int10", f"{what}, intercepted HTTPS", tls, compare="md-int10")
    load_row(b, f"{key}-int1", f"{what}, intercepted HTTPS", tls, concurrency=1, compare="md-int1")
    load_row(
        b,
        f"{key}-newint",
        f"{what}, new intercepted connection per request",
        [*tls, "--new-conn"],
        unit="conn/s",
        compare="md-newint",
    )
    load_row(
        b,
        f"{key}-newconn",
        f"{what}, new CONNECT tunnel per request, passed through",
        [*tunnel, "--new-conn"],
        unit="conn/s",
        compare="md-newconn",
    )
    bulk_row(b, f"{key}-bulk", f"{what}, 100 MB through a passed-through tunnel", tunnel, compare="md-bulk")
    if nagle:
        nagle_row(b, f"{what}, plain HTTP GET", plain)
        nagle_row(b, f"{what}, plain HTTP POST 64 B", [*plain, "--method", "POST", "--body-size", "64"])
        nagle_row(b, f"{what}, intercepted HTTPS GET", tls)
        nagle_row(b, f"{what}, intercepted HTTPS POST 64 B", [*tls, "--method", "POST", "--body-size", "64"])
        nagle_row(b, f"{what}, passed-through HTTPS GET", tunnel)


def bench_rules(b: Bench, name: str) -> tuple[Path, str]:
    rules = b.tmp / name
    t = tenantgen.write_rules_dir(rules, 10, http_port=b.http_port, tls_port=b.tls_port)
    return rules, f"{t.sandbox}:{t.token}"


def phase_sandgate(b: Bench) -> None:
    has_flag = workers_flag()
    rules, cred = bench_rules(b, "rules-10")
    b.notes.append(
        "`sandgate run --workers`: "
        + (
            "available"
            if has_flag
            else "NOT available in this build (the 1-worker rows run without the flag)"
        )
    )
    print("sandgate, 1 worker", file=sys.stderr)
    with sandgate(b, "sandgate-w1", rules, cred, 1 if has_flag else None) as gw:
        gateway_rows(b, "sg1", "sandgate, 1 worker", gw, nagle=True)
    counts = sorted({n for n in (2, 4, 8) if n < CORES} | {CORES}) if CORES > 1 else []
    for n in counts:
        what = f"sandgate, {n} workers"
        key = f"sg{n}"
        if not has_flag:
            for suffix, label, unit, c in ROW_SHAPES:
                unavailable(
                    b,
                    f"{key}-{suffix}",
                    f"{what}, {label}",
                    "`sandgate run --workers` not in this build",
                    unit=unit,
                    concurrency=c,
                )
            continue
        print(what, file=sys.stderr)
        with sandgate(b, f"sandgate-w{n}", rules, cred, n) as gw:
            if n == CORES:
                gateway_rows(b, key, what, gw, nagle=True)
                SUPERVISORS[key] = gw.pid
            else:  # the curve: only the scaling rows
                tls = tls_args(gw.proxy, f"https://api.test:{b.tls_port}/", gw.ca, gw.cred)
                load_row(b, f"{key}-int10", f"{what}, intercepted HTTPS", tls, compare="md-int10")


ROW_SHAPES = [
    ("plain", "plain HTTP", "req/s", 10),
    ("int10", "intercepted HTTPS", "req/s", 10),
    ("int1", "intercepted HTTPS", "req/s", 1),
    ("newint", "new intercepted connection per request", "conn/s", 10),
    ("newconn", "new CONNECT tunnel per request, passed through", "conn/s", 10),
    ("bulk", "100 MB through a passed-through tunnel", "MB/s", 1),
]


# -- Rego ----------------------------------------------------------------------------------------

REGO_MODULE = """package sandgate.tenants.t00000

import rego.v1

import data.sandgate.examples.methods
import data.sandgate.examples.paths

deny contains d if some d in methods.deny

deny contains d if some d in paths.deny

deny contains "t00000 sends no debug tokens" if input.request.headers["x-debug-token"]
"""

REGO_TENANT_EXTRA = """rego: [t00000.rego, ../rego/examples/methods.rego, ../rego/examples/paths.rego]
data:
  methods:
    api.test: [GET, HEAD, POST]
  paths:
    api.test: ["/", "/v1/**", "/simple/**"]
"""


def phase_rego(b: Bench) -> None:
    """The same 10-tenant allowlist with tenant t00000's realistic Rego (three modules + data),
    decision cache on (the default); compared with the 1-worker rows."""
    print("sandgate, 1 worker, tenant with Rego", file=sys.stderr)
    rules, cred = rego_rules(b)
    with sandgate(b, "sandgate-rego", rules, cred, 1 if workers_flag() else None) as gw:
        rego_denies(b, gw)
        plain = [
            "--address",
            gw.proxy,
            "--url",
            f"http://api.test:{b.http_port}/",
            "--proxy",
            "--auth",
            gw.cred,
        ]
        tls = tls_args(gw.proxy, f"https://api.test:{b.tls_port}/", gw.ca, gw.cred)
        load_row(b, "rego-plain", "sandgate, 1 worker, Rego tenant, plain HTTP", plain, compare="md-plain")
        load_row(
            b, "rego-int10", "sandgate, 1 worker, Rego tenant, intercepted HTTPS", tls, compare="md-int10"
        )


def rego_rules(b: Bench) -> tuple[Path, str]:
    """The bench's 10-tenant rules, tenant t00000 with the Rego policy above."""
    rules, cred = bench_rules(b, "rules-rego")
    shutil.copytree(run.REPO / "rules" / "rego", rules / "rego")
    tenant = rules / "tenants" / "t00000.yaml"
    tenant.write_text(tenant.read_text() + REGO_TENANT_EXTRA)
    (rules / "tenants" / "t00000.rego").write_text(REGO_MODULE)
    return rules, cred


def rego_denies(b: Bench, gw: Gateway) -> None:
    """The Rego policy must be in force: a path it does not allow gets 403."""
    r = run.run_client(
        b,
        [
            "--address",
            gw.proxy,
            "--url",
            f"http://api.test:{b.http_port}/private",
            "--proxy",
            "--auth",
            gw.cred,
            "--concurrency",
            "1",
            "--requests",
            "3",
        ],
        duration=5,
    )
    ok = set(r["statuses"]) == {"403"}
    b.notes.append(
        f"Rego check: a path the policy denies → {r['statuses']}"
        + ("" if ok else " (EXPECTED 403: Rego NOT in force)")
    )
    if not ok:
        b.notes.append("SANITY FAILURE: the Rego tenant's policy did not deny /private")


# -- peers ---------------------------------------------------------------------------------------


def phase_squid(b: Bench) -> None:
    print("squid (allowlist CONNECT proxy)", file=sys.stderr)
    rows = [
        ("squid-plain", "squid, plain HTTP", "req/s", 10),
        ("squid-newconn", "squid, new CONNECT tunnel per request", "conn/s", 10),
        ("squid-bulk", "squid, 100 MB through a tunnel", "MB/s", 1),
    ]
    try:
        version = peers.squid_version()
        port = free_port(PROXY_IP)
        hosts = {tenantgen.BENCH_HOST: UPSTREAM_IP, tenantgen.PASS_HOST: UPSTREAM_IP}
        sq = peers.start_squid(b.tmp, port, hosts, [b.http_port, b.tls_port], core_prefix(PROXY_CORE))
    except peers.Unavailable as e:
        for key, label, unit, c in rows:
            unavailable(b, key, label, str(e), unit=unit, concurrency=c)
        return
    b.notes.append(f"peer: {version}, `squid -N` (one process), allowlist ACL, access log on, no cache")
    try:
        with under_test(b, sq):
            sq.wait_listening(port, 30)
            proxy = f"{PROXY_IP}:{port}"
            t = b.tls_port
            tunnel = tls_args(proxy, f"https://pass.api.test:{t}/", str(b.pki.ca_file))
            plain = ["--address", proxy, "--url", f"http://api.test:{b.http_port}/", "--proxy"]
            load_row(b, "squid-plain", rows[0][1], plain, compare="md-plain")
            load_row(
                b, "squid-newconn", rows[1][1], [*tunnel, "--new-conn"], unit="conn/s", compare="md-newconn"
            )
            bulk_row(b, "squid-bulk", rows[2][1], tunnel, compare="md-bulk")
            run._stderr_note(b, sq)
    finally:
        sq.stop()


def phase_node(b: Bench) -> None:
    print(f"Node proxy ({peers.SRT_PACKAGE}@{peers.SRT_VERSION} srt-proxy + decider)", file=sys.stderr)
    rows = [
        ("node-int10", "Node srt-proxy, intercepted HTTPS", "req/s", 10),
        ("node-int1", "Node srt-proxy, intercepted HTTPS", "req/s", 1),
        ("node-newint", "Node srt-proxy, new intercepted connection per request", "conn/s", 10),
    ]
    port = free_port(PROXY_IP)
    t = b.tls_port
    try:
        node = peers.start_node_proxy(
            b.tmp,
            port,
            [f"{UPSTREAM_IP}:{t}"],
            b.pki.ca_file,
            core_prefix(PROXY_CORE),
            install=not b.args.no_install,
        )
    except peers.Unavailable as e:
        for key, label, unit, c in rows:
            unavailable(b, key, label, str(e), unit=unit, concurrency=c)
        return
    b.notes.append(
        f"peer: {peers.SRT_PACKAGE}@{peers.SRT_VERSION} `srt-proxy` on Node {peers.node_version()}: TLS terminated "
        "with its own CA, each request sent to bench/srt_decider.mjs (a Node process on the same core) "
        f"and decided there; the client CONNECTs to {UPSTREAM_IP}:{t} (an IP literal: the proxy refuses names "
        "that resolve to loopback)"
    )
    try:
        with under_test(b, node.proxy, (node.decider.proc.pid,)):
            node.proxy.wait_listening(port, 30)
            proxy = f"{PROXY_IP}:{port}"
            tls = tls_args(proxy, f"https://{UPSTREAM_IP}:{t}/", str(node.ca_cert))
            # Its leaf certificate is made on the first CONNECT (RSA in JavaScript): not in the window.
            run.run_client(b, [*tls, "--concurrency", "1", "--requests", "3"], duration=10)
            load_row(b, rows[0][0], rows[0][1], tls, compare="md-int10")
            load_row(b, rows[1][0], rows[1][1], tls, concurrency=1, compare="md-int1")
            load_row(b, rows[2][0], rows[2][1], [*tls, "--new-conn"], unit="conn/s", compare="md-newint")
            nagle_row(b, "Node srt-proxy, intercepted HTTPS GET", tls)
            run._stderr_note(b, node.proxy)
    finally:
        node.stop()


# -- transparent -----------------------------------------------------------------------------------

TR_TOKEN = "bench-token-0123456789abcdef"


def _stop_client(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def parallel_row(
    b: Bench,
    key: str,
    label: str,
    clients: Sequence[tuple[tuple[str, ...], list[str]]],
    *,
    compare: str | None = None,
) -> Row:
    """One row from several load clients at once (one per guest namespace), c10 split among them.

    req/s and errors are summed; p50 and p99 are the highest of the clients' (each client's own
    percentiles: the merged distribution is not kept). CPU is sampled from the moment every
    client measures to the moment the first stops.
    """
    row = Row(key, label, run.CONCURRENCY, "req/s", compare=compare)
    b.rows.append(row)
    print(f"  {label} (c{run.CONCURRENCY} over {len(clients)} clients) ...", file=sys.stderr, flush=True)
    per = max(1, run.CONCURRENCY // len(clients))
    started: list[threading.Event] = []
    ended = threading.Event()
    procs: list[tuple[subprocess.Popen[str], Any]] = []
    errs: list[list[str]] = []
    samples: list[run.CpuSample] = []

    def read(proc: subprocess.Popen[str], mark: threading.Event, sink: list[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("measure-start"):
                mark.set()
            elif line.startswith("measure-end"):
                ended.set()
            else:
                sink.append(line)

    with contextlib.ExitStack() as stack:
        for prefix, args in clients:
            argv = [*prefix, *pinned(CLIENT_CORE, [sys.executable, str(BENCH / "loadclient.py"), *args])]
            argv += [
                "--concurrency",
                str(per),
                "--duration",
                str(b.duration),
                "--warmup",
                str(b.args.warmup),
                "--marks",
            ]
            out = stack.enter_context(tempfile.TemporaryFile("w+"))
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, text=True)
            stack.callback(_stop_client, proc)
            procs.append((proc, out))
            mark, sink = threading.Event(), list[str]()
            started.append(mark)
            errs.append(sink)
            threading.Thread(target=read, args=(proc, mark, sink), daemon=True).start()
        deadline = time.monotonic() + b.args.warmup + 30
        while not all(m.is_set() for m in started) and time.monotonic() < deadline:
            time.sleep(0.01)
        samples.append(run.CpuSample.now())
        ended.wait(timeout=b.duration + 30)
        samples.append(run.CpuSample.now())
        results: list[dict[str, Any]] = []
        for (proc, out), sink in zip(procs, errs, strict=True):
            proc.wait(timeout=b.duration + b.args.warmup + 60)
            out.seek(0)
            text = out.read()
            if proc.returncode != 0 or not text:
                row.note = f"FAILED: a load client exited {proc.returncode}: {''.join(sink).strip()[-300:]}"
                return row
            results.append(json.loads(text))
        ours = run._ours(b) | {p.pid for p, _ in procs}
        row.cpu.fill(samples[0], samples[1], run._proxy_pids(b) or None, ours)
    row.value = sum(r["rps"] for r in results)
    row.p50_ms = max(r["p50_ms"] for r in results)
    row.p99_ms = max(r["p99_ms"] for r in results)
    row.errors = sum(r["errors"] for r in results)
    notes = [f"{len(results)} guests × c{per}: " + ", ".join(f"{r['rps']:.0f}" for r in results) + " req/s"]
    if row.errors:
        first = next(r["first_error"] for r in results if r["errors"])
        notes.append(f"{row.errors} errors, first: {first}")
    row.note = "; ".join(notes)
    return row


def phase_transparent(b: Bench) -> None:
    """Plain HTTP c10 from guest namespaces through the transparent listener (nft redirect) vs
    the explicit listener of the same gateway, to an upstream in its own namespace; with 1
    worker and with N. There are N guests (one per core) with c10 split among them, for both
    worker counts, so the host rules can steer each guest to its own worker."""
    counts = [1, CORES] if CORES > 1 else [1]
    has_flag = workers_flag()
    if os.geteuid() != 0 or shutil.which("nft") is None:
        for n in counts:
            for key, label in _transparent_rows(n):
                unavailable(b, key, label, "needs root and nft (network namespaces, nftables redirect)")
        return
    with balanced_lab(max(counts)) as lab:
        up_ns = lab.add("bup")
        guests = [lab.add(f"bg{i}") for i in range(max(counts))]
        with upstream(b, "upstream-ns", up_ns.addr, ("ip", "netns", "exec", up_ns.name)) as (http_port, _):
            for n in counts:
                if n > 1 and not has_flag:
                    for key, label in _transparent_rows(n):
                        unavailable(b, key, label, "`sandgate run --workers` not in this build")
                    continue
                print(
                    f"sandgate, {n} worker(s), transparent mode ({len(guests)} guest namespaces)",
                    file=sys.stderr,
                )
                _transparent_gateway(b, lab, up_ns, guests, http_port, n, has_flag)


@contextlib.contextmanager
def balanced_lab(workers: int) -> Iterator[NetnsLab]:
    """A namespace lab whose guests 1..workers (namespace 0 is the upstream) are steered one to
    each worker: the host rules pick a worker by a hash of the interface name, which embeds the
    lab's tag, so a tag is drawn until the hash gives each worker one guest."""
    for _ in range(1000):
        tag = secrets.token_hex(2)
        if {worker_for(f"sgh{n}-{tag}", workers) for n in range(1, workers + 1)} == set(range(workers)):
            break
    lab = NetnsLab(tag=tag)
    try:
        yield lab
    finally:
        lab.close()


def _transparent_rows(n: int) -> list[tuple[str, str]]:
    what = f"sandgate, {n} worker{'s' if n > 1 else ''}"
    return [
        (f"tr{n}-explicit", f"{what}, explicit listener, plain HTTP (upstream in a namespace)"),
        (f"tr{n}-transparent", f"{what}, transparent listener, plain HTTP from {CORES} guest namespaces"),
    ]


def _transparent_gateway(
    b: Bench, lab: Any, up_ns: Any, guests: list[Any], http_port: int, workers: int, has_flag: bool
) -> None:
    root = b.tmp / f"transparent-w{workers}"
    (root / "rules" / "tenants").mkdir(parents=True)
    digest = hashlib.sha256(TR_TOKEN.encode()).hexdigest()
    tenant = {
        "tenant": "t",
        "sandboxes": [{"id": "sb", "token": f"sha256:{digest}"}],
        "allow": [{"hosts": ["web.test"], "ports": [http_port]}],
    }
    (root / "rules" / "tenants" / "t.yaml").write_text(yaml.safe_dump(tenant))
    # Worker i listens on transparent and DNS port base + i: one run of free ports for all.
    transparent = free_port_run(2 * workers + 1)
    dns_port, explicit = transparent + workers, transparent + 2 * workers
    config = root / "sandgate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listeners": [
                    {"host": PROXY_IP, "port": explicit},
                    {"mode": "transparent", "host": "0.0.0.0", "port": transparent},
                ],
                "dns": {"host": "0.0.0.0", "port": dns_port},
                "rules_dir": str(root / "rules"),
                "state_dir": str(root / "state"),
                "resolver": {"hosts": {"web.test": [up_ns.addr]}},
                "address_guard": {"reachable_by_name": [f"10.200.{lab.subnet}.0/24"]},
                "log": {"level": "warning"},
                "host_rules": {"table": f"sgbench_{lab.tag}_{workers}"},
            }
        )
    )
    argv = [str(BIN / "sandgate"), "run", "--config", str(config)]
    if has_flag:
        argv += ["--workers", str(workers)]
    argv = all_cores(argv) if workers > 1 else pinned(PROXY_CORE, argv)
    rows = _transparent_rows(workers)
    sandgate_bin = str(BIN / "sandgate")
    with service(f"sandgate-transparent-w{workers}", argv, b.tmp) as sg, under_test(b, sg):
        sg.wait_listening(explicit, 60)
        _wait_workers(sg, workers)
        if workers > 1:
            SUPERVISORS[f"tr{workers}"] = sg.proc.pid
        added: list[str] = []
        try:
            for i, guest in enumerate(guests):
                sid = f"bench-guest-{i}"
                add = [
                    sandgate_bin, "sandbox", "add", "--interface", guest.host_if, "--address", guest.addr,
                    "--tenant", "t", "--id", sid, "--config", str(config),
                ]  # fmt: skip
                cp = subprocess.run(add, capture_output=True, text=True, timeout=60, check=False)
                if cp.returncode != 0:
                    raise BenchError(f"sandgate sandbox add failed: {cp.stderr.strip()[-300:]}")
                added.append(sid)
            time.sleep(1.0)
            url = f"http://web.test:{http_port}/"
            explicit_args = [
                "--address",
                f"{PROXY_IP}:{explicit}",
                "--url",
                url,
                "--proxy",
                "--auth",
                f"sb:{TR_TOKEN}",
            ]
            load_row(b, rows[0][0], rows[0][1], explicit_args)
            clients = [
                (("ip", "netns", "exec", g.name), ["--address", f"{up_ns.addr}:{http_port}", "--url", url])
                for g in guests
            ]
            parallel_row(b, rows[1][0], rows[1][1], clients, compare=rows[0][0])
        finally:
            for sid in added:
                subprocess.run(
                    [sandgate_bin, "sandbox", "remove", sid, "--config", str(config)],
                    capture_output=True,
                    timeout=60,
                    check=False,
                )
        run._stderr_note(b, sg)


# -- ratios ----------------------------------------------------------------------------------------


@dataclass
class Ratio:
    name: str
    num: str
    den: str
    target: float | None
    value: float | None = None
    note: str = ""


def ratios(b: Bench) -> list[Ratio]:
    n = f"sg{CORES}"
    out = [
        Ratio(f"{CORES} workers / 1 worker, intercepted HTTPS c10", f"{n}-int10", "sg1-int10", 1.8),
        Ratio(f"{CORES} workers / 1 worker, plain HTTP c10", f"{n}-plain", "sg1-plain", 1.8),
        Ratio(f"{CORES} workers / 1 worker, new intercepted connections/s", f"{n}-newint", "sg1-newint", 1.8),
        Ratio(
            f"{CORES} workers / 1 worker, passthrough new connections/s", f"{n}-newconn", "sg1-newconn", 1.8
        ),
        Ratio("1 worker / bare mitmdump, intercepted HTTPS c10", "sg1-int10", "md-int10", 1.5),
        Ratio("1 worker / bare mitmdump, intercepted HTTPS c1", "sg1-int1", "md-int1", 1.5),
        Ratio("1 worker / bare mitmdump, plain HTTP c10", "sg1-plain", "md-plain", None),
        Ratio(
            f"gateway on {CORES} cores / Node proxy on 1, intercepted HTTPS c10",
            f"{n}-int10",
            "node-int10",
            1.0,
        ),
        Ratio(
            f"gateway on {CORES} cores / Node proxy on 1, intercepted HTTPS c1", f"{n}-int1", "node-int1", 1.0
        ),
        Ratio("1 worker / Node proxy, intercepted HTTPS c10", "sg1-int10", "node-int10", None),
        Ratio("Rego tenant / allowlist only, plain HTTP c10 (1 worker)", "rego-plain", "sg1-plain", 0.85),
        Ratio(
            "Rego tenant / allowlist only, intercepted HTTPS c10 (1 worker)", "rego-int10", "sg1-int10", 0.85
        ),
        Ratio("passthrough new connections/s, 1 worker / squid", "sg1-newconn", "squid-newconn", 0.9),
        Ratio(
            f"passthrough new connections/s, {CORES} workers / squid", f"{n}-newconn", "squid-newconn", 0.9
        ),
        Ratio("passthrough bulk MB/s, 1 worker / squid", "sg1-bulk", "squid-bulk", 1.0),
        Ratio(
            "passthrough new connections/s, minimal asyncio splice / squid",
            "splice-newconn",
            "squid-newconn",
            None,
        ),
        Ratio(
            "passthrough new connections/s, 1 worker / minimal asyncio splice",
            "sg1-newconn",
            "splice-newconn",
            None,
        ),
        Ratio(
            "transparent / explicit listener, plain HTTP c10 (1 worker)",
            "tr1-transparent",
            "tr1-explicit",
            None,
        ),
        Ratio(
            f"transparent, {CORES} workers / 1 worker, plain HTTP c10 from {CORES} guests",
            f"tr{CORES}-transparent",
            "tr1-transparent",
            1.8,
        ),
    ]
    for r in out:
        a, d = b.row(r.num), b.row(r.den)
        if a is not None and d is not None and a.value is not None and d.value:
            r.value = a.value / d.value
            if a.cpu.disturbed or d.cpu.disturbed:
                r.note = "a row is disturbed (⚠)"
        else:
            missing = [k for k, x in ((r.num, a), (r.den, d)) if x is None or x.value is None]
            r.note = "no figure for " + ", ".join(missing)
    return out


def ratio_markdown(rs: list[Ratio]) -> str:
    out = ["## Ratios (issue 14)", "", "| ratio | value | target | met | note |", "|---|---:|---:|---|---|"]
    for r in rs:
        # Three decimals where two would round a miss up to the target (0.998 shown as 1.00).
        close = r.value is not None and r.target is not None and abs(r.value - r.target) < 0.005
        value = "–" if r.value is None else f"{r.value:.3f}×" if close else f"{r.value:.2f}×"
        target = "–" if r.target is None else f"≥ {r.target:g}×"
        met = "–" if r.value is None or r.target is None else ("yes" if r.value >= r.target else "no")
        out.append(f"| {r.name} | {value} | {target} | {met} | {r.note} |")
    if CORES < 4:
        out += [
            "",
            f"The curve to 4 and 8 workers is not measured: this machine has {CORES} cores, and workers "
            "beyond the cores only share them; what the workers share per request follows, when they ran.",
        ]
    return "\n".join(out) + "\n"


# -- what the workers share ---------------------------------------------------------------------

SUPERVISORS: dict[str, int] = {}  # row-key prefix of an N-worker gateway: its supervisor's pid


def shared_markdown(b: Bench) -> str:
    """Per N-worker row: CPU of the supervisor (audit collector, reloads), the limit relay
    (redis-server: shared limits) and the workers, and the shared part per request."""
    out: list[str] = []
    for prefix, sup in SUPERVISORS.items():
        for r in b.rows:
            parts = r.cpu.proxy_parts
            if not r.key.startswith(prefix + "-") or not parts or not r.value or r.unit == "MB/s":
                continue
            sup_pct = sum(pct for pid, (_, pct) in parts.items() if pid == sup)
            broker = sum(pct for pid, (name, pct) in parts.items() if pid != sup and name.startswith("redis"))
            workers = sorted(
                (pct for pid, (name, pct) in parts.items() if pid != sup and not name.startswith("redis")),
                reverse=True,
            )
            shared_us = (sup_pct + broker) / 100 * 1e6 / r.value
            out.append(
                f"| {r.label} (c{r.concurrency}) | {r.value:,.0f} {r.unit} | {sup_pct:.0f} | {broker:.0f} | "
                f"{' + '.join(f'{w:.0f}' for w in workers) or '–'} | {shared_us:.0f} |"
            )
    if not out:
        return ""
    head = [
        "",
        "## What N workers share, per request (CPU in the measured window, % of one core)",
        "",
        "The supervisor owns the audit file (the workers forward their records to it in batches) and",
        "the limit relay (redis-server) holds the shared limits; the last column is their CPU per",
        "request or connection, in µs: what the workers pay to act as one gateway.",
        "",
        "| row | throughput | supervisor % | broker % | workers % | shared µs per request |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    return "\n".join(head + out) + "\n"


# -- main ------------------------------------------------------------------------------------------


def wait_quiet(limit: float) -> str:
    """Wait up to `limit` s for other processes to use < 10 % of a core; say how busy it was."""
    waited = 0.0
    while True:
        before = run.CpuSample.now()
        time.sleep(1.0)
        cpu = run.CpuWindow()
        cpu.fill(before, run.CpuSample.now(), None, {os.getpid()})
        if cpu.others < run.DISTURBED_PCT or waited >= limit:
            break
        print(f"waiting for a quiet machine: {', '.join(cpu.top_others)}", file=sys.stderr)
        waited += 1.0
    cores = ", ".join(f"core {k} {v:.0f} %" for k, v in sorted(cpu.cores.items()))
    top = f" ({', '.join(cpu.top_others)})" if cpu.others >= run.DISTURBED_PCT else ""
    return f"waited {waited:.0f} s for quiet; then {cores} busy, other processes {cpu.others:.0f} % of a core{top}"


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="sandgate workers matrix with peers (loopback only)")
    p.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_SECONDS,
        help=f"seconds per load (default {DEFAULT_SECONDS:g})",
    )
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up per load (default 1)")
    p.add_argument(
        "--quick", action="store_true", help=f"{QUICK_SECONDS:g} s per load, no retries: a smoke run"
    )
    p.add_argument("--json", type=Path, help="write every figure as JSON here")
    p.add_argument("--markdown", type=Path, help="also write the markdown report here")
    p.add_argument(
        "--retry-disturbed",
        type=int,
        default=1,
        metavar="N",
        help="re-run a disturbed row up to N times (default 1)",
    )
    p.add_argument(
        "--upstream",
        choices=("nginx", "python"),
        default="nginx" if nginx_upstream.available() else "python",
        help="the upstream on core 1: nginx (default when installed) or bench/upstream.py",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=30.0,
        metavar="S",
        help="first wait up to S seconds for other processes to go quiet (default 30; 0 with --quick)",
    )
    p.add_argument(
        "--no-install", action="store_true", help="do not npm-install the Node proxy if it is missing"
    )
    p.add_argument(
        "--only",
        default="direct,mitmdump,sandgate,rego,squid,splice,node,transparent",
        help="comma-separated phases to run (default: all)",
    )
    args = p.parse_args(argv)
    quick = args.quick
    if quick:
        args.retry_disturbed = 0
    signal.signal(signal.SIGTERM, _on_sigterm)
    if run.PIN:
        os.sched_setaffinity(0, {CLIENT_CORE})
    started = time.monotonic()
    phases = {
        "direct": phase_direct,
        "mitmdump": phase_mitmdump,
        "sandgate": phase_sandgate,
        "rego": phase_rego,
        "squid": phase_squid,
        "splice": phase_splice,
        "node": phase_node,
        "transparent": phase_transparent,
    }
    wanted = [x.strip() for x in args.only.split(",") if x.strip()]
    if unknown := set(wanted) - phases.keys():
        p.error(f"unknown phases: {', '.join(sorted(unknown))}")
    background = wait_quiet(0.0 if quick else args.wait_quiet)
    with contextlib.ExitStack() as stack:
        b = new_bench(stack, args, "sgbench-workers-")
        b.notes.append(f"before the run: {background}")
        # run.Bench.duration reads args.quick: give it this script's quick length.
        args.duration = QUICK_SECONDS if args.quick else args.duration
        args.quick = False
        b.http_port, b.tls_port = stack.enter_context(upstream(b, "upstream", UPSTREAM_IP, ()))
        for name in wanted:
            try:
                phases[name](b)
            except BenchError as e:
                b.notes.append(f"{name} FAILED: {e}")
                print(f"{name} FAILED: {e}", file=sys.stderr)
        b.notes.append(f"whole run took {time.monotonic() - started:.0f} s")
        m = run.machine()
        m["pinning"] = (
            f"proxy on core {PROXY_CORE} (1-worker sandgate, mitmdump, squid, the Node proxy and its decider); "
            f"sandgate with N workers on all {CORES} cores, so it shares core {CLIENT_CORE} with the client and "
            f"upstream; client and upstream on core {CLIENT_CORE} (taskset)"
            if run.PIN
            else "none (taskset missing or < 2 cores)"
        )
        rs = ratios(b)
        report = run.markdown(b, m, title="sandgate workers matrix", ratio="vs bare mitmdump (same row)")
        report += "\n" + ratio_markdown(rs) + shared_markdown(b)
        if args.upstream == "nginx":
            report = report.replace(
                "upstream `bench/upstream.py`", "upstream nginx (`bench/nginx_upstream.py`, 1 worker)", 1
            )
        if quick:
            report = report.replace("## Load", "## Load (--quick: short loads, noisy figures)", 1)
    sys.stdout.write(report)
    if args.markdown:
        args.markdown.write_text(report)
    if args.json:
        data: dict[str, Any] = {
            "machine": m,
            "duration": b.duration,
            "rows": [asdict(r) for r in b.rows],
            "nagle": [asdict(n) | {"verdict": n.verdict} for n in b.nagle],
            "ratios": [asdict(r) for r in rs],
            "notes": b.notes,
        }
        args.json.write_text(json.dumps(data, indent=2))
    failed = any(r.value is None and not r.note.startswith(NOT_AVAILABLE) for r in b.rows)
    return 1 if failed or any("FAILED" in n for n in b.notes) else 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; processes stopped and temporary files removed", file=sys.stderr)
        raise SystemExit(130) from None
