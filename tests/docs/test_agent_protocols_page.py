"""The manual's worked MCP policy (docs/concepts/agent-protocols.md) loads as a tenant file and
decides tool calls as the page says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.protocols.decide import decide_graphql_body, decide_mcp_body
from sandgate.policy.protocols.list_filter import filter_list_message
from sandgate.policy.protocols.rules import GraphqlSection, McpSection

PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "agent-protocols.md"


@pytest.fixture(scope="module")
def section(tmp_path_factory: pytest.TempPathFactory) -> McpSection:
    # The worked policy: the page's one whole tenant file (its other blocks are fragments).
    (block,) = [
        b
        for b in re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)
        if "tenant: agents" in b and "id: github-mcp" in b
    ]
    rules = tmp_path_factory.mktemp("rules")
    (rules / "tenants").mkdir()
    (rules / "tenants" / "agents.yaml").write_text(block)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AGENT_1_TOKEN", "agent-token-0123456789abcdef")
        policy = load_policy_dir(rules)
    tenant = policy.tenants["agents"]
    (rule,) = [r for r in tenant.allow.rules if r.rule_id.endswith("github-mcp")]
    assert isinstance(rule.messages, McpSection)
    return rule.messages


def call(tool: str, **arguments: object) -> bytes:
    params = {"name": tool, "arguments": arguments}
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (call("get_issue", owner="acme", repo="api", number=1), "allowed"),
        (call("create_issue", owner="acme", repo="web", title="a bug"), "allowed"),
        (call("create_issue", owner="acme", repo="infra", title="a bug"), "argument_not_allowed"),
        (call("create_issue", owner="acme", repo="api"), "argument_not_allowed"),  # no title
        (call("delete_repository", owner="acme", repo="api"), "tool_denied"),
        (call("Delete_Repository", owner="acme", repo="api"), "tool_denied"),  # any case
        (call("merge_pull_request", owner="acme", repo="api"), "tool_not_allowed"),
    ],
)
def test_the_worked_policy_decides_as_the_page_says(section: McpSection, body: bytes, reason: str) -> None:
    verdict, _ = decide_mcp_body(body, section)
    assert verdict.reason == reason


def test_the_worked_policy_lists_as_the_page_says(section: McpSection) -> None:
    names = ["get_issue", "create_issue", "delete_repository", "merge_pull_request"]
    answer: dict[str, object] = {"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": n} for n in names]}}
    _, removed = filter_list_message(section, "tools/list", answer)  # type: ignore[arg-type]
    assert removed == ("delete_repository", "merge_pull_request")
    assert "`delete_repository` and\n  `merge_pull_request` are not listed" in PAGE.read_text()


@pytest.fixture(scope="module")
def graphql_section(tmp_path_factory: pytest.TempPathFactory) -> GraphqlSection:
    """The page's GraphQL policy, loaded as the tenant file it is."""
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)
    (block,) = [b for b in blocks if "tenant: agents" in b and "id: github-graphql" in b]
    rules = tmp_path_factory.mktemp("graphql-rules")
    (rules / "tenants").mkdir()
    (rules / "tenants" / "agents.yaml").write_text(block)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AGENT_1_TOKEN", "agent-token-0123456789abcdef")
        policy = load_policy_dir(rules)
    (rule,) = [r for r in policy.tenants["agents"].allow.rules if r.rule_id.endswith("github-graphql")]
    assert isinstance(rule.messages, GraphqlSection)
    return rule.messages


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("query { viewer { login } }", "allowed"),
        ("mutation { createIssue(title: 1) { id } }", "allowed"),
        ("mutation { deleteRepository(id: 1) { id } }", "field_not_allowed"),
        ("mutation { x: transferRepository(id: 1) { id } }", "field_not_allowed"),  # behind an alias
        ("{ __schema { types { name } } }", "introspection_not_allowed"),
        ("subscription { issues { id } }", "operation_not_allowed"),
    ],
)
def test_the_graphql_policy_decides_as_the_page_says(
    graphql_section: GraphqlSection, query: str, reason: str
) -> None:
    verdict, _ = decide_graphql_body(json.dumps({"query": query}).encode(), graphql_section)
    assert verdict.reason == reason
