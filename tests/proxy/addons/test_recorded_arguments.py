"""`mcp.tools.record`: the argument values a rule asks the audit record to carry (issue 26,
item 7). By default a record holds the arguments' digest only; a rule may name paths whose
values it carries, placeholders masked and long strings cut, for allowed and refused calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TOKEN, tenant_yaml
from mitmproxy import http
from mitmproxy.proxy.layers.http._hooks import HttpRequestHeadersHook, HttpRequestHook, HttpResponseHook
from mitmproxy.test import tflow
from pydantic import ValidationError
from support.inprocess import proxy_flow
from support.whole_pipeline import Pipeline, whole_pipeline

from sandgate.policy.protocols.rules import McpSection
from sandgate.proxy.addons.protocol_bodies import RECORDED_VALUE_MAX, recorded_arguments

PORT = 8080
HOSTS = {"mcp.test": ["127.0.0.2"]}
PLACEHOLDER = "sgph_" + "a" * 32
RULE = {
    "tools": {
        "allow": ["create_issue", "search_*"],
        "deny": ["delete_*"],
        "arguments": {"create_issue": [{"path": "repo", "one_of": ["octo/app"]}]},
        "record": {"create_*": ["repo", "labels[*]"], "delete_*": ["repo"], "CREATE_ISSUE": ["repo"]},
    }
}
SECTION = McpSection.model_validate(RULE)


def test_only_the_named_paths_are_carried_masked_and_bounded() -> None:
    arguments: dict[str, Any] = {
        "repo": f"octo/app {PLACEHOLDER}",
        "labels": ["bug", "x" * 1000, {"nested": 1}],
        "body": "not recorded",
    }
    chosen = recorded_arguments(SECTION, "create_issue", arguments)
    assert chosen == {
        "repo": "octo/app <placeholder>",
        "labels[*]": ["bug", "x" * RECORDED_VALUE_MAX + "...", "<object>"],
    }
    assert recorded_arguments(SECTION, "search_issues", arguments) == {}
    assert recorded_arguments(SECTION, "create_issue", {"title": "no repo"}) == {}


def test_a_bad_path_is_a_load_error_naming_it() -> None:
    with pytest.raises(ValidationError) as info:
        McpSection.model_validate({"tools": {"record": {"t": ["repo..name"]}}})
    assert "record.t.0" in str(info.value).replace(" ", "").replace("\n", ".")


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Pipeline]:
    rules = [{"id": "mcp", "hosts": ["mcp.test"], "ports": [PORT], "mcp": RULE}]
    with whole_pipeline(tmp_path, {"t1.yaml": tenant_yaml("t1", rules)}, HOSTS) as running:
        yield running


async def send(gw: Pipeline, tool: str, arguments: dict[str, Any]) -> http.HTTPFlow:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(
        client,
        f"http://mcp.test:{PORT}/mcp",
        method="POST",
        sandbox="sb1",
        token=TOKEN,
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    await gw.hook(HttpRequestHeadersHook(flow))
    if flow.response is None:
        await gw.hook(HttpRequestHook(flow))
    if flow.response is None:
        flow.response = http.Response.make(200, b'{"jsonrpc":"2.0","id":1,"result":{}}')
    await gw.hook(HttpResponseHook(flow))
    return flow


@pytest.mark.parametrize(
    ("tool", "arguments", "decision", "carried"),
    [
        ("create_issue", {"repo": "octo/app", "title": "secret plans"}, "allow", {"repo": "octo/app"}),
        ("create_issue", {"repo": "evil/x", "title": "secret plans"}, "deny", {"repo": "evil/x"}),
        ("delete_repo", {"repo": "octo/app", "title": "secret plans"}, "deny", {"repo": "octo/app"}),
        ("search_issues", {"repo": "octo/app", "title": "secret plans"}, "allow", None),
    ],
    ids=["allowed", "refused by an argument", "denied tool", "a tool no record entry names"],
)
async def test_the_record_carries_what_the_rule_names_and_nothing_else(
    gw: Pipeline, tool: str, arguments: dict[str, Any], decision: str, carried: dict[str, Any] | None
) -> None:
    await send(gw, tool, arguments)
    (record,) = gw.records()
    assert record["decision"] == decision
    (message,) = record["mcp"]["messages"]
    assert message.get("arguments") == carried
    assert len(message["arguments_sha256"]) == 64
    assert "secret plans" not in json.dumps(record)
