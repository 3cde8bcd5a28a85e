"""Tests for sandgate.policy.decide: the evaluation order, over policies loaded from YAML."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import decide, literal_ip
from sandgate.policy.decision import Decision, EgressRequest, Identity, Mode, Phase
from sandgate.policy.errors import ResolveError
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.reasons import Reason
from sandgate.policy.resolver import Resolution, StaticResolver
from sandgate.policy.trace import REQUEST_ORDER, Outcome, StepName, Trace

R = Reason

BASE = """
deny:
  - id: metadata
    hosts: [metadata.google.internal]
  - id: metadata-net
    cidrs: [169.254.169.254/32]
  - id: bad-net
    cidrs: [93.184.219.0/24]
  - id: no-admin
    hosts: [shop.example.com]
    paths: ["/admin/**"]
"""

ACME = """
tenant: acme
allow:
  - id: api
    hosts: [api.example.com]
  - id: wild
    hosts: ["*.example.com"]
  - id: lab
    cidrs: [10.1.2.0/24]
  - id: unopened-lab
    cidrs: [10.30.0.0/16]
  - id: names
    hosts: [lab.example.net, intranet.example.net, corp.example.net, dual.example.net, gone.example.net]
  - id: docs
    hosts: [docs.example.org]
    methods: [GET]
    paths: ["/v1/**"]
deny:
  - id: blocked
    hosts: [blocked.example.com]
  - id: no-post
    hosts: [api.example.com]
    methods: [POST]
  - id: bad-net
    cidrs: [93.184.217.0/24]
"""

BROAD = """
tenant: broad
allow:
  - id: internet
    cidrs: [0.0.0.0/0, "::/0"]
    ports: [80, 443]
  - id: names
    hosts: [corp.example.net]
"""

ANY = """
tenant: any
allow:
  - id: everything
    hosts: ["*"]
  - id: corp
    hosts: [corp.example.net]
    ports: [8443]
  - id: lab
    cidrs: [10.1.2.0/24]
deny:
  - id: blocked
    hosts: [blocked.example.com]
"""

TRIAL = """
tenant: trial
mode: report
allow:
  - id: api
    hosts: [api.example.com]
deny:
  - id: blocked
    hosts: [blocked.example.com]
"""

HOSTS = {
    "api.example.com": ["93.184.216.34"],
    "www.example.com": ["93.184.216.41"],
    "blocked.example.com": ["93.184.216.40"],
    "lab.example.net": ["10.1.2.5"],
    "intranet.example.net": ["10.9.9.9"],
    "corp.example.net": ["10.20.1.1"],
    "dual.example.net": ["10.9.9.9", "93.184.216.35"],
    "docs.example.org": ["93.184.216.36"],
    "other.test": ["93.184.216.50"],
    "private.test": ["10.9.9.9"],
    "metadata.google.internal": ["169.254.169.254"],
    "meta.example.com": ["169.254.169.254"],
    "bad.example.com": ["93.184.217.7"],
    "worse.example.com": ["93.184.219.9"],
    "mixed.example.com": ["93.184.217.8", "93.184.216.42"],
    "mixed-base.example.com": ["93.184.219.8", "93.184.216.44"],
    "private-then-denied.example.com": ["10.9.9.9", "93.184.217.9"],
    "shop.example.com": ["93.184.216.43"],
    "own.example.com": ["93.184.216.66"],
    "lab.example.com": ["10.1.2.5"],
    "unopened.example.com": ["10.30.0.5"],
    "loop.example.com": ["127.0.0.1"],
    "ecs.example.com": ["169.254.170.2"],
    "mapped-meta.example.com": ["::ffff:169.254.170.2"],
}

ACME_ID = Identity("acme", "acme-1")
BROAD_ID = Identity("broad", "broad-1")
ANY_ID = Identity("any", "any-1")
TRIAL_ID = Identity("trial", "trial-1")


def write_rules(root: Path, base: str | None, tenants: dict[str, str]) -> Path:
    """A rules directory with an optional base and one file per tenant."""
    (root / "tenants").mkdir(parents=True)
    if base is not None:
        (root / "base.yaml").write_text(textwrap.dedent(base))
    for name, text in tenants.items():
        (root / "tenants" / f"{name}.yaml").write_text(textwrap.dedent(text))
    return root


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> PolicySet:
    tenants = {"acme": ACME, "trial": TRIAL, "broad": BROAD, "any": ANY}
    root = write_rules(tmp_path_factory.mktemp("rules"), BASE, tenants)
    return load_policy_dir(root)


def guard() -> AddressGuard:
    """The operator's guard: 10.20.0.0/16 may be reached by name, 10.1.2.0/24 by tenants whose
    own cidr covers it; 93.184.216.66 is the gateway's own address."""
    return AddressGuard(
        reachable_by_name=["10.20.0.0/16"], tenant_reachable=["10.1.2.0/24"], own_addresses=["93.184.216.66"]
    )


class RecordingResolver:
    """A StaticResolver that records every name it is asked for."""

    def __init__(self, hosts: dict[str, list[str]]) -> None:
        self.calls: list[str] = []
        self._inner = StaticResolver(hosts)

    async def resolve(self, host: str) -> Resolution:
        self.calls.append(host)
        return await self._inner.resolve(host)


@dataclass(frozen=True)
class Case:
    """One row of the decision table."""

    why: str
    identity: Identity | None
    host: str
    reason: Reason
    allowed: bool = False
    port: int = 443
    method: str | None = None
    path: str | None = None
    address: str | None = None
    rule_id: str | None = None
    inspect: bool = False
    report_only: bool = False

    def request(self) -> EgressRequest:
        phase = Phase.REQUEST if self.method is not None else Phase.CONNECT
        return EgressRequest(phase, self.host, self.port, method=self.method, path=self.path)


CASES = [
    Case("a request without identity has no identity", None, "api.example.com", R.NO_IDENTITY),
    Case(
        "a tenant that is not defined has no identity",
        Identity("ghost", "g-1"),
        "www.example.com",
        R.NO_IDENTITY,
    ),
    Case("a private literal without a cidr rule is refused", ACME_ID, "10.9.9.9", R.PRIVATE_ADDRESS),
    Case(
        "a private literal covered by a cidr rule is allowed",
        ACME_ID,
        "10.1.2.3",
        R.ALLOWED,
        allowed=True,
        address="10.1.2.3",
        rule_id="acme/allow/lab",
    ),
    Case(
        "the ipv4-mapped spelling of a covered literal is allowed",
        ACME_ID,
        "::ffff:10.1.2.3",
        R.ALLOWED,
        allowed=True,
        address="::ffff:10.1.2.3",
        rule_id="acme/allow/lab",
    ),
    Case("a cidr rule does not cover a port it omits", ACME_ID, "10.1.2.3", R.PRIVATE_ADDRESS, port=22),
    Case("the metadata literal is refused", ACME_ID, "169.254.169.254", R.PRIVATE_ADDRESS),
    Case("the ipv6 loopback literal is refused", ACME_ID, "::1", R.PRIVATE_ADDRESS),
    Case("a public literal no rule names is not allowed", ACME_ID, "93.184.216.34", R.HOST_NOT_ALLOWED),
    Case(
        "a deny rule wins over an allow wildcard",
        ACME_ID,
        "blocked.example.com",
        R.HOST_DENIED,
        rule_id="acme/deny/blocked",
    ),
    Case(
        "a base deny rule holds for a tenant",
        ACME_ID,
        "metadata.google.internal",
        R.HOST_DENIED,
        rule_id="base/deny/metadata",
    ),
    Case("a name no rule names is not allowed", ACME_ID, "other.test", R.HOST_NOT_ALLOWED),
    Case(
        "a port the rule omits is not allowed",
        ACME_ID,
        "api.example.com",
        R.PORT_NOT_ALLOWED,
        port=8443,
        rule_id="acme/allow/api",
    ),
    Case(
        "an allowed name is dialled at the address it resolved to",
        ACME_ID,
        "www.example.com",
        R.ALLOWED,
        allowed=True,
        address="93.184.216.41",
        rule_id="acme/allow/wild",
    ),
    Case(
        "a deny rule on a method makes the connection inspected",
        ACME_ID,
        "api.example.com",
        R.ALLOWED,
        allowed=True,
        address="93.184.216.34",
        rule_id="acme/allow/api",
        inspect=True,
    ),
    Case(
        "a request with a denied method is denied",
        ACME_ID,
        "api.example.com",
        R.HOST_DENIED,
        method="POST",
        path="/",
        rule_id="acme/deny/no-post",
    ),
    Case(
        "a request with another method passes the method deny rule",
        ACME_ID,
        "api.example.com",
        R.ALLOWED,
        allowed=True,
        method="GET",
        path="/",
        address="93.184.216.34",
        rule_id="acme/allow/api",
        inspect=True,
    ),
    Case(
        "a name resolving to a private address is refused", ACME_ID, "intranet.example.net", R.PRIVATE_ADDRESS
    ),
    Case(
        "a name resolving into reachable by name is allowed",
        ACME_ID,
        "corp.example.net",
        R.ALLOWED,
        allowed=True,
        address="10.20.1.1",
        rule_id="acme/allow/names",
    ),
    Case(
        "a name resolving into a tenant cidr rule is allowed",
        ACME_ID,
        "lab.example.net",
        R.ALLOWED,
        allowed=True,
        address="10.1.2.5",
        rule_id="acme/allow/names",
    ),
    Case(
        "a name resolving to private and public addresses is dialled at the public one",
        ACME_ID,
        "dual.example.net",
        R.ALLOWED,
        allowed=True,
        address="93.184.216.35",
        rule_id="acme/allow/names",
    ),
    Case(
        "an allowed name that does not resolve is a dns failure", ACME_ID, "gone.example.net", R.DNS_FAILURE
    ),
    Case(
        "a rule with paths makes the connection inspected",
        ACME_ID,
        "docs.example.org",
        R.ALLOWED,
        allowed=True,
        address="93.184.216.36",
        rule_id="acme/allow/docs",
        inspect=True,
    ),
    Case(
        "a request outside the path globs is not allowed",
        ACME_ID,
        "docs.example.org",
        R.PATH_NOT_ALLOWED,
        method="GET",
        path="/v2/x",
        rule_id="acme/allow/docs",
    ),
    Case(
        "a request with a method the rule omits is not allowed",
        ACME_ID,
        "docs.example.org",
        R.METHOD_NOT_ALLOWED,
        method="DELETE",
        path="/v1/x",
        rule_id="acme/allow/docs",
    ),
    Case(
        "report mode allows a name no rule names and records it",
        TRIAL_ID,
        "other.test",
        R.HOST_NOT_ALLOWED,
        allowed=True,
        address="93.184.216.50",
        report_only=True,
    ),
    Case(
        "report mode allows a port no rule names and records it",
        TRIAL_ID,
        "api.example.com",
        R.PORT_NOT_ALLOWED,
        allowed=True,
        port=8443,
        address="93.184.216.34",
        rule_id="trial/allow/api",
        report_only=True,
    ),
    Case(
        "report mode allows what its rules allow without a record",
        TRIAL_ID,
        "api.example.com",
        R.ALLOWED,
        allowed=True,
        address="93.184.216.34",
        rule_id="trial/allow/api",
    ),
    Case(
        "a name resolving into a tenant deny network is denied by that rule",
        ACME_ID,
        "bad.example.com",
        R.HOST_DENIED,
        rule_id="acme/deny/bad-net",
    ),
    Case(
        "a name resolving into a base deny network is denied by that rule",
        ACME_ID,
        "worse.example.com",
        R.HOST_DENIED,
        rule_id="base/deny/bad-net",
    ),
    Case(
        "a name resolving to the metadata address is denied by the base network rule",
        ACME_ID,
        "meta.example.com",
        R.HOST_DENIED,
        rule_id="base/deny/metadata-net",
    ),
    Case(
        "a name resolving to a denied and an allowed address is dialled at the allowed one",
        ACME_ID,
        "mixed.example.com",
        R.ALLOWED,
        allowed=True,
        address="93.184.216.42",
        rule_id="acme/allow/wild",
    ),
    Case(
        "a name resolving to a base denied and an allowed address is dialled at the allowed one",
        ACME_ID,
        "mixed-base.example.com",
        R.ALLOWED,
        allowed=True,
        address="93.184.216.44",
        rule_id="acme/allow/wild",
    ),
    Case(
        "a name resolving to a private and a denied address is denied by the network rule",
        ACME_ID,
        "private-then-denied.example.com",
        R.HOST_DENIED,
        rule_id="acme/deny/bad-net",
    ),
    Case(
        "a public literal in a tenant deny network is denied",
        ACME_ID,
        "93.184.217.7",
        R.HOST_DENIED,
        rule_id="acme/deny/bad-net",
    ),
    Case(
        "a public literal in a base deny network is denied",
        ACME_ID,
        "93.184.219.9",
        R.HOST_DENIED,
        rule_id="base/deny/bad-net",
    ),
    Case(
        "a base deny rule on a path makes the connection inspected",
        ACME_ID,
        "shop.example.com",
        R.ALLOWED,
        allowed=True,
        address="93.184.216.43",
        rule_id="acme/allow/wild",
        inspect=True,
    ),
    Case(
        "a request on a path a base rule denies is denied",
        ACME_ID,
        "shop.example.com",
        R.HOST_DENIED,
        method="GET",
        path="/admin/users",
        rule_id="base/deny/no-admin",
    ),
    Case(
        "a request on another path passes the base path rule",
        ACME_ID,
        "shop.example.com",
        R.ALLOWED,
        allowed=True,
        method="GET",
        path="/cart",
        address="93.184.216.43",
        rule_id="acme/allow/wild",
        inspect=True,
    ),
    Case(
        "report mode allows a name its own deny rule refuses and records it",
        TRIAL_ID,
        "blocked.example.com",
        R.HOST_DENIED,
        allowed=True,
        address="93.184.216.40",
        rule_id="trial/deny/blocked",
        report_only=True,
    ),
    Case(
        "report mode does not relax a base deny rule on a name",
        TRIAL_ID,
        "metadata.google.internal",
        R.HOST_DENIED,
        rule_id="base/deny/metadata",
    ),
    Case(
        "report mode does not relax a base deny network on a literal",
        TRIAL_ID,
        "93.184.219.9",
        R.HOST_DENIED,
        rule_id="base/deny/bad-net",
    ),
    Case(
        "report mode does not relax a base deny network on a resolved name",
        TRIAL_ID,
        "worse.example.com",
        R.HOST_DENIED,
        rule_id="base/deny/bad-net",
    ),
    Case(
        "report mode does not relax the base metadata network on a resolved name",
        TRIAL_ID,
        "meta.example.com",
        R.HOST_DENIED,
        rule_id="base/deny/metadata-net",
    ),
    Case(
        "report mode does not relax a base deny rule on a path",
        TRIAL_ID,
        "shop.example.com",
        R.HOST_DENIED,
        method="GET",
        path="/admin/users",
        rule_id="base/deny/no-admin",
    ),
    Case(
        "report mode inspects a connection a base path rule needs",
        TRIAL_ID,
        "shop.example.com",
        R.HOST_NOT_ALLOWED,
        allowed=True,
        address="93.184.216.43",
        inspect=True,
        report_only=True,
    ),
    Case("report mode still refuses a private literal", TRIAL_ID, "10.9.9.9", R.PRIVATE_ADDRESS),
    Case("report mode still refuses a name resolving privately", TRIAL_ID, "private.test", R.PRIVATE_ADDRESS),
    Case("report mode still reports a dns failure", TRIAL_ID, "nowhere.test", R.DNS_FAILURE),
    # The guard is the operator's: what a tenant rule can never open (issue 10, item 1).
    *(
        Case(f"a tenant cidr 0.0.0.0/0 does not open {what}", BROAD_ID, literal, R.PRIVATE_ADDRESS, port=80)
        for literal, what in (
            ("127.0.0.1", "ipv4 loopback"),
            ("127.0.0.2", "the rest of 127/8"),
            ("169.254.169.254", "the metadata address"),
            ("169.254.170.2", "the ecs metadata address"),
            ("0.0.0.0", "the unspecified address"),
            ("::1", "ipv6 loopback"),
            ("::", "the ipv6 unspecified address"),
            ("::ffff:127.0.0.1", "ipv4-mapped loopback"),
            ("::ffff:169.254.169.254", "the ipv4-mapped metadata address"),
            ("::7f00:1", "ipv4-compatible loopback"),
            ("64:ff9b::a9fe:a9fe", "the nat64 metadata address"),
            ("2002:a9fe:a9fe::1", "the 6to4 metadata address"),
            ("2001:0:4136:e378:8000:63bf:5601:5601", "a teredo address whose client is metadata"),
            ("fd00:ec2::254", "the aws ipv6 metadata address"),
            ("10.1.2.3", "a private range the operator opens to tenant cidrs that name it"),
            ("10.9.9.9", "a private address"),
            ("10.20.1.1", "a range the operator opens by name only"),
            ("172.16.0.1", "172.16/12"),
            ("192.168.1.1", "192.168/16"),
            ("100.64.0.1", "cgnat"),
            ("fd12::1", "ula"),
            ("fe80::1", "ipv6 link-local"),
            ("169.254.1.1", "ipv4 link-local"),
            ("224.0.0.1", "multicast"),
            ("ff02::1", "ipv6 multicast"),
            ("255.255.255.255", "the broadcast address"),
            ("198.51.100.7", "a reserved address"),
            ("240.0.0.1", "class e"),
            ("93.184.216.66", "the gateway's own public address"),
            ("::ffff:93.184.216.66", "the gateway's own address ipv4-mapped"),
        )
    ),
    Case(
        "a tenant cidr 0.0.0.0/0 allows a public literal",
        BROAD_ID,
        "93.184.216.34",
        R.ALLOWED,
        allowed=True,
        port=80,
        address="93.184.216.34",
        rule_id="broad/allow/internet",
    ),
    Case(
        "a tenant cidr ::/0 allows a public ipv6 literal",
        BROAD_ID,
        "2606:2800:220:1::1",
        R.ALLOWED,
        allowed=True,
        address="2606:2800:220:1::1",
        rule_id="broad/allow/internet",
    ),
    Case(
        "a tenant cidr the operator does not open never opens a private literal",
        ACME_ID,
        "10.30.0.5",
        R.PRIVATE_ADDRESS,
    ),
    Case(
        "a name resolving into a tenant cidr the operator does not open is refused",
        ACME_ID,
        "unopened.example.com",
        R.PRIVATE_ADDRESS,
    ),
    Case(
        "a name resolving to the gateway's own address is refused",
        BROAD_ID,
        "own.example.com",
        R.HOST_NOT_ALLOWED,
    ),
    Case(
        "a name a rule names explicitly reaches a by-name range even for a broad tenant",
        BROAD_ID,
        "corp.example.net",
        R.ALLOWED,
        allowed=True,
        address="10.20.1.1",
        rule_id="broad/allow/names",
    ),
    # hosts: ["*"] (issue 10, item 2).
    Case(
        "hosts star allows a name resolving to a public address",
        ANY_ID,
        "www.example.com",
        R.ALLOWED,
        allowed=True,
        address="93.184.216.41",
        rule_id="any/allow/everything",
    ),
    Case(
        "hosts star does not cover an ip literal",
        ANY_ID,
        "93.184.216.34",
        R.HOST_NOT_ALLOWED,
    ),
    Case(
        "hosts star keeps the default port 443 only",
        ANY_ID,
        "www.example.com",
        R.PORT_NOT_ALLOWED,
        port=80,
        rule_id="any/allow/everything",
    ),
    Case(
        "hosts star does not reach a range the operator opens by name",
        ANY_ID,
        "corp.example.net",
        R.PRIVATE_ADDRESS,
    ),
    Case(
        "a rule naming the host reaches the by-name range where hosts star does not",
        ANY_ID,
        "corp.example.net",
        R.ALLOWED,
        allowed=True,
        port=8443,
        address="10.20.1.1",
        rule_id="any/allow/corp",
    ),
    Case(
        "hosts star reaches an opened range the tenant's own cidr covers",
        ANY_ID,
        "lab.example.com",
        R.ALLOWED,
        allowed=True,
        address="10.1.2.5",
        rule_id="any/allow/everything",
    ),
    Case("hosts star does not reach a metadata address", ANY_ID, "ecs.example.com", R.PRIVATE_ADDRESS),
    Case(
        "hosts star does not reach a mapped metadata address",
        ANY_ID,
        "mapped-meta.example.com",
        R.PRIVATE_ADDRESS,
    ),
    Case("hosts star does not reach loopback", ANY_ID, "loop.example.com", R.PRIVATE_ADDRESS),
    Case("hosts star does not reach the gateway's own address", ANY_ID, "own.example.com", R.PRIVATE_ADDRESS),
    Case("hosts star does not reach a private address", ANY_ID, "intranet.example.net", R.PRIVATE_ADDRESS),
    Case(
        "a tenant deny rule holds against hosts star",
        ANY_ID,
        "blocked.example.com",
        R.HOST_DENIED,
        rule_id="any/deny/blocked",
    ),
    Case(
        "a base deny rule holds against hosts star",
        ANY_ID,
        "metadata.google.internal",
        R.HOST_DENIED,
        rule_id="base/deny/metadata",
    ),
    Case(
        "a base deny network holds against hosts star",
        ANY_ID,
        "worse.example.com",
        R.HOST_DENIED,
        rule_id="base/deny/bad-net",
    ),
    Case(
        "report mode does not open a by-name range to a name no rule names",
        TRIAL_ID,
        "corp.example.net",
        R.PRIVATE_ADDRESS,
    ),
    Case(
        "report mode does not open the gateway's own address", TRIAL_ID, "own.example.com", R.PRIVATE_ADDRESS
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.why for c in CASES])
async def test_decide(policy: PolicySet, case: Case) -> None:
    decision = await decide(policy, case.identity, case.request(), StaticResolver(HOSTS), guard())
    assert decision.reason is case.reason
    assert decision.allowed is case.allowed
    assert decision.address == case.address
    assert decision.rule_id == case.rule_id
    assert decision.inspect is case.inspect
    assert decision.report_only is case.report_only
    assert decision.policy_version == policy.version
    assert decision.verdict == ("would_deny" if case.report_only else "allow" if case.allowed else "deny")
    tenant = policy.tenant(case.identity.tenant) if case.identity else None
    assert decision.mode is (tenant.mode if tenant else Mode.ENFORCE)


@pytest.mark.parametrize("case", CASES, ids=[f"the trace agrees: {c.why}" for c in CASES])
async def test_the_trace_records_the_steps_that_decided(policy: PolicySet, case: Case) -> None:
    """A trace changes nothing and tells the same story: the steps in order, none twice, each
    one taken before the one that decided; a denial's last step denies, an allow has all six."""
    untraced = await decide(policy, case.identity, case.request(), StaticResolver(HOSTS), guard())
    trace = Trace()
    traced = await decide(policy, case.identity, case.request(), StaticResolver(HOSTS), guard(), trace=trace)
    assert traced == untraced
    names = [s.name for s in trace.steps]
    assert names == list(REQUEST_ORDER)[: len(names)]
    outcomes = [s.outcome for s in trace.steps]
    if traced.allowed:
        assert names == list(REQUEST_ORDER)
        assert Outcome.DENY not in outcomes and Outcome.ERROR not in outcomes
        assert (Outcome.WOULD_DENY in outcomes) is traced.report_only
        dialled = [a.address for s in trace.steps for a in s.addresses if a.result == "dial"]
        assert dialled[-1] == traced.address
    else:
        assert outcomes[-1] is Outcome.DENY
        assert Outcome.DENY not in outcomes[:-1]


async def test_a_report_mode_deny_rule_is_traced_as_would_deny(policy: PolicySet) -> None:
    trace = Trace()
    request = EgressRequest(Phase.CONNECT, "blocked.example.com", 443)
    decision = await decide(policy, TRIAL_ID, request, StaticResolver(HOSTS), guard(), trace=trace)
    assert (decision.verdict, decision.reason) == ("would_deny", R.HOST_DENIED)
    assert [(s.name, s.outcome, s.rule_id) for s in trace.steps] == [
        (StepName.IDENTITY, Outcome.OK, None),
        (StepName.ADDRESS_GUARD, Outcome.SKIP, None),
        (StepName.DENY_RULES, Outcome.WOULD_DENY, "trial/deny/blocked"),
        # Allow rules are not asked once a deny rule matched; resolution still runs.
        (StepName.ALLOW_RULES, Outcome.SKIP, None),
        (StepName.RESOLVE, Outcome.OK, None),
        (StepName.REGO, Outcome.SKIP, None),
    ]


async def test_a_dns_failure_is_traced_at_the_resolve_step(policy: PolicySet) -> None:
    trace = Trace()
    request = EgressRequest(Phase.CONNECT, "gone.example.net", 443)
    await decide(policy, ACME_ID, request, StaticResolver(HOSTS), guard(), trace=trace)
    last = trace.steps[-1]
    assert (last.name, last.outcome) == (StepName.RESOLVE, Outcome.DENY)
    assert last.detail.startswith("cannot resolve: ") and "gone.example.net" in last.detail


async def test_a_name_whose_every_address_is_denied_says_so(policy: PolicySet) -> None:
    request = EgressRequest(Phase.CONNECT, "bad.example.com", 443)
    decision = await decide(policy, ACME_ID, request, StaticResolver(HOSTS), guard())
    assert (decision.reason, decision.rule_id, decision.detail) == (
        R.HOST_DENIED,
        "acme/deny/bad-net",
        "every resolved address is refused",
    )


async def test_a_dns_failure_carries_the_resolver_message(policy: PolicySet) -> None:
    request = EgressRequest(Phase.CONNECT, "gone.example.net", 443)
    decision = await decide(policy, ACME_ID, request, StaticResolver(HOSTS), guard())
    assert decision.reason is R.DNS_FAILURE
    assert "gone.example.net" in decision.detail


# --- what is resolved, and what is not ----------------------------------------------------

UNRESOLVED = [
    (None, "www.example.com", "a request without identity"),
    (Identity("ghost", "g-1"), "www.example.com", "a request from an undefined tenant"),
    (ACME_ID, "other.test", "a name the tenant may not reach"),
    (ACME_ID, "blocked.example.com", "a name a deny rule refuses"),
    (ACME_ID, "metadata.google.internal", "a name the base refuses"),
    (ACME_ID, "www.example.com:8443", "a name on a port the rule omits"),
    (ACME_ID, "10.1.2.3", "an address literal"),
    (ACME_ID, "93.184.217.7", "an address literal in a deny network"),
    (TRIAL_ID, "metadata.google.internal", "a name the base refuses in report mode"),
]


@pytest.mark.parametrize(
    ("identity", "target"),
    [c[:2] for c in UNRESOLVED],
    ids=[f"{c[2]} is never resolved" for c in UNRESOLVED],
)
async def test_names_are_resolved_only_once_the_rules_allow_them(
    policy: PolicySet, identity: Identity | None, target: str
) -> None:
    host, _, port = target.partition(":")
    resolver = RecordingResolver(HOSTS)
    await decide(policy, identity, EgressRequest(Phase.CONNECT, host, int(port or 443)), resolver, guard())
    assert resolver.calls == []


async def test_an_allowed_name_is_resolved_once(policy: PolicySet) -> None:
    resolver = RecordingResolver(HOSTS)
    decision = await decide(
        policy, ACME_ID, EgressRequest(Phase.CONNECT, "www.example.com", 443), resolver, guard()
    )
    assert decision.allowed
    assert resolver.calls == ["www.example.com"]


PINNED = [
    ("93.184.216.99", R.ALLOWED, "93.184.216.99", "a pinned public address is dialled as pinned"),
    ("10.9.9.9", R.PRIVATE_ADDRESS, None, "a pinned private address is refused"),
    ("10.20.1.1", R.ALLOWED, "10.20.1.1", "a pinned address reachable by name is dialled"),
    ("10.1.2.9", R.ALLOWED, "10.1.2.9", "a pinned address a tenant cidr rule covers is dialled"),
    ("not-an-address", R.PRIVATE_ADDRESS, None, "a pinned value that is no address is refused"),
    ("93.184.217.8", R.HOST_DENIED, None, "a pinned address in a tenant deny network is refused"),
    ("169.254.169.254", R.HOST_DENIED, None, "a pinned address in a base deny network is refused"),
]


@pytest.mark.parametrize(
    ("pinned", "reason", "address"),
    [c[:3] for c in PINNED],
    ids=[c[3] for c in PINNED],
)
async def test_a_pinned_address_is_rechecked_not_reresolved(
    policy: PolicySet, pinned: str, reason: Reason, address: str | None
) -> None:
    resolver = RecordingResolver(HOSTS)
    request = EgressRequest(Phase.REQUEST, "www.example.com", 443, method="GET", path="/")
    decision = await decide(policy, ACME_ID, request, resolver, guard(), address=pinned)
    assert (decision.reason, decision.address) == (reason, address)
    assert resolver.calls == []


async def test_the_gateway_own_address_is_refused_even_when_public(policy: PolicySet) -> None:
    own = AddressGuard(own_addresses=["93.184.216.41"])
    request = EgressRequest(Phase.CONNECT, "www.example.com", 443)
    decision = await decide(policy, ACME_ID, request, StaticResolver(HOSTS), own)
    assert decision.reason is R.PRIVATE_ADDRESS
    assert not decision.allowed


async def test_a_resolver_error_from_any_resolver_is_a_dns_failure(policy: PolicySet) -> None:
    class Failing:
        async def resolve(self, host: str) -> Resolution:
            raise ResolveError(f"{host}: timed out")

    request = EgressRequest(Phase.CONNECT, "www.example.com", 443)
    decision = await decide(policy, ACME_ID, request, Failing(), guard())
    assert (decision.reason, decision.detail) == (R.DNS_FAILURE, "www.example.com: timed out")


# --- smaller policies -----------------------------------------------------------------------


async def test_a_tenant_without_rules_is_denied_everything(tmp_path: Path) -> None:
    policy = load_policy_dir(write_rules(tmp_path, None, {"empty": "tenant: empty\n"}))
    resolver = RecordingResolver(HOSTS)
    decision = await decide(
        policy,
        Identity("empty", "e-1"),
        EgressRequest(Phase.CONNECT, "www.example.com", 443),
        resolver,
        guard(),
    )
    assert (decision.allowed, decision.reason, decision.rule_id) == (False, R.HOST_NOT_ALLOWED, None)
    assert resolver.calls == []


async def test_a_deny_rule_on_a_path_is_applied_per_request(tmp_path: Path) -> None:
    tenant = """
    tenant: t
    allow:
      - hosts: [git.example.com]
    deny:
      - id: no-admin
        hosts: [git.example.com]
        paths: ["/admin/**"]
    """
    policy = load_policy_dir(write_rules(tmp_path, None, {"t": tenant}))
    resolver = StaticResolver({"git.example.com": ["93.184.216.60"]})
    ident = Identity("t", "t-1")

    connect = await decide(
        policy, ident, EgressRequest(Phase.CONNECT, "git.example.com", 443), resolver, guard()
    )
    admin = EgressRequest(Phase.REQUEST, "git.example.com", 443, method="GET", path="/admin/users")
    repo = EgressRequest(Phase.REQUEST, "git.example.com", 443, method="GET", path="/repo")
    assert (connect.allowed, connect.inspect) == (True, True)
    assert (await decide(policy, ident, admin, resolver, guard())).reason is R.HOST_DENIED
    assert (await decide(policy, ident, repo, resolver, guard())).reason is R.ALLOWED


async def test_a_deny_network_on_a_path_inspects_a_name_that_resolves_into_it(tmp_path: Path) -> None:
    tenant = """
    tenant: t
    allow:
      - hosts: [panel.example.com]
    deny:
      - id: no-admin-net
        cidrs: [93.184.220.0/24]
        paths: ["/admin/**"]
    """
    policy = load_policy_dir(write_rules(tmp_path, None, {"t": tenant}))
    resolver = StaticResolver({"panel.example.com": ["93.184.220.5"]})
    ident = Identity("t", "t-1")
    admin = EgressRequest(Phase.REQUEST, "panel.example.com", 443, method="GET", path="/admin/x")
    assert (await decide(policy, ident, admin, resolver, guard())).rule_id == "t/deny/no-admin-net"
    connect = await decide(
        policy, ident, EgressRequest(Phase.CONNECT, "panel.example.com", 443), resolver, guard()
    )
    assert (connect.allowed, connect.address) == (True, "93.184.220.5")
    assert connect.inspect, "a tunnel passed through untouched never meets the per-request deny rule"


# --- values ----------------------------------------------------------------------------------


def test_the_zero_decision_denies() -> None:
    zero = Decision()
    assert (zero.allowed, zero.reason, zero.verdict, zero.address) == (False, R.INTERNAL_ERROR, "deny", None)


LITERALS = [
    ("10.1.2.3", "10.1.2.3", "a dotted quad is a literal"),
    ("::1", "::1", "an ipv6 address is a literal"),
    ("example.com", None, "a name is not a literal"),
    ("1.2.3.example", None, "a name with numeric labels is not a literal"),
    ("", None, "an empty host is not a literal"),
]


@pytest.mark.parametrize(
    ("host", "expected"),
    [c[:2] for c in LITERALS],
    ids=[c[2] for c in LITERALS],
)
def test_literal_ip(host: str, expected: str | None) -> None:
    ip = literal_ip(host)
    assert (str(ip) if ip is not None else None) == expected


@pytest.mark.parametrize(
    ("tenant", "host", "rule_id"),
    [
        ("acme", "blocked.example.com", "acme/deny/blocked"),  # the tenant's own, outright
        ("acme", "metadata.google.internal", "base/deny/metadata"),  # the operator's
        ("any", "metadata.google.internal", "base/deny/metadata"),  # whatever `*` allows
        ("acme", "api.example.com", None),  # denied for POST only: still looked up
        ("acme", "shop.example.com", None),  # denied under /admin/** only
        ("trial", "blocked.example.com", None),  # report mode relaxes its own deny rules
        ("any", "www.example.com", None),
    ],
)
def test_a_name_refused_outright_is_never_looked_up(
    policy: PolicySet, tenant: str, host: str, rule_id: str | None
) -> None:
    """What the DNS listener and the transparent SNI check ask before resolving a name."""
    t = policy.tenant(tenant)
    assert t is not None
    refused = t.refuses_name(host)
    assert (refused.rule_id if refused is not None else None) == rule_id
