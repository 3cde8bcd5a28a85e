"""The embedded engine's fast path (raw deny sets reduced in Python) decides exactly as the
shipped data.sandgate.decision rule does, and is used only when that rule is the shipped one."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import pytest

from sandgate.policy.decision import EgressRequest, Identity, Phase
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.compiler import compile_programs
from sandgate.policy.rego.deny_sets import SHIPPED_DECISION_DIGESTS, fast_path_applies, reduce_deny_sets
from sandgate.policy.rego.embedded import EmbeddedEngine
from sandgate.policy.rego.input_document import input_document
from sandgate.policy.rego.program import RegoModule, RegoProgram
from sandgate.policy.rego.protocol import RegoQuery, RegoVerdict
from sandgate.policy.rego.source import module_facts

REPO = Path(__file__).resolve().parents[3]
SHIPPED = (REPO / "rules" / "rego" / "sandgate.rego").read_text()
WHO = Identity("t1", "t1-1")


def module(path: str, text: str, operator: bool = False) -> RegoModule:
    return RegoModule(path, text, module_facts(text), operator=operator)


def tenant_module(rules: str) -> RegoModule:
    return module("t1.rego", f"package sandgate.tenants.t1\n\nimport rego.v1\n\n{rules}\n")


def compiled(*modules: RegoModule) -> RegoProgram:
    program = RegoProgram("t1", (module("rego/sandgate.rego", SHIPPED, operator=True), *modules), {})
    done, problems = compile_programs([program])
    assert not problems, problems
    return done["t1"]


def both_paths(program: RegoProgram, doc: dict[str, Any]) -> tuple[RegoVerdict, RegoVerdict]:
    """The verdict through the fast path and through data.sandgate.decision, same bundle."""
    assert program.fast_path
    engine = EmbeddedEngine()
    fast = engine.evaluate_now(RegoQuery(program, doc))
    slow_program = dataclasses.replace(program)
    object.__setattr__(slow_program, "fast_path", False)
    object.__setattr__(slow_program, "bundle_file", program.bundle_file)
    slow = engine.evaluate_now(RegoQuery(slow_program, doc))
    return fast, slow


def doc(method: str = "GET", path: str = "/", **override: Any) -> dict[str, Any]:
    request = EgressRequest(Phase.REQUEST, "api.example.com", 443, "https", method, path, "api.example.com")
    return input_document(WHO, request, "93.184.215.14") | override


def test_the_shipped_decision_module_is_the_one_the_fast_path_mirrors() -> None:
    """Changing rules/rego/sandgate.rego must come with a new digest (and a look at the reduction)."""
    assert hashlib.sha256(SHIPPED.encode()).hexdigest() in SHIPPED_DECISION_DIGESTS


DENY_RULES = {
    "no denial": "deny contains 1 if false",
    "a string": 'deny contains "no writes" if input.request.method == "POST"',
    "an object with a reason": (
        'deny contains {"reason": "method_not_allowed", "message": "only GET"} '
        'if input.request.method != "GET"'
    ),
    "an object without a message": 'deny contains {"reason": "path_not_allowed"} if true',
    "an object without a reason": 'deny contains {"message": "nope"} if true',
    "an unknown reason": 'deny contains {"reason": "teapot", "message": "short and stout"} if true',
    "neither string nor object": "deny contains 42 if true",
    "a number as reason (rego-cpp decides)": 'deny contains {"reason": 7, "message": "x"} if true',
    "several: smallest reason then smallest message": (
        'deny contains {"reason": "policy_denied", "message": "b"} if true\n'
        'deny contains {"reason": "method_not_allowed", "message": "z"} if true\n'
        'deny contains {"reason": "method_not_allowed", "message": "y"} if true\n'
        'deny contains "a" if true'
    ),
    "unicode messages order by code point": 'deny contains "é" if true\ndeny contains "z" if true',
}


@pytest.mark.parametrize("rules", list(DENY_RULES.values()), ids=list(DENY_RULES))
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_fast_and_full_decisions_agree(rules: str, method: str) -> None:
    program = compiled(tenant_module(rules))
    fast, slow = both_paths(program, doc(method))
    assert (fast.allowed, fast.reason, fast.message, fast.fault) == (
        slow.allowed,
        slow.reason,
        slow.message,
        slow.fault,
    )


def test_the_operator_deny_set_counts_too() -> None:
    program = compiled(tenant_module("deny contains 1 if false"))
    fast, slow = both_paths(program, doc(version=3))
    assert fast == slow
    assert (fast.allowed, fast.reason, fast.message) == (
        False,
        Reason.POLICY_DENIED,
        "unsupported input version",
    )


def test_a_tenant_without_deny_rules_is_allowed_on_both_paths() -> None:
    program = compiled(tenant_module("helper := 1"))
    fast, slow = both_paths(program, doc())
    assert fast == slow
    assert fast.allowed


def test_an_edited_decision_module_turns_the_fast_path_off() -> None:
    operator = module("rego/sandgate.rego", SHIPPED.replace("policy_denied", "host_denied"), operator=True)
    assert not fast_path_applies([operator, tenant_module("deny contains 1 if false")])


def test_a_second_module_defining_the_decision_turns_it_off() -> None:
    shipped = module("rego/sandgate.rego", SHIPPED, operator=True)
    other = module("rego/mine.rego", 'package sandgate\n\ndecision := {"allow": true}\n', operator=True)
    assert fast_path_applies([shipped])
    assert not fast_path_applies([shipped, other])


def test_extra_operator_deny_rules_keep_the_fast_path_and_are_applied() -> None:
    extra = module("rego/operator.rego", 'package sandgate\n\ndeny contains "ops says no" if true\n', True)
    program = compiled(extra, tenant_module("deny contains 1 if false"))
    fast, slow = both_paths(program, doc())
    assert fast == slow
    assert (fast.allowed, fast.message) == (False, "ops says no")


@pytest.mark.parametrize(
    "text",
    ["undefined", "(error)", '{"expressions": []}', '{"expressions": [[{}, []]]}', '{"expressions": [1]}'],
)
def test_output_the_reduction_does_not_know_goes_to_rego_cpp(text: str) -> None:
    assert reduce_deny_sets(text) is None


def test_the_fast_path_asks_rego_cpp_only_for_the_deny_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandgate.policy.rego import embedded as rego_embedded

    asked: list[str] = []
    real = rego_embedded._query

    def spy(interpreter: Any, bundle: Any, entrypoint: str) -> str | None:
        asked.append(entrypoint)
        return real(interpreter, bundle, entrypoint)

    monkeypatch.setattr(rego_embedded, "_query", spy)
    program = compiled(tenant_module(DENY_RULES["several: smallest reason then smallest message"]))
    verdict = EmbeddedEngine().evaluate_now(RegoQuery(program, doc()))
    assert (verdict.reason, verdict.message) == (Reason.METHOD_NOT_ALLOWED, "y")
    assert asked == ["sandgate_gateway/deny_sets"]


@pytest.mark.parametrize(
    "tree",
    [
        None,
        {"phase": True},
        {"dest": True, "tenant": True},
        {"dest": {"host": True, "ip": True}, "request": {"method": True}},
        {"request": {"headers": {"x-debug-token": True}, "query": True}},
        {"request": True, "credentials": True, "client": True, "sandbox": True, "version": True},
        {"tenant": {"nested": True}, "dest": {"host": {"x": True}}, "request": {"nope": True}, "zzz": True},
    ],
)
def test_the_projected_input_is_the_projection_of_the_whole_document(tree: Any) -> None:
    from sandgate.policy.rego.input_document import project, projected_input

    request = EgressRequest(
        Phase.REQUEST,
        "api.example.com",
        443,
        "https",
        "POST",
        "/v1/x",
        "api.example.com",
        query="a=1&token=s3cret&a=2",
        headers=(
            ("X-Debug-Token", "1"),
            ("Authorization", "Bearer s3cret"),
            ("Accept", "a"),
            ("accept", "b"),
        ),
        body_size=12,
        client="10.0.0.2",
        credentials=("openai",),
    )
    whole = input_document(WHO, request, "93.184.215.14")
    assert projected_input(WHO, request, "93.184.215.14", tree) == project(whole, tree)
