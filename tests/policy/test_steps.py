"""sandgate.policy.steps: the steps the gateway used to take around `decide` (the reserved name,
the credentials bound to a destination) and the DNS listener's order (`decide_name`), as steps
of the one path, with their trace."""

from __future__ import annotations

import shutil
import textwrap
import time
from pathlib import Path

import pytest

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import CredentialBindings, credential_interception, decide, decide_name
from sandgate.policy.decision import Decision, EgressRequest, Identity, Mode, Phase
from sandgate.policy.model.grants import Grant, Grants
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.reasons import Reason
from sandgate.policy.resolver import StaticResolver
from sandgate.policy.trace import REQUEST_ORDER, Outcome, StepName, Trace

REPO_REGO = Path(__file__).parents[2] / "rules" / "rego" / "sandgate.rego"
BASE = """
deny:
  - id: never
    hosts: [never.test]
"""
ACME = """
tenant: acme
allow:
  - id: api
    hosts: [api.test]
deny:
  - id: blocked
    hosts: [blocked.test]
rego: [acme.rego]
"""
TRIAL = """
tenant: trial
mode: report
allow:
  - id: api
    hosts: [api.test, blocked.test]
deny:
  - id: blocked
    hosts: [blocked.test]
"""
# Denies a request Rego is told carries the bound credential to a path it must not reach.
ACME_REGO = """package sandgate.tenants.acme

import rego.v1

deny contains "not with the key" if {
	"key" in input.credentials
	input.request.path == "/no-key"
}
"""
HOSTS = {"api.test": ["93.184.216.34"], "granted.test": ["93.184.216.35"]}
ACME_ID, TRIAL_ID, GONE = Identity("acme", "a-1"), Identity("trial", "t-1"), Identity("gone", "g-1")


class Bound:
    """A real in-memory CredentialBindings: credential names per (tenant, host, port), counted."""

    def __init__(self, names: dict[tuple[str, str, int], tuple[str, ...]]) -> None:
        self.names = names
        self.asked = 0

    def bound_names(self, tenant: str, host: str, port: int) -> tuple[str, ...]:
        self.asked += 1
        return self.names.get((tenant, host, port), ())


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> PolicySet:
    root = tmp_path_factory.mktemp("rules")
    (root / "tenants").mkdir()
    (root / "rego").mkdir()
    shutil.copy(REPO_REGO, root / "rego" / "sandgate.rego")
    (root / "base.yaml").write_text(textwrap.dedent(BASE))
    (root / "tenants" / "acme.yaml").write_text(textwrap.dedent(ACME))
    (root / "tenants" / "acme.rego").write_text(ACME_REGO)
    (root / "tenants" / "trial.yaml").write_text(textwrap.dedent(TRIAL))
    return load_policy_dir(root)


def get(host: str, path: str = "/") -> EgressRequest:
    return EgressRequest(Phase.REQUEST, host, 443, scheme="https", method="GET", path=path, sni=host)


async def decided(
    policy: PolicySet,
    identity: Identity | None,
    request: EgressRequest,
    *,
    bindings: CredentialBindings | None = None,
    trace: Trace | None = None,
) -> Decision:
    return await decide(
        policy,
        identity,
        request,
        StaticResolver(HOSTS),
        AddressGuard(),
        reserved="sandgate.internal",
        bindings=bindings,
        trace=trace,
    )


# --- step 0: the reserved name ---------------------------------------------------------------


@pytest.mark.parametrize(
    "identity", [ACME_ID, None], ids=["a sandbox asking for the gateway's own name", "nobody asking for it"]
)
async def test_the_reserved_name_is_refused_before_anything_else(
    policy: PolicySet, identity: Identity | None
) -> None:
    trace = Trace()
    d = await decided(policy, identity, EgressRequest(Phase.CONNECT, "sandgate.internal", 443), trace=trace)
    assert (d.allowed, d.reason, d.rule_id, d.mode) == (False, Reason.RESERVED_HOST, None, Mode.ENFORCE)
    assert (d.policy_version, d.detail) == (
        policy.version,
        "the gateway's own name: answered over plain HTTP on port 80 only",
    )
    steps = trace.padded()
    assert [(s.name, s.outcome) for s in steps] == [(StepName.RESERVED_NAME, Outcome.DENY)] + [
        (name, Outcome.NOT_REACHED) for name in REQUEST_ORDER
    ]
    assert steps[0].number == 0
    assert (
        steps[0].detail
        == "sandgate.internal is the gateway's own name: answered over plain HTTP on port 80 only"
    )


async def test_another_name_is_not_the_reserved_one_and_no_step_zero_is_shown(policy: PolicySet) -> None:
    trace = Trace()
    d = await decided(policy, ACME_ID, EgressRequest(Phase.CONNECT, "x.sandgate.internal", 443), trace=trace)
    assert d.reason is Reason.HOST_NOT_ALLOWED
    assert StepName.RESERVED_NAME not in [s.name for s in trace.steps]


# --- step 7: the credentials bound to the destination -----------------------------------------


async def test_rego_sees_the_credentials_bound_to_the_destination(policy: PolicySet) -> None:
    bound = Bound({("acme", "api.test", 443): ("key",)})
    d = await decided(policy, ACME_ID, get("api.test", "/no-key"), bindings=bound)
    assert (d.allowed, d.reason, d.rule_id) == (False, Reason.POLICY_DENIED, "acme/rego")
    # Without them (another host, or no bindings at all), the same request is allowed.
    assert (await decided(policy, ACME_ID, get("api.test", "/no-key"))).allowed
    assert (await decided(policy, ACME_ID, get("api.test", "/no-key"), bindings=Bound({}))).allowed


async def test_the_credentials_a_request_names_itself_are_kept(policy: PolicySet) -> None:
    # `policy test` cases name them: nothing is looked up then.
    bound = Bound({("acme", "api.test", 443): ("key",)})
    request = EgressRequest(
        Phase.REQUEST, "api.test", 443, scheme="https", method="GET", path="/no-key", credentials=("other",)
    )
    assert (await decided(policy, ACME_ID, request, bindings=bound)).allowed
    assert bound.asked == 0


async def test_the_credentials_step_is_traced_when_a_credential_is_bound(policy: PolicySet) -> None:
    bound = Bound({("acme", "api.test", 443): ("key", "token")})
    trace = Trace()
    d = await decided(policy, ACME_ID, get("api.test"), bindings=bound, trace=trace)
    assert d.allowed
    assert bound.asked == 1, "looked up once, for Rego and the trace alike"
    last = trace.steps[-1]
    assert (last.name, last.number, last.outcome) == (StepName.CREDENTIALS, 7, Outcome.OK)
    assert last.detail == (
        "bound to api.test:443: key, token (injected by the broker; the connection is intercepted)"
    )
    assert trace.rego is not None and trace.rego.input["credentials"] == ["key", "token"]
    # None bound: no step 7 in the explanation.
    trace = Trace()
    await decided(policy, ACME_ID, get("api.test"), bindings=Bound({}), trace=trace)
    assert [s.name for s in trace.padded()] == list(REQUEST_ORDER)


ALLOWED = Decision(allowed=True, reason=Reason.ALLOWED, address="93.184.216.34")


@pytest.mark.parametrize(
    ("decision", "identity", "host", "inspect"),
    [
        (ALLOWED, ACME_ID, "api.test", True),
        (ALLOWED, ACME_ID, "other.test", False),
        (ALLOWED, None, "api.test", False),
        (Decision(reason=Reason.HOST_NOT_ALLOWED), ACME_ID, "api.test", False),
    ],
    ids=[
        "an allowed tunnel to a bound host is intercepted",
        "an allowed tunnel to another host is left as decided",
        "nobody's tunnel is left as decided",
        "a denial stays a denial",
    ],
)
def test_a_bound_credential_intercepts_the_tunnel(
    decision: Decision, identity: Identity | None, host: str, inspect: bool
) -> None:
    bound = Bound({("acme", "api.test", 443): ("key",)})
    got = credential_interception(decision, bound, identity, host, 443)
    assert (got.inspect, got.allowed, got.reason) == (inspect, decision.allowed, decision.reason)
    assert credential_interception(decision, None, identity, host, 443) is decision


# --- the DNS listener's order ----------------------------------------------------------------


def grants_for(host: str, sandbox: str | None) -> Grants:
    return Grants(
        [
            Grant(
                id="0123456789ab0001",
                tenant="acme",
                sandbox=sandbox,
                host=host,
                port=443,
                # Built when the table is collected, which can be long before the test runs.
                expires=time.time() + 86_400,
            )
        ]
    )


@pytest.mark.parametrize(
    ("identity", "name", "grants", "want"),
    [
        (None, "api.test", None, (False, Reason.NO_IDENTITY, None, "", Mode.ENFORCE)),
        (GONE, "api.test", None, (False, Reason.NO_IDENTITY, None, "", Mode.ENFORCE)),
        (ACME_ID, "never.test", None, (False, Reason.DNS_DENIED, "base/deny/never", "a deny rule refuses this name", Mode.ENFORCE)),
        (ACME_ID, "blocked.test", None, (False, Reason.DNS_DENIED, "acme/deny/blocked", "a deny rule refuses this name", Mode.ENFORCE)),
        (TRIAL_ID, "blocked.test", None, (True, Reason.ALLOWED, None, "", Mode.REPORT)),
        (TRIAL_ID, "never.test", None, (False, Reason.DNS_DENIED, "base/deny/never", "a deny rule refuses this name", Mode.REPORT)),
        (ACME_ID, "api.test", None, (True, Reason.ALLOWED, None, "", Mode.ENFORCE)),
        (ACME_ID, "granted.test", grants_for("granted.test", "a-1"), (True, Reason.ALLOWED, None, "", Mode.ENFORCE)),
        (ACME_ID, "granted.test", grants_for("granted.test", "a-2"), (False, Reason.DNS_DENIED, None, "", Mode.ENFORCE)),
        (ACME_ID, "other.test", None, (False, Reason.DNS_DENIED, None, "", Mode.ENFORCE)),
    ],
    ids=[
        "a query from no sandbox is refused",
        "a query from a sandbox whose tenant is gone is refused",
        "a name the operator's base rule denies is not looked up",
        "a name the tenant's deny rule denies is not looked up",
        "in report mode, the tenant's own deny rule lets a name its allow rule names through",
        "in report mode, the operator's still refuses it",
        "a name an allow rule names is answered",
        "a name the sandbox's live grant names is answered",
        "another sandbox's grant answers nothing",
        "a name nothing names is not looked up",
    ],
)  # fmt: skip
async def test_a_dns_query_is_decided_in_the_listener_s_order(
    policy: PolicySet,
    identity: Identity | None,
    name: str,
    grants: Grants | None,
    want: tuple[bool, Reason, str | None, str, Mode],
) -> None:
    d = await decide_name(policy, identity, name, grants=grants)
    assert (d.allowed, d.reason, d.rule_id, d.detail, d.mode) == want
    assert d.policy_version == policy.version


async def test_a_dns_query_is_traced_with_the_dns_steps(policy: PolicySet) -> None:
    trace = Trace()
    await decide_name(policy, ACME_ID, "blocked.test", trace=trace)
    assert [(s.name, s.number, s.outcome, s.rule_id) for s in trace.steps] == [
        (StepName.IDENTITY, 1, Outcome.OK, None),
        (StepName.DNS_NAME, 2, Outcome.DENY, "acme/deny/blocked"),
    ]
    assert trace.steps[1].detail == "a deny rule refuses this name: it is not looked up"
