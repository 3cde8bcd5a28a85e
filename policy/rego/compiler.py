"""Compile tenants' Rego into bundle files, in separate processes, kept by content digest.

Compiling happens in `worker` processes (rego-cpp can abort a process on some inputs;
the gateway must not be that process), several at once on several cores. Each bundle is a
file `<digest>.rbb` in the bundle store, named by a digest of its modules and data: a reload
recompiles only the tenants whose Rego or data changed, and the embedded engine loads a
tenant's bundle when the tenant is first asked about (and again after it was evicted).

The store is a private temporary folder, removed at exit, unless `use_store` names one that
outlives the process (then gateways on the host and restarts reuse what was compiled).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandgate.policy.decision import EgressRequest, Identity, Phase
from sandgate.policy.errors import PolicyError
from sandgate.policy.rego.deny_sets import DENY_SETS_ENTRYPOINT, DENY_SETS_MODULE, DENY_SETS_MODULE_NAME
from sandgate.policy.rego.input_document import input_document
from sandgate.policy.rego.program import DECISION_ENTRYPOINT, RegoModule, RegoProgram
from sandgate.policy.rego.source import byte_to_char_offset, line_column
from sandgate.policy.rego.wire import BUNDLE_STEP

__all__ = [
    "BundleStore",
    "RegoProblem",
    "RegoTestResult",
    "bundle_store",
    "check_modules",
    "compile_programs",
    "run_rego_tests",
    "sample_inputs",
    "use_store",
]

# Jobs per worker process before another process is worth starting.
_JOBS_PER_WORKER = 25


class BundleStore:
    """A folder of compiled bundles named by digest; private ones forget old generations."""

    def __init__(self, directory: Path, *, private: bool) -> None:
        self.directory = directory
        self.private = private
        self._lock = threading.Lock()
        self._previous: set[str] = set()

    def path(self, digest: str) -> Path:
        return self.directory / f"{digest}.rbb"

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def add(self, digest: str, built: Path) -> None:
        """Move a freshly built bundle in (atomically: readers never see half a file)."""
        os.replace(built, self.path(digest))

    def retain(self, digests: Iterable[str]) -> None:
        """After a load: a private store keeps this generation and the one before it."""
        current = set(digests)
        with self._lock:
            keep, self._previous = current | self._previous, current
        if not self.private:
            return
        for f in self.directory.glob("*.rbb"):
            if f.stem not in keep:
                f.unlink(missing_ok=True)


_store: BundleStore | None = None
_store_lock = threading.Lock()


def bundle_store() -> BundleStore:
    """The store in use (a private temporary folder unless `use_store` chose one)."""
    global _store
    with _store_lock:
        if _store is None:
            directory = Path(tempfile.mkdtemp(prefix="sandgate-rego-"))
            atexit.register(shutil.rmtree, directory, ignore_errors=True)
            _store = BundleStore(directory, private=True)
        return _store


def use_store(directory: Path) -> None:
    """Keep compiled bundles in `directory` (created 0700; refused if others may write to it)."""
    global _store
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = directory.stat()
    if st.st_mode & 0o022 or st.st_uid != os.getuid():
        raise PolicyError(
            f"{directory}: the Rego bundle store must be owned by this user and not writable by others"
        )
    with _store_lock:
        _store = BundleStore(directory, private=False)


@dataclass(frozen=True, slots=True)
class RegoProblem:
    """A compile error: the module file and position when rego-cpp gave one."""

    file: str | None
    line: int | None
    column: int | None
    message: str


@dataclass(frozen=True, slots=True)
class RegoTestResult:
    """The outcome of one `test_` rule: pass, fail or error."""

    name: str
    result: str
    detail: str = ""


def sample_inputs(tenant: str) -> list[dict[str, Any]]:
    """Input documents a policy must evaluate without an error (connect, and a GET request)."""
    who = Identity(tenant=tenant, sandbox="sample")
    connect = EgressRequest(Phase.CONNECT, "example.com", 443)
    get = EgressRequest(Phase.REQUEST, "example.com", 443, scheme="https", method="GET", path="/")
    return [input_document(who, r, "93.184.215.14") for r in (connect, get)]


def compile_programs(
    programs: Sequence[RegoProgram], *, workers: int | None = None
) -> tuple[dict[str, RegoProgram], dict[str, list[RegoProblem]]]:
    """Compile what the store does not hold yet; (programs with their bundle file, problems), by tenant."""
    store = bundle_store()
    todo = {p.digest: p for p in programs if not store.has(p.digest)}
    problems: dict[str, list[RegoProblem]] = {}
    if todo:
        with tempfile.TemporaryDirectory(prefix="sandgate-rego-build-", dir=store.directory) as out_dir:
            results = _run_jobs("build", list(todo.values()), out_dir, workers)
            for digest, program in todo.items():
                errors = results.get(digest)
                if errors:
                    problems[digest] = _problems(errors, program.modules)
                else:
                    store.add(digest, Path(out_dir) / f"{digest}.rbb")
    done: dict[str, RegoProgram] = {}
    by_tenant_problems: dict[str, list[RegoProblem]] = {}
    for p in programs:
        if p.digest in problems:
            by_tenant_problems[p.tenant] = problems[p.digest]
        else:
            done[p.tenant] = p.compiled(str(store.path(p.digest)))
    return done, by_tenant_problems


def keep_only(programs: Iterable[RegoProgram]) -> None:
    """After a successful load: the store may forget bundles neither this load nor the last used."""
    bundle_store().retain(p.digest for p in programs)


def check_modules(modules: Sequence[RegoModule]) -> list[RegoProblem]:
    """Compile modules on their own (no decision entrypoint): syntax and well-formedness."""
    program = RegoProgram("check", tuple(modules), {})
    results = _run_jobs("check", [program], None, 1)
    return _problems(results.get(program.digest) or [], program.modules)


def run_rego_tests(
    shared: Sequence[RegoModule],
    groups: Sequence[tuple[RegoModule, Sequence[tuple[str, str, str]]]],
    data: Mapping[str, Any],
) -> list[RegoTestResult]:
    """Run `test_` rules: each group is a test module and its [(query, name, entrypoint)],
    evaluated with the `shared` (non-test) modules and `data`, apart from the other groups."""
    out: dict[str, RegoTestResult] = {}
    no_bundle: set[str] = set()
    pending = [(m.path, m, list(tests)) for m, tests in groups]
    while pending:
        request: dict[str, Any] = {
            "op": "test",
            "shared": [[m.path, m.text] for m in shared],
            "data": dict(data),
            "groups": [
                {
                    "id": gid,
                    "modules": [] if m in shared else [[m.path, m.text]],
                    "bundle": gid not in no_bundle,
                    "tests": [t for t in tests if t[1] not in out],
                }
                for gid, m, tests in pending
            ],
        }
        count = sum(len(t) for _, _, t in pending)
        lines, stderr, _ = _worker(request, timeout=60.0 + 0.5 * count)
        started = None
        for line in lines:
            if "start" in line:
                started = line["start"]
            elif "test" in line:
                out[line["test"]] = RegoTestResult(line["test"], line["result"], line.get("detail", ""))
                started = None
        if started is not None and started.startswith(BUNDLE_STEP):
            no_bundle.add(started.removeprefix(BUNDLE_STEP))  # building it crashed: query by query
        elif started is not None and started not in out:
            out[started] = RegoTestResult(started, "error", _crash(stderr))
        rest = [(g, m, t) for g, m, t in pending if any(x[1] not in out for x in t)]
        if started is None and len(rest) == len(pending):
            for _, _, tests in rest:
                for _, name, _ in tests:
                    out.setdefault(name, RegoTestResult(name, "error", _crash(stderr)))
            break
        pending = rest
    return [out[name] for _, tests in groups for _, name, _ in tests]


def _run_jobs(
    op: str, programs: list[RegoProgram], out_dir: str | None, workers: int | None
) -> dict[str, list[dict[str, Any]]]:
    """Errors by program digest (an empty list: compiled); recovers from a crashing worker."""
    results: dict[str, list[dict[str, Any]]] = {}
    pending = programs
    while pending:
        n = workers or min(os.cpu_count() or 1, max(1, math.ceil(len(pending) / _JOBS_PER_WORKER)))
        chunks = [pending[i::n] for i in range(n) if pending[i::n]]
        with ThreadPoolExecutor(len(chunks)) as pool:
            outcomes = list(pool.map(lambda c: _run_chunk(op, c, out_dir), chunks))
        for outcome in outcomes:
            results.update(outcome)
        rest = [p for p in pending if p.digest not in results]
        if len(rest) == len(pending):
            for p in rest:
                results[p.digest] = [{"module": None, "offset": None, "message": "the Rego compiler failed"}]
            break
        pending = rest
    return results


def _run_chunk(op: str, programs: list[RegoProgram], out_dir: str | None) -> dict[str, list[dict[str, Any]]]:
    # The operator's modules are the same for every tenant of a load: sent once per process.
    shared = tuple(m for m in programs[0].modules if m.operator)
    if any(tuple(m for m in p.modules if m.operator) != shared for p in programs):
        shared = ()
    request = {
        "op": op,
        "out_dir": out_dir,
        "entrypoint": DECISION_ENTRYPOINT,
        "shared": [[m.path, m.text] for m in shared],
        "jobs": [
            {
                "id": p.digest,
                "modules": [[m.path, m.text] for m in p.modules if not (shared and m.operator)]
                + ([[DENY_SETS_MODULE_NAME, DENY_SETS_MODULE]] if p.fast_path and op == "build" else []),
                "entrypoints": [DENY_SETS_ENTRYPOINT] if p.fast_path and op == "build" else [],
                "data": p.data_document(),
                "samples": sample_inputs(p.tenant) if op == "build" else [],
            }
            for p in programs
        ],
    }
    lines, stderr, _ = _worker(request, timeout=30.0 + 0.1 * len(programs))
    out: dict[str, list[dict[str, Any]]] = {}
    started = None
    for line in lines:
        if "start" in line:
            started = line["start"]
        elif "id" in line:
            out[line["id"]] = [] if line.get("ok") else list(line["errors"])
            started = None
    if started is not None and started not in out:
        out[started] = [{"module": None, "offset": None, "message": _crash(stderr)}]
    return out


def _worker(request: dict[str, Any], timeout: float) -> tuple[list[dict[str, Any]], str, int]:
    """Run one worker process; its JSON lines, the tail of its stderr, its exit code."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandgate.policy.rego.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        stdout, stderr = proc.communicate(json.dumps(request).encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, _ = proc.communicate()
        stderr = b"timed out"
    lines = []
    for raw in stdout.decode(errors="replace").splitlines():
        try:
            value = json.loads(raw)
        except ValueError:
            break
        if isinstance(value, dict):
            lines.append(value)
    return lines, stderr.decode(errors="replace")[-2000:], proc.returncode


def _crash(stderr: str) -> str:
    last = [line for line in stderr.strip().splitlines() if line.strip()]
    hint = last[-1].strip() if last else "no message"
    if hint == "timed out":
        return "the Rego compiler timed out on this policy"
    return f"the Rego compiler crashed on this policy ({hint[:200]})"


def _problems(errors: list[dict[str, Any]], modules: Sequence[RegoModule]) -> list[RegoProblem]:
    by_path = {m.path: m for m in modules}
    out = []
    for e in errors:
        module = by_path.get(e.get("module") or "")
        line = column = None
        if module is not None and isinstance(e.get("offset"), int):
            line, column = line_column(module.text, byte_to_char_offset(module.text, e["offset"]))
        out.append(RegoProblem(module.path if module else None, line, column, str(e.get("message", ""))))
    return out
