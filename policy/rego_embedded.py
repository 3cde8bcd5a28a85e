"""The embedded engine: evaluates a tenant's compiled bundle in process with regopy.

A tenant's bundle is loaded from the bundle store when the tenant is first asked about
(~0.1 ms) and kept in a bounded least-recently-used set (a loaded bundle costs ~150 KB, so
10,000 tenants are not all kept). Each evaluation marshals only the input fields the
tenant's modules can read, queries the bundle's `sandgate/decision` entrypoint and reads
the result (or, when the decision rules are the shipped ones, the raw deny sets, reduced in
Python: policy/rego_decision.py). One interpreter per thread (an interpreter holds the input). The output of a
failed query is never read as text: some rego-cpp error outputs crash when printed.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from regopy import BundleFormat, Interpreter, LogLevel
from regopy.rego_shared import (
    rego,
    rego_bundle_query_entrypoint,
    rego_free_output,
    rego_output_ok,
    rego_output_string,
)

from .engine import UNDEFINED, RegoQuery, RegoVerdict, fault, interpret
from .rego_decision import DENY_SETS_ENTRYPOINT, reduce_deny_sets
from .rego_program import DECISION_ENTRYPOINT

__all__ = ["EmbeddedEngine"]

# rego-cpp's input builder, called directly: regopy's generic one costs twice as much.
_new_input, _free_input, _set_input = rego.regoNewInput, rego.regoFreeInput, rego.regoSetInput
_string, _int, _float = rego.regoInputString, rego.regoInputInt, rego.regoInputFloat
_bool, _null = rego.regoInputBoolean, rego.regoInputNull
_item, _object, _array = rego.regoInputObjectItem, rego.regoInputObject, rego.regoInputArray


class EmbeddedEngine:
    """In-process Rego (rego-cpp through regopy), one compiled bundle per tenant."""

    name = "embedded"

    def __init__(self, max_loaded: int = 1_000) -> None:
        if max_loaded < 1:
            raise ValueError("the embedded engine keeps at least one bundle loaded")
        self.max_loaded = max_loaded
        self._local = threading.local()
        self._loaded: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0

    async def evaluate(self, query: RegoQuery) -> RegoVerdict:
        return self.evaluate_now(query)

    def evaluate_now(self, query: RegoQuery) -> RegoVerdict:
        """Evaluate synchronously (it takes tens of microseconds, less than a thread hop)."""
        program = query.program
        if program.bundle_file is None:
            return fault("the tenant's policy is not compiled")
        try:
            interpreter = self._interpreter()
            bundle = self._bundle(program.digest, program.bundle_file)
            if bundle is None:
                return fault("the tenant's compiled policy cannot be loaded")
            _set(interpreter, query.projected)
            if program.fast_path:
                text = _query(interpreter, bundle, DENY_SETS_ENTRYPOINT)
                document = reduce_deny_sets(text) if text is not None else None
                if document is not None:
                    return interpret(document)
            text = _query(interpreter, bundle, DECISION_ENTRYPOINT)
        except Exception as e:
            return fault(f"the embedded engine failed ({type(e).__name__})")
        if text is None:
            return fault("the policy failed to evaluate")
        return _read(text)

    def _interpreter(self) -> Interpreter:
        interpreter: Interpreter | None = getattr(self._local, "interpreter", None)
        if interpreter is None:
            interpreter = Interpreter()
            interpreter.log_level = LogLevel.NONE
            self._local.interpreter = interpreter
        return interpreter

    def _bundle(self, digest: str, path: str) -> Any:
        with self._lock:
            bundle = self._loaded.get(digest)
            if bundle is not None:
                self._loaded.move_to_end(digest)
                return bundle
        if not os.path.isfile(path):
            return None  # rego-cpp would print its complaint to stdout
        # A throwaway interpreter loads it: an interpreter keeps state from every bundle it
        # loaded, and queries through it slow down by half once it has loaded ~10,000.
        loader = Interpreter()
        loader.log_level = LogLevel.NONE
        bundle = loader.load_bundle(path, BundleFormat.Binary)
        if not bundle.ok():
            return None
        with self._lock:
            self.loads += 1
            self._loaded[digest] = bundle
            while len(self._loaded) > self.max_loaded:
                self._loaded.popitem(last=False)
        return bundle

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        with self._lock:
            self._loaded.clear()


def _set(interpreter: Interpreter, document: Mapping[str, Any]) -> None:
    """Make `document` the interpreter's input."""
    handle = _new_input()
    try:
        if _add(handle, document) or _set_input(interpreter._impl, handle):
            raise ValueError("rego-cpp refused the input document")
    finally:
        _free_input(handle)


def _query(interpreter: Interpreter, bundle: Any, entrypoint: str) -> str | None:
    """Query one of the bundle's entrypoints; the output text, or None when the query failed."""
    out = rego_bundle_query_entrypoint(interpreter._impl, bundle._impl, entrypoint)
    try:
        return rego_output_string(out) if rego_output_ok(out) else None
    finally:
        rego_free_output(out)


def _add(handle: int, value: Any) -> int:
    """Push one JSON value onto rego-cpp's input builder; nonzero when a call failed."""
    kind = type(value)
    if kind is str:
        return int(_string(handle, value.encode()))
    if kind is dict:
        bad = 0
        for k, v in value.items():
            bad |= _string(handle, k.encode()) | _add(handle, v) | _item(handle)
        return bad | int(_object(handle, len(value)))
    if kind is bool:
        return int(_bool(handle, value))
    if kind is int:
        return int(_int(handle, value))
    if value is None:
        return int(_null(handle))
    if kind is list or kind is tuple:
        bad = 0
        for v in value:
            bad |= _add(handle, v)
        return bad | int(_array(handle, len(value)))
    if kind is float:
        return int(_float(handle, value))
    raise TypeError(f"a {kind.__name__} is not a JSON value")


def _read(text: str) -> RegoVerdict:
    """The verdict from rego-cpp's output text: `undefined`, an error, or {"expressions": [v]}."""
    if text == "undefined":
        return interpret(UNDEFINED)
    try:
        parsed = json.loads(text)
    except ValueError:
        # A runtime error (an unknown function, a conflict) comes back as an error term.
        return fault("the policy failed to evaluate")
    expressions = parsed.get("expressions") if isinstance(parsed, dict) else None
    if not isinstance(expressions, list) or len(expressions) != 1:
        return fault("the policy returned an unexpected result")
    return interpret(expressions[0])
