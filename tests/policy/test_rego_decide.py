"""Step 6 of the evaluation order: the tenant's Rego, after the allowlist and resolution."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import decide
from sandgate.policy.decision import Decision, EgressRequest, Identity, Mode, Phase
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.cache import CachingEngine, DecisionCache
from sandgate.policy.rego.embedded import EmbeddedEngine
from sandgate.policy.rego.engine import make_engine
from sandgate.policy.rego.protocol import RegoQuery, RegoVerdict, fault
from sandgate.policy.resolver import StaticResolver

GOOD = Path(__file__).parents[1] / "data" / "rego" / "good"
REPO_REGO = Path(__file__).parents[2] / "rules" / "rego"
RESOLVER = StaticResolver(
    {
        "api.github.com": ["140.82.112.6"],
        "pypi.org": ["151.101.0.223"],
        "upload.pypi.org": ["151.101.0.224"],
        "example.com": ["93.184.215.14"],
    }
)
GUARD = AddressGuard()


class Recording:
    """An engine that records the queries it gets and answers from a script (or the real engine)."""

    name = "recording"

    def __init__(self, answer: RegoVerdict | Exception | None = None) -> None:
        self.answer = answer
        self.queries: list[RegoQuery] = []
        self.real = EmbeddedEngine()

    async def evaluate(self, query: RegoQuery) -> RegoVerdict:
        self.queries.append(query)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer if self.answer is not None else await self.real.evaluate(query)

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def policy() -> PolicySet:
    return load_policy_dir(GOOD)


def http(method: str, url_host: str, path: str = "/", **kw: Any) -> EgressRequest:
    return EgressRequest(
        Phase.REQUEST, url_host, 443, scheme="https", method=method, path=path, sni=url_host, **kw
    )


async def run(policy: PolicySet, tenant: str, request: EgressRequest, engine: Any = None) -> Decision:
    return await decide(policy, Identity(tenant, f"{tenant}-1"), request, RESOLVER, GUARD, engine=engine)


async def test_the_allowlist_decides_first_and_rego_is_not_asked(policy: PolicySet) -> None:
    engine = Recording()
    decision = await run(policy, "acme", http("GET", "example.com"), engine)
    assert decision.reason is Reason.HOST_NOT_ALLOWED
    assert engine.queries == []


async def test_a_tenant_without_rego_never_asks_the_engine(policy: PolicySet) -> None:
    engine = Recording()
    decision = await run(policy, "plain", http("DELETE", "pypi.org"), engine)
    assert decision.allowed and engine.queries == []


async def test_rego_allows_what_it_allows(policy: PolicySet) -> None:
    decision = await run(policy, "acme", http("POST", "api.github.com", "/repos/acme/x"), Recording())
    assert (decision.allowed, decision.reason, decision.rule_id) == (
        True,
        Reason.ALLOWED,
        "acme/allow/github-api",
    )
    assert decision.address == "140.82.112.6"


async def test_a_rego_denial_names_its_reason_rule_and_message(policy: PolicySet) -> None:
    decision = await run(policy, "acme", http("POST", "api.github.com", "/repos/evil/x"), Recording())
    assert (decision.allowed, decision.reason, decision.rule_id) == (False, Reason.POLICY_DENIED, "acme/rego")
    assert decision.detail == "acme writes only to its own repositories"
    assert decision.policy_version == policy.version and decision.address is None


async def test_the_input_carries_the_checked_address_and_the_request(policy: PolicySet) -> None:
    engine = Recording()
    request = http(
        "GET", "pypi.org", "/simple/", query="q=1", headers=(("Cookie", "c"),), body_size=0, client="10.0.0.2"
    )
    await run(policy, "acme", request, engine)
    (query,) = engine.queries
    doc = query.document
    assert doc["dest"] == {
        "host": "pypi.org",
        "port": 443,
        "ip": "151.101.0.223",
        "sni": "pypi.org",
        "scheme": "https",
    }
    assert doc["request"]["headers"] == {"cookie": "REDACTED"}
    assert (doc["tenant"], doc["sandbox"], doc["client"], doc["phase"]) == (
        "acme",
        "acme-1",
        "10.0.0.2",
        "request",
    )


async def test_report_mode_records_a_rego_denial_as_would_deny(policy: PolicySet) -> None:
    decision = await run(policy, "trial", http("POST", "pypi.org"), Recording())
    assert (decision.allowed, decision.report_only, decision.verdict) == (True, True, "would_deny")
    assert (decision.reason, decision.rule_id, decision.mode) == (
        Reason.METHOD_NOT_ALLOWED,
        "trial/rego",
        Mode.REPORT,
    )
    assert decision.address == "151.101.0.223"


async def test_report_mode_never_relaxes_a_policy_error(policy: PolicySet) -> None:
    decision = await run(policy, "trial", http("GET", "pypi.org"), Recording(fault("the OPA server failed")))
    assert (decision.allowed, decision.reason, decision.report_only) == (False, Reason.POLICY_ERROR, False)


@pytest.mark.parametrize(
    "answer",
    [RuntimeError("engine bug"), fault("timed out")],
    ids=["an engine that raises", "an engine that reports a fault"],
)
async def test_an_engine_failure_denies_with_policy_error(policy: PolicySet, answer: Any) -> None:
    decision = await run(policy, "acme", http("GET", "pypi.org"), Recording(answer))
    assert (decision.allowed, decision.reason, decision.rule_id) == (False, Reason.POLICY_ERROR, "acme/rego")


async def test_a_policy_that_reads_the_request_is_intercepted(policy: PolicySet) -> None:
    connect = EgressRequest(Phase.CONNECT, "pypi.org", 443)
    acme = await run(policy, "acme", connect, Recording())
    plain = await run(policy, "plain", connect, Recording())
    assert acme.allowed and acme.inspect
    assert plain.allowed and not plain.inspect


async def test_without_an_engine_decide_uses_the_embedded_default(policy: PolicySet) -> None:
    decision = await run(policy, "acme", http("PUT", "pypi.org", "/simple/"))
    assert decision.reason is Reason.METHOD_NOT_ALLOWED


async def test_repeated_requests_hit_the_cache(policy: PolicySet) -> None:
    engine = make_engine("embedded")
    assert isinstance(engine, CachingEngine)
    for _ in range(5):
        await run(policy, "acme", http("GET", "pypi.org", "/simple/", headers=(("Accept", "x"),)), engine)
    # Headers other than x-debug-token are not read: they do not split the cache.
    await run(policy, "acme", http("GET", "pypi.org", "/simple/", headers=(("Accept", "y"),)), engine)
    stats = engine.cache.stats()
    assert (stats.misses, stats.hits) == (1, 5)


def test_a_policy_reading_the_clock_is_evaluated_every_time(tmp_path: Path) -> None:
    shutil.copytree(REPO_REGO, tmp_path / "rego")
    (tmp_path / "tenants").mkdir()
    (tmp_path / "tenants" / "t.yaml").write_text(
        "tenant: t\nallow:\n  - hosts: [pypi.org]\nrego: [../rego/examples/hours.rego, t.rego]\n"
        "data:\n  hours: {start: 0, end: 24, days: [Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday]}\n"
    )
    (tmp_path / "tenants" / "t.rego").write_text(
        "package sandgate.tenants.t\nimport rego.v1\nimport data.sandgate.examples.hours\n"
        "deny contains d if some d in hours.deny\n"
    )
    policy = load_policy_dir(tmp_path)
    program = policy.tenants["t"].rego
    assert program is not None and not program.deterministic
    engine = CachingEngine(EmbeddedEngine(), DecisionCache(10))

    async def twice() -> list[Decision]:
        return [await run(policy, "t", http("POST", "pypi.org"), engine) for _ in range(2)]

    assert all(d.allowed for d in asyncio.run(twice()))
    assert engine.cache.stats().size == 0


async def test_reload_under_load_never_mixes_two_policies(tmp_path: Path) -> None:
    """Requests decided while a new policy is built see the old one or the new one, whole."""
    shutil.copytree(REPO_REGO, tmp_path / "rego")
    (tmp_path / "tenants").mkdir()
    tenant = "tenant: t\nallow:\n  - hosts: [pypi.org]\nrego: [t.rego]\n"
    (tmp_path / "tenants" / "t.yaml").write_text(tenant)
    rule = 'package sandgate.tenants.t\nimport rego.v1\ndeny contains "no" if input.request.method == "{}"\n'
    (tmp_path / "tenants" / "t.rego").write_text(rule.format("DELETE"))
    current = {"policy": load_policy_dir(tmp_path)}
    v1 = current["policy"].version
    engine = make_engine("embedded")
    seen: list[tuple[str, bool]] = []
    stop = asyncio.Event()

    async def traffic() -> None:
        while not stop.is_set():
            d = await run(current["policy"], "t", http("POST", "pypi.org"), engine)
            seen.append((d.policy_version, d.allowed))
            await asyncio.sleep(0)

    task = asyncio.create_task(traffic())
    (tmp_path / "tenants" / "t.rego").write_text(rule.format("POST"))
    current["policy"] = await asyncio.to_thread(load_policy_dir, tmp_path)
    v2 = current["policy"].version
    await asyncio.sleep(0.05)
    stop.set()
    await task
    assert {v for v, _ in seen} <= {v1, v2} and v2 in {v for v, _ in seen}
    assert all(allowed == (version == v1) for version, allowed in seen)
