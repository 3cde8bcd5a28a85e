"""A protocol section (`mcp:`, `jsonrpc:`, `graphql:`) binds its hosts and ports, not only the
requests its own rule allows: whichever rule, grant, ask or report-mode relaxation lets a
request to such a host and port through, its decision carries the section (sandgate.policy.decide).
Two different sections that could apply to one request are refused at load (policy/model/loader.py)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import decide
from sandgate.policy.decision import Decision, EgressRequest, Identity, Mode, Phase
from sandgate.policy.errors import PolicySetError
from sandgate.policy.model.grants import Grant, Grants
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.overrides import decide_readings
from sandgate.policy.protocols.rules import JsonRpcSection, McpSection
from sandgate.policy.reasons import Reason
from sandgate.policy.resolver import StaticResolver

REPO_REGO = Path(__file__).parents[2] / "rules" / "rego"
HOSTS = {
    "mcp.acme.example": ["93.184.216.34"],
    "a.mcp.acme.example": ["93.184.216.34"],
    "other.example": ["93.184.216.35"],
    "byname.example": ["93.184.216.40"],
    "both.example": ["93.184.216.40"],
}
T = Identity("t", "s1")
SECTION = "mcp: {tools: {allow: ['search_*'], deny: ['delete_*']}}"


def load(
    tmp_path: Path, tenant: str, *, grants: str | None = None, files: dict[str, str] | None = None
) -> PolicySet:
    (tmp_path / "tenants").mkdir(parents=True, exist_ok=True)
    (tmp_path / "tenants" / "t.yaml").write_text(textwrap.dedent(tenant))
    if grants is not None:
        (tmp_path / "tenants" / "t.grants.yaml").write_text(textwrap.dedent(grants))
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return load_policy_dir(tmp_path)


def post(
    host: str = "mcp.acme.example", path: str = "/mcp", method: str = "POST", port: int = 443
) -> EgressRequest:
    return EgressRequest(Phase.REQUEST, host, port, scheme="https", method=method, path=path)


async def ask(policy: PolicySet, request: EgressRequest, grants: Grants | None = None) -> Decision:
    return await decide(policy, T, request, StaticResolver(HOSTS), AddressGuard(), grants=grants)


def is_the_section(decision: Decision) -> None:
    assert isinstance(decision.messages, McpSection), f"no section on {decision}"
    assert decision.messages.tools.deny == ["delete_*"]
    assert decision.inspect and not decision.raw_tcp


# Each tenant: a sectioned rule for mcp.acme.example that does not match the request, and another
# rule that does (and is the one the matcher picks), so the request would go on undecided.
BYPASSES = {
    "an exact rule for the same host without a section, listed first": """
        allow:
          - {id: plain, hosts: [mcp.acme.example]}
          - {id: mcp, hosts: [mcp.acme.example], SECTION}
    """,
    "a wildcard rule, when the sectioned rule's path does not match": """
        allow:
          - {id: mcp, hosts: [mcp.acme.example], paths: [/mcp], SECTION}
          - {id: broad, hosts: ["*.acme.example"]}
    """,
    "a hosts * rule, when the sectioned rule's path does not match": """
        allow:
          - {id: mcp, hosts: [mcp.acme.example], paths: [/mcp], SECTION}
          - {id: any, hosts: ["*"]}
    """,
    "a path rule for the same host": """
        allow:
          - {id: rest, hosts: [mcp.acme.example], paths: ["/**"]}
          - {id: mcp, hosts: [mcp.acme.example], SECTION}
    """,
    "a method rule for the same host": """
        allow:
          - {id: mcp, hosts: [mcp.acme.example], methods: [GET], SECTION}
          - {id: posts, hosts: [mcp.acme.example], methods: [POST]}
    """,
    "a sectioned wildcard and an exact rule without one": """
        allow:
          - {id: plain, hosts: [a.mcp.acme.example]}
          - {id: mcp, hosts: ["*.mcp.acme.example"], SECTION}
    """,
}


@pytest.mark.parametrize("rules", BYPASSES.values(), ids=BYPASSES.keys())
async def test_another_allow_rule_for_the_host_still_carries_the_section(tmp_path: Path, rules: str) -> None:
    policy = load(tmp_path, "tenant: t\n" + textwrap.dedent(rules).replace("SECTION", SECTION))
    host = "a.mcp.acme.example" if "a.mcp.acme.example" in rules else "mcp.acme.example"
    d = await ask(policy, post(host, "/MCP"))
    assert d.allowed and d.reason is Reason.ALLOWED
    assert d.rule_id is not None and not d.rule_id.endswith("/mcp"), "the sectioned rule itself matched"
    is_the_section(d)
    # At CONNECT too (the tunnel is intercepted, so every request in it is decided).
    is_the_section(await ask(policy, EgressRequest(Phase.CONNECT, host, 443)))


async def test_a_port_the_section_does_not_cover_gets_no_section(tmp_path: Path) -> None:
    policy = load(
        tmp_path,
        f"""
        tenant: t
        allow:
          - {{id: mcp, hosts: [mcp.acme.example], {SECTION}}}
          - {{id: alt, hosts: [mcp.acme.example], ports: [8443]}}
        """,
    )
    d = await ask(policy, post(port=8443))
    assert d.allowed and d.messages is None


SECTIONED_PATH = textwrap.dedent(f"""
    tenant: t
    allow:
      - {{id: mcp, hosts: [mcp.acme.example], paths: [/mcp], {SECTION}}}
""")


async def test_a_grant_from_the_grants_file_carries_the_section(tmp_path: Path) -> None:
    grants = "tenant: t\ngrants:\n  - id: 0123456789ab\n    host: mcp.acme.example\n    port: 443\n"
    grants += '    methods: ["*"]\n    paths: ["*"]\n'
    policy = load(tmp_path, SECTIONED_PATH, grants=grants)
    d = await ask(policy, post(path="/other"))
    assert d.allowed and d.rule_id is not None and "/grant/" in d.rule_id
    is_the_section(d)


async def test_a_gateway_grant_carries_the_section(tmp_path: Path) -> None:
    policy = load(tmp_path, SECTIONED_PATH)
    grants = Grants([Grant("g1", "t", "s1", "mcp.acme.example", 443)])
    d = await ask(policy, post(path="/other"), grants)
    assert d.allowed and d.rule_id == "t/grant/g1"
    is_the_section(d)


async def test_a_held_request_carries_the_section_so_its_release_does(tmp_path: Path) -> None:
    policy = load(tmp_path, SECTIONED_PATH + "unmatched: ask\n")
    d = await ask(policy, post(path="/other"))
    assert (d.allowed, d.ask, d.reason) == (False, True, Reason.APPROVAL_REQUIRED)
    assert isinstance(d.messages, McpSection)


async def test_an_ask_rule_for_the_host_carries_the_section(tmp_path: Path) -> None:
    policy = load(tmp_path, SECTIONED_PATH + "ask:\n  - {id: more, hosts: [mcp.acme.example]}\n")
    d = await ask(policy, post(path="/other"))
    assert d.ask and d.rule_id == "t/ask/more"
    assert isinstance(d.messages, McpSection)


async def test_report_mode_lets_the_request_through_with_the_section(tmp_path: Path) -> None:
    policy = load(tmp_path, SECTIONED_PATH + "mode: report\n")
    d = await ask(policy, post(path="/other"))
    assert (d.allowed, d.report_only, d.mode) == (True, True, Mode.REPORT)
    assert isinstance(d.messages, McpSection)


async def test_a_method_override_read_by_another_rule_keeps_the_section(tmp_path: Path) -> None:
    policy = load(
        tmp_path,
        f"""
        tenant: t
        allow:
          - {{id: reads, hosts: [mcp.acme.example], methods: [GET]}}
          - {{id: mcp, hosts: [mcp.acme.example], methods: [POST], {SECTION}}}
        """,
    )
    request = EgressRequest(
        Phase.REQUEST,
        "mcp.acme.example",
        443,
        scheme="https",
        method="GET",
        path="/mcp",
        headers=(("X-HTTP-Method-Override", "POST"),),
    )

    async def again(identity: Identity | None, r: EgressRequest, *, address: str | None = None) -> Decision:
        return await decide(policy, identity, r, StaticResolver(HOSTS), AddressGuard(), address=address)

    first = await again(T, request)
    d = await decide_readings(again, T, request, first)
    assert d.allowed and d.rule_id == "t/allow/reads"
    is_the_section(d)


async def test_a_rego_tenant_allowed_by_a_broad_rule_carries_the_section(tmp_path: Path) -> None:
    """Rego can only refuse what the rules allow; what it allows goes on with the section."""
    shutil.copytree(REPO_REGO, tmp_path / "rego")
    module = (
        'package sandgate.tenants.t\nimport rego.v1\ndeny contains "no" if input.request.method == "PUT"\n'
    )
    tenant = f"""
        tenant: t
        rego: [t.rego]
        allow:
          - {{id: mcp, hosts: [mcp.acme.example], paths: [/mcp], {SECTION}}}
          - {{id: broad, hosts: ["*.acme.example"]}}
    """
    policy = load(tmp_path, tenant, files={"tenants/t.rego": module})
    assert policy.tenants["t"].rego is not None
    d = await ask(policy, post(path="/other"))
    assert d.allowed and d.rule_id == "t/allow/broad"
    is_the_section(d)
    # Rego alone allows nothing: no rule for the host, no request.
    d = await ask(policy, post("unnamed.test"))
    assert (d.allowed, d.reason) == (False, Reason.HOST_NOT_ALLOWED)


CIDR_SECTION = """
    tenant: t
    allow:
      - {id: net, cidrs: [93.184.216.0/24], jsonrpc: {methods: {allow: [eth_*]}}}
      - {id: byname, hosts: [byname.example]}
      - {id: anyv4, cidrs: [0.0.0.0/0]}
"""


async def test_a_name_that_resolves_into_a_sectioned_network_carries_its_section(tmp_path: Path) -> None:
    policy = load(tmp_path, CIDR_SECTION)
    d = await ask(policy, post("byname.example"))
    assert d.allowed and d.rule_id == "t/allow/byname" and d.address == "93.184.216.40"
    assert isinstance(d.messages, JsonRpcSection) and d.inspect


async def test_an_ip_literal_allowed_by_a_broader_network_carries_the_section(tmp_path: Path) -> None:
    policy = load(
        tmp_path,
        """
        tenant: t
        allow:
          - {id: anyv4, cidrs: [0.0.0.0/0]}
          - {id: net, cidrs: [93.184.216.0/24], jsonrpc: {methods: {allow: [eth_*]}}}
        """,
    )
    d = await ask(policy, post("93.184.216.7"))
    assert d.allowed and d.rule_id == "t/allow/anyv4"
    assert isinstance(d.messages, JsonRpcSection)


async def test_a_raw_tcp_rule_for_a_name_in_a_sectioned_network_is_intercepted(tmp_path: Path) -> None:
    policy = load(
        tmp_path,
        """
        tenant: t
        allow:
          - {id: net, cidrs: [93.184.216.0/24], jsonrpc: {methods: {allow: [eth_*]}}}
          - {id: raw, hosts: [byname.example], protocol: tcp}
        """,
    )
    d = await ask(policy, EgressRequest(Phase.CONNECT, "byname.example", 443))
    assert d.allowed and d.rule_id == "t/allow/raw"
    assert (d.raw_tcp, d.inspect) == (False, True)
    assert isinstance(d.messages, JsonRpcSection)


async def test_two_different_sections_for_one_request_deny_it(tmp_path: Path) -> None:
    """A name's section and its address's network's section differ: no one section decides."""
    policy = load(
        tmp_path,
        f"""
        tenant: t
        allow:
          - {{id: net, cidrs: [93.184.216.0/24], jsonrpc: {{methods: {{allow: [eth_*]}}}}}}
          - {{id: mcp, hosts: [both.example], {SECTION}}}
        """,
    )
    d = await ask(policy, post("both.example"))
    assert (d.allowed, d.reason) == (False, Reason.POLICY_ERROR)
    assert "t/allow/net" in d.detail and "t/allow/mcp" in d.detail


# --- at load: two sections (or a raw tunnel and a section) for the same requests -------------

CONFLICTS = {
    "an exact host under a wildcard": (
        "{id: a, hosts: [mcp.acme.example], SECTION}",
        "{id: b, hosts: ['*.acme.example'], jsonrpc: {methods: {allow: [x]}}}",
        "'mcp.acme.example' and '*.acme.example'",
    ),
    "a wildcard under a wildcard": (
        "{id: a, hosts: ['*.mcp.acme.example'], SECTION}",
        "{id: b, hosts: ['*.acme.example'], mcp: {tools: {allow: ['*']}}}",
        "'*.mcp.acme.example' and '*.acme.example'",
    ),
    "any host and a named one": (
        "{id: a, hosts: [mcp.acme.example], SECTION}",
        "{id: b, hosts: ['*'], graphql: {}}",
        "'mcp.acme.example' and '*'",
    ),
    "two overlapping networks": (
        "{id: a, cidrs: [93.184.216.0/24], SECTION}",
        "{id: b, cidrs: [93.184.0.0/16], jsonrpc: {methods: {allow: [x]}}}",
        "93.184.216.0/24 and 93.184.0.0/16",
    ),
    "a raw tcp rule on the same host and port": (
        "{id: a, hosts: [mcp.acme.example], SECTION}",
        "{id: b, hosts: [mcp.acme.example], protocol: tcp}",
        "protocol: tcp",
    ),
}


@pytest.mark.parametrize(("first", "second", "named"), CONFLICTS.values(), ids=CONFLICTS.keys())
def test_two_sections_for_the_same_requests_are_refused_at_load(
    tmp_path: Path, first: str, second: str, named: str
) -> None:
    tenant = f"tenant: t\nallow:\n  - {first.replace('SECTION', SECTION)}\n  - {second}\n"
    with pytest.raises(PolicySetError) as e:
        load(tmp_path, tenant)
    (error,) = e.value.errors
    text = str(error)
    where = str(tmp_path / "tenants" / "t.yaml")
    # Both rules, each by file, line and field.
    assert text.startswith(f"{where}:4:")
    assert f"{where}:3:" in text and "allow.0." in text and "allow.1." in text, text
    assert named in text, text


SAME_REQUESTS_FINE = {
    "the same section twice": (
        "{id: a, hosts: [mcp.acme.example], paths: [/mcp], SECTION}",
        "{id: b, hosts: ['*.acme.example'], SECTION}",
    ),
    "disjoint ports": (
        "{id: a, hosts: [mcp.acme.example], SECTION}",
        "{id: b, hosts: ['*.acme.example'], ports: [8443], jsonrpc: {methods: {allow: [x]}}}",
    ),
    "disjoint hosts": (
        "{id: a, hosts: [mcp.acme.example], SECTION}",
        "{id: b, hosts: ['*.other.example', 'example'], jsonrpc: {methods: {allow: [x]}}}",
    ),
    "a raw tcp rule on another port": (
        "{id: a, hosts: [mcp.acme.example], SECTION}",
        "{id: b, hosts: [mcp.acme.example], ports: [5432], protocol: tcp}",
    ),
}


@pytest.mark.parametrize(("first", "second"), SAME_REQUESTS_FINE.values(), ids=SAME_REQUESTS_FINE.keys())
def test_sections_that_never_meet_or_agree_load(tmp_path: Path, first: str, second: str) -> None:
    tenant = f"tenant: t\nallow:\n  - {first.replace('SECTION', SECTION)}\n  - {second.replace('SECTION', SECTION)}\n"
    assert "t" in load(tmp_path, tenant).tenants


def test_a_conflict_with_a_preset_names_the_preset_file(tmp_path: Path) -> None:
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "rpc.yaml").write_text(
        "preset: rpc\nallow:\n  - {id: any, hosts: ['*.acme.example'], jsonrpc: {methods: {allow: [x]}}}\n"
    )
    tenant = f"tenant: t\ninclude: [rpc]\nallow:\n  - {{id: a, hosts: [mcp.acme.example], {SECTION}}}\n"
    with pytest.raises(PolicySetError) as e:
        load(tmp_path, tenant)
    text = str(e.value.errors[0])
    assert str(tmp_path / "presets" / "rpc.yaml") + ":3:" in text and "allow.0.jsonrpc" in text, text
    assert str(tmp_path / "tenants" / "t.yaml") + ":4:" in text and "allow.0.mcp" in text, text
