"""Grants in sandgate.policy: the grants file (rendered, parsed back, refused when broken), and
decide (a grant joins the allow rules only: deny rules and the guard refuse first; expiry is
checked at every decision; a sandbox's grant is that sandbox's)."""

from __future__ import annotations

import json
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.ceiling import effective_rules, load_ceiling, prove_tenants
from sandgate.policy.decide import decide
from sandgate.policy.decision import Decision, EgressRequest, Identity, Phase
from sandgate.policy.errors import PolicySetError
from sandgate.policy.model.grants import Grant, Grants, ToolCallAsked, predicate_json, render_grants_file
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.protocols.arguments import ArgumentPredicate
from sandgate.policy.reasons import Reason
from sandgate.policy.resolver import StaticResolver
from sandgate.policy.trace import Outcome, StepName, Trace

BASE = """
deny:
  - id: metadata
    hosts: [metadata.example.com]
"""

ASKER = """
tenant: asker
allow:
  - id: open
    hosts: [open.example.com]
ask:
  - id: more
    hosts: [api.example.com, blocked.example.com, metadata.example.com, inside.example.com]
deny:
  - id: blocked
    hosts: [blocked.example.com]
"""

OTHER = """
tenant: other
allow: []
"""

HOSTS = {
    "api.example.com": ["93.184.216.34"],
    "open.example.com": ["93.184.216.35"],
    "blocked.example.com": ["93.184.216.38"],
    "metadata.example.com": ["93.184.216.39"],
    "inside.example.com": ["10.9.9.9"],
}

A1, A2, OTHER_ID = Identity("asker", "a-1"), Identity("asker", "a-2"), Identity("other", "o-1")
ID1, ID2, ID3 = "0123456789ab0001", "0123456789ab0002", "0123456789ab0003"


def grant(
    gid: str = ID1,
    host: str = "api.example.com",
    *,
    sandbox: str | None = None,
    methods: list[str] | None = None,
    paths: list[str] | None = None,
    expires: float | None = None,
    reason: str | None = "the build needs it",
) -> Grant:
    return Grant(
        id=gid,
        tenant="asker",
        sandbox=sandbox,
        host=host,
        port=443,
        methods=frozenset(methods) if methods is not None else None,
        paths=tuple(paths) if paths is not None else None,
        expires=expires,
        by="alice",
        at=1_790_000_000.0,
        reason=reason,
    )


def write_rules(root: Path, grants: str | None = None) -> Path:
    (root / "tenants").mkdir(parents=True, exist_ok=True)
    (root / "base.yaml").write_text(textwrap.dedent(BASE))
    (root / "tenants" / "asker.yaml").write_text(textwrap.dedent(ASKER))
    (root / "tenants" / "other.yaml").write_text(textwrap.dedent(OTHER))
    if grants is not None:
        (root / "tenants" / "asker.grants.yaml").write_text(grants)
    return root


async def ask(
    policy: PolicySet, identity: Identity, request: EgressRequest, grants: Grants | None = None
) -> Decision:
    return await decide(policy, identity, request, StaticResolver(HOSTS), AddressGuard(), grants=grants)


def http(host: str = "api.example.com", method: str = "GET", path: str = "/v1/items") -> EgressRequest:
    return EgressRequest(Phase.REQUEST, host, 443, scheme="https", method=method, path=path)


def test_a_rendered_grants_file_parses_back_with_its_comments(tmp_path: Path) -> None:
    hostile = "line one\n- id: ffffffffffff\n  host: evil.example.com # and more"
    grants = [
        grant(methods=["GET"], paths=["/v1/items"], reason=hostile),
        grant(ID2, expires=1_890_000_000.0),
    ]
    text = render_grants_file("asker", grants)
    assert "# approval 0123456789ab0001: approved by alice at 2026-09-21T14:13:20Z (scope tenant)" in text
    assert "# why: line one - id: ffffffffffff" in text, "a reason never breaks out of its comment"
    assert "until 2029-" in text
    # Sealed (sandgate.policy.model.grants_seal), and every grant states its methods and paths.
    assert text.startswith("# sandgate-grants-file v1") and "\n# sandgate-grants-file end sha256:" in text
    assert '    methods: ["*"]\n    paths: ["*"]\n' in text
    root = write_rules(tmp_path, text)
    policy = load_policy_dir(root)
    loaded = list(policy.tenants["asker"].grants)
    assert [(g.id, g.host, g.port, g.methods, g.paths, g.sandbox) for g in loaded] == [
        (ID1, "api.example.com", 443, frozenset({"GET"}), ("/v1/items",), None),
        (ID2, "api.example.com", 443, None, None, None),
    ]
    assert loaded[0].reason == hostile and loaded[1].expires == 1_890_000_000.0
    assert loaded[0].origin.endswith("asker.grants.yaml:12")
    assert [d["id"] for d in yaml.safe_load(text)["grants"]] == [ID1, ID2]
    # The grants file is the tenant's: it is in the policy's files and its version.
    assert str(root / "tenants" / "asker.grants.yaml") in policy.files
    assert policy.version != load_policy_dir(write_rules(tmp_path / "bare")).version


async def test_a_tenant_grant_allows_exactly_what_was_approved(tmp_path: Path) -> None:
    text = render_grants_file("asker", [grant(methods=["GET"], paths=["/v1/items"])])
    policy = load_policy_dir(write_rules(tmp_path, text))
    d = await ask(policy, A1, http())
    assert (d.allowed, d.reason, d.rule_id, d.inspect) == (True, Reason.ALLOWED, f"asker/grant/{ID1}", True)
    # Every sandbox of the tenant; no other tenant.
    assert (await ask(policy, A2, http())).allowed
    assert not (await ask(policy, OTHER_ID, http())).allowed
    # The exact path, not a prefix; the method approved, no other: asked about as before.
    for other in (http(path="/v1/items/1"), http(path="/v1"), http(method="POST")):
        d = await ask(policy, A1, other)
        assert (d.allowed, d.ask, d.reason) == (False, True, Reason.APPROVAL_REQUIRED), other
    # Its CONNECT is let through, intercepted, so each request is decided.
    d = await ask(policy, A1, EgressRequest(Phase.CONNECT, "api.example.com", 443))
    assert (d.allowed, d.inspect) == (True, True)
    # Another port is not granted.
    d = await ask(policy, A1, EgressRequest(Phase.CONNECT, "api.example.com", 8443))
    assert not d.allowed


async def test_a_sandbox_grant_is_that_sandboxs_only(tmp_path: Path) -> None:
    policy = load_policy_dir(write_rules(tmp_path))
    grants = Grants([grant(sandbox="a-1")])
    d = await ask(policy, A1, http(), grants)
    assert (d.allowed, d.rule_id, d.inspect) == (True, f"asker/grant/{ID1}", False)
    assert (await ask(policy, A2, http(), grants)).ask
    assert not (await ask(policy, OTHER_ID, http(), grants)).allowed


async def test_an_expired_grant_allows_nothing_before_any_sweep(tmp_path: Path) -> None:
    policy = load_policy_dir(write_rules(tmp_path))
    expires = time.time() + 1.0  # room for a loaded machine to ask before it
    grants = Grants([grant(sandbox="a-1", expires=expires)])
    assert (await ask(policy, A1, http(), grants)).allowed
    time.sleep(max(0.0, expires - time.time()) + 0.05)
    d = await ask(policy, A1, http(), grants)
    assert (d.allowed, d.ask) == (False, True)


@pytest.mark.parametrize(
    ("host", "reason", "rule_id"),
    [
        ("blocked.example.com", Reason.HOST_DENIED, "asker/deny/blocked"),
        ("metadata.example.com", Reason.HOST_DENIED, "base/deny/metadata"),
        ("inside.example.com", Reason.PRIVATE_ADDRESS, None),
    ],
    ids=["the tenant's deny rule wins", "the base deny rule wins", "the address guard wins"],
)
async def test_a_grant_never_beats_a_refusal(
    tmp_path: Path, host: str, reason: Reason, rule_id: str | None
) -> None:
    policy = load_policy_dir(write_rules(tmp_path))
    grants = Grants([grant(host=host), grant(ID2, host=host, sandbox="a-1")])
    d = await ask(policy, A1, EgressRequest(Phase.CONNECT, host, 443), grants)
    assert (d.allowed, d.reason) == (False, reason)
    if rule_id is not None:
        assert d.rule_id == rule_id


async def test_explain_names_the_grant(tmp_path: Path) -> None:
    policy = load_policy_dir(write_rules(tmp_path))
    trace = Trace()
    await decide(
        policy, A1, http(), StaticResolver(HOSTS), AddressGuard(), trace=trace, grants=Grants([grant()])
    )
    [step] = [s for s in trace.steps if s.name is StepName.ALLOW_RULES]
    assert step.outcome is Outcome.OK and ID1 in step.detail


def entry(*lines: str, gid: str = ID1, host: str = "api.example.com", port: str = "443") -> str:
    """A hand-written grants file with one grant: id, host, port, then `lines`."""
    head = f"tenant: asker\ngrants:\n  - id: {gid}\n    host: {host}\n    port: {port}\n"
    return head + "".join(f"    {line}\n" for line in lines)


EXPLICIT = ('methods: ["*"]', 'paths: ["*"]')
SEALED = render_grants_file("asker", [grant(ID2, methods=["GET"], paths=["/v1/other"])])


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (entry(*EXPLICIT, port="0"), ":5:5: grants.0.port: "),
        (entry(*EXPLICIT, gid="nothex"), ":3:5: grants.0.id: "),
        (entry(*EXPLICIT, host="'*.example.com'"), ":4:5: grants.0.host: "),
        ("tenant: other\ngrants: []\n", ":1:1: tenant: "),
        ("tenant: asker\ngrants: [\n", ":3:1: invalid YAML"),
        (entry(), ':3:5: grants.0.methods: missing: name the methods it allows, or write methods: ["*"]'),
        (entry("methods: [GET]"), ":3:5: grants.0.paths: missing: name the paths it allows"),
        (entry("methods:", 'paths: ["*"]'), ":6:5: grants.0.methods: missing"),
        (entry("methods: []", 'paths: ["*"]'), ":6:5: grants.0.methods: List should have at least 1 item"),
        (entry('methods: ["*", GET]', 'paths: ["*"]'), ':6:5: grants.0.methods: "*" means every method'),
        (entry("methods: [GET]", 'paths: ["*", "/v1/**"]'), ':7:5: grants.0.paths: "*" means every path'),
        (entry("methods: [get]", 'paths: ["*"]'), ":6:15: grants.0.methods.0: 'get' is not an upper-case"),
        (
            SEALED[: SEALED.index("    paths:")],
            ":15: the gateway wrote this file (line 1) and its end line is missing",
        ),
        (SEALED.replace("/v1/other", "/v1/**"), ":20: the file does not match the digest on its end line"),
        (SEALED + "  - id: 0123456789ab0009\n", ":20: text after the end line"),
    ],
    ids=[
        "a port out of range",
        "an id that is no approval id",
        "a wildcard host",
        "another tenant's",
        "bad yaml",
        "a grant cut before its methods line",
        "a grant cut before its paths line",
        "methods: with nothing after it",
        "an empty list of methods",
        "every method beside a method",
        "every path beside a path",
        "a method in lower case",
        "a gateway-written file cut short",
        "a gateway-written file changed under its seal",
        "a gateway-written file with a grant added after its end line",
    ],
)
def test_a_broken_grants_file_is_refused_naming_file_and_line(tmp_path: Path, text: str, where: str) -> None:
    root = write_rules(tmp_path, render_grants_file("asker", [grant()]))
    good = load_policy_dir(root, isolate=True)
    (root / "tenants" / "asker.grants.yaml").write_text(text)
    with pytest.raises(PolicySetError) as e:
        load_policy_dir(root)
    assert f"asker.grants.yaml{where}" in str(e.value)
    # The running gateway keeps the tenant's last good version, its grants with it.
    kept = load_policy_dir(root, previous=good, isolate=True)
    assert [g.id for g in kept.tenants["asker"].grants] == [ID1]
    [problem] = kept.problems
    assert problem.kept_last_good and "asker.grants.yaml" in problem.errors[0]


def test_prove_counts_live_grants_among_the_effective_rules(tmp_path: Path) -> None:
    past = time.time() - 10
    grants = [grant(methods=["GET"], paths=["/v1/items"]), grant(ID2, "open.example.com", expires=past)]
    policy = load_policy_dir(write_rules(tmp_path, render_grants_file("asker", grants)))
    asker = next(t for t in effective_rules(policy) if t.tenant == "asker")
    assert [r.rule_id for r in asker.rules] == ["asker/allow/open", f"asker/grant/{ID1}"]
    ceiling = tmp_path / "ceiling.yaml"
    ceiling.write_text("regions:\n  - id: open\n    hosts: [open.example.com]\n")
    proof = prove_tenants(effective_rules(policy), load_ceiling(ceiling))
    assert [x.rule_id for x in proof.excesses] == [f"asker/grant/{ID1}"]
    example = proof.excesses[0].example
    assert example is not None and (example.host, example.path) == ("api.example.com", "/v1/items")


def test_the_dns_listener_answers_a_name_only_a_live_grant_of_the_sandbox_names() -> None:
    grants = Grants(
        [grant(sandbox="a-1", expires=time.time() + 60), grant(ID2, "gone.example.com", expires=1.0)]
    )
    now = time.time()
    assert grants.names_host("asker", "a-1", "api.example.com", now)
    assert not grants.names_host("asker", "a-2", "api.example.com", now), "another sandbox's grant"
    assert not grants.names_host("other", "a-1", "api.example.com", now), "another tenant's"
    assert not grants.names_host("asker", "a-1", "gone.example.com", now), "expired"


REQUESTS = ("GET /v1/items", "POST /v1", "POST /admin", "DELETE /", "GET /v2")


@pytest.mark.parametrize(
    ("lines", "methods", "paths", "allowed", "inspect"),
    [
        (EXPLICIT, None, None, set(REQUESTS), False),
        (('methods: ["*"]', 'paths: ["/v1/**"]'), None, ("/v1/**",), {"GET /v1/items", "POST /v1"}, True),
        (("methods: [POST]", 'paths: ["*"]'), frozenset({"POST"}), None, {"POST /v1", "POST /admin"}, True),
        (("methods:", "  - '*'", "paths:", "  - '*'"), None, None, set(REQUESTS), False),
    ],
    ids=[
        "every method and every path, as a held CONNECT's grant: its tunnel, not intercepted",
        "every method on some paths",
        "one method on every path",
        "every method and path in block style",
    ],
)
async def test_every_method_or_path_is_written_out_and_accepted(
    tmp_path: Path,
    lines: tuple[str, ...],
    methods: frozenset[str] | None,
    paths: tuple[str, ...] | None,
    allowed: set[str],
    inspect: bool,
) -> None:
    policy = load_policy_dir(write_rules(tmp_path, entry(*lines)))
    [loaded] = policy.tenants["asker"].grants
    assert (loaded.methods, loaded.paths) == (methods, paths)
    d = await ask(policy, A1, EgressRequest(Phase.CONNECT, "api.example.com", 443))
    assert (d.allowed, d.inspect) == (True, inspect)
    for request in REQUESTS:
        method, path = request.split(" ")
        d = await ask(policy, A1, http(method=method, path=path))
        assert d.allowed is (request in allowed), request
    # Written back by the gateway, it says the same.
    again = render_grants_file("asker", [loaded])
    root = write_rules(tmp_path / "again", again)
    [back] = load_policy_dir(root).tenants["asker"].grants
    assert (back.methods, back.paths) == (methods, paths)


TOOL_DIGEST = "a" * 64


def tool_grant(**fields: Any) -> Grant:
    """A tool grant on api.example.com:443 POST /mcp for `merge_pull`."""
    base = grant(ID3, methods=["POST"], paths=["/mcp"], sandbox="a-1")
    return replace(base, tool="merge_pull", **fields)


def asked(
    tool: str = "merge_pull", arguments: dict[str, object] | None = None, digest: str = TOOL_DIGEST
) -> ToolCallAsked:
    return ToolCallAsked("api.example.com", 443, "POST", "/mcp", tool, dict(arguments or {}), digest)  # type: ignore[arg-type]


async def test_a_tool_grant_allows_no_request_and_names_no_host(tmp_path: Path) -> None:
    policy = load_policy_dir(write_rules(tmp_path))
    grants = Grants([tool_grant()])
    # The request that would carry the call is still asked about: only the tool call is granted.
    d = await ask(policy, A1, http(method="POST", path="/mcp"), grants)
    assert (d.allowed, d.ask) == (False, True)
    assert not grants.names_host("asker", "a-1", "api.example.com", time.time())
    assert grants.match("asker", "a-1", "api.example.com", 443, "POST", "/mcp", None, time.time()) is None


@pytest.mark.parametrize(
    ("fields", "call", "allowed"),
    [
        ({}, asked(), True),
        ({"arguments_sha256": TOOL_DIGEST}, asked(), True),
        ({"arguments_sha256": "b" * 64}, asked(), False),
        ({}, asked("merge_branch"), False),
        ({"arguments": (ArgumentPredicate(path="n", max=5),)}, asked(arguments={"n": 5}), True),
        ({"arguments": (ArgumentPredicate(path="n", max=5),)}, asked(arguments={"n": 6}), False),
        ({"arguments": (ArgumentPredicate(path="n", max=5),)}, asked(arguments={}), False),
    ],
    ids=[
        "the tool, any arguments",
        "the tool with the digest it names",
        "another digest",
        "another tool",
        "arguments that pass its predicate",
        "arguments that fail its predicate",
        "a missing argument its predicate needs",
    ],
)
def test_a_tool_grant_allows_its_tool_call_only(
    fields: dict[str, Any], call: ToolCallAsked, allowed: bool
) -> None:
    grants = Grants([tool_grant(**fields)])
    found = grants.match_call("asker", "a-1", call, time.time())
    assert (found is not None) is allowed
    assert Grants([grant(sandbox="a-1")]).match_call("asker", "a-1", call, time.time()) is None, (
        "a host grant never releases a tool call"
    )


def test_a_tool_grant_round_trips_through_the_grants_file_and_the_store(tmp_path: Path) -> None:
    predicate = ArgumentPredicate(path="title", glob="fix: *\U0001f600")
    tenant_wide = replace(tool_grant(arguments_sha256=TOOL_DIGEST, arguments=(predicate,)), sandbox=None)
    text = render_grants_file("asker", [tenant_wide])
    assert '    tool: "merge_pull"\n' in text and f'    arguments_sha256: "{TOOL_DIGEST}"\n' in text
    [loaded] = load_policy_dir(write_rules(tmp_path, text)).tenants["asker"].grants
    assert (loaded.tool, loaded.arguments_sha256, shown(loaded)) == (
        "merge_pull",
        TOOL_DIGEST,
        [predicate_json(predicate)],
    )
    stored = Grant.from_json(json.loads(json.dumps(tenant_wide.as_json())), "redis")
    assert (stored.tool, stored.arguments_sha256, shown(stored)) == (
        "merge_pull",
        TOOL_DIGEST,
        [predicate_json(predicate)],
    )


def shown(g: Grant) -> list[dict[str, object]]:
    return [predicate_json(p) for p in g.arguments or ()]


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (f'arguments_sha256: "{TOOL_DIGEST}"', "arguments_sha256 and arguments go with tool"),
        ('tool: "merge_*"', "grants.0.tool"),
        ('tool: "merge_pull"\n    arguments_sha256: "abc"', "grants.0.arguments_sha256"),
    ],
    ids=["a digest without a tool", "a tool glob", "a digest that is none"],
)
def test_a_broken_tool_grant_is_refused(tmp_path: Path, extra: str, problem: str) -> None:
    text = (
        textwrap.dedent(
            f"""\
        tenant: asker
        grants:
          - id: "{ID1}"
            host: api.example.com
            port: 443
            methods: [POST]
            paths: ["/mcp"]
        """
        )
        + f"    {extra}\n"
    )
    with pytest.raises(PolicySetError) as e:
        load_policy_dir(write_rules(tmp_path, text))
    assert problem in str(e.value)
