"""`sandgate audit query --tool/--rpc-method`, `stats --by tool|rpc-method` and `suggest` over
agent-protocol records.

The trail is written as the gateway writes it: each record is `decision_record`'s, and its
`mcp` or `jsonrpc` object is `body_facts` of the verdict that `decide_mcp_body` /
`decide_jsonrpc_body` gave a real request body under a real rule section; the record's decision
and reason are the body's, as the agent_protocols addon sets them (report mode: the record
allows, its protocol object says would_deny). Files are real; the CLI runs through its `main`.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.audit_trail import at, decision, line

from sandgate.policy.protocols.decide import Verdict, decide_jsonrpc_body, decide_mcp_body
from sandgate.policy.protocols.rules import JsonRpcSection, McpSection
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.protocol_bodies import body_facts
from sandgate.proxy.audit.calls import calls, glob_matches
from sandgate.proxy.cli.main import main

MCP_HOST, RPC_HOST = "mcp.github.test", "rpc.chain.test"
MCP_RULE, RPC_RULE = "t1/allow/github-mcp", "t1/allow/chain"
SECRET = "octo/secret-repo-name"

MCP_RULES: dict[str, Any] = {
    "tools": {
        "allow": ["search_*", "create_issue"],
        "deny": ["delete_*"],
        "arguments": {"create_issue": [{"path": "repo", "one_of": ["octo/api"]}]},
    }
}
MCP_SECTION = McpSection.model_validate(MCP_RULES)
RPC_SECTION = JsonRpcSection.model_validate({"methods": {"allow": ["eth_get*"]}})


def call(tool: str, ident: int = 1, **arguments: Any) -> dict[str, Any]:
    params = {"name": tool, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": params}


def rpc(method: str, ident: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "method": method, "params": {}}


def protocol_record(
    name: str, minutes: float, body: Any, *, jsonrpc: bool = False, report: bool = False, sandbox: str = "sb1"
) -> dict[str, Any]:
    """The record of one POST whose body a rule's section decided."""
    raw = json.dumps(body).encode()
    if jsonrpc:
        section: McpSection | JsonRpcSection = RPC_SECTION
        verdict, read = decide_jsonrpc_body(raw, RPC_SECTION)
    else:
        section = MCP_SECTION
        verdict, read = decide_mcp_body(raw, MCP_SECTION)  # type: ignore[assignment]
    refused = verdict.verdict is not Verdict.ALLOW and not report
    host, rule = (RPC_HOST, RPC_RULE) if jsonrpc else (MCP_HOST, MCP_RULE)
    reason = Reason(str(verdict.reason)) if refused else Reason.ALLOWED
    record = decision(
        name, at(minutes), reason, host, method="POST", path="/mcp", rule_id=rule, sandbox=sandbox
    )
    record.update(body_facts(section, verdict, read, report=report))
    if report:
        record["mode"] = "report"
    return record


TRAIL = [
    protocol_record("m1", 1, call("search_issues", query=SECRET)),
    protocol_record("m2", 2, call("delete_repo", repo=SECRET)),
    protocol_record("m3", 3, call("Delete_Repo", repo="x")),
    protocol_record("m4", 4, call("push_code", branch="main")),
    protocol_record("m5", 5, call("push_code", branch="dev")),
    protocol_record("m6", 6, call("merge_pull", number=7)),
    protocol_record("m7", 7, call("create_issue", repo=SECRET, title="t")),
    protocol_record("m8", 8, [call("search_issues", 1, query="q"), call("push_code", 2, branch="b")]),
    protocol_record("m9", 9, call("list_secrets"), report=True),
    protocol_record("m10", 10, call("list_secrets"), report=True),
    protocol_record("m11", 11, rpc("tasks/get")),
    protocol_record("m12", 12, rpc("tasks/get")),
    protocol_record("j1", 13, rpc("eth_getBalance"), jsonrpc=True),
    protocol_record("j2", 14, rpc("eth_sendTransaction"), jsonrpc=True),
    protocol_record("j3", 15, rpc("eth_sendTransaction"), jsonrpc=True),
    decision("h1", at(16), Reason.HOST_NOT_ALLOWED, "evil.test", method="GET", path="/"),
    decision("h2", at(17), Reason.HOST_NOT_ALLOWED, "evil.test", method="GET", path="/x"),
    protocol_record("o1", 18, call("push_code"), sandbox="sb2"),
]


@pytest.fixture
def trail(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    path.write_text("".join(line(r) for r in TRAIL))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """`sandgate audit ...`'s stdout; it must exit 0 and say nothing on stderr."""
    code = main(["audit", *argv])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    return out


def test_the_trail_is_what_the_gateway_writes() -> None:
    by_id = {r["decision_id"]: r for r in TRAIL}
    assert (by_id["m2"]["decision"], by_id["m2"]["reason"], by_id["m2"]["mcp"]["rule"]) == (
        "deny",
        "tool_denied",
        "mcp.tools.deny[0]",
    )
    assert [m["reason"] for m in by_id["m8"]["mcp"]["messages"]] == ["batch_refused", "tool_not_allowed"]
    assert (by_id["m9"]["decision"], by_id["m9"]["mcp"]["verdict"]) == ("allow", "would_deny")
    assert by_id["m7"]["mcp"]["messages"][0]["rule"] == "mcp.tools.arguments[create_issue][0]"
    assert SECRET not in json.dumps(TRAIL), "an argument value in a record"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--tool", "push_code"], ["m4", "m5", "m8", "o1"]),
        (["--tool", "DELETE_*"], ["m2", "m3"]),
        (["--tool", "list_secret?"], ["m9", "m10"]),
        (["--tool", "search_issues", "--reason", "tool_not_allowed"], ["m8"]),
        (["--tool", "merge_pull", "--tool", "create_issue"], ["m6", "m7"]),
        (["--tool", "push_code", "--sandbox", "sb2"], ["o1"]),
        (["--rpc-method", "tasks/*"], ["m11", "m12"]),
        (["--rpc-method", "eth_send*"], ["j2", "j3"]),
        (["--rpc-method", "tools/call", "--tool", "list_*"], ["m9", "m10"]),
        (["--tool", "eth_*"], []),
        (["--tool", "nothing_called_this"], []),
    ],
    ids=[
        "a tool by name, single calls and a batch member",
        "a glob matches in any case",
        "a question mark is one character",
        "a tool filter ANDs with the record's reason",
        "repeated tool filters OR",
        "a tool filter ANDs with the sandbox",
        "a method glob",
        "a JSON-RPC method",
        "method and tool together",
        "a JSON-RPC method is no tool",
        "nothing matches",
    ],
)
def test_query_by_tool_and_method(
    trail: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: list[str]
) -> None:
    out = run(capsys, "query", "--file", str(trail), "--format", "json", *argv)
    assert [json.loads(x)["decision_id"] for x in out.splitlines()] == expected


def test_stats_by_tool_counts_each_call_by_its_own_verdict(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = json.loads(run(capsys, "stats", "--file", str(trail), "--by", "tool", "--format", "json"))
    assert (document["records"], document["calls"], document["distinct"]) == (18, 12, 7)
    tools = {t["tool"]: t for t in document["tools"]}
    assert [t["tool"] for t in document["tools"]][:2] == ["push_code", "list_secrets"]
    assert tools["push_code"] == {
        "tool": "push_code",
        "calls": 4,
        "verdicts": {"deny": 4},
        "denial_reasons": {"tool_not_allowed": 4},
        "top_hosts": [{"host": MCP_HOST, "count": 4}],
    }
    assert tools["search_issues"]["verdicts"] == {"allow": 1, "deny": 1}
    assert tools["search_issues"]["denial_reasons"] == {"batch_refused": 1}
    assert tools["list_secrets"]["verdicts"] == {"would_deny": 2}
    assert tools["create_issue"]["denial_reasons"] == {"argument_not_allowed": 1}
    assert "Delete_Repo" in tools, "a tool is counted under the name it was called by"


def test_stats_by_tool_top_and_table(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "stats", "--file", str(trail), "--by", "tool", "--top", "1", "--sandbox", "sb1")
    assert out.splitlines() == [
        "17 decision records, 11 tool calls, 7 tools (the 1 most called)",
        "",
        "tool push_code: 3 tool calls",
        "  verdicts: deny 3",
        "  denial reasons: tool_not_allowed 3",
        f"  hosts: {MCP_HOST} 3",
    ]


def test_stats_by_method_counts_mcp_and_jsonrpc_messages(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = json.loads(
        run(capsys, "stats", "--file", str(trail), "--by", "rpc-method", "--format", "json")
    )
    methods = {m["method"]: m for m in document["methods"]}
    assert methods["tools/call"]["calls"] == 12
    assert methods["tasks/get"]["denial_reasons"] == {"rpc_method_not_allowed": 2}
    assert methods["eth_sendTransaction"]["top_hosts"] == [{"host": RPC_HOST, "count": 2}]
    assert methods["eth_getBalance"]["verdicts"] == {"allow": 1}


def rule_block(out: str, rule_id: str) -> list[str]:
    """The comment lines under `# rule <rule_id>, ...`, up to the next rule or the YAML."""
    lines = out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(f"# rule {rule_id},"))
    block = []
    for x in lines[start + 1 :]:
        if x == "#" or not x.startswith("#"):
            break
        block.append(x)
    return [lines[start], *block]


def pasted(block: list[str]) -> dict[str, Any]:
    """The section lines of a block with `# ` removed, as a paste would give them."""
    loaded: dict[str, Any] = yaml.safe_load("\n".join(x[2:] for x in block[1:]))
    return loaded


def test_suggest_proposes_the_section_lines_of_the_rule_that_refused(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run(capsys, "suggest", "--file", str(trail), "--sandbox", "sb1")
    assert [r["hosts"] for r in yaml.safe_load(out)["allow"]] == [["evil.test"]], "new rules stay apart"
    block = rule_block(out, MCP_RULE)
    assert block[0] == (
        f"# rule {MCP_RULE}, host {MCP_HOST} (mcp): 11 refused calls "
        "(tool_not_allowed 6, rpc_method_not_allowed 2, tool_denied 2, argument_not_allowed 1), "
        "2026-11-30T10:02:00Z .. 2026-11-30T10:12:00Z"
    )
    section = pasted(block)
    assert section["mcp"]["tools"] == {"allow": ["list_secrets", "push_code"]}
    methods = section["mcp"]["methods"]["allow"]
    assert methods[-1] == "tasks/get" and "initialize" in methods and "tools/call" in methods
    McpSection.model_validate(section["mcp"])
    notes = [x for x in block if x.startswith("# #   ")]
    assert notes == [
        "# #   Delete_Repo (tool, 1 call): refused by deny glob mcp.tools.deny[0], which wins over any "
        "allow: narrow it by hand",
        "# #   create_issue (tool, 1 call): failed mcp.tools.arguments[create_issue][0]: write that "
        "predicate by hand (the trail has no argument values to suggest one from)",
        "# #   delete_repo (tool, 1 call): refused by deny glob mcp.tools.deny[0], which wins over any "
        "allow: narrow it by hand",
        "# #   merge_pull (tool, 1 call): fewer than --min-count 2",
    ]
    assert "# # if the rule lists its own methods, add only: tasks/get" in block
    assert pasted(rule_block(out, RPC_RULE)) == {"jsonrpc": {"methods": {"allow": ["eth_sendTransaction"]}}}
    assert SECRET not in out


def test_the_suggested_lines_allow_what_was_refused_and_nothing_denied(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run(capsys, "suggest", "--file", str(trail), "--sandbox", "sb1")
    suggested = pasted(rule_block(out, MCP_RULE))["mcp"]
    merged = copy.deepcopy(MCP_RULES)
    merged["tools"]["allow"] += suggested["tools"]["allow"]
    merged["methods"] = suggested["methods"]
    section = McpSection.model_validate(merged)
    for body, allowed in [
        (call("push_code", branch="main"), True),
        (call("list_secrets"), True),
        (rpc("tasks/get"), True),
        (call("delete_repo", repo="x"), False),
        (call("create_issue", repo=SECRET, title="t"), False),
        (call("merge_pull", number=7), False),
    ]:
        verdict, _ = decide_mcp_body(json.dumps(body).encode(), section)
        assert verdict.allowed is allowed, body


def test_suggest_min_count_1_takes_single_refusals_and_sb2_only_its_own(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run(capsys, "suggest", "--file", str(trail), "--sandbox", "sb1", "--min-count", "1")
    assert pasted(rule_block(out, MCP_RULE))["mcp"]["tools"]["allow"] == [
        "list_secrets",
        "merge_pull",
        "push_code",
    ]
    out = run(capsys, "suggest", "--file", str(trail), "--sandbox", "sb2", "--min-count", "1")
    assert pasted(rule_block(out, MCP_RULE)) == {"mcp": {"tools": {"allow": ["push_code"]}}}
    assert RPC_RULE not in out


def test_suggest_sets_aside_protocol_refusals_it_cannot_turn_into_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    resources = McpSection.model_validate({"resources": {"allow": ["repo://octo/*"]}})
    raw = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "file:///etc"}}
    )
    verdict, read = decide_mcp_body(raw.encode(), resources)
    record = decision("r1", at(1), Reason(str(verdict.reason)), MCP_HOST, method="POST", path="/mcp")
    record.update(body_facts(resources, verdict, read, report=False))
    path = tmp_path / "audit.jsonl"
    path.write_text(line(record))
    out = run(capsys, "suggest", "--file", str(path), "--sandbox", "sb1", "--min-count", "1")
    assert "#   1 resource_not_allowed: an mcp.resources list refused it" in out
    assert "# rule" not in out and yaml.safe_load(out) == {"allow": []}


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("delete_*", "delete_repo", True),
        ("delete_*", "DELETE_REPO", True),
        ("*", "", True),
        ("a?c", "abc", True),
        ("a?c", "ac", False),
        ("a.c", "abc", False),
        ("tools/*", "tools/call", True),
        ("[ab]", "a", False),
    ],
    ids=[
        "a star runs on",
        "any case",
        "a star matches nothing",
        "a question mark is one character",
        "and not zero",
        "a dot is a dot",
        "a slash is literal",
        "brackets are literal",
    ],
)
def test_glob_matches(pattern: str, name: str, matches: bool) -> None:
    assert glob_matches(pattern, name) is matches


def test_calls_skip_what_is_malformed() -> None:
    (odd,) = calls({"mcp": {"messages": [1, None, {"method": 3, "tool": ["x"]}]}})
    assert (odd.method, odd.tool, odd.verdict, odd.reason, odd.denied) == (None, None, "-", None, False)
    assert list(calls({"mcp": "nonsense"})) == []
    assert list(calls({"jsonrpc": {"messages": "x"}})) == []
    (one,) = calls(
        {"mcp": {"verdict": "would_deny", "messages": [{"method": "tools/call", "verdict": "deny"}]}}
    )
    assert (one.method, one.verdict, one.denied) == ("tools/call", "would_deny", True)


def test_the_cli_as_a_process_filters_by_tool(trail: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sandgate.proxy.cli.main", "audit", "query", "--file", str(trail),
         "--tool", "push_*", "--format", "table"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    rows = done.stdout.splitlines()[1:]
    assert [row.split()[0:2] for row in rows] == [
        ["2026-11-30T10:04:00Z", "deny"],
        ["2026-11-30T10:05:00Z", "deny"],
        ["2026-11-30T10:08:00Z", "deny"],
        ["2026-11-30T10:18:00Z", "deny"],
    ]
    assert rows[2].endswith(f"{MCP_RULE} tools=search_issues,push_code")
    bad = subprocess.run(
        [sys.executable, "-m", "sandgate.proxy.cli.main", "audit", "stats", "--file", str(trail), "--by", "host"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "--by" in bad.stderr
