"""The ceiling's `protocols:` entries (sandgate.policy.ceiling.sections): `policy prove` finds a
tenant section that could allow what an entry denies, and a request to an entry's hosts that
no section decides; the file, line and field of both sides are named."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sandgate.policy.ceiling import effective_rules, load_ceiling, prove_tenants
from sandgate.policy.ceiling.auto import asked_shape, needs_a_person
from sandgate.policy.ceiling.report import Excess, Proof
from sandgate.policy.errors import PolicyLoadError
from sandgate.policy.model.loader import load_policy_dir

CEILING = """
regions:
  - hosts: ["*.acme.example"]
protocols:
  - id: mcp
    hosts: [mcp.acme.example]
    mcp: {tools: {deny: ["delete_*"]}, methods: {deny: ["sampling/*"]}}
  - id: rpc
    hosts: [rpc.acme.example]
    jsonrpc: {methods: {deny: ["admin_*"]}}
  - id: gql
    hosts: [api.acme.example]
    graphql: {operation_types: {deny: [subscription]}, root_fields: {deny: ["mutation.delete*"]}}
"""


def prove(tmp_path: Path, allow: str, *, extra: str = "") -> Proof:
    (tmp_path / "tenants").mkdir(exist_ok=True)
    (tmp_path / "tenants" / "t.yaml").write_text(
        "tenant: t\n" + extra + "allow:\n" + textwrap.indent(textwrap.dedent(allow), "  ")
    )
    (tmp_path / "ceiling.yaml").write_text(textwrap.dedent(CEILING))
    return prove_tenants(effective_rules(load_policy_dir(tmp_path)), load_ceiling(tmp_path / "ceiling.yaml"))


def only(proof: Proof) -> Excess:
    (found,) = proof.excesses
    return found


INSIDE = {
    "allowed tools that no deny glob meets": "- {hosts: [mcp.acme.example], mcp: {tools: {allow: ['get_*', 'search_*']}}}",
    "a tenant deny glob that takes the overlap away": (
        "- {hosts: [mcp.acme.example], mcp: {tools: {allow: ['*'], deny: ['DELETE_*']}}}"
    ),
    "tools never called (tools/call not allowed)": (
        "- {hosts: [mcp.acme.example], mcp: {methods: {allow: [initialize]}, tools: {allow: ['*']}}}"
    ),
    "JSON-RPC methods apart": "- {hosts: [rpc.acme.example], jsonrpc: {methods: {allow: [eth_*]}}}",
    "GraphQL queries only, any field": "- {hosts: [api.acme.example], graphql: {}}",
    "mutations whose fields stay clear of the deny glob": (
        "- {hosts: [api.acme.example], graphql: {operation_types: [query, mutation], "
        "root_fields: {allow: ['create*', 'mutation.update*']}}}"
    ),
    "a sectionless rule whose requests a sectioned one covers": (
        "- {id: mcp, hosts: [mcp.acme.example], paths: [/mcp], mcp: {tools: {allow: [get_x]}}}\n"
        "- {id: more, hosts: [mcp.acme.example], methods: [GET]}"
    ),
    "a sectionless rule elsewhere": "- {hosts: [www.acme.example]}",
}


@pytest.mark.parametrize("allow", INSIDE.values(), ids=INSIDE.keys())
def test_inside(tmp_path: Path, allow: str) -> None:
    proof = prove(tmp_path, allow)
    assert proof.inside, [e.as_dict() for e in proof.excesses]


OUTSIDE = {
    "an allow-everything tool glob": (
        "- {hosts: [mcp.acme.example], mcp: {tools: {allow: ['*']}}}",
        "tools/call of tool 'delete_'",
        "mcp.tools.allow[0] '*' allows it",
        "mcp.tools.deny[0] 'delete_*'",
    ),
    "an allow glob in another case (deny globs match in any case)": (
        "- {hosts: [mcp.acme.example], mcp: {tools: {allow: ['Delete_Repo']}}}",
        "tools/call of tool 'Delete_Repo'",
        "mcp.tools.allow[0] 'Delete_Repo' allows it",
        "mcp.tools.deny[0]",
    ),
    "an ask glob (an approval could allow it)": (
        "- {hosts: [mcp.acme.example], mcp: {tools: {allow: [get_x], ask: ['*_repo']}}}",
        "tools/call of tool 'delete_repo'",
        "mcp.tools.ask[0] '*_repo' allows it",
        "mcp.tools.deny[0]",
    ),
    "an MCP method the ceiling denies": (
        "- {hosts: [mcp.acme.example], mcp: {methods: {allow: ['*']}}}",
        "method 'sampling/'",
        "mcp.methods.allow[0] '*' allows it",
        "mcp.methods.deny[0] 'sampling/*'",
    ),
    "a JSON-RPC method": (
        "- {hosts: [rpc.acme.example], jsonrpc: {methods: {allow: ['*_users']}}}",
        "method 'admin_users'",
        "jsonrpc.methods.allow[0] '*_users' allows it",
        "jsonrpc.methods.deny[0] 'admin_*'",
    ),
    "a GraphQL operation type": (
        "- {hosts: [api.acme.example], graphql: {operation_types: [query, subscription]}}",
        "a subscription operation",
        "graphql.operation_types allows subscription",
        "operation_types.deny",
    ),
    "a mutation root field": (
        "- {hosts: [api.acme.example], graphql: {operation_types: [mutation]}}",
        "mutation root field 'delete'",
        "graphql.root_fields.allow[0] '*' allows it",
        "graphql.root_fields.deny[0] 'mutation.delete*'",
    ),
    "persisted queries run unread": (
        "- {hosts: [api.acme.example], graphql: {persisted_queries: [" + "a" * 64 + "]}}",
        "a persisted query",
        "graphql.persisted_queries",
        "graphql bounds",
    ),
    "a section of another kind": (
        "- {hosts: [rpc.acme.example], mcp: {}}",
        None,
        "its section is 'mcp:', not 'jsonrpc:'",
        "requires a section of kind 'jsonrpc'",
    ),
}


@pytest.mark.parametrize(("allow", "message", "allows", "denies"), OUTSIDE.values(), ids=OUTSIDE.keys())
def test_a_section_that_could_allow_what_the_ceiling_denies(
    tmp_path: Path, allow: str, message: str | None, allows: str, denies: str
) -> None:
    found = only(prove(tmp_path, allow))
    assert found.message == message
    assert found.origin == f"{tmp_path / 'tenants' / 't.yaml'}:3"
    assert allows in found.why and denies in found.why, found.why
    assert f"{tmp_path / 'ceiling.yaml'}:" in found.why  # the entry's file:line
    assert found.example is not None and found.example.method == "POST"


def test_a_host_the_ceiling_bounds_with_no_section_is_found(tmp_path: Path) -> None:
    proof = prove(tmp_path, "- {id: all, hosts: ['*.acme.example']}")
    hosts = set()
    for found in proof.excesses:
        assert found.rule_id == "t/allow/all" and found.example is not None
        assert "no protocol section decides this request" in found.why
        hosts.add(found.example.host)
        entry = {"mcp": "mcp", "rpc": "rpc", "api": "gql"}[found.example.host.split(".")[0]]
        assert f"ceiling/protocols/{entry} " in found.why
    assert hosts == {"mcp.acme.example", "rpc.acme.example", "api.acme.example"}


def test_a_grant_for_a_bounded_host_without_a_section_is_found(tmp_path: Path) -> None:
    (tmp_path / "tenants").mkdir()
    (tmp_path / "tenants" / "t.grants.yaml").write_text(
        "tenant: t\ngrants:\n  - id: 0123456789ab\n    host: rpc.acme.example\n    port: 443\n"
        '    methods: ["*"]\n    paths: ["*"]\n'
    )
    found = only(prove(tmp_path, "- {hosts: [www.acme.example]}"))
    assert found.rule_id == "t/grant/0123456789ab"
    assert found.example is not None and found.example.host == "rpc.acme.example"


def test_deny_rules_take_requests_away_from_the_check(tmp_path: Path) -> None:
    allow = "- {hosts: ['*.acme.example']}\n"
    extra = "deny:\n  - {hosts: [mcp.acme.example, rpc.acme.example, api.acme.example]}\n"
    assert prove(tmp_path, allow, extra=extra).inside


def test_report_mode_is_found_under_every_entry(tmp_path: Path) -> None:
    proof = prove(tmp_path, "- {hosts: [www.acme.example]}", extra="mode: report\n")
    protocol = [e for e in proof.excesses if "protocol section refuses" in e.why]
    assert len(protocol) == 3 and all(e.rule_id == "t/mode" for e in protocol)


def test_a_protocols_entry_names_one_section(tmp_path: Path) -> None:
    path = tmp_path / "ceiling.yaml"
    path.write_text("protocols:\n  - hosts: [a.acme.example]\n    mcp: {}\n    jsonrpc: {}\n")
    with pytest.raises(PolicyLoadError) as e:
        load_ceiling(path)
    assert "exactly one of 'mcp', 'jsonrpc' and 'graphql'" in str(e.value)
    path.write_text("protocols:\n  - hosts: [a.acme.example]\n    mcp: {tools: {deny: ['bad name']}}\n")
    with pytest.raises(PolicyLoadError) as e:
        load_ceiling(path)
    assert "protocols.0.mcp.tools.deny.0" in str(e.value)


def test_automatic_approval_leaves_a_bounded_host_to_people(tmp_path: Path) -> None:
    (tmp_path / "ceiling.yaml").write_text(textwrap.dedent(CEILING))
    ceiling = load_ceiling(tmp_path / "ceiling.yaml")
    why = needs_a_person(asked_shape("mcp.acme.example", 443, None, None), ceiling)
    assert why is not None and "ceiling/protocols/mcp" in why
    assert needs_a_person(asked_shape("www.acme.example", 443, None, None), ceiling) is None
