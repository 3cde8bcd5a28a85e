"""Tests for sandgate.policy.rego.engine (reading decisions, building engines) and the decision cache."""

from __future__ import annotations

import re
from typing import Any

import pytest

from sandgate.policy.reasons import Reason
from sandgate.policy.rego.cache import CachingEngine, DecisionCache
from sandgate.policy.rego.embedded import EmbeddedEngine
from sandgate.policy.rego.engine import make_engine
from sandgate.policy.rego.opa import OpaEngine, module_id
from sandgate.policy.rego.program import RegoModule, RegoProgram
from sandgate.policy.rego.protocol import UNDEFINED, EngineError, RegoQuery, RegoVerdict, fault, interpret
from sandgate.policy.rego.source import module_facts

INTERPRET_CASES: list[tuple[object, bool, Reason, str, bool]] = [
    ({"allow": True, "reason": "allowed"}, True, Reason.ALLOWED, "", False),
    ({"allow": True}, True, Reason.ALLOWED, "", False),
    (
        {"allow": False, "reason": "method_not_allowed", "message": "GET only"},
        False,
        Reason.METHOD_NOT_ALLOWED,
        "GET only",
        False,
    ),
    ({"allow": False, "message": "no"}, False, Reason.POLICY_DENIED, "no", False),
    ({"allow": False, "reason": "teapot"}, False, Reason.POLICY_DENIED, "", False),
    ({"allow": False, "reason": "private_address"}, False, Reason.POLICY_DENIED, "", False),
    ({"allow": False, "reason": "allowed"}, False, Reason.POLICY_DENIED, "", False),
    ({"allow": False, "reason": 7, "message": 8}, False, Reason.POLICY_DENIED, "", False),
    (UNDEFINED, False, Reason.POLICY_DENIED, "the policy's decision is undefined", False),
    ({"allow": True, "reason": "because"}, False, Reason.POLICY_ERROR, "", True),
    ({"allow": "yes"}, False, Reason.POLICY_ERROR, "", True),
    ({}, False, Reason.POLICY_ERROR, "", True),
    ("allow", False, Reason.POLICY_ERROR, "", True),
    (None, False, Reason.POLICY_ERROR, "", True),
    ([{"allow": True}], False, Reason.POLICY_ERROR, "", True),
]


@pytest.mark.parametrize(
    ("result", "allowed", "reason", "message", "is_fault"),
    INTERPRET_CASES,
    ids=[
        "allow with reason allowed allows",
        "allow without a reason allows",
        "a denial keeps a reason code a policy may give, and its message",
        "a denial without a reason is policy_denied",
        "an unknown reason string is policy_denied",
        "an operator's reason code is not a policy's: policy_denied",
        "allowed as the reason of a denial is policy_denied",
        "a reason that is not a string is policy_denied, a message that is not one is dropped",
        "an undefined decision is a denial, not a fault",
        "allow with another reason is a contradiction: policy_error",
        "allow that is not a boolean is policy_error",
        "an object without allow is policy_error",
        "a string is policy_error",
        "null is policy_error",
        "an array is policy_error",
    ],
)
def test_interpret(result: object, allowed: bool, reason: Reason, message: str, is_fault: bool) -> None:
    verdict = interpret(result)
    assert (verdict.allowed, verdict.reason, verdict.fault) == (allowed, reason, is_fault)
    if message or not is_fault:
        assert verdict.message == message


def test_the_zero_verdict_denies() -> None:
    assert RegoVerdict() == RegoVerdict(allowed=False, reason=Reason.POLICY_ERROR)


def test_a_long_message_is_cut() -> None:
    assert len(interpret({"allow": False, "message": "x" * 10_000}).message) == 500
    assert len(fault("y" * 10_000).message) == 500


def test_make_engine_builds_each_kind_behind_a_cache() -> None:
    embedded = make_engine()
    assert isinstance(embedded, CachingEngine) and isinstance(embedded.engine, EmbeddedEngine)
    assert embedded.cache.ttl is None
    opa = make_engine("opa", url="http://127.0.0.1:8181", timeout=0.25)
    assert isinstance(opa, CachingEngine) and isinstance(opa.engine, OpaEngine)
    assert opa.cache.ttl == 1.0 and opa.engine.timeout == 0.25
    assert isinstance(make_engine(cache_size=0), EmbeddedEngine)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"kind": "wasm"}, "unknown policy engine 'wasm'"),
        ({"kind": "opa"}, "needs the server's url"),
        ({"kind": "opa", "url": "ftp://opa"}, "must be http(s)://host[:port]"),
        ({"kind": "opa", "url": "http://opa:8181/v1"}, "takes no path"),
        ({"kind": "opa", "url": "http://u:p@opa:8181"}, "takes no path, query or credentials"),
        ({"kind": "opa", "url": "http://opa:8181", "timeout": 0}, "timeout must be positive"),
    ],
    ids=[
        "an unknown kind",
        "opa without a url",
        "a url that is not http",
        "a url with a path",
        "credentials in the url",
        "a zero timeout",
    ],
)
def test_make_engine_refuses_bad_settings(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(EngineError, match=re.escape(problem)):
        make_engine(**kwargs)


def test_module_ids_are_stable_and_url_safe() -> None:
    assert module_id("rules/rego/sandgate.rego") == "sandgate/rules/rego/sandgate.rego"
    assert module_id("rules/rego/sandgate.rego", "rules") == "sandgate/rego/sandgate.rego"
    assert module_id("/etc/rules/tenants/a b.rego", "/etc/rules") == "sandgate/tenants/a/b.rego"
    assert module_id("../x/../y.rego") == "sandgate/x/y.rego"
    assert module_id("/elsewhere/m.rego", "/etc/rules") == "sandgate/elsewhere/m.rego"


# --- the decision cache --------------------------------------------------------------------


def program(text: str, tenant: str = "t") -> RegoProgram:
    return RegoProgram(tenant, (RegoModule("m.rego", text, module_facts(text)),), {})


READS_HOST = 'package sandgate.tenants.t\nimport rego.v1\ndeny contains "x" if input.dest.host == "a"\n'
READS_CLOCK = "package sandgate.tenants.t\nimport rego.v1\ndeny contains 1 if time.now_ns() < 0\n"


class CountingEngine:
    """Answers from a script and counts calls."""

    name = "counting"

    def __init__(self, verdict: RegoVerdict) -> None:
        self.verdict = verdict
        self.calls = 0

    async def evaluate(self, query: RegoQuery) -> RegoVerdict:
        self.calls += 1
        return self.verdict

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def doc(host: str, method: str = "GET") -> dict[str, Any]:
    return {"dest": {"host": host, "port": 443}, "request": {"method": method, "headers": {"a": method}}}


async def test_the_cache_keys_on_the_fields_the_policy_reads() -> None:
    inner = CountingEngine(RegoVerdict(allowed=True, reason=Reason.ALLOWED))
    engine = CachingEngine(inner, DecisionCache(100))
    p = program(READS_HOST)
    first = await engine.evaluate(RegoQuery(p, doc("a", "GET")))
    second = await engine.evaluate(RegoQuery(p, doc("a", "POST")))  # method and headers are not read
    third = await engine.evaluate(RegoQuery(p, doc("b")))
    assert inner.calls == 2
    assert (first.cached, second.cached, third.cached) == (False, True, False)
    assert engine.cache.stats().hits == 1


async def test_a_changed_program_is_a_different_key() -> None:
    inner = CountingEngine(RegoVerdict(allowed=True, reason=Reason.ALLOWED))
    engine = CachingEngine(inner, DecisionCache(100))
    await engine.evaluate(RegoQuery(program(READS_HOST), doc("a")))
    await engine.evaluate(RegoQuery(program(READS_HOST.replace('"x"', '"y"')), doc("a")))
    assert inner.calls == 2


async def test_faults_and_clock_reading_policies_are_never_cached() -> None:
    inner = CountingEngine(fault("down"))
    engine = CachingEngine(inner, DecisionCache(100))
    for _ in range(3):
        await engine.evaluate(RegoQuery(program(READS_HOST), doc("a")))
    inner.verdict = RegoVerdict(allowed=True, reason=Reason.ALLOWED)
    for _ in range(3):
        await engine.evaluate(RegoQuery(program(READS_CLOCK), doc("a")))
    assert inner.calls == 6
    assert engine.cache.stats().size == 0


def test_the_cache_is_bounded_least_recently_used_first() -> None:
    cache = DecisionCache(2)
    verdict = RegoVerdict(allowed=True, reason=Reason.ALLOWED)
    cache.put(("p", "a"), verdict)
    cache.put(("p", "b"), verdict)
    assert cache.get(("p", "a")) is not None
    cache.put(("p", "c"), verdict)
    assert cache.get(("p", "b")) is None
    assert cache.get(("p", "a")) is not None and cache.get(("p", "c")) is not None
    assert cache.stats().size == 2


def test_entries_expire_after_the_time_to_live() -> None:
    now = [100.0]
    cache = DecisionCache(10, ttl=1.0, clock=lambda: now[0])
    cache.put(("p", "a"), RegoVerdict(allowed=True, reason=Reason.ALLOWED))
    now[0] = 100.9
    assert cache.get(("p", "a")) is not None
    now[0] = 101.1
    assert cache.get(("p", "a")) is None
    assert cache.stats().size == 0


def test_a_cache_holds_at_least_one_entry() -> None:
    with pytest.raises(ValueError, match="at least one"):
        DecisionCache(0)
