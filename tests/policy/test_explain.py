"""Tests for sandgate.policy.explain: an explanation is `decide`'s own trace of its steps."""

from __future__ import annotations

from pathlib import Path

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decision import EgressRequest, Identity, Phase
from sandgate.policy.explain import Outcome, StepName, explain
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.embedded import EmbeddedEngine
from sandgate.policy.rego.protocol import RegoQuery, RegoVerdict
from sandgate.policy.resolver import StaticResolver
from sandgate.policy.trace import REQUEST_ORDER

GOOD = Path(__file__).parents[1] / "data" / "rego" / "good"
RESOLVER = StaticResolver({"pypi.org": ["151.101.0.223"], "api.github.com": ["140.82.112.6"]})
ACME = Identity("acme", "acme-1")


class CountingEngine:
    """The embedded engine, counting its evaluations; or one that fails on every query."""

    name = "counting"

    def __init__(self, *, broken: bool = False) -> None:
        self.evaluations = 0
        self.broken = broken
        self.real = EmbeddedEngine()

    async def evaluate(self, query: RegoQuery) -> RegoVerdict:
        self.evaluations += 1
        if self.broken:
            raise RuntimeError("engine bug")
        return await self.real.evaluate(query)

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def get(host: str, path: str = "/", method: str = "GET") -> EgressRequest:
    return EgressRequest(Phase.REQUEST, host, 443, scheme="https", method=method, path=path, sni=host)


async def test_the_policy_is_evaluated_once_for_an_explanation() -> None:
    engine = CountingEngine()
    got = await explain(
        load_policy_dir(GOOD), ACME, get("pypi.org", "/simple/"), RESOLVER, AddressGuard(), engine
    )
    assert got.decision.allowed
    assert engine.evaluations == 1
    assert got.rego is not None and got.rego.verdict.allowed
    assert got.rego.input["dest"] == {
        "host": "pypi.org",
        "port": 443,
        "ip": "151.101.0.223",
        "sni": "pypi.org",
        "scheme": "https",
    }


async def test_an_engine_that_fails_is_explained_as_an_error() -> None:
    engine = CountingEngine(broken=True)
    got = await explain(load_policy_dir(GOOD), ACME, get("pypi.org"), RESOLVER, AddressGuard(), engine)
    assert (got.decision.allowed, got.decision.reason) == (False, Reason.POLICY_ERROR)
    rego = got.steps[-1]
    assert (rego.name, rego.outcome, rego.rule_id) == (StepName.REGO, Outcome.ERROR, "acme/rego")
    assert rego.detail == "policy_error: the policy engine failed (RuntimeError)"
    assert got.rego is not None and got.rego.verdict.fault


async def test_every_step_is_shown_once_in_order_and_the_rest_not_reached() -> None:
    policy = load_policy_dir(GOOD)
    got = await explain(policy, ACME, get("example.com"), RESOLVER, AddressGuard(), CountingEngine())
    assert [s.name for s in got.steps] == list(REQUEST_ORDER)
    assert [s.outcome for s in got.steps] == [
        Outcome.OK,
        Outcome.SKIP,
        Outcome.OK,
        Outcome.DENY,
        Outcome.NOT_REACHED,
        Outcome.NOT_REACHED,
    ]
    assert got.rego is None


async def test_an_address_literal_the_guard_refuses_stops_at_step_two() -> None:
    policy = load_policy_dir(GOOD)
    got = await explain(policy, ACME, get("169.254.169.254"), RESOLVER, AddressGuard(), CountingEngine())
    guard_step = got.steps[1]
    assert (guard_step.name, guard_step.outcome) == (StepName.ADDRESS_GUARD, Outcome.DENY)
    assert [(a.address, a.result) for a in guard_step.addresses] == [("169.254.169.254", "refused")]
    assert guard_step.detail == got.decision.detail
    assert {s.outcome for s in got.steps[2:]} == {Outcome.NOT_REACHED}
