"""sandgate benchmark: direct vs bare mitmdump vs sandgate, one run, one machine, one client.

Run: `.venv/bin/python bench/run.py [--duration 10] [--quick] [--json out.json] [--markdown out.md]`.
See bench/README.md for what each row means. Everything runs on loopback; every process
and temporary directory is removed on exit, Ctrl-C or error.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import os
import platform
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(BENCH))

import matcher  # noqa: E402
import tenantgen  # noqa: E402
from support.pki import TestPKI  # noqa: E402
from support.ports import free_port  # noqa: E402

from sandgate.policy.model.loader import load_policy_dir  # noqa: E402
from sandgate.policy.model.policyset import PolicySet  # noqa: E402

BIN = Path(sys.executable).parent
UPSTREAM_IP = "127.0.0.2"  # 127.0.0.1 is the gateway's own address: its guard refuses it
PROXY_IP = "127.0.0.1"
BULK_BYTES = 100_000_000
BULK_REPEAT = 3
NAGLE_REQUESTS = 200
NAGLE_STALL_MS = 35.0
CONCURRENCY = 10
REFERENCE_SECONDS = 5.0  # the direct new-connection reference row runs at most this long
DISTURBED_PCT = 10.0  # other processes using more than this % of a core mark a row as disturbed
UNEXPLAINED_PCT = 20.0  # ... and so does core 0 being this many points busier than the proxy
DISTURBED_MIN_TICKS = 3  # ... but never on fewer clock ticks than this


NOT_AVAILABLE = (
    "not available"  # a row note starting so: the row could not run here (said why), not a failure
)


class BenchError(Exception):
    """A service or client failed; the message is what to report."""


# -- processes ---------------------------------------------------------------------------------

PIN = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
PROXY_CORE, CLIENT_CORE = 0, 1


def pinned(core: int, argv: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *argv] if PIN else argv


class Service:
    """A background process with its output in files; stop() is idempotent."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        workdir: Path,
        *,
        stdout_pipe: bool = False,
        pass_fds: tuple[int, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.err_path = workdir / f"{name}.stderr"
        self.out_path = workdir / f"{name}.stdout"
        with self.err_path.open("wb") as err, self.out_path.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                # The upstream stops when its stdin closes (if this process is killed -9).
                stdin=subprocess.PIPE if stdout_pipe else subprocess.DEVNULL,
                stdout=subprocess.PIPE if stdout_pipe else out,
                stderr=err,
                start_new_session=True,  # Ctrl-C reaches only us; we stop the children
                pass_fds=pass_fds,
                env=env,
            )

    def read_json_line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            raise BenchError(f"{self.name} did not start: {self.failure()}")
        data: dict[str, Any] = json.loads(line)
        return data

    def failure(self) -> str:
        rc = self.proc.poll()
        state = f"exit code {rc}" if rc is not None else "still running"
        return f"{state}; stderr: {self.stderr_tail() or '(empty)'}"

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            text = self.err_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def stderr_lines(self) -> list[str]:
        try:
            return [x for x in self.err_path.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return []

    def wait_listening(self, port: int, timeout: float) -> float:
        """Seconds until (PROXY_IP, port) accepts; BenchError if the process exits first."""
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited before listening: {self.failure()}")
            with contextlib.suppress(OSError), socket.create_connection((PROXY_IP, port), timeout=0.5):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise BenchError(
                    f"{self.name} not listening on :{port} after {timeout:.0f}s: {self.failure()}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@contextlib.contextmanager
def service(name: str, argv: list[str], workdir: Path, *, stdout_pipe: bool = False) -> Iterator[Service]:
    s = Service(name, argv, workdir, stdout_pipe=stdout_pipe)
    try:
        yield s
    finally:
        s.stop()


# -- CPU accounting ------------------------------------------------------------------------------


def cpu_times() -> dict[int, tuple[int, int, int]]:
    """Per core: (busy, total, irq + softirq) jiffies from /proc/stat."""
    out: dict[int, tuple[int, int, int]] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("cpu") and line[3].isdigit():
                name, *rest = line.split()
                f = [int(x) for x in rest[:8]]  # user nice system idle iowait irq softirq steal
                total = sum(f)
                out[int(name[3:])] = (total - f[3] - f[4], total, f[5] + f[6])
    return out


_PF_KTHREAD = 0x00200000


def proc_ticks() -> dict[int, tuple[str, int]]:
    """Per user-space process: (name, utime + stime of all threads in clock ticks).

    Kernel threads are left out: their work (softirqs, for one) is mostly this benchmark's own
    loopback traffic; the per-core figures include it.
    """
    out: dict[int, tuple[str, int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                text = Path(entry.path, "stat").read_text()
                name = text[text.index("(") + 1 : text.rindex(")")]
                fields = text.rsplit(")", 1)[1].split()
                if int(fields[6]) & _PF_KTHREAD:
                    continue
                out[int(entry.name)] = (name, int(fields[11]) + int(fields[12]))
            except (OSError, ValueError, IndexError):
                continue
    return out


@dataclass
class CpuSample:
    at: float
    cores: dict[int, tuple[int, int, int]]
    procs: dict[int, tuple[str, int]]

    @classmethod
    def now(cls) -> CpuSample:
        return cls(time.monotonic(), cpu_times(), proc_ticks())


@dataclass
class CpuWindow:
    """CPU use over a measured window: per core busy %, the proxy process, everything not ours."""

    cores: dict[int, float] = field(default_factory=dict)
    proxy: float | None = None
    others: float = 0.0  # % of one core used by processes that are not part of this benchmark
    top_others: list[str] = field(default_factory=list)
    others_ticks: int = 0
    core0_irq: float = 0.0  # % of core 0 spent in interrupts and softirqs (loopback traffic)
    ticks_per_pct: float = 0.0  # clock ticks that make 1 % of a core over the window
    proxy_parts: dict[int, tuple[str, float]] = field(default_factory=dict)  # pid: (name, % of a core)

    @property
    def unexplained_core0(self) -> float:
        """With a proxy under test, core 0 busy beyond the proxy process: processes too short-lived
        to see, or kernel work. (Without a proxy, core 0 still does some of the loopback kernel work,
        up to half a core for new TLS connections, so it tells nothing.)"""
        if self.proxy is None:
            return 0.0
        return max(0.0, self.cores.get(PROXY_CORE, 0.0) - self.core0_irq - self.proxy)

    @property
    def disturbed(self) -> bool:
        """Other processes used ≥ DISTURBED_PCT of a core, or core 0 was busier than the proxy by
        ≥ UNEXPLAINED_PCT (core 0 is the proxy's alone)."""
        if not self.cores:
            return False
        # Clock ticks are 10 ms: over a short window (a bulk download) a tick or two means nothing.
        enough = max(DISTURBED_MIN_TICKS, 1) / max(self.ticks_per_pct, 1e-9)
        others = self.others >= max(DISTURBED_PCT, enough)
        return others or (PIN and self.unexplained_core0 >= max(UNEXPLAINED_PCT, enough))

    @property
    def disturbance(self) -> str:
        parts = list(self.top_others)
        if PIN and self.unexplained_core0 >= UNEXPLAINED_PCT:
            parts.append(f"core 0 busier than the proxy by {self.unexplained_core0:.0f} points")
        return ", ".join(parts)

    def fill(self, a: CpuSample, b: CpuSample, proxy: int | set[int] | None, ours: set[int]) -> None:
        for core in a.cores.keys() & b.cores.keys():
            total = b.cores[core][1] - a.cores[core][1]
            busy = b.cores[core][0] - a.cores[core][0]
            self.cores[core] = round(100.0 * busy / total, 0) if total > 0 else 0.0
            if core == PROXY_CORE and total > 0:
                self.core0_irq = round(100.0 * (b.cores[core][2] - a.cores[core][2]) / total, 0)
        scale = 100.0 / os.sysconf("SC_CLK_TCK") / max(b.at - a.at, 1e-3)
        self.ticks_per_pct = 1.0 / scale
        # The proxy may be several processes (workers, a decider): their sum. One born inside
        # the window counts all it used.
        pids = {proxy} if isinstance(proxy, int) else proxy
        if pids and any(pid in a.procs and pid in b.procs for pid in pids):
            for p in pids & b.procs.keys():
                name, ticks = b.procs[p]
                self.proxy_parts[p] = (name, (ticks - a.procs.get(p, (name, 0))[1]) * scale)
            self.proxy = round(sum(pct for _, pct in self.proxy_parts.values()), 0)
        # Processes that exist at both ends count their difference, ones born in the window all
        # they used; ones that ended inside it are missed (the per-core figures still show them).
        foreign: dict[str, int] = {}
        for pid, (name, ticks) in b.procs.items():
            used = ticks - a.procs.get(pid, (name, 0))[1]
            if pid not in ours and used > 0:
                foreign[name] = foreign.get(name, 0) + used
        self.others_ticks = sum(foreign.values())
        self.others = round(self.others_ticks * scale, 0)
        top = sorted(foreign.items(), key=lambda kv: -kv[1])[:3]
        self.top_others = [f"{name} {used * scale:.0f} %" for name, used in top]


# -- results -----------------------------------------------------------------------------------


@dataclass
class Row:
    key: str
    label: str
    concurrency: int
    unit: str  # req/s, conn/s, MB/s
    value: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    errors: int = 0
    compare: str | None = None  # key of the bare-mitmdump row this one is compared with
    cpu: CpuWindow = field(default_factory=CpuWindow)
    note: str = ""


@dataclass
class WrkRow:
    label: str
    rps: float
    p50_ms: float
    p99_ms: float
    bad: int
    loadclient_rps: float | None
    others: float = 0.0  # % of a core used by other processes during the run


@dataclass
class NagleRow:
    label: str
    requests: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    stalls: int
    errors: int
    others: float = 0.0  # % of a core used by other processes during the run

    @property
    def verdict(self) -> str:
        if self.requests == 0:
            return "FAILED"
        if self.stalls:
            return f"STALL ({self.stalls} ≥ {NAGLE_STALL_MS:.0f} ms)" + (
                " ⚠" if self.others >= DISTURBED_PCT else ""
            )
        return "ok"


@dataclass
class Bench:
    args: argparse.Namespace
    tmp: Path
    pki: TestPKI
    http_port: int = 0
    tls_port: int = 0
    rows: list[Row] = field(default_factory=list)
    wrk: list[WrkRow] = field(default_factory=list)
    nagle: list[NagleRow] = field(default_factory=list)
    matcher: list[matcher.MatcherRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    policies: dict[int, PolicySet] = field(default_factory=dict)
    proxy: Service | None = None  # the proxy under test, for its CPU use
    proxy_helpers: set[int] = field(default_factory=set)  # other processes of the proxy under test
    pids: set[int] = field(default_factory=set)  # our long-running processes (the upstream)

    @property
    def duration(self) -> float:
        return 3.0 if self.args.quick else float(self.args.duration)

    def row(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)


# -- the load client -----------------------------------------------------------------------------


def _run_counted(argv: list[str], timeout: float, b: Bench) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run a command; return its result and the % of a core other processes used meanwhile."""
    before = CpuSample.now()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            proc.kill()
            raise
    cpu = CpuWindow()
    cpu.fill(before, CpuSample.now(), None, _ours(b) | {proc.pid})
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), cpu.others


def _ours(b: Bench) -> set[int]:
    """This process, the upstream and the proxy under test (with its helpers and children)."""
    return {os.getpid(), *b.pids, *_proxy_pids(b)}


def descendants(pid: int) -> set[int]:
    """Every live process below pid (workers under a supervisor), from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                ppid = int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _proxy_pids(b: Bench) -> set[int]:
    """The proxy under test: its process, its descendants and any helper it needs (b.proxy_helpers)."""
    if b.proxy is None:
        return set()
    return {b.proxy.proc.pid, *descendants(b.proxy.proc.pid), *b.proxy_helpers}


def run_client(
    b: Bench,
    args: list[str],
    *,
    duration: float | None = None,
    cpu: CpuWindow | None = None,
    prefix: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run bench/loadclient.py on the client core; with `cpu`, measure CPU use in its window.

    `prefix` goes before the command (`ip netns exec NS`, for a client in a guest namespace).
    """
    d = b.duration if duration is None else duration
    argv = [*prefix, *pinned(CLIENT_CORE, [sys.executable, str(BENCH / "loadclient.py"), *args])]
    argv += ["--duration", str(d), "--warmup", str(b.args.warmup)]
    if cpu is not None:
        argv.append("--marks")
    samples: dict[str, CpuSample] = {}
    err_lines: list[str] = []
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, text=True)

        def read_stderr() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                if line.startswith("measure-"):
                    samples[line.strip()] = CpuSample.now()
                else:
                    err_lines.append(line)

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=d + b.args.warmup + 120)
        except subprocess.TimeoutExpired as e:
            raise BenchError(f"load client timed out: {' '.join(argv)}") from e
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(timeout=5)
        out.seek(0)
        stdout = out.read()
    if proc.returncode != 0:
        raise BenchError(f"load client failed ({proc.returncode}): {''.join(err_lines).strip()[-800:]}")
    if cpu is not None and "measure-start" in samples and "measure-end" in samples:
        proxy = _proxy_pids(b) or None
        cpu.fill(samples["measure-start"], samples["measure-end"], proxy, _ours(b) | {proc.pid})
    result: dict[str, Any] = json.loads(stdout)
    return result


def load_row(
    b: Bench,
    key: str,
    label: str,
    client_args: list[str],
    *,
    concurrency: int = CONCURRENCY,
    unit: str = "req/s",
    compare: str | None = None,
    duration: float | None = None,
    prefix: tuple[str, ...] = (),
) -> Row:
    row = Row(key, label, concurrency, unit, compare=compare)
    b.rows.append(row)
    print(f"  {label} (c{concurrency}) ...", file=sys.stderr, flush=True)
    args = [*client_args, "--concurrency", str(concurrency)]
    best: tuple[dict[str, Any], CpuWindow] | None = None
    attempts = 0
    # Another process on the machine skews a row: run it again (up to --retry-disturbed times)
    # and keep the least disturbed attempt.
    while attempts <= b.args.retry_disturbed:
        attempts += 1
        cpu = CpuWindow()
        try:
            r = run_client(b, args, cpu=cpu, duration=duration, prefix=prefix)
        except BenchError as e:
            row.note = f"FAILED: {e}"
            return row
        score = cpu.others + cpu.unexplained_core0
        if best is None or score < best[1].others + best[1].unexplained_core0:
            best = (r, cpu)
        if not cpu.disturbed:
            break
        print(f"    disturbed ({cpu.disturbance}); again", file=sys.stderr, flush=True)
    assert best is not None
    r, row.cpu = best
    notes = []
    if duration is not None and duration != b.duration:
        notes.append(f"measured for {duration:g} s")
    if attempts > 1:
        notes.append(f"{attempts} attempts (others on the machine were busy), least disturbed kept")
    row.value, row.p50_ms, row.p99_ms, row.errors = r["rps"], r["p50_ms"], r["p99_ms"], r["errors"]
    if r["errors"]:
        notes.append(f"{r['errors']} errors, first: {r['first_error']}; statuses {r['statuses']}")
    row.note = "; ".join(notes)
    return row


def bulk_row(b: Bench, key: str, label: str, client_args: list[str], compare: str | None = None) -> Row:
    row = Row(key, label, 1, "MB/s", compare=compare)
    b.rows.append(row)
    print(f"  {label} ...", file=sys.stderr, flush=True)
    speeds: list[float] = []
    disturbed = 0
    attempts = 0
    # BULK_REPEAT undisturbed downloads; a download during which other processes were busy
    # is repeated (up to BULK_REPEAT extra times) and listed apart.
    while len(speeds) < BULK_REPEAT and attempts < 2 * BULK_REPEAT:
        attempts += 1
        cpu = CpuWindow()
        try:
            r = run_client(b, [*client_args, "--bulk", str(BULK_BYTES)], duration=0, cpu=cpu)
        except BenchError as e:
            row.note = f"FAILED: {e}"
            return row
        if r["errors"]:
            row.errors += 1
            row.note = f"error: {r['first_error']}"
            continue
        if cpu.disturbed and attempts < 2 * BULK_REPEAT:
            disturbed += 1
            print(f"    disturbed ({cpu.disturbance}); again", file=sys.stderr, flush=True)
            continue
        speeds.append(r["mbps"])
    if speeds:
        row.value = statistics.median(speeds)
        runs = "median of " + ", ".join(f"{s:.0f}" for s in speeds)
        if disturbed:
            runs += f" ({disturbed} disturbed downloads discarded)"
        row.note = (row.note + "; " if row.note else "") + runs
    return row


def nagle_row(b: Bench, label: str, client_args: list[str]) -> None:
    print(f"  nagle: {label} ...", file=sys.stderr, flush=True)
    args = [*client_args, "--concurrency", "1", "--requests", str(NAGLE_REQUESTS)]
    try:
        argv = pinned(CLIENT_CORE, [sys.executable, str(BENCH / "loadclient.py"), *args])
        argv += ["--duration", "60", "--warmup", "0.2"]
        cp, others = _run_counted(argv, 120, b)
        if cp.returncode != 0:
            raise BenchError(cp.stderr.strip()[-500:])
        r = json.loads(cp.stdout)
    except (BenchError, subprocess.TimeoutExpired) as e:
        b.nagle.append(NagleRow(label, 0, 0, 0, 0, 0, 1))
        b.notes.append(f"Nagle check {label} failed: {e}")
        return
    lat: list[float] = r["latencies_ms"]
    b.nagle.append(
        NagleRow(
            label,
            len(lat),
            r["p50_ms"],
            r["p99_ms"],
            r["max_ms"],
            sum(1 for x in lat if x >= NAGLE_STALL_MS),
            r["errors"],
            others,
        )
    )


_WRK_TIME = re.compile(r"([\d.]+)(us|ms|s|m)\b")


def _wrk_ms(text: str) -> float:
    m = _WRK_TIME.fullmatch(text.strip())
    if not m:
        return float("nan")
    value, unit = float(m.group(1)), m.group(2)
    return value * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def wrk_row(b: Bench, label: str, url: str, lua: str | None, loadclient_key: str) -> None:
    if shutil.which("wrk") is None:
        return
    d = max(2, min(3, round(b.duration / 2)))
    print(f"  wrk: {label} ({d}s) ...", file=sys.stderr, flush=True)
    argv = ["wrk", "-t1", f"-c{CONCURRENCY}", f"-d{d}s", "--latency"]
    if lua is not None:
        script = b.tmp / f"wrk-{len(b.wrk)}.lua"
        script.write_text(lua)
        argv += ["-s", str(script)]
    try:
        cp, others = _run_counted(pinned(CLIENT_CORE, [*argv, url]), d + 60, b)
    except subprocess.TimeoutExpired:
        b.notes.append(f"wrk {label}: timed out")
        return
    out = cp.stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if rps is None or p50 is None or p99 is None:
        b.notes.append(f"wrk {label}: could not parse output: {(out + cp.stderr).strip()[-300:]}")
        return
    errors = (int(bad.group(1)) if bad else 0) + (sum(int(x) for x in sock.groups()) if sock else 0)
    ref = b.row(loadclient_key)
    b.wrk.append(
        WrkRow(
            label,
            float(rps.group(1)),
            _wrk_ms(p50.group(1)),
            _wrk_ms(p99.group(1)),
            errors,
            ref.value if ref else None,
            others,
        )
    )


def wrk_proxy_lua(url: str, host: str, auth: str | None) -> str:
    head = f"GET {url} HTTP/1.1\r\nHost: {host}\r\n"
    if auth:
        head += f"Proxy-Authorization: Basic {base64.b64encode(auth.encode()).decode()}\r\n"
    return f"local req = {json.dumps(head + chr(13) + chr(10))}\nrequest = function() return req end\n"


@contextlib.contextmanager
def _under_test(b: Bench, s: Service) -> Iterator[None]:
    b.proxy = s
    try:
        yield
    finally:
        b.proxy = None


# -- phases ----------------------------------------------------------------------------------------


def phase_direct(b: Bench) -> None:
    print("direct to upstream", file=sys.stderr)
    h, t = b.http_port, b.tls_port
    addr_h, addr_t = f"{UPSTREAM_IP}:{h}", f"{UPSTREAM_IP}:{t}"
    ca = str(b.pki.ca_file)
    load_row(
        b,
        "direct-plain",
        "direct → upstream, plain HTTP keep-alive",
        ["--address", addr_h, "--url", f"http://api.test:{h}/"],
    )
    wrk_row(b, "direct → upstream", f"http://{UPSTREAM_IP}:{h}/", None, "direct-plain")
    load_row(
        b,
        "direct-newconn",
        "direct → upstream, new TLS connection per request (reference)",
        ["--address", addr_t, "--url", f"https://pass.api.test:{t}/", "--cafile", ca, "--new-conn"],
        unit="conn/s",
        duration=min(b.duration, REFERENCE_SECONDS),
    )
    direct_plain = ["--address", addr_h, "--url", f"http://api.test:{h}/"]
    nagle_row(b, "direct, plain HTTP GET (reference)", direct_plain)
    nagle_row(
        b,
        "direct, plain HTTP POST 64 B (reference)",
        [*direct_plain, "--method", "POST", "--body-size", "64"],
    )
    bulk_row(
        b,
        "direct-bulk",
        "direct → upstream, 100 MB HTTPS download (reference)",
        ["--address", addr_t, "--url", f"https://pass.api.test:{t}/", "--cafile", ca],
    )


def _mitmdump_argv(b: Bench, port: int, confdir: Path, extra: list[str]) -> list[str]:
    return pinned(
        PROXY_CORE,
        [
            str(BIN / "mitmdump"),
            "-q",
            "--mode",
            f"regular@{PROXY_IP}:{port}",
            "--set",
            "connection_strategy=lazy",
            "--set",
            f"confdir={confdir}",
            "--set",
            f"ssl_verify_upstream_trusted_ca={b.pki.ca_file}",
            *extra,
        ],
    )


def phase_mitmdump(b: Bench) -> None:
    print("bare mitmdump", file=sys.stderr)
    port = free_port(PROXY_IP)
    confdir = b.tmp / "mitmdump-conf"
    with service("mitmdump", _mitmdump_argv(b, port, confdir, []), b.tmp) as md, _under_test(b, md):
        b.notes.append(f"bare mitmdump ready in {md.wait_listening(port, 60):.1f} s")
        proxy = f"{PROXY_IP}:{port}"
        h, t = b.http_port, b.tls_port
        gw_ca = str(confdir / "mitmproxy-ca-cert.pem")
        plain = ["--address", proxy, "--url", f"http://{UPSTREAM_IP}:{h}/", "--proxy"]
        tls = [
            "--address",
            proxy,
            "--url",
            f"https://api.test:{t}/",
            "--connect",
            "--connect-to",
            f"{UPSTREAM_IP}:{t}",
            "--cafile",
            gw_ca,
        ]
        load_row(b, "md-plain", "bare mitmdump, plain HTTP via proxy", plain)
        wrk_row(
            b,
            "bare mitmdump (Lua absolute-form)",
            f"http://{proxy}/",
            wrk_proxy_lua(f"http://{UPSTREAM_IP}:{h}/", f"{UPSTREAM_IP}:{h}", None),
            "md-plain",
        )
        load_row(b, "md-int10", "bare mitmdump, intercepted HTTPS", tls)
        load_row(b, "md-int1", "bare mitmdump, intercepted HTTPS", tls, concurrency=1)
        nagle_row(b, "bare mitmdump, plain HTTP GET", plain)
        nagle_row(b, "bare mitmdump, plain HTTP POST 64 B", [*plain, "--method", "POST", "--body-size", "64"])
        nagle_row(b, "bare mitmdump, intercepted HTTPS GET", tls)
        nagle_row(
            b, "bare mitmdump, intercepted HTTPS POST 64 B", [*tls, "--method", "POST", "--body-size", "64"]
        )
        _stderr_note(b, md)

    print("bare mitmdump, TLS passed through (ignore_hosts=.*)", file=sys.stderr)
    port = free_port(PROXY_IP)
    argv = _mitmdump_argv(b, port, b.tmp / "mitmdump-conf", ["--set", "ignore_hosts=.*"])
    with service("mitmdump-passthrough", argv, b.tmp) as md, _under_test(b, md):
        md.wait_listening(port, 60)
        proxy = f"{PROXY_IP}:{port}"
        t = b.tls_port
        tunnel = [
            "--address",
            proxy,
            "--url",
            f"https://pass.api.test:{t}/",
            "--connect",
            "--connect-to",
            f"{UPSTREAM_IP}:{t}",
            "--cafile",
            str(b.pki.ca_file),
        ]
        load_row(
            b,
            "md-tunnel1",
            "bare mitmdump + ignore_hosts, requests over one passed-through tunnel",
            tunnel,
            concurrency=1,
        )
        load_row(
            b,
            "md-newconn",
            "bare mitmdump + ignore_hosts, new TLS connection (CONNECT) per request",
            [*tunnel, "--new-conn"],
            unit="conn/s",
        )
        bulk_row(
            b,
            "md-bulk",
            "bare mitmdump + ignore_hosts, 100 MB download through a passed-through tunnel",
            tunnel,
        )
        _stderr_note(b, md)


def _sandgate_config(b: Bench, name: str, rules: Path, port: int, *, watch: bool = True) -> Path:
    config = {
        "listeners": [{"host": PROXY_IP, "port": port}],
        "rules_dir": str(rules),
        "state_dir": str(b.tmp / f"{name}-state"),
        "resolver": {"hosts": {tenantgen.BENCH_HOST: [UPSTREAM_IP], tenantgen.PASS_HOST: [UPSTREAM_IP]}},
        "address_guard": {"reachable_by_name": ["127.0.0.0/8"]},
        "upstream": {"trusted_ca": str(b.pki.ca_file)},
        "log": {"level": "warning"},
    }
    if not watch:
        config["reload"] = {"watch": False}
    path = b.tmp / f"{name}.yaml"
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


def _sanity(b: Bench, port: int, cred: str) -> None:
    """The gateway under load must be enforcing: a wrong token gets 407, a host not allowed 403."""
    auth = base64.b64encode(cred.encode()).decode()
    bad = base64.b64encode(f"{cred.split(':')[0]}:wrong-token-xxxxxxxx".encode()).decode()
    checks = [
        ("allowed host", f"http://api.test:{b.http_port}/", auth, 200),
        ("host not allowed", f"http://nope.test:{b.http_port}/", auth, 403),
        ("allowed host, port not allowed", "http://api.test:9/", auth, 403),
        ("wrong token", f"http://api.test:{b.http_port}/", bad, 407),
    ]
    results = []
    for label, url, a, want in checks:
        host = url.split("/")[2]
        req = (
            f"GET {url} HTTP/1.1\r\nHost: {host}\r\n"
            f"Proxy-Authorization: Basic {a}\r\nConnection: close\r\n\r\n"
        )
        with socket.create_connection((PROXY_IP, port), timeout=10) as s:
            s.sendall(req.encode())
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else -1
        results.append(f"{label} → {status}" + ("" if status == want else f" (EXPECTED {want})"))
        if status != want:
            b.notes.append(f"SANITY FAILURE: {label}: got {status}, expected {want}: {data[:300]!r}")
    b.notes.append("sandgate sanity checks: " + "; ".join(results))


def _stderr_note(b: Bench, s: Service) -> None:
    lines = s.stderr_lines()
    if lines:
        b.notes.append(f"{s.name} wrote {len(lines)} stderr lines; last: {lines[-1][:300]}")


def phase_sandgate10(b: Bench) -> None:
    print("sandgate, 10 tenants", file=sys.stderr)
    rules = b.tmp / "rules-10"
    cred_t = tenantgen.write_rules_dir(rules, 10, http_port=b.http_port, tls_port=b.tls_port)
    cred = f"{cred_t.sandbox}:{cred_t.token}"
    port = free_port(PROXY_IP)
    cfg = _sandgate_config(b, "sandgate-10", rules, port)
    argv = pinned(PROXY_CORE, [str(BIN / "sandgate"), "run", "--config", str(cfg)])
    with service("sandgate-10", argv, b.tmp) as sg, _under_test(b, sg):
        b.notes.append(f"sandgate, 10 tenants: ready in {sg.wait_listening(port, 60):.1f} s")
        _sanity(b, port, cred)
        b.notes.append(f"sandgate, 10 tenants: idle CPU {_idle_cpu(sg):.1f} % of a core")
        proxy = f"{PROXY_IP}:{port}"
        h, t = b.http_port, b.tls_port
        gw_ca = str(b.tmp / "sandgate-10-state" / "ca" / "mitmproxy-ca-cert.pem")
        plain = ["--address", proxy, "--url", f"http://api.test:{h}/", "--proxy", "--auth", cred]
        tls = [
            "--address",
            proxy,
            "--url",
            f"https://api.test:{t}/",
            "--connect",
            "--auth",
            cred,
            "--cafile",
            gw_ca,
        ]
        tunnel = [
            "--address",
            proxy,
            "--url",
            f"https://pass.api.test:{t}/",
            "--connect",
            "--auth",
            cred,
            "--cafile",
            str(b.pki.ca_file),
        ]
        load_row(b, "sg10-plain", "sandgate, 10 tenants, plain HTTP via proxy", plain, compare="md-plain")
        wrk_row(
            b,
            "sandgate, 10 tenants (Lua absolute-form)",
            f"http://{proxy}/",
            wrk_proxy_lua(f"http://api.test:{h}/", f"api.test:{h}", cred),
            "sg10-plain",
        )
        load_row(b, "sg10-int10", "sandgate, intercepted HTTPS (`inspect: true`)", tls, compare="md-int10")
        load_row(
            b,
            "sg10-int1",
            "sandgate, intercepted HTTPS (`inspect: true`)",
            tls,
            concurrency=1,
            compare="md-int1",
        )
        load_row(
            b,
            "sg10-tunnel1",
            "sandgate, requests over one passed-through CONNECT tunnel",
            tunnel,
            concurrency=1,
            compare="md-tunnel1",
        )
        load_row(
            b,
            "sg10-newconn",
            "sandgate, new TLS connection (CONNECT) per request, passed through",
            [*tunnel, "--new-conn"],
            unit="conn/s",
            compare="md-newconn",
        )
        bulk_row(
            b,
            "sg10-bulk",
            "sandgate, 100 MB download through a passed-through tunnel",
            tunnel,
            compare="md-bulk",
        )
        nagle_row(b, "sandgate, plain HTTP GET", plain)
        nagle_row(b, "sandgate, plain HTTP POST 64 B", [*plain, "--method", "POST", "--body-size", "64"])
        nagle_row(b, "sandgate, intercepted HTTPS GET", tls)
        nagle_row(b, "sandgate, intercepted HTTPS POST 64 B", [*tls, "--method", "POST", "--body-size", "64"])
        nagle_row(b, "sandgate, passed-through HTTPS GET", tunnel)
        _stderr_note(b, sg)
    b.policies[10] = load_policy_dir(rules)


def _idle_cpu(s: Service, seconds: float = 2.0) -> float:
    """% of one core the process uses with no traffic (its background tasks)."""

    def ticks() -> int:
        fields = Path(f"/proc/{s.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime, every thread

    a = ticks()
    time.sleep(seconds)
    pct = 100.0 * (ticks() - a) / os.sysconf("SC_CLK_TCK") / seconds
    return round(pct, 1)


def phase_sandgate10k(b: Bench) -> None:
    n = 10_000
    print(f"sandgate, {n:,} tenants (generating and loading the rules takes a while)", file=sys.stderr)
    rules = b.tmp / f"rules-{n}"
    cred_t = tenantgen.write_rules_dir(rules, n, http_port=b.http_port, tls_port=b.tls_port)
    cred = f"{cred_t.sandbox}:{cred_t.token}"
    # The matcher benchmark needs the same policy in this process: load it on the client
    # core while the gateway loads its copy on the proxy core.
    loaded: list[PolicySet] = []
    loader = threading.Thread(target=lambda: loaded.append(load_policy_dir(rules)), daemon=True)
    # First with the default config (the rules directory is polled for changes every second),
    # then with `reload: {watch: false}`, to separate the watcher's cost from the matcher's.
    for watch in (True, False) if b.args.watch_control else (True,):
        name = "sandgate-10k" if watch else "sandgate-10k-nowatch"
        key = "sg10k-plain" if watch else "sg10k-nowatch-plain"
        what = f"sandgate, {n:,} tenants" + ("" if watch else ", `reload.watch: false`")
        port = free_port(PROXY_IP)
        cfg = _sandgate_config(b, name, rules, port, watch=watch)
        argv = pinned(PROXY_CORE, [str(BIN / "sandgate"), "run", "--config", str(cfg)])
        with service(name, argv, b.tmp) as sg, _under_test(b, sg):
            if watch:
                loader.start()
            ready = sg.wait_listening(port, 300)
            b.notes.append(f"{what}: ready in {ready:.1f} s (the policy loads before the port opens)")
            if watch:
                loader.join()
            _sanity(b, port, cred)
            b.notes.append(f"{what}: idle CPU {_idle_cpu(sg):.1f} % of a core")
            proxy = f"{PROXY_IP}:{port}"
            url = f"http://api.test:{b.http_port}/"
            plain = ["--address", proxy, "--url", url, "--proxy", "--auth", cred]
            load_row(b, key, f"{what}, plain HTTP via proxy", plain, compare="md-plain")
            if watch:
                lua = wrk_proxy_lua(url, f"api.test:{b.http_port}", cred)
                wrk_row(b, f"{what} (Lua absolute-form)", f"http://{proxy}/", lua, key)
            _stderr_note(b, sg)
    if loaded:
        b.policies[n] = loaded[0]


def phase_matcher(b: Bench) -> None:
    print("matcher micro-benchmark", file=sys.stderr)
    b.matcher = matcher.run_matcher(matcher.DEFAULT_SIZES, 20_000, b.policies)
    b.policies.clear()


# -- report --------------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    osname = platform.platform()
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                osname = line.split("=", 1)[1].strip('"')
    from mitmproxy.version import VERSION

    wrk = "not installed"
    if shutil.which("wrk"):
        cp = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
        wrk = (cp.stdout + cp.stderr).split("Copyright")[0].strip()
    git = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(
            ["git", "-C", str(REPO), "log", "-1", "--format=%h %s"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "proxy", "policy"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split("\n")
        changed = len([x for x in dirty if x.strip()])
        git = f"{head}" + (
            f" + uncommitted changes to {changed} files in proxy/ and policy/" if changed else ""
        )
    return {
        "git": git,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "os": f"{osname}, kernel {platform.release()}",
        "python": platform.python_version(),
        "mitmproxy": VERSION,
        "wrk": wrk,
        "pinning": f"proxy on core {PROXY_CORE}; client, upstream and wrk on core {CLIENT_CORE} (taskset)"
        if PIN
        else "none (taskset missing or < 2 cores)",
    }


def _fmt(v: float | None, nd: int = 2) -> str:
    return "–" if v is None else f"{v:,.{nd}f}"


def markdown(
    b: Bench, m: dict[str, str], *, title: str = "sandgate benchmark", ratio: str = "sandgate / mitmdump"
) -> str:
    out = [
        f"# {title} — {m['date']}",
        "",
        f"- machine: {m['cpu']}; {m['os']}",
        f"- code: {m['git']}",
        f"- Python {m['python']}, mitmproxy {m['mitmproxy']}, {m['wrk']}",
        f"- pinning: {m['pinning']}",
        f"- each load: {b.duration:g} s measured after {b.args.warmup:g} s warm-up; closed loop; "
        "client `bench/loadclient.py` (asyncio, HTTP/1.1) for every row; upstream `bench/upstream.py` "
        f"on {UPSTREAM_IP} (3-byte body)" + ("; **--quick run**" if b.args.quick else ""),
        "",
        "## Load",
        "",
        "| # | row | conc. | throughput | p50 ms | p99 ms | errors "
        f"| CPU % proxy / core 0 / core 1 / other | {ratio} |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(b.rows, 1):
        ratio = "–"
        base = b.row(r.compare) if r.compare else None
        if base is not None and base.value and r.value is not None:
            ratio = f"{r.value / base.value:.2f}×"
        value = "FAILED" if r.value is None else f"{r.value:,.0f} {r.unit}"
        if r.value is None and r.note.startswith(NOT_AVAILABLE):
            value = "not available"
        if r.cpu.disturbed:
            value += " ⚠"
            r.note = (r.note + "; " if r.note else "") + "disturbed: " + r.cpu.disturbance
        p50 = _fmt(r.p50_ms) if r.unit != "MB/s" else "–"
        p99 = _fmt(r.p99_ms) if r.unit != "MB/s" else "–"
        c = r.cpu
        cpu = "–"
        if c.cores:
            proxy_pct = "–" if c.proxy is None else f"{c.proxy:.0f}"
            cores = " / ".join(f"{c.cores[k]:.0f}" for k in sorted(c.cores))
            cpu = f"{proxy_pct} / {cores} / {c.others:.0f}"
        out.append(
            f"| {i} | {r.label} | {r.concurrency} | {value} | {p50} | {p99} | {r.errors} | {cpu} | {ratio} |"
        )
    row_notes = [f"- row {i}: {r.note}" for i, r in enumerate(b.rows, 1) if r.note]
    if any(r.cpu.disturbed for r in b.rows):
        row_notes.append(
            f"- ⚠ disturbed: processes outside the benchmark used ≥ {DISTURBED_PCT:.0f} % of a core "
            f"(column `other`), or core 0 was ≥ {UNEXPLAINED_PCT:.0f} points busier than the proxy, "
            "during the measured window even after a retry; treat that row with suspicion."
        )
    if row_notes:
        out += ["", *row_notes]
    if b.wrk:
        out += [
            "",
            "## wrk cross-check (plain HTTP, `wrk -t1 -c10`; proxies via a Lua absolute-form request line)",
            "",
            "| target | wrk req/s | wrk p50 ms | wrk p99 ms | wrk errors | loadclient req/s | other CPU % |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for w in b.wrk:
            out.append(
                f"| {w.label} | {w.rps:,.0f} | {w.p50_ms:.2f} | {w.p99_ms:.2f} | {w.bad} | "
                f"{_fmt(w.loadclient_rps, 0)} | {w.others:.0f} |"
            )
    if b.nagle:
        out += [
            "",
            f"## Nagle / delayed-ACK check ({NAGLE_REQUESTS} sequential requests, one keep-alive connection)",
            "",
            "| path | requests | p50 ms | p99 ms | max ms | ≥ 35 ms | other CPU % | verdict |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for n in b.nagle:
            out.append(
                f"| {n.label} | {n.requests} | {n.p50_ms:.2f} | {n.p99_ms:.2f} | {n.max_ms:.2f} | "
                f"{n.stalls} | {n.others:.0f} | {n.verdict} |"
            )
    if b.matcher:
        out += ["", "## Matcher micro-benchmark (in process, one decision timed at a time)", ""]
        out.append(matcher.markdown(b.matcher))
    if b.notes:
        out += ["", "## Notes", "", *[f"- {n}" for n in b.notes]]
    return "\n".join(out) + "\n"


# -- main ------------------------------------------------------------------------------------------


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="sandgate benchmark (loopback only)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per load (default 10)")
    p.add_argument("--warmup", type=float, default=0.5, help="seconds of warm-up per load (default 0.5)")
    p.add_argument("--quick", action="store_true", help="3 s per load: a smoke run")
    p.add_argument("--json", type=Path, help="write every figure as JSON here")
    p.add_argument("--markdown", type=Path, help="also write the markdown report here")
    p.add_argument("--skip-10k", action="store_true", help="skip the 10,000-tenant gateway")
    p.add_argument(
        "--retry-disturbed",
        type=int,
        default=1,
        metavar="N",
        help="re-run a load row up to N times when other processes were busy during it (default 1)",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=30.0,
        metavar="S",
        help="before starting, wait up to S seconds for other processes to go quiet (default 30)",
    )
    p.add_argument(
        "--watch-control",
        action="store_true",
        help="also run the 10,000-tenant gateway with reload.watch: false (about 40 s more)",
    )
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    if PIN:
        os.sched_setaffinity(0, {CLIENT_CORE})
    for tool in ("mitmdump", "sandgate"):
        if not (BIN / tool).exists():
            print(f"run.py: {BIN / tool} not found; run with the venv's python", file=sys.stderr)
            return 2
    started = time.monotonic()
    # Other work on the machine skews every figure: wait (a while) for quiet, record how busy it was.
    waited = 0.0
    while True:
        before = CpuSample.now()
        time.sleep(2.0)
        background = CpuWindow()
        background.fill(before, CpuSample.now(), None, {os.getpid()})
        if background.others < DISTURBED_PCT or waited >= args.wait_quiet:
            break
        print(f"waiting for a quiet machine: {', '.join(background.top_others)}", file=sys.stderr)
        waited += 2.0
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sgbench-run-")))
        (tmp / "pki").mkdir()
        pki = stack.enter_context(
            TestPKI(names=("api.test", "*.api.test", UPSTREAM_IP), directory=tmp / "pki")
        )
        b = Bench(args, tmp, pki)
        cores = ", ".join(f"core {k} {v:.0f} %" for k, v in sorted(background.cores.items()))
        b.notes.append(
            f"machine load just before the run (after waiting {waited:.0f} s for quiet): {cores} busy; "
            f"other processes {background.others:.0f} % of a core"
            + (f" ({', '.join(background.top_others)})" if background.others >= DISTURBED_PCT else "")
        )
        up_argv = pinned(
            CLIENT_CORE,
            [
                sys.executable,
                str(BENCH / "upstream.py"),
                "--host",
                UPSTREAM_IP,
                "--cert",
                str(pki.cert_file),
                "--key",
                str(pki.key_file),
            ],
        )
        up = stack.enter_context(service("upstream", up_argv, tmp, stdout_pipe=True))
        ports = up.read_json_line(15)
        b.pids.add(up.proc.pid)
        b.http_port, b.tls_port = int(ports["http_port"]), int(ports["tls_port"])
        phases = [phase_direct, phase_mitmdump, phase_sandgate10]
        if not args.skip_10k:
            phases.append(phase_sandgate10k)
        phases.append(phase_matcher)
        for phase in phases:
            try:
                phase(b)
            except BenchError as e:
                b.notes.append(f"{phase.__name__} FAILED: {e}")
                print(f"{phase.__name__} FAILED: {e}", file=sys.stderr)
        if up.proc.poll() is not None:
            b.notes.append(f"the upstream died during the run: {up.failure()}")
        b.notes.append(f"whole run took {time.monotonic() - started:.0f} s")
        m = machine()
        report = markdown(b, m)
    _emit(report, args.markdown, sys.stdout)
    if args.json:
        data = {
            "machine": m,
            "duration": b.duration,
            "rows": [asdict(r) for r in b.rows],
            "wrk": [asdict(w) for w in b.wrk],
            "nagle": [asdict(n) | {"verdict": n.verdict} for n in b.nagle],
            "matcher": [asdict(x) for x in b.matcher],
            "notes": b.notes,
        }
        args.json.write_text(json.dumps(data, indent=2))
    failed = any(r.value is None for r in b.rows) or any("FAILED" in n for n in b.notes)
    return 1 if failed else 0


def _emit(report: str, path: Path | None, stream: TextIO) -> None:
    stream.write(report)
    stream.flush()
    if path is not None:
        path.write_text(report)


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; processes stopped and temporary files removed", file=sys.stderr)
        raise SystemExit(130) from None
