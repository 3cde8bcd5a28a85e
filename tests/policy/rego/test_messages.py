"""Tests for sandgate.policy.rego.messages: the tenant's Rego asked about each message of a body
(phase "message"), all or nothing, failing closed; on the embedded engine and on an OPA server
(the small OPA-compatible server of tests/support: no OPA binary exists here)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.opa_server import FakeOpaServer

from sandgate.policy.decision import EgressRequest, Identity, Phase
from sandgate.policy.protocols.decide import Verdict
from sandgate.policy.protocols.graphql_ops import read_graphql_body
from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.policy.protocols.jsonrpc import parse_jsonrpc
from sandgate.policy.protocols.mcp import parse_mcp
from sandgate.policy.protocols.reasons import ProtocolReason
from sandgate.policy.protocols.rules import GraphqlSection, JsonRpcSection, McpSection
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.compiler import compile_programs
from sandgate.policy.rego.embedded import EmbeddedEngine
from sandgate.policy.rego.message_input import graphql_variables
from sandgate.policy.rego.messages import (
    REGO_RULE,
    decide_messages,
    message_inputs,
    protocol_of,
    reads_messages,
)
from sandgate.policy.rego.opa import OpaEngine
from sandgate.policy.rego.program import RegoModule, RegoProgram
from sandgate.policy.rego.protocol import PolicyEngine, RegoQuery, RegoVerdict
from sandgate.policy.rego.source import module_facts

REPO = Path(__file__).resolve().parents[3]
SHIPPED = (REPO / "rules" / "rego" / "sandgate.rego").read_text()
WHO = Identity("t1", "t1-1")
REQUEST = EgressRequest(Phase.REQUEST, "mcp.test", 443, scheme="https", method="POST", path="/mcp")

REPOSITORIES = """
deny contains {"reason": "policy_denied", "message": "create_issue only in acme's repositories"} if {
\tinput.mcp.tool == "create_issue"
\tnot input.mcp.arguments.repo in {"acme/api", "acme/web"}
}
"""


def program(rules: str) -> RegoProgram:
    modules = (
        RegoModule("rego/sandgate.rego", SHIPPED, module_facts(SHIPPED), operator=True),
        RegoModule(
            "t1.rego",
            text := f"package sandgate.tenants.t1\n\nimport rego.v1\n\n{rules}\n",
            module_facts(text),
        ),
    )
    done, problems = compile_programs([RegoProgram("t1", modules, {})])
    assert not problems, problems
    return done["t1"]


@pytest.fixture(scope="module")
def repositories() -> RegoProgram:
    return program(REPOSITORIES)


def call(tool: str, repo: str, rpc_id: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {"repo": repo}},
    }


async def decide_mcp(engine: PolicyEngine, prog: RegoProgram, body: object) -> Any:
    read = parse_mcp(json.dumps(body))
    inputs = message_inputs(read, session_id="s")
    return await decide_messages(engine, prog, WHO, REQUEST, "93.184.215.14", inputs, batch=read.batch)


@pytest.mark.parametrize(
    ("rules", "protocol", "reads"),
    [
        (REPOSITORIES, "mcp", True),
        (REPOSITORIES, "jsonrpc", False),
        ('deny contains "x" if input.request.method == "DELETE"', "mcp", False),
        ('deny contains "x" if input.jsonrpc.method == "eth_sign"', "jsonrpc", True),
        ('deny contains "x" if input.graphql.operation_type == "mutation"', "graphql", True),
        ('deny contains "x" if input[k] == 1', "mcp", True),
    ],
    ids=[
        "a policy reading input.mcp is asked about mcp bodies",
        "but not about json-rpc bodies",
        "a policy reading only the request is never asked about messages",
        "one reading input.jsonrpc is asked about json-rpc bodies",
        "one reading input.graphql about graphql bodies",
        "one whose input reads cannot be followed is asked (fail closed)",
    ],
)
def test_only_policies_that_read_the_field_are_asked(rules: str, protocol: str, reads: bool) -> None:
    modules = (RegoModule("t1.rego", text := f"package sandgate.tenants.t1\n{rules}\n", module_facts(text)),)
    assert reads_messages(RegoProgram("t1", modules, {}), protocol) is reads
    assert not reads_messages(None, protocol)


def test_each_section_fills_its_own_field() -> None:
    assert protocol_of(McpSection()) == "mcp"
    assert protocol_of(JsonRpcSection()) == "jsonrpc"
    assert protocol_of(GraphqlSection()) == "graphql"


async def test_an_argument_in_the_set_is_allowed(repositories: RegoProgram) -> None:
    verdict = await decide_mcp(EmbeddedEngine(), repositories, call("create_issue", "acme/api", 1))
    assert verdict.allowed and verdict.evaluated == 1 and not verdict.fault
    assert verdict.body.rule == REGO_RULE


async def test_an_argument_outside_the_set_is_denied_with_the_policys_message(
    repositories: RegoProgram,
) -> None:
    verdict = await decide_mcp(EmbeddedEngine(), repositories, call("create_issue", "evil/api", 5))
    assert not verdict.allowed and not verdict.fault
    assert (verdict.body.reason, verdict.body.rule) == (Reason.POLICY_DENIED, REGO_RULE)
    (message,) = verdict.body.messages
    assert (message.id, message.subject) == (5, "create_issue")
    assert message.detail == "create_issue only in acme's repositories"


async def test_a_batch_is_refused_whole_naming_the_denied_member(repositories: RegoProgram) -> None:
    batch = [
        call("search", "evil/x", 1),
        call("create_issue", "evil/api", 2),
        call("create_issue", "acme/web", 3),
    ]
    verdict = await decide_mcp(EmbeddedEngine(), repositories, batch)
    assert verdict.evaluated == 3 and verdict.body.batch
    assert [(m.index, m.verdict, m.reason) for m in verdict.body.messages] == [
        (0, Verdict.DENY, ProtocolReason.BATCH_REFUSED),
        (1, Verdict.DENY, Reason.POLICY_DENIED),
        (2, Verdict.DENY, ProtocolReason.BATCH_REFUSED),
    ]


async def test_a_batch_of_allowed_calls_is_allowed(repositories: RegoProgram) -> None:
    batch = [call("search", "evil/x", 1), call("create_issue", "acme/web", 2)]
    verdict = await decide_mcp(EmbeddedEngine(), repositories, batch)
    assert verdict.allowed and verdict.evaluated == 2


async def test_a_policy_reason_is_kept() -> None:
    prog = program(
        'deny contains {"reason": "rate_limited", "message": "slow down"} if input.mcp.tool == "x"'
    )
    verdict = await decide_mcp(EmbeddedEngine(), prog, call("x", "a/b", 1))
    assert (verdict.body.reason, verdict.body.messages[0].detail) == (Reason.RATE_LIMITED, "slow down")


async def test_json_rpc_params_are_decided() -> None:
    prog = program('deny contains "no signing" if {\n\tinput.jsonrpc.method == "eth_sign"\n}')
    read = parse_jsonrpc(
        b'[{"jsonrpc":"2.0","id":1,"method":"eth_call"},{"jsonrpc":"2.0","id":2,"method":"eth_sign"}]'
    )
    verdict = await decide_messages(
        EmbeddedEngine(), prog, WHO, REQUEST, None, message_inputs(read), batch=read.batch
    )
    assert [m.reason for m in verdict.body.messages] == [ProtocolReason.BATCH_REFUSED, Reason.POLICY_DENIED]


async def test_every_graphql_operation_is_asked_and_variables_are_read() -> None:
    prog = program(
        'deny contains "no deletes" if input.graphql.operation_type == "mutation"\n'
        'deny contains "not that owner" if input.graphql.variables.owner == "evil"'
    )
    engine = EmbeddedEngine()
    # The mutation does not run (operationName names the query), and is refused all the same.
    both: JsonValue = {"query": "query Q { a } mutation M { b }", "operationName": "Q"}
    evil: JsonValue = {
        "query": "query Q($owner: String) { a(owner: $owner) }",
        "variables": {"owner": "evil"},
    }
    fine: JsonValue = {
        "query": "query Q($owner: String) { a(owner: $owner) }",
        "variables": {"owner": "acme"},
    }
    for raw, allowed in ((both, False), (evil, False), (fine, True)):
        requests = read_graphql_body(raw)
        inputs = message_inputs(requests, variables=graphql_variables(raw))
        verdict = await decide_messages(engine, prog, WHO, REQUEST, None, inputs, batch=False)
        assert verdict.allowed is allowed, raw


class BrokenEngine:
    """A real engine that cannot evaluate anything: it raises (as a bug would)."""

    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    async def evaluate(self, query: RegoQuery) -> RegoVerdict:
        self.calls += 1
        raise RuntimeError("the engine broke")

    async def health(self) -> bool:
        return False

    async def close(self) -> None:
        return None


async def test_an_engine_that_raises_refuses_with_policy_error_and_stops(repositories: RegoProgram) -> None:
    engine = BrokenEngine()
    verdict = await decide_mcp(engine, repositories, [call("create_issue", "acme/api", 1), call("x", "a", 2)])
    assert verdict.fault and not verdict.allowed and engine.calls == 1
    assert verdict.body.reason == Reason.POLICY_ERROR
    assert [m.reason for m in verdict.body.messages] == [Reason.POLICY_ERROR, ProtocolReason.BATCH_REFUSED]


@pytest.fixture(scope="module")
def opa() -> Iterator[FakeOpaServer]:
    with FakeOpaServer() as server:
        yield server


async def test_an_opa_server_decides_messages_the_same(opa: FakeOpaServer, repositories: RegoProgram) -> None:
    opa.reset()
    engine = OpaEngine(opa.url, timeout=5.0)
    try:
        await engine.push(repositories.modules, {"t1": {}})
        denied = await decide_mcp(engine, repositories, call("create_issue", "evil/api", 1))
        allowed = await decide_mcp(engine, repositories, call("create_issue", "acme/api", 2))
    finally:
        await engine.close()
    assert (denied.body.reason, denied.body.messages[0].detail) == (
        Reason.POLICY_DENIED,
        "create_issue only in acme's repositories",
    )
    assert allowed.allowed


async def test_an_opa_server_that_times_out_refuses_with_policy_error(
    opa: FakeOpaServer, repositories: RegoProgram
) -> None:
    opa.reset()
    pusher = OpaEngine(opa.url, timeout=5.0)
    try:
        await pusher.push(repositories.modules, {"t1": {}})
    finally:
        await pusher.close()
    engine = OpaEngine(opa.url, timeout=0.2)
    opa.fault, opa.delay = "slow", 1.0
    try:
        verdict = await decide_mcp(engine, repositories, call("create_issue", "acme/api", 1))
    finally:
        opa.reset()
        await engine.close()
    assert verdict.fault and verdict.body.reason == Reason.POLICY_ERROR
    assert "did not answer" in verdict.body.detail
