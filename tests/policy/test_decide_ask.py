"""`ask` rules and `unmatched: ask` in sandgate.policy.decide: refusals first, allow wins, held
decisions checked like allowed ones (resolved, guarded, pinned), report mode never holds."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import decide
from sandgate.policy.decision import Decision, EgressRequest, Identity, Phase
from sandgate.policy.errors import PolicyLoadError
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
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
  - id: api
    hosts: [api.example.com]
    methods: [GET]
ask:
  - id: more
    hosts: [api.example.com, new.example.com, metadata.example.com, blocked.example.com, inside.example.com]
    ports: [443, 8443]
  - id: docs
    hosts: [docs.example.com]
    paths: ["/v1/**"]
deny:
  - id: blocked
    hosts: [blocked.example.com]
"""

OPEN = """
tenant: open
unmatched: ask
allow:
  - id: api
    hosts: [api.example.com]
deny:
  - id: blocked
    hosts: [blocked.example.com]
"""

REPORT = """
tenant: watcher
mode: report
ask:
  - id: more
    hosts: [new.example.com]
"""

HOSTS = {
    "api.example.com": ["93.184.216.34"],
    "new.example.com": ["93.184.216.35"],
    "docs.example.com": ["93.184.216.36"],
    "other.example.com": ["93.184.216.37"],
    "blocked.example.com": ["93.184.216.38"],
    "metadata.example.com": ["169.254.169.254"],
    "inside.example.com": ["10.9.9.9"],
}

ASKER_ID, OPEN_ID, REPORT_ID = Identity("asker", "a-1"), Identity("open", "o-1"), Identity("watcher", "w-1")


def write_rules(root: Path, tenants: dict[str, str]) -> Path:
    (root / "tenants").mkdir(parents=True)
    (root / "base.yaml").write_text(textwrap.dedent(BASE))
    for name, text in tenants.items():
        (root / "tenants" / f"{name}.yaml").write_text(textwrap.dedent(text))
    return root


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> PolicySet:
    root = write_rules(tmp_path_factory.mktemp("rules"), {"asker": ASKER, "open": OPEN, "watcher": REPORT})
    return load_policy_dir(root)


async def ask(policy: PolicySet, identity: Identity, request: EgressRequest) -> Decision:
    return await decide(policy, identity, request, StaticResolver(HOSTS), AddressGuard())


def http(host: str, method: str = "GET", path: str = "/", port: int = 443) -> EgressRequest:
    return EgressRequest(Phase.REQUEST, host, port, scheme="https", method=method, path=path)


async def test_an_ask_rule_holds_what_no_allow_rule_allows(policy: PolicySet) -> None:
    d = await ask(policy, ASKER_ID, EgressRequest(Phase.CONNECT, "new.example.com", 443))
    assert (d.allowed, d.ask, d.reason, d.rule_id) == (
        False,
        True,
        Reason.APPROVAL_REQUIRED,
        "asker/ask/more",
    )
    # Checked as an allowed request would be: resolved, guarded, pinned.
    assert d.address == "93.184.216.35"
    assert d.verdict == "deny"


async def test_allow_wins_over_ask(policy: PolicySet) -> None:
    d = await ask(policy, ASKER_ID, http("api.example.com"))
    assert (d.allowed, d.ask, d.rule_id) == (True, False, "asker/allow/api")
    # A method the allow rule does not name falls to the ask rule.
    d = await ask(policy, ASKER_ID, http("api.example.com", "POST"))
    assert (d.allowed, d.ask, d.reason, d.rule_id) == (
        False,
        True,
        Reason.APPROVAL_REQUIRED,
        "asker/ask/more",
    )


async def test_deny_rules_and_the_guard_refuse_before_any_ask(policy: PolicySet) -> None:
    # The operator's base deny rule.
    d = await ask(policy, ASKER_ID, EgressRequest(Phase.CONNECT, "metadata.example.com", 443))
    assert (d.ask, d.reason, d.rule_id) == (False, Reason.HOST_DENIED, "base/deny/metadata")
    # The tenant's deny rule.
    d = await ask(policy, ASKER_ID, EgressRequest(Phase.CONNECT, "blocked.example.com", 443))
    assert (d.ask, d.reason, d.rule_id) == (False, Reason.HOST_DENIED, "asker/deny/blocked")
    # The guard: an asked name that resolves to an internal address stays refused.
    d = await ask(policy, ASKER_ID, EgressRequest(Phase.CONNECT, "inside.example.com", 443))
    assert (d.allowed, d.ask, d.reason) == (False, False, Reason.PRIVATE_ADDRESS)
    # An internal IP literal is refused at step 2, whatever `unmatched: ask` says.
    d = await ask(policy, OPEN_ID, EgressRequest(Phase.CONNECT, "10.1.2.3", 443))
    assert (d.ask, d.reason) == (False, Reason.PRIVATE_ADDRESS)


async def test_an_asked_name_that_does_not_resolve_is_a_dns_failure(policy: PolicySet) -> None:
    d = await ask(policy, OPEN_ID, EgressRequest(Phase.CONNECT, "nowhere.example.com", 443))
    assert (d.ask, d.reason) == (False, Reason.DNS_FAILURE)


async def test_what_no_ask_rule_names_is_denied_as_before(policy: PolicySet) -> None:
    d = await ask(policy, ASKER_ID, EgressRequest(Phase.CONNECT, "other.example.com", 443))
    assert (d.allowed, d.ask, d.reason) == (False, False, Reason.HOST_NOT_ALLOWED)
    # A port the ask rule does not name.
    d = await ask(policy, ASKER_ID, EgressRequest(Phase.CONNECT, "new.example.com", 8080))
    assert (d.ask, d.reason) == (False, Reason.HOST_NOT_ALLOWED)


async def test_an_ask_rule_with_paths_is_asked_per_request(policy: PolicySet) -> None:
    d = await ask(policy, ASKER_ID, EgressRequest(Phase.CONNECT, "docs.example.com", 443))
    assert (d.ask, d.rule_id, d.inspect) == (True, "asker/ask/docs", True)
    assert (await ask(policy, ASKER_ID, http("docs.example.com", path="/v1/a"))).ask
    d = await ask(policy, ASKER_ID, http("docs.example.com", path="/v2/a"))
    assert (d.ask, d.reason) == (False, Reason.HOST_NOT_ALLOWED)


async def test_unmatched_ask_asks_for_anything_no_rule_allows(policy: PolicySet) -> None:
    d = await ask(policy, OPEN_ID, EgressRequest(Phase.CONNECT, "other.example.com", 443))
    assert (d.ask, d.reason, d.rule_id, d.address) == (
        True,
        Reason.APPROVAL_REQUIRED,
        "open/unmatched",
        "93.184.216.37",
    )
    assert (await ask(policy, OPEN_ID, EgressRequest(Phase.CONNECT, "api.example.com", 443))).allowed
    d = await ask(policy, OPEN_ID, EgressRequest(Phase.CONNECT, "blocked.example.com", 443))
    assert (d.ask, d.reason) == (False, Reason.HOST_DENIED)
    d = await ask(policy, OPEN_ID, EgressRequest(Phase.CONNECT, "metadata.example.com", 443))
    assert (d.ask, d.reason) == (False, Reason.HOST_DENIED)


async def test_report_mode_never_holds(policy: PolicySet) -> None:
    d = await ask(policy, REPORT_ID, EgressRequest(Phase.CONNECT, "new.example.com", 443))
    assert (d.allowed, d.ask, d.report_only, d.reason, d.verdict) == (
        True,
        False,
        True,
        Reason.APPROVAL_REQUIRED,
        "would_deny",
    )


def test_ask_keys_are_checked_like_the_others(tmp_path: Path) -> None:
    bad = """
    tenant: bad
    unmatched: sometimes
    ask:
      - hosts: [API.example.com]
    """
    with pytest.raises(PolicyLoadError) as e:
        load_policy_dir(write_rules(tmp_path, {"bad": bad}))
    text = str(e.value)
    assert "bad.yaml:3" in text and "unmatched" in text
    assert "bad.yaml:5" in text and "ask.0.hosts.0" in text


def test_operator_base_rules_cannot_ask(tmp_path: Path) -> None:
    root = write_rules(tmp_path, {})
    (root / "base.yaml").write_text("ask:\n  - hosts: [x.example.com]\n")
    with pytest.raises(PolicyLoadError, match="ask"):
        load_policy_dir(root)


def test_a_raw_tcp_rule_cannot_be_asked_for(tmp_path: Path) -> None:
    bad = """
    tenant: bad
    ask:
      - hosts: [db.example.com]
        ports: [5432]
        protocol: tcp
    """
    with pytest.raises(PolicyLoadError) as e:
        load_policy_dir(write_rules(tmp_path, {"bad": bad}))
    assert "bad.yaml:6" in str(e.value) and "ask.0.protocol" in str(e.value)


async def test_the_trace_says_the_request_is_held(policy: PolicySet) -> None:
    trace = Trace()
    request = EgressRequest(Phase.CONNECT, "new.example.com", 443)
    d = await decide(policy, ASKER_ID, request, StaticResolver(HOSTS), AddressGuard(), trace=trace)
    assert d.ask
    steps = [(s.name, s.outcome) for s in trace.steps]
    assert (StepName.ALLOW_RULES, Outcome.DENY) in steps
    assert steps[-1] == (StepName.REGO, Outcome.SKIP)
    assert "approval_required" in next(s.detail for s in trace.steps if s.name is StepName.ALLOW_RULES)
