"""Shared fixtures: a test PKI, recording upstreams on loopback, and real sandgate gateways.

Upstreams listen on 127.0.0.2/127.0.0.3 (not an interface address, so the gateway's
own-address check does not apply) and are reached through test names (`*.test`) that the
gateway resolves with a static map or a scripted DNS server. Nothing leaves loopback.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import RecordingUpstream, RedisServer, TestPKI, free_port
from support.leftovers import MARKER, new_run_id, reap

from sandgate.proxy.state.statusfile import STATUS_FILE, read_status
from sandgate.proxy.worker_role import ENV as WORKER_ENV
from sandgate.proxy.worker_role import WorkerRole

REPO = Path(__file__).resolve().parent.parent
SANDGATE = str(Path(sys.executable).with_name("sandgate"))

TOKEN = "test-token-0123456789abcdef"
TOKEN_REF = "sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()
OTHER_TOKEN = "other-token-0123456789abcdef"
OTHER_TOKEN_REF = "sha256:" + hashlib.sha256(OTHER_TOKEN.encode()).hexdigest()

UPSTREAM_IP = "127.0.0.2"
ATTACKER_IP = "127.0.0.3"
TEST_HOSTS = {
    "api.test": [UPSTREAM_IP],
    "x.api.test": [UPSTREAM_IP],
    "pass.test": [UPSTREAM_IP],
    "open.test": [UPSTREAM_IP],
    "other.test": [ATTACKER_IP],
    "self.test": ["127.0.0.1"],
    "meta.test": ["169.254.169.254"],
}

# Every process this test run starts inherits the marker, so the session's end can find (and
# stop) what a test left running, without touching other test runs on the machine.
RUN_ID = new_run_id()
os.environ[MARKER] = RUN_ID

# Every gateway this run starts has this many workers (its subprocesses inherit it as the
# default count): 1 unless the run asks for more (tests/run.sh runs a subset with 2).
os.environ["SANDGATE_WORKERS"] = os.environ.get("SANDGATE_TEST_WORKERS", "1")


@pytest.hookimpl(trylast=True)  # after pytest-xdist stopped its workers (they carry the id too)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a test left a process behind (gateway, follower, server); kill it."""
    left = reap(RUN_ID, exclude=frozenset({os.getpid()}))
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"pid {p.pid}: {p.command}" for p in left]
    if reporter is not None:
        reporter.write_sep("=", "processes left behind by the tests (killed now)", red=True, bold=True)
        for text in lines:
            reporter.write_line(text)
    else:
        print("processes left behind by the tests (killed now):", *lines, sep="\n  ", file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


E2E = REPO / "tests" / "e2e"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests under tests/e2e/ start real gateways (or the CLI, or a namespace lab): marked
    `e2e`, so `-m "not e2e"` runs the in-process part alone, in seconds."""
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: only called with `-n`
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` as pytest-xdist does it, but the files under tests/e2e/ go out first.

    xdist hands out files by their number of tests, most first: the end-to-end files of one or
    two long tests (the sinks' outage, the manual's walkthrough) came last, and one worker ran
    them alone after the other had finished. The in-process files (thousands of short tests)
    now fill the end instead. Each file still runs whole on one worker, in the same order.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class EndToEndFirst(LoadFileScheduling):  # type: ignore[misc]
        def _assign_work_unit(self, node: Any) -> None:
            queue = getattr(self, "workqueue", None)
            # Once (the queue is complete by now); an xdist whose queue is no longer a dict of
            # files schedules as it does by default.
            if not getattr(self, "_e2e_first", False) and isinstance(queue, dict):
                units = sorted(queue.items(), key=lambda unit: not str(unit[0]).startswith("tests/e2e/"))
                queue.clear()
                queue.update(units)  # a stable sort: xdist's order within each part
                self._e2e_first = True
            super()._assign_work_unit(node)

    return EndToEndFirst(config, log)


DEMO_TOKEN = REPO / "rules" / "tenants" / "demo-1.token"
_DEMO_TOKEN_MADE = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    """The shipped demo tenant reads rules/tenants/demo-1.token, which quickstart creates on a
    fresh clone; tests that load the shipped rules get one for the run (and it goes again).
    Made once per run: by the one pytest process, or by pytest-xdist's controller before its
    workers start (a worker that removed it at its end would take it from the other)."""
    if hasattr(config, "workerinput"):
        return
    try:
        fd = os.open(DEMO_TOKEN, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        config.stash[_DEMO_TOKEN_MADE] = False
        return
    with os.fdopen(fd, "w") as f:
        f.write("test-demo-token-0123456789abcdef\n")
    config.stash[_DEMO_TOKEN_MADE] = True


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_DEMO_TOKEN_MADE, False):
        DEMO_TOKEN.unlink(missing_ok=True)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real, empty redis-server on a free loopback port, for one test."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestPKI]:
    names = ["api.test", "*.api.test", "pass.test", "open.test", "other.test", UPSTREAM_IP, ATTACKER_IP]
    with TestPKI(names, directory=tmp_path_factory.mktemp("pki")) as p:
        yield p


@pytest.fixture(scope="session")
def http_upstream() -> Iterator[RecordingUpstream]:
    with RecordingUpstream(UPSTREAM_IP, name="http-upstream") as up:
        yield up


@pytest.fixture(scope="session")
def https_upstream(pki: TestPKI) -> Iterator[RecordingUpstream]:
    with RecordingUpstream(UPSTREAM_IP, tls=pki, name="https-upstream") as up:
        yield up


@pytest.fixture(scope="session")
def attacker_upstream() -> Iterator[RecordingUpstream]:
    """Where a rebinding or spoofing attempt would land; it must never see a connection."""
    with RecordingUpstream(ATTACKER_IP, name="attacker") as up:
        yield up


@pytest.fixture(autouse=True)
def _reset_upstreams(request: pytest.FixtureRequest) -> None:
    for name in ("http_upstream", "https_upstream", "attacker_upstream"):
        if name in request.fixturenames:
            request.getfixturevalue(name).reset()


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real curl client (quiet, 10 s limit)."""
    return subprocess.run(["curl", "-sS", "-m", "10", *args], capture_output=True, text=True, timeout=30)


def tenant_yaml(
    name: str,
    allow: list[dict[str, Any]],
    *,
    sandbox: str = "sb1",
    token_ref: str = TOKEN_REF,
    mode: str = "enforce",
    deny: list[dict[str, Any]] | None = None,
) -> str:
    """A tenant file with one sandbox."""
    return yaml.safe_dump(
        {
            "tenant": name,
            "mode": mode,
            "sandboxes": [{"id": sandbox, "token": token_ref}],
            "allow": allow,
            "deny": deny or [],
        },
        sort_keys=False,
    )


Record = dict[str, Any]


def records_when(
    read: Callable[[], list[Record]], done: Callable[[list[Record]], bool], timeout: float = 10.0
) -> list[Record]:
    """`read()` again until `done` holds for what it returns, or until `timeout` (then the
    caller's assertions say what is missing). The answer to a request goes out before its audit
    record is written (by a thread; with workers, through the collector): wait for the records
    a test expects instead of reading the trail once."""
    deadline = time.monotonic() + timeout
    while True:
        found = read()
        if done(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def wait_quiet(path: Path, quiet: float = 0.5, timeout: float = 10.0) -> None:
    """Wait until the file at `path` has not grown for `quiet` s (or `timeout`): what the audit
    writer had queued is written by then, so a record missing now is not merely late."""
    deadline = time.monotonic() + timeout
    size, still_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now_size = path.stat().st_size if path.exists() else 0
        if now_size != size:
            size, still_since = now_size, time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            return
        time.sleep(0.02)


@dataclass
class RunningGateway:
    """A `sandgate run` subprocess and what tests need to talk to it."""

    port: int
    root: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    _audit_mark: int = field(default=0)  # audit lines before it belong to earlier tests

    @property
    def rules_dir(self) -> Path:
        return self.root / "rules"

    @property
    def ca_file(self) -> Path:
        return self.root / "state" / "ca" / "mitmproxy-ca-cert.pem"

    @property
    def audit_path(self) -> Path:
        return self.root / "state" / "audit" / "audit.jsonl"

    def proxy(self, sandbox: str = "sb1", token: str = TOKEN) -> str:
        return f"http://{sandbox}:{token}@127.0.0.1:{self.port}"

    @property
    def bare_proxy(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def records(
        self, count: int | None = None, *, event: str = "decision", timeout: float = 5.0
    ) -> list[dict[str, Any]]:
        """Audit records of one event type since the last `mark()`; with `count`, wait until at
        least that many exist."""
        deadline = time.monotonic() + timeout
        while True:
            found = []
            if self.audit_path.exists():
                text = self.audit_path.read_text()
                # A last line without its newline is still being written: read it next time.
                lines = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]
                for line in lines[self._audit_mark :]:
                    rec = json.loads(line)  # every whole line must be well-formed JSON
                    if rec.get("event") == event:
                        found.append(rec)
            if count is None or len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.02)

    def record(self, decision_id: str, timeout: float = 5.0) -> dict[str, Any]:
        """The one decision record with this id (waiting for the writer thread to flush it)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [r for r in self.records() if r["decision_id"] == decision_id]
            if found or time.monotonic() > deadline:
                assert len(found) == 1, f"expected exactly one record for {decision_id}, found {len(found)}"
                return found[0]
            time.sleep(0.02)

    def records_until(
        self, done: Callable[[list[dict[str, Any]]], bool], *, event: str = "decision", timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """Audit records of one event type since the last `mark()`, once `done` holds for them."""
        return records_when(lambda: self.records(event=event), done, timeout)

    def settled(
        self, quiet: float = 0.5, *, event: str = "decision", timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """Audit records since the last `mark()` once the file has been still for `quiet` s: for
        asserting that a record is absent (the writer has written what it had by then)."""
        wait_quiet(self.audit_path, quiet, timeout)
        return self.records(event=event)

    def mark(self, quiet: float = 0.15, timeout: float = 5.0) -> None:
        """Start a test on a shared gateway: `records()` then shows only what comes after.
        Waits until the audit file has not grown for `quiet` s, so that a record an earlier
        test's request is still writing (the answer goes out before the record) is not taken
        for one of this test's."""
        wait_quiet(self.audit_path, quiet, timeout)
        text = self.audit_path.read_text() if self.audit_path.exists() else ""
        self._audit_mark = len(text.splitlines())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def placeholders(self, sandbox: str = "sb1") -> dict[str, str]:
        """The sandbox's placeholders (env name → value), as `sandgate credentials placeholders`
        lists them."""
        out = subprocess.run(
            [SANDGATE, "credentials", "placeholders", "--sandbox", sandbox, "--format", "json"]
            + ["--config", str(self.root / "sandgate.yaml")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        found: dict[str, str] = json.loads(out.stdout)
        return found

    def write_tenant(self, filename: str, text: str) -> None:
        (self.rules_dir / "tenants" / filename).write_text(text)

    def reload(self) -> None:
        self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def write_gateway_files(
    root: Path,
    tenants: dict[str, str],
    *,
    base: str | None = None,
    config: dict[str, Any] | None = None,
    port: int | None = None,
) -> tuple[Path, int]:
    """A rules dir and a gateway config under `root`; returns (config path, port)."""
    (root / "rules" / "tenants").mkdir(parents=True, exist_ok=True)
    if base is not None:
        (root / "rules" / "base.yaml").write_text(textwrap.dedent(base))
    for filename, text in tenants.items():
        (root / "rules" / "tenants" / filename).write_text(text)
    port = port or free_port()
    cfg: dict[str, Any] = {
        "listeners": [{"host": "127.0.0.1", "port": port}],
        "rules_dir": str(root / "rules"),
        "state_dir": str(root / "state"),
        "resolver": {"hosts": TEST_HOSTS},
        "address_guard": {"reachable_by_name": ["127.0.0.0/8"]},
        "log": {"level": "info", "format": "json"},
        "reload": {"watch": True, "interval_seconds": 0.2, "settle_seconds": 0.3},
    }
    for key, value in (config or {}).items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    path = root / "sandgate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, port


GatewayFactory = Callable[..., RunningGateway]


class Gateways:
    """Starts `sandgate run` gateways in folders under `folder`; `close()` stops them all."""

    def __init__(self, folder: Path, pki: TestPKI) -> None:
        self.folder = folder
        self.pki = pki
        self.started: list[RunningGateway] = []

    def start(
        self,
        tenants: dict[str, str],
        *,
        base: str | None = None,
        config: dict[str, Any] | None = None,
        expect_exit: bool = False,
        prepare: Callable[[Path], None] | None = None,
        env: dict[str, str] | None = None,
    ) -> RunningGateway:
        """Start a gateway on a free port with these tenant files (and `env` added to its
        environment); wait until it serves, or with `expect_exit` until it exits.

        A gateway whose port another process took between the draw and the bind is started
        again on another port: it exits, and the port answers for that other process."""
        cfg = {"upstream": {"trusted_ca": str(self.pki.ca_file)}, **(config or {})}
        for attempt in range(3):
            gw = self._launch(tenants, base, cfg, prepare, env)
            if expect_exit:
                gw.proc.wait(30)
                return gw
            if self._serves(gw, cfg, env):
                return gw
            gw.stop()  # exited, or never served: its state folder and locks go with it
            if attempt < 2 and f"port {gw.port} is in use" in gw.log():
                continue
            raise AssertionError(f"gateway did not start:\n{gw.log()}")
        raise AssertionError("unreachable")

    def _launch(
        self,
        tenants: dict[str, str],
        base: str | None,
        cfg: dict[str, Any],
        prepare: Callable[[Path], None] | None,
        env: dict[str, str] | None,
    ) -> RunningGateway:
        root = self.folder / f"gw{len(self.started)}"
        config_path, port = write_gateway_files(root, tenants, base=base, config=cfg)
        if prepare is not None:
            prepare(root)
        log_path = root / "gateway.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [SANDGATE, "run", "--config", str(config_path)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=root,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            )
        gw = RunningGateway(port=port, root=root, proc=proc, log_path=log_path)
        self.started.append(gw)
        return gw

    @staticmethod
    def _serves(gw: RunningGateway, cfg: dict[str, Any], env: dict[str, str] | None) -> bool:
        """Wait until this gateway serves: its status file (written once its listeners run) names
        its own pid and its port (the port alone answers for whichever process holds it). False
        once it exited, or after the timeout."""
        workers = _workers(cfg, env)
        # Several workers each import mitmproxy and load the policy: on a loaded 2-core
        # machine that was seen to take over 20 s before the first one listened.
        deadline = time.monotonic() + (30 if workers == 1 else 90)
        status = _status_path(gw.root, cfg, env)
        listener = f"127.0.0.1:{gw.port}"
        while time.monotonic() < deadline:
            if gw.proc.poll() is not None:
                return False
            shown = read_status(status) or {}
            if shown.get("pid") == gw.proc.pid and listener in shown.get("listeners", ()):
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        for gw in self.started:
            gw.stop()


def _status_path(root: Path, cfg: dict[str, Any], env: dict[str, str] | None) -> Path:
    """Where the started process writes its status: the gateway's, or, for one worker started
    without its supervisor (`SANDGATE_WORKER=i/N`), that worker's own."""
    state = Path(cfg.get("state_dir") or "state").expanduser()
    state = state if state.is_absolute() else root / state  # relative to the config file's folder
    index, _, count = (env or {}).get(WORKER_ENV, "").partition("/")
    if index.isdigit() and count.isdigit() and int(count) > 1:
        return WorkerRole(int(index), int(count)).folder(state) / STATUS_FILE
    return state / STATUS_FILE


def _workers(config: dict[str, Any], env: dict[str, str] | None) -> int:
    """How many worker processes a gateway started with this config and environment runs."""
    if "SANDGATE_WORKER" in (env or {}):
        return 1  # one worker of a gateway, started by a test without its supervisor
    count = (config.get("workers") or {}).get("count") or (env or {}).get("SANDGATE_WORKERS")
    count = count or os.environ.get("SANDGATE_WORKERS") or 1
    return len(os.sched_getaffinity(0)) if count == "auto" else int(count)


@pytest.fixture
def one_jail_at_a_time() -> Iterator[None]:
    """Held for a test that starts jails: jails of both pytest-xdist workers never overlap.

    Jail names, addresses and the host's nftables are global, and a test's checks on what a
    jail leaves behind see every jail of the machine: a test's jail once never ran its command
    (nothing on its stderr) while the other worker's jail tests ran. The workers share their
    parent (the xdist controller), so the lock file is the same for both.
    """
    path = Path(tempfile.gettempdir()) / f"sandgate-tests-jails-{os.getppid()}.lock"
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture
def start_gateway(tmp_path: Path, pki: TestPKI) -> Iterator[GatewayFactory]:
    """Start `sandgate run` on a free port with the given tenant files; stopped at teardown."""
    gateways = Gateways(tmp_path, pki)
    yield gateways.start
    gateways.close()


@pytest.fixture(scope="module")
def start_module_gateway(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI) -> Iterator[GatewayFactory]:
    """`start_gateway` for a gateway that the tests of one module share (starting one takes
    seconds): for tests that change nothing in it. Each test calls `mark()` on it first (a
    function fixture does), so `records()` shows that test's records only."""
    gateways = Gateways(tmp_path_factory.mktemp("gateways"), pki)
    yield gateways.start
    gateways.close()
