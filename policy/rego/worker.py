"""The Rego compiler process: builds bundles and runs `test_` rules away from the gateway.

rego-cpp can abort the whole process on some inputs (seen: a `with` in a module aborts the
bundle builder), so sandgate never compiles untrusted Rego in the gateway process. The
parent (`rego.compiler`) starts `python -m sandgate.policy.rego.worker`, writes one JSON
request on stdin and reads one JSON line per step on stdout:

    {"op": "build", "out_dir": D, "entrypoint": "sandgate/decision", "shared": [[name, text], ...],
     "jobs": [{"id": K, "modules": [[name, text], ...], "data": {...}, "samples": [input, ...],
               "entrypoints": [more entrypoints the bundle answers]}]}
        → {"start": K} then {"id": K, "ok": true} (bundle in D/K.rbb) or {"id": K, "errors": [...]}
    {"op": "check", "jobs": [...]}          → the same, without a bundle
    {"op": "test", "shared": [[name, text], ...], "data": {...},
     "groups": [{"id": G, "modules": [[name, text]], "bundle": true, "tests": [[query, name, entrypoint]]}]}
        → {"start": name} then {"test": name, "result": "pass" | "fail" | "error", "detail": ...}

A `start` line without its result means the job crashed the process: the parent reports
that job and runs the rest in a new process. Only the standard library, regopy and `wire` here.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any

from regopy import BundleFormat, Input, Interpreter, LogLevel, RegoError
from regopy.rego_shared import (
    rego_bundle_query_entrypoint,
    rego_free_output,
    rego_output_ok,
    rego_output_string,
    rego_query,
)

from sandgate.policy.rego.wire import BUNDLE_STEP

__all__ = ["main", "parse_errors"]

_ERROR = re.compile(rb"\(error (\d+):")
_ERROR_BARE = re.compile(rb"\(error\s")
_MESSAGE = re.compile(rb"\(errormsg (\d+):")
_SPAN = re.compile(rb"\|(\d+)\|(\d+)")


def parse_errors(text: str) -> list[dict[str, Any]]:
    """rego-cpp error sequences → [{"module", "offset", "message"}] (offset in UTF-8 bytes)."""
    raw = text.encode()
    starts = [m.start() for m in _ERROR_BARE.finditer(raw)] + [len(raw)]
    out = []
    for begin, end in itertools.pairwise(starts):
        chunk = raw[begin:end]
        module: str | None = None
        offset: int | None = None
        head = _ERROR.match(chunk)
        if head:
            n = int(head.group(1))
            name_end = head.end() + n
            module = chunk[head.end() : name_end].decode(errors="replace")
            span = _SPAN.match(chunk, name_end)
            if span:
                offset = int(span.group(1))
        message = "rego error"
        msg = _MESSAGE.search(chunk)
        if msg:
            n = int(msg.group(1))
            message = chunk[msg.end() : msg.end() + n].decode(errors="replace")
        out.append({"module": module, "offset": offset, "message": message})
    return out or [{"module": None, "offset": None, "message": text.strip()[:500] or "rego error"}]


def _interpreter() -> Interpreter:
    r = Interpreter()
    r.log_level = LogLevel.NONE
    return r


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _load(r: Interpreter, modules: list[list[str]], data: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        for name, text in modules:
            r.add_module(name, text)
        r.add_data(data)
    except RegoError as e:
        return parse_errors(str(e))
    return []


def _build(job: dict[str, Any], shared: list[list[str]], entrypoint: str | None, out_dir: str | None) -> None:
    r = _interpreter()
    errors = _load(r, [*shared, *job["modules"]], job["data"])
    if errors:
        _emit({"id": job["id"], "errors": errors})
        return
    try:
        entrypoints = [entrypoint, *job.get("entrypoints", [])]
        bundle = r.build(None, entrypoints) if entrypoint else r.build("x := true", [])
    except RegoError as e:
        _emit({"id": job["id"], "errors": parse_errors(str(e))})
        return
    if not bundle.ok():
        node = bundle.node()
        _emit(
            {
                "id": job["id"],
                "errors": [e for i in range(len(node)) for e in parse_errors(node.at(i).json())],
            }
        )
        return
    if entrypoint:
        problem = _smoke(bundle, entrypoint, job.get("samples", []))
        if problem:
            _emit({"id": job["id"], "errors": [{"module": None, "offset": None, "message": problem}]})
            return
        if out_dir:
            r.save_bundle(str(Path(out_dir) / f"{job['id']}.rbb"), bundle, BundleFormat.Binary)
    _emit({"id": job["id"], "ok": True})


def _smoke(bundle: Any, entrypoint: str, samples: list[Any]) -> str:
    """Evaluate sample inputs: rego-cpp finds some mistakes (unknown functions) only when run."""
    for sample in samples:
        r = _interpreter()
        r.set_input(Input(sample))
        out = rego_bundle_query_entrypoint(r._impl, bundle._impl, entrypoint)
        try:
            if not rego_output_ok(out):
                return f"the decision fails on a sample {sample.get('phase')} request"
            text = rego_output_string(out)
        finally:
            rego_free_output(out)
        if text.startswith("(error") or text.startswith("("):
            found = parse_errors(text)[0]["message"]
            return f"the decision fails on a sample {sample.get('phase')} request: {found}"
    return ""


def _tests(req: dict[str, Any]) -> None:
    """Run each group (a test module's rules) on its own: rego-cpp compiles a module set as a
    whole, so one module it cannot compile must not take the other modules' tests with it."""
    for group in req["groups"]:
        modules = [*req["shared"], *group["modules"]]
        if group.get("bundle", True) and _tests_from_bundle(group, modules, req["data"]):
            continue
        _tests_by_query(group["tests"], modules, req["data"])


def _tests_from_bundle(group: dict[str, Any], modules: list[list[str]], data: dict[str, Any]) -> bool:
    """Run a group's tests from one bundle (fast); False when the bundle cannot be built."""
    r = _interpreter()
    if _load(r, modules, data):
        return False
    _emit({"start": BUNDLE_STEP + group["id"]})
    try:
        bundle = r.build(None, [entrypoint for _, _, entrypoint in group["tests"]])
    except RegoError:
        return False
    if not bundle.ok():
        return False
    runner = _interpreter()
    for _, name, entrypoint in group["tests"]:
        _emit({"start": name})
        out = rego_bundle_query_entrypoint(runner._impl, bundle._impl, entrypoint)
        _emit({"test": name, **_outcome(out)})
    return True


def _tests_by_query(tests: list[list[str]], modules: list[list[str]], data: dict[str, Any]) -> None:
    r: Interpreter | None = None
    for query, name, _ in tests:
        if r is None:
            r = _interpreter()
            errors = _load(r, modules, data)
            if errors:
                _emit({"test": name, "result": "error", "detail": errors[0]["message"]})
                r = None
                continue
        _emit({"start": name})
        outcome = _outcome(rego_query(r._impl, query))
        if outcome["result"] == "error":
            r = None  # start clean after an error
        _emit({"test": name, **outcome})


def _outcome(out: Any) -> dict[str, str]:
    """pass when the rule is true; fail when false or undefined; error when it cannot be evaluated."""
    try:
        if not rego_output_ok(out):
            return {"result": "error", "detail": "the interpreter could not evaluate this rule"}
        text = rego_output_string(out)
    finally:
        rego_free_output(out)
    if text.replace(" ", "") == '{"expressions":[true]}':
        return {"result": "pass", "detail": ""}
    if text.startswith("("):
        return {"result": "error", "detail": parse_errors(text)[0]["message"]}
    return {"result": "fail", "detail": "undefined" if text == "undefined" else text[:200]}


def main() -> int:
    """Read one request from stdin, answer on stdout."""
    req = json.loads(sys.stdin.read())
    if req["op"] == "test":
        _tests(req)
        return 0
    entrypoint = req.get("entrypoint") if req["op"] == "build" else None
    for job in req["jobs"]:
        _emit({"start": job["id"]})
        _build(job, req.get("shared", []), entrypoint, req.get("out_dir"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
