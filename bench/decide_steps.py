"""The cost of one policy decision, per kind of request: `decide()` and the gateway's
`GatewayContext.decide` (the reserved name and the credential binding around it).

Cases, each one request decided over and over:

- allowed by name:          CONNECT api.test:443, an allow rule names it (resolver cache hit)
- denied by deny rule:      CONNECT blocked.test:443, a tenant deny rule names it
- literal IP refused:       CONNECT 169.254.169.254:80, the address guard refuses it
- with Rego:                GET https://api.test/v1/x for a tenant with Rego (decision cache hit)

The gateway's context has the reserved name set and a broker with one credential bound to
api.test:443, as a gateway with approvals and credentials has. A decision that does not
suspend is driven with `coroutine.send(None)` (no event loop in the figure); rounds of every
case are interleaved so drift spreads evenly, and the median of the rounds' means is reported.

    .venv/bin/python bench/decide_steps.py [--rounds 15] [--per-round 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import yaml
from matcher import run_sync  # bench/: the sibling script

from sandgate.brokers import Broker, Secret
from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import decide
from sandgate.policy.decision import Decision, EgressRequest, Identity, Phase
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.engine import make_engine
from sandgate.policy.resolver import CachingResolver, StaticResolver
from sandgate.proxy.approvals.reserved import ReservedName
from sandgate.proxy.audit.trail import AuditLog
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.startup.broker_setup import configure_broker

_REPO_REGO = Path(__file__).resolve().parent.parent / "rules" / "rego" / "sandgate.rego"

PLAIN = {
    "tenant": "plain",
    "allow": [{"id": "api", "hosts": ["api.test"], "ports": [443]}],
    "deny": [{"id": "blocked", "hosts": ["blocked.test"]}],
    "credentials": [
        {
            "name": "api-key",
            "secret": "env:SANDGATE_BENCH_SECRET",
            "hosts": ["api.test"],
            "inject": {"header": "Authorization", "format": "Bearer {secret}"},
        }
    ],
}
WITH_REGO = {
    "tenant": "rego",
    "allow": [{"id": "api", "hosts": ["api.test"], "ports": [443]}],
    "rego": ["rego.rego"],
}
REGO_MODULE = """package sandgate.tenants.rego

import rego.v1

deny contains "no deletes" if input.request.method == "DELETE"
"""

CASES: tuple[tuple[str, Identity, EgressRequest, Reason], ...] = (
    (
        "allowed by name",
        Identity("plain", "b"),
        EgressRequest(Phase.CONNECT, "api.test", 443),
        Reason.ALLOWED,
    ),
    (
        "denied by deny rule",
        Identity("plain", "b"),
        EgressRequest(Phase.CONNECT, "blocked.test", 443),
        Reason.HOST_DENIED,
    ),
    (
        "literal IP refused by the guard",
        Identity("plain", "b"),
        EgressRequest(Phase.CONNECT, "169.254.169.254", 80),
        Reason.PRIVATE_ADDRESS,
    ),
    (
        "with Rego",
        Identity("rego", "b"),
        EgressRequest(
            Phase.REQUEST, "api.test", 443, scheme="https", method="GET", path="/v1/x", sni="api.test"
        ),
        Reason.ALLOWED,
    ),
)


def write_rules(root: Path) -> PolicySet:
    (root / "tenants").mkdir(parents=True)
    (root / "rego").mkdir()
    (root / "rego" / "sandgate.rego").write_text(_REPO_REGO.read_text())
    (root / "tenants" / "plain.yaml").write_text(yaml.safe_dump(PLAIN, sort_keys=False))
    (root / "tenants" / "rego.yaml").write_text(yaml.safe_dump(WITH_REGO, sort_keys=False))
    (root / "tenants" / "rego.rego").write_text(REGO_MODULE)
    return load_policy_dir(root)


def _round(decide_one: Callable[[], Coroutine[Any, Any, Decision]], n: int) -> float:
    """Mean µs per decision over n decisions."""
    clock = time.perf_counter_ns
    t0 = clock()
    for _ in range(n):
        run_sync(decide_one())
    return (clock() - t0) / n / 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--per-round", type=int, default=4000)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="sgbench-decide-") as tmp:
        policy = write_rules(Path(tmp) / "rules")
        resolver = CachingResolver(StaticResolver({"api.test": ["127.0.0.2"], "blocked.test": ["127.0.0.3"]}))
        guard = AddressGuard(["127.0.0.0/8"], ["127.0.0.1"])
        engine = make_engine("embedded")
        ctx = GatewayContext(policy, resolver, guard, AuditLog([]), engine=engine)
        ctx.reserved = ReservedName("sandgate.internal", "169.254.77.77")
        broker = Broker(placeholder_key=Secret(b"k" * 32))
        configure_broker(broker, policy)
        ctx.broker = broker

        def via_decide(
            identity: Identity, request: EgressRequest
        ) -> Callable[[], Coroutine[Any, Any, Decision]]:
            return lambda: decide(policy, identity, request, resolver, guard, engine=engine)

        def via_context(
            identity: Identity, request: EgressRequest
        ) -> Callable[[], Coroutine[Any, Any, Decision]]:
            return lambda: ctx.decide(identity, request)

        runs: list[tuple[str, Callable[[], Coroutine[Any, Any, Decision]]]] = []
        for name, identity, request, want in CASES:
            for label, make in (("decide()", via_decide), ("GatewayContext.decide", via_context)):
                one = make(identity, request)

                async def warm(one: Callable[[], Coroutine[Any, Any, Decision]] = one) -> Decision:
                    return await one()

                got = asyncio.run(warm())
                if got.reason is not want:
                    raise AssertionError(f"{name}: {label} gave {got.reason}, expected {want}")
                runs.append((f"{name} | {label}", one))
        means: dict[str, list[float]] = {key: [] for key, _ in runs}
        gc.collect()
        gc.disable()
        try:
            for _ in range(a.rounds):
                for key, one in runs:
                    means[key].append(_round(one, a.per_round))
        finally:
            gc.enable()
        asyncio.run(broker.aclose())
    print("| case | function | µs per decision (median of rounds) | min round |")
    print("|---|---|---:|---:|")
    for key, values in means.items():
        case, function = key.split(" | ")
        print(f"| {case} | `{function}` | {statistics.median(values):.2f} | {min(values):.2f} |")


if __name__ == "__main__":
    main()
