"""`policy test` cases with a body: the allow rule's `mcp:`/`jsonrpc:` section decides it, then
the tenant's Rego each message (phase "message"), as the gateway does; run through
sandgate.policy.policytests and through `sandgate policy test` itself, on the shipped
rules/rego (the mcp_arguments example included)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandgate.policy.policytests import run_case_file

REPO = Path(__file__).resolve().parents[3]
SANDGATE = str(Path(sys.executable).with_name("sandgate"))

TENANT = {
    "tenant": "agents",
    "mode": "enforce",
    "allow": [
        {
            "id": "github-mcp",
            "hosts": ["mcp.github.example"],
            "mcp": {"tools": {"allow": ["search_*", "create_issue"], "deny": ["delete_*"]}},
        },
        {"id": "chain", "hosts": ["rpc.example"], "jsonrpc": {"methods": {"allow": ["eth_*"]}}},
    ],
    "rego": ["agents.rego", "../rego/examples/mcp_arguments.rego"],
    "data": {"mcp_repositories": {"tools": ["create_issue"], "repositories": ["acme/api"]}},
}
MODULE = """package sandgate.tenants.agents

import rego.v1

import data.sandgate.examples.mcp_arguments

deny contains d if some d in mcp_arguments.deny

deny contains {"reason": "policy_denied", "message": "no signing"} if input.jsonrpc.method == "eth_sign"
"""


def call(tool: str, arguments: dict[str, Any], rpc_id: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


MCP = "POST https://mcp.github.example/mcp"
CASES: list[dict[str, Any]] = [
    {
        "name": "an issue in the tenant's repository",
        "tenant": "agents",
        "request": MCP,
        "body": call("create_issue", {"repo": "acme/api", "title": "x"}),
        "expect": {"decision": "allow"},
    },
    {
        "name": "an issue elsewhere is denied by the Rego",
        "tenant": "agents",
        "request": MCP,
        "body": call("create_issue", {"repo": "evil/api", "title": "x"}),
        "expect": {"decision": "deny", "reason": "policy_denied"},
    },
    {
        "name": "a denied tool is the YAML's refusal, with the protocol's reason",
        "tenant": "agents",
        "request": MCP,
        "body": call("delete_repo", {"repo": "acme/api"}),
        "expect": {"decision": "deny", "reason": "tool_denied"},
    },
    {
        "name": "a batch with one refused call is refused",
        "tenant": "agents",
        "request": MCP,
        "body": [call("search_code", {"q": "x"}, 1), call("create_issue", {"repo": "evil/x"}, 2)],
        "expect": {"decision": "deny", "reason": "policy_denied"},
    },
    {
        "name": "a body sent as text is read the one strict way",
        "tenant": "agents",
        "request": MCP,
        "body": '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","name":"y"}}',
        "expect": {"decision": "deny", "reason": "invalid_request"},
    },
    {
        "name": "json-rpc messages are decided by input.jsonrpc",
        "tenant": "agents",
        "request": "POST https://rpc.example/",
        "body": {"jsonrpc": "2.0", "id": 1, "method": "eth_sign", "params": ["0x1", "0x2"]},
        "expect": {"decision": "deny", "reason": "policy_denied"},
    },
    {
        "name": "other json-rpc methods pass",
        "tenant": "agents",
        "request": "POST https://rpc.example/",
        "body": {"jsonrpc": "2.0", "id": 1, "method": "eth_call", "params": []},
        "expect": {"decision": "allow"},
    },
]


def rules_dir(root: Path, cases: list[dict[str, Any]], *, mode: str = "enforce") -> Path:
    rules = root / "rules"
    (rules / "tenants").mkdir(parents=True)
    shutil.copytree(REPO / "rules" / "rego", rules / "rego")
    (rules / "tenants" / "agents.yaml").write_text(yaml.safe_dump({**TENANT, "mode": mode}, sort_keys=False))
    (rules / "tenants" / "agents.rego").write_text(MODULE)
    (rules / "tests").mkdir()
    (rules / "tests" / "agents.yaml").write_text(yaml.safe_dump({"cases": cases}, sort_keys=False))
    return rules


def test_cases_with_bodies_are_decided_by_the_section_then_the_rego(tmp_path: Path) -> None:
    rules = rules_dir(tmp_path, CASES)
    report = run_case_file(rules / "tests" / "agents.yaml")
    assert [(o.name, o.result, o.detail) for o in report.outcomes if o.result != "pass"] == []
    assert len(report.outcomes) == len(CASES)


@pytest.mark.parametrize(
    ("case", "detail"),
    [
        (
            {**CASES[1], "expect": {"decision": "allow"}},
            "expected allow, got deny policy_denied, rule data.sandgate.decision "
            "(tool create_issue may act only on this tenant's repositories)",
        ),
        (
            {**CASES[0], "expect": {"decision": "deny"}},
            "expected deny, got allow allowed, rule agents/allow/github-mcp",
        ),
    ],
    ids=["a rego denial where allow was expected", "an allowed body where a denial was expected"],
)
def test_a_failing_case_says_what_the_rego_said(tmp_path: Path, case: dict[str, Any], detail: str) -> None:
    rules = rules_dir(tmp_path, [case])
    (outcome,) = run_case_file(rules / "tests" / "agents.yaml").outcomes
    assert outcome.result == "fail"
    assert outcome.detail.endswith(detail)


def test_report_mode_cases_say_would_deny(tmp_path: Path) -> None:
    case = {**CASES[1], "expect": {"decision": "would_deny", "reason": "policy_denied"}}
    rules = rules_dir(tmp_path, [case], mode="report")
    (outcome,) = run_case_file(rules / "tests" / "agents.yaml").outcomes
    assert (outcome.result, outcome.detail) == ("pass", "")


def test_sandgate_policy_test_runs_the_example_its_rego_tests_and_the_cases(tmp_path: Path) -> None:
    rules = rules_dir(tmp_path, CASES)
    done = subprocess.run(
        [SANDGATE, "policy", "test", str(rules), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    value = json.loads(done.stdout)
    by_source = {Path(s["source"]).name: s["tests"] for s in value["sources"]}
    assert {t["result"] for t in by_source["mcp_arguments_test.rego"]} == {"pass"}
    assert len(by_source["mcp_arguments_test.rego"]) >= 5
    assert [t["result"] for t in by_source["agents.yaml"]] == ["pass"] * len(CASES)


def test_sandgate_policy_test_fails_on_a_wrong_expectation(tmp_path: Path) -> None:
    rules = rules_dir(tmp_path, [{**CASES[1], "expect": {"decision": "allow"}}])
    done = subprocess.run(
        [SANDGATE, "policy", "test", str(rules)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "expected allow, got deny policy_denied" in done.stdout
