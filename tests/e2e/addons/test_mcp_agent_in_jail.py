"""An MCP agent behind the gateway, end to end in real network namespaces (issue 26).

The agent is a small script using the official MCP SDK (`streamable_http_client`,
`ClientSession`, the SDK's HTTP client with its defaults): it knows only its URL, the
`GITHUB_TOKEN` placeholder in its environment and whatever proxy and CA its environment
names. The MCP server is the SDK's MCPServer (streamable HTTP) served by uvicorn over TLS
(the test PKI, which the gateway trusts upstream) in an `up` namespace, reached by name
(`mcp.test`, a DNS server there). One scenario, run by the agent from start to end:

1. `tools/list` shows the allowed and the asked-for tools only;
2. a call of the credential's bound tool with the placeholder in its arguments: the tool gets
   the real value and echoes it, the agent reads the placeholder back;
3. a denied tool and an out-of-bounds argument are JSON-RPC errors naming the gateway's
   reason, and the session goes on;
4. an `ask` tool is held for an operator and released by `sandgate requests approve`.

Run in `sandgate jail` (transparent listener, the jail's DNS, CA and placeholder
environment), and again with the same agent in a namespace this module creates, through the
same gateway's explicit listener (its address on that namespace's veth, the sandbox's proxy
token). In both, the asked call waits until `sandgate requests approve` and then completes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml
from conftest import SANDGATE, TOKEN, TOKEN_REF, records_when, wait_quiet, write_gateway_files
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from support import ScriptedDNSServer, TestPKI, free_port, wait_for_port
from support.leftovers import MARKER
from support.netns import Namespace, NetnsLab, in_namespace, netns_lab

pytestmark = [pytest.mark.root, pytest.mark.slow]

MCP_HOST = "mcp.test"
URL = f"https://{MCP_HOST}/mcp"
# A quote, a slash and a non-ASCII letter: JSON escapes each on the way in and on the way back.
SECRET = 'ghp_JAILED/"mcp"-é-0123456789abcdef'
ENV_NAME = "GITHUB_TOKEN"
# Argument values the trail must never show (the placeholder stands where `$token` is written).
TITLE = "flaky-jail-title-4711"
OUT_OF_BOUNDS = "evil/exfiltrate-4711"
QUERY = "secret-query-4711"
MERGED_REPO = "acme/merge-target-4711"

# What the agent does, step by step: (step, tool, arguments).
PLAN: list[tuple[str, str, dict[str, Any]]] = [
    ("bound", "create_issue", {"repo": "acme/api", "title": TITLE, "token": "$token"}),
    ("denied", "delete_repo", {"repo": "acme/api"}),
    ("out_of_bounds", "create_issue", {"repo": OUT_OF_BOUNDS, "title": TITLE, "token": "$token"}),
    ("alive", "search_issues", {"query": QUERY}),
    ("asked", "merge_pull", {"number": 7, "repo": MERGED_REPO}),
    ("after", "search_issues", {"query": "x"}),
]

AGENT = '''
"""An MCP agent: lists the tools, then makes the calls of its plan; one JSON line per step."""
import asyncio
import json
import os
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

URL, PLAN = sys.argv[1], json.loads(sys.argv[2])
TOKEN = os.environ["GITHUB_TOKEN"]  # a placeholder, handed over by the environment


def say(step, **fields):
    print(json.dumps({"step": step, **fields}, ensure_ascii=False), flush=True)


def placed(value):
    """The arguments with the placeholder where the plan says `$token`."""
    if isinstance(value, dict):
        return {k: placed(v) for k, v in value.items()}
    return TOKEN if value == "$token" else value


async def main():
    say("environment", token=TOKEN, environ=dict(os.environ))
    # The SDK's HTTP client with its defaults: the proxy and CA the environment names, if any.
    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120)) as http,
        streamable_http_client(URL, http_client=http, terminate_on_close=False) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = await session.list_tools()
        say("list", tools=sorted(tool.name for tool in listed.tools))
        for step, tool, arguments in PLAN:
            try:
                result = await session.call_tool(tool, placed(arguments))
            except MCPError as e:
                say(step, error={"code": e.code, "message": e.message, "data": e.data})
            else:
                say(step, result=result.model_dump(mode="json"))


asyncio.run(main())
'''

# What the MCP server's tools were called with, in order: (tool, arguments).
SEEN: list[tuple[str, dict[str, Any]]] = []


def mcp_app() -> Any:
    server = MCPServer("sandgate-jail-agent")

    @server.tool()
    def search_issues(query: str) -> str:
        """Search issues."""
        SEEN.append(("search_issues", {"query": query}))
        return f"found: {len(query)} characters"

    @server.tool()
    def create_issue(repo: str, title: str, token: str) -> str:
        """Create an issue with a token (the credential is bound to this tool); echoes the token."""
        SEEN.append(("create_issue", {"repo": repo, "title": title, "token": token}))
        return f"created {len(title)}-character issue in {len(repo)}-character repo with token {token}"

    @server.tool()
    def delete_repo(repo: str) -> str:
        """Delete a repository (denied)."""
        SEEN.append(("delete_repo", {"repo": repo}))
        return "deleted"

    @server.tool()
    def merge_pull(number: int, repo: str) -> str:
        """Merge a pull request (asked for)."""
        SEEN.append(("merge_pull", {"number": number, "repo": repo}))
        return f"merged {number}"

    @server.tool()
    def push_code(branch: str) -> str:
        """Push code (no rule allows it)."""
        SEEN.append(("push_code", {"branch": branch}))
        return "pushed"

    # The Host the server sees names the gateway's destination (mcp.test).
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return server.streamable_http_app(transport_security=security, host=MCP_HOST)


def tenant() -> str:
    doc = {
        "tenant": "t1",
        "mode": "enforce",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        "allow": [
            {
                "id": "mcp",
                "hosts": [MCP_HOST],
                "ports": [443],
                "paths": ["/mcp"],
                "mcp": {
                    "tools": {
                        "allow": ["search_*", "create_issue"],
                        "ask": ["merge_*"],
                        "deny": ["delete_*"],
                        "arguments": {"create_issue": [{"path": "repo", "one_of": ["acme/api", "acme/web"]}]},
                    }
                },
            }
        ],
        "credentials": [
            {
                "name": "gh",
                "secret": "env:SANDGATE_TEST_GH",
                "hosts": [MCP_HOST],
                "ports": [443],
                "tools": ["create_issue"],
                "inject": {"body": True},
                "env": ENV_NAME,
            }
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class Lab:
    nl: NetnsLab
    up: Namespace
    agent_ns: Namespace
    root: Path
    config: Path
    explicit_port: int
    gateway: subprocess.Popen[bytes]

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def audit(self) -> Path:
        return self.state / "audit" / "audit.jsonl"

    def sandgate(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [SANDGATE, *args, "--config", str(self.config)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=guest_environ())

    def records(self, sandbox: str, done: int) -> list[dict[str, Any]]:
        """The sandbox's decision records once `done` of them carry a tool call."""

        def read() -> list[dict[str, Any]]:
            lines = self.audit.read_text().splitlines() if self.audit.exists() else []
            found = [json.loads(line) for line in lines if '"event":"decision"' in line]
            return [r for r in found if r.get("sandbox") == sandbox]

        return records_when(read, lambda rs: len(tool_records(rs)) >= done, timeout=15)


def guest_environ() -> dict[str, str]:
    """The environment for the CLI, the jail and the agent: this process's, which never held
    the secret (only the gateway's environment does), output in UTF-8."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    assert "SANDGATE_TEST_GH" not in env
    return env


@contextlib.contextmanager
def mcp_server(up: Namespace, pki: TestPKI) -> Iterator[None]:
    """The SDK's MCP server in `up` on :443 over TLS, with a leaf for mcp.test from the test CA."""
    cert, key = pki.issue([MCP_HOST], "mcp")
    config = uvicorn.Config(
        mcp_app(), host=up.addr, port=443, ssl_certfile=str(cert), ssl_keyfile=str(key), log_level="warning"
    )
    server = uvicorn.Server(config)

    def start() -> threading.Thread:
        # Started from a thread inside the namespace: the server's thread binds there too.
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        return thread

    thread = in_namespace(up.name, start)
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError("the MCP server did not start")
        time.sleep(0.05)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("mcpjail")
    (root / "agent.py").write_text(AGENT)
    with contextlib.ExitStack() as stack:
        nl = stack.enter_context(netns_lab())
        up, agent_ns = nl.add("up"), nl.add("agent")
        stack.enter_context(mcp_server(up, pki))
        dns = in_namespace(
            up.name, lambda: ScriptedDNSServer(up.addr, 53, records={MCP_HOST: [up.addr]}).start()
        )
        stack.callback(dns.stop)
        transparent_port, dns_port, explicit_port = free_port(), free_port(), free_port()
        config, _ = write_gateway_files(
            root,
            {"t1.yaml": tenant()},
            config={
                "listeners": [
                    # The explicit proxy, on the host's address of the agent namespace's veth.
                    {"host": agent_ns.host_addr, "port": explicit_port},
                    {"mode": "transparent", "host": "0.0.0.0", "port": transparent_port},
                ],
                "dns": {"host": "0.0.0.0", "port": dns_port},
                "resolver": {"hosts": {}, "nameservers": [f"{up.addr}:53"], "ipv6": False},
                "address_guard": {"reachable_by_name": [f"{up.addr}/32"]},
                "upstream": {"trusted_ca": str(pki.ca_file)},
                # A table of its own: concurrent test runs on one host must not replace each other's.
                "host_rules": {"table": f"sgt_{nl.tag}"},
            },
        )
        stack.callback(
            subprocess.run, ["nft", "delete", "table", "inet", f"sgt_{nl.tag}"], capture_output=True
        )
        log = stack.enter_context((root / "gateway.log").open("wb"))
        gateway = subprocess.Popen(
            [SANDGATE, "run", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "SANDGATE_TEST_GH": SECRET, "PYTHONUNBUFFERED": "1"},
        )

        def stop() -> None:
            gateway.terminate()
            try:
                gateway.wait(20)
            except subprocess.TimeoutExpired:
                gateway.kill()
                gateway.wait(5)

        stack.callback(stop)
        try:
            wait_for_port(agent_ns.host_addr, explicit_port, timeout=30)
            wait_for_port("127.0.0.1", transparent_port, timeout=30)
        except TimeoutError:
            raise AssertionError((root / "gateway.log").read_text()) from None
        deadline = time.monotonic() + 30
        while not (root / "state" / "gateway.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield Lab(nl, up, agent_ns, root, config, explicit_port, gateway)


def agent_argv(lab: Lab) -> list[str]:
    plan = json.dumps(PLAN)
    return [sys.executable, str(lab.root / "agent.py"), URL, plan]


def steps(stdout: str) -> dict[str, dict[str, Any]]:
    """The agent's JSON lines by step."""
    found: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        found[json.loads(line)["step"]] = json.loads(line)
    return found


def assert_no_secret(*texts: str) -> None:
    escaped = json.dumps(SECRET)[1:-1]
    ascii_escaped = json.dumps(SECRET, ensure_ascii=True)[1:-1]
    for text in texts:
        for form in (SECRET, escaped, ascii_escaped, "ghp_JAILED"):
            assert form not in text, "the real value reached the agent or the trail"


def text_of(step: dict[str, Any]) -> str:
    assert "result" in step, step
    assert step["result"]["is_error"] is False, step
    return " ".join(c["text"] for c in step["result"]["content"] if c["type"] == "text")


def refusal(step: dict[str, Any]) -> tuple[str, str]:
    """A refused call's JSON-RPC error: the gateway's reason and rule (its `data`)."""
    assert "error" in step, step
    data = step["error"]["data"]
    return data["reason"], data["rule"]


def digest(arguments: dict[str, Any]) -> str:
    """`arguments_sha256` as documented: the sha256 of the arguments' canonical JSON."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def tool_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records of exchanges that carried a tools/call."""
    return [
        r
        for r in records
        if any(m.get("method") == "tools/call" for m in r.get("mcp", {}).get("messages", []))
    ]


def assert_common_scenario(out: dict[str, dict[str, Any]], placeholder: str) -> None:
    """Steps 1 to 3, and the session alive after them, as the agent saw them."""
    assert out["list"]["tools"] == ["create_issue", "merge_pull", "search_issues"]
    assert text_of(out["bound"]).endswith(f"with token {placeholder}"), "the agent reads the placeholder back"
    assert refusal(out["denied"]) == ("tool_denied", "mcp.tools.deny[0]")
    assert refusal(out["out_of_bounds"]) == ("argument_not_allowed", "mcp.tools.arguments[create_issue][0]")
    assert OUT_OF_BOUNDS not in json.dumps(out["out_of_bounds"]["error"]["data"]), "the value is not echoed"
    assert text_of(out["alive"]) == f"found: {len(QUERY)} characters"
    assert text_of(out["after"]) == "found: 1 characters"


def assert_trail(lab: Lab, records: list[dict[str, Any]], placeholder: str, asked: tuple[str, str]) -> None:
    """The records of the agent's tool calls: tools, digests, the credential named, no values."""
    calls = [
        (r["decision"], r["reason"], m["tool"], m["arguments_sha256"])
        for r in tool_records(records)
        for m in r["mcp"]["messages"]
        if m.get("method") == "tools/call"
    ]
    bound = {"repo": "acme/api", "title": TITLE, "token": placeholder}
    outside = {"repo": OUT_OF_BOUNDS, "title": TITLE, "token": placeholder}
    merge = {"number": 7, "repo": MERGED_REPO}
    assert calls == [
        ("allow", "allowed", "create_issue", digest(bound)),
        ("deny", "tool_denied", "delete_repo", digest({"repo": "acme/api"})),
        ("deny", "argument_not_allowed", "create_issue", digest(outside)),
        ("allow", "allowed", "search_issues", digest({"query": QUERY})),
        (*asked, "merge_pull", digest(merge)),
        ("allow", "allowed", "search_issues", digest({"query": "x"})),
    ]
    [injected] = [r for r in tool_records(records) if r.get("credentials")]
    assert (injected["credentials"], injected["injectors"]) == (["gh"], ["body"])
    assert injected["broker"]["tools"] == [{"credential": "gh", "tool": "create_issue"}]
    assert injected["dest"]["host"] == MCP_HOST
    [listing] = [r for r in records if r.get("mcp", {}).get("removed")]
    removed = {"tools/list": {"count": 2, "names": ["delete_repo", "push_code"]}}
    assert listing["mcp"]["removed"] == removed, "the tools/list answer lost what a call would be refused"
    trail = lab.audit.read_text()
    assert_no_secret(trail, (lab.root / "gateway.log").read_text())
    for value in (TITLE, OUT_OF_BOUNDS, QUERY, MERGED_REPO, placeholder):
        assert value not in trail, f"an argument value reached the audit trail: {value}"


def assert_server_saw(placeholder: str, *, merged: bool) -> None:
    """What reached the MCP server: the real secret for the bound tool, never a refused call."""
    expected: list[tuple[str, dict[str, Any]]] = [
        ("create_issue", {"repo": "acme/api", "title": TITLE, "token": SECRET}),
        ("search_issues", {"query": QUERY}),
    ]
    if merged:
        expected.append(("merge_pull", {"number": 7, "repo": MERGED_REPO}))
    expected.append(("search_issues", {"query": "x"}))
    seen = list(SEEN)
    assert seen == expected
    assert placeholder not in json.dumps(seen)


@pytest.mark.usefixtures("one_jail_at_a_time")
def test_an_mcp_agent_in_a_jail_runs_the_whole_scenario(lab: Lab) -> None:
    """Steps 1 to 4 in `sandgate jail`: through its transparent listener the asked call is held
    until `sandgate requests approve`, and then completes."""
    SEEN.clear()
    wait_quiet(lab.audit, 0.3)
    sandbox = f"jail-mcp-{lab.nl.tag}"
    argv = [SANDGATE, "jail", "--config", str(lab.config), "--tenant", "t1", "--sandbox", sandbox, "--"]
    with subprocess.Popen(
        [*argv, *agent_argv(lab)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=guest_environ(),
    ) as agent:
        try:
            pending = held(lab, timeout=60)
            assert (pending["tool"], pending["sandbox"]) == ("merge_pull", sandbox)
            assert agent.poll() is None, "the agent waits while its call is held"
            approved = lab.sandgate("requests", "approve", pending["id"])
            assert approved.returncode == 0, approved.stderr
            stdout, stderr = agent.communicate(timeout=60)
        finally:
            if agent.poll() is None:
                agent.kill()
    assert agent.returncode == 0, stderr + stdout
    out = steps(stdout)

    # The jail handed the agent its placeholder and the gateway's CA, and no proxy.
    environ = out["environment"]["environ"]
    placeholder = out["environment"]["token"]
    assert placeholder.startswith("sgph_") and environ[ENV_NAME] == placeholder
    assert environ["SSL_CERT_FILE"] and environ["SANDGATE_SANDBOX"] == sandbox
    assert not {k for k in environ if k.lower().endswith("_proxy")}
    assert_no_secret(stdout)

    assert_common_scenario(out, placeholder)
    assert text_of(out["asked"]) == "merged 7"
    assert_server_saw(placeholder, merged=True)

    records = lab.records(sandbox, done=7)
    # Its name resolved by the gateway's DNS listener, its calls through the transparent one.
    assert any(r["phase"] == "dns" and r["dest"]["host"] == MCP_HOST for r in records)
    listeners = {r["listener"].split("@")[0] for r in tool_records(records)}
    assert listeners == {"transparent"}, "the jail's calls went through its transparent listener"
    [ask] = [r for r in records if r.get("approval_id") == pending["id"]]
    assert (ask["decision"], ask["mcp"]["messages"][0]["tool"]) == ("ask", "merge_pull")
    assert_trail(lab, [r for r in records if r is not ask], placeholder, asked=("allow", "allowed"))


def held(lab: Lab, timeout: float = 20.0) -> dict[str, Any]:
    """The one access request held now (waits for it)."""
    deadline = time.monotonic() + timeout
    while True:
        out = lab.sandgate("requests", "list", "--format", "json")
        assert out.returncode == 0, out.stderr
        found = [r for r in json.loads(out.stdout)["requests"] if r["state"] == "held"]
        if found:
            assert len(found) == 1, found
            first: dict[str, Any] = found[0]
            return first
        assert time.monotonic() < deadline, "no request was held"
        time.sleep(0.2)


def test_the_same_agent_through_the_explicit_proxy_has_its_asked_call_approved(lab: Lab) -> None:
    """The whole scenario, step 4 included, from a namespace of this module's own through the
    gateway's explicit listener: the asked call waits until `sandgate requests approve`."""
    SEEN.clear()
    wait_quiet(lab.audit, 0.3)
    out = lab.sandgate("credentials", "placeholders", "--sandbox", "sb1", "--format", "json")
    assert out.returncode == 0, out.stderr
    placeholder = json.loads(out.stdout)[ENV_NAME]
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONIOENCODING": "utf-8",
        MARKER: os.environ[MARKER],
        "SSL_CERT_FILE": str(lab.state / "ca" / "mitmproxy-ca-cert.pem"),
        "HTTPS_PROXY": f"http://sb1:{TOKEN}@{lab.agent_ns.host_addr}:{lab.explicit_port}",
        ENV_NAME: placeholder,
    }
    with subprocess.Popen(
        ["ip", "netns", "exec", lab.agent_ns.name, *agent_argv(lab)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as agent:
        try:
            pending = held(lab)
            assert (pending["tool"], pending["host"], pending["sandbox"]) == ("merge_pull", MCP_HOST, "sb1")
            [asked] = pending["tool_calls"]
            assert asked["arguments_sha256"] == digest({"number": 7, "repo": MERGED_REPO})
            assert agent.poll() is None, "the agent waits while its call is held"
            approved = lab.sandgate("requests", "approve", pending["id"])
            assert approved.returncode == 0, approved.stderr
            stdout, stderr = agent.communicate(timeout=60)
        finally:
            if agent.poll() is None:
                agent.kill()
    assert agent.returncode == 0, stderr + stdout
    out_steps = steps(stdout)
    assert_no_secret(stdout)
    assert_common_scenario(out_steps, placeholder)
    assert text_of(out_steps["asked"]) == "merged 7"
    assert_server_saw(placeholder, merged=True)

    records = lab.records("sb1", done=7)
    [ask] = [r for r in records if r.get("approval_id") == pending["id"]]
    assert (ask["decision"], ask["mcp"]["messages"][0]["tool"]) == ("ask", "merge_pull")
    released = [r for r in records if r.get("approval", {}).get("id") == pending["id"]]
    assert [(r["decision"], r["reason"]) for r in released] == [("allow", "allowed")]
    assert_trail(lab, [r for r in records if r is not ask], placeholder, asked=("allow", "allowed"))
