"""`policy prove` cost: a whole policy against a ceiling, and one proposed rule (what automatic
approval asks per access request).

Generates a rules directory: N tenants of 11 allow rules each (exact hosts, wildcards, methods,
path globs, a raw-TCP /24), and a ceiling of R regions over the same hosts (a third restrict
methods, a quarter paths, port ranges) plus a network region. Times loading, pairing rules with
their globs, and proving; then `excess()` for single proposals. Prints one JSON line.

    .venv/bin/python bench/prove_ceiling.py --tenants 500 --regions 100
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from sandgate.policy.ceiling import RuleShape, effective_rules, excess, load_ceiling, ports_of, prove_tenants
from sandgate.policy.model.loader import load_policy_dir


def write_rules(root: Path, tenants: int, regions: int, seed: int) -> None:
    rng = random.Random(seed)
    (root / "tenants").mkdir(parents=True)
    out = []
    for i in range(regions):
        r = f"  - hosts: ['*.svc{i}.test', 'svc{i}.test']\n    ports: [443, '8000-8100']\n"
        if i % 3 == 0:
            r += "    methods: [GET, HEAD]\n"
        if i % 4 == 0:
            r += f"    paths: ['/v{i % 5}/**', '/pub/*']\n"
        out.append(r)
    out.append("  - cidrs: [10.0.0.0/16]\n    ports: [5432]\n")
    (root / "ceiling.yaml").write_text("regions:\n" + "".join(out))
    for t in range(tenants):
        rules = []
        for j in range(10):
            i = rng.randrange(regions + regions // 10)  # some hosts no region has
            r = f"  - hosts: ['*.svc{i}.test']\n" if j % 2 else f"  - hosts: ['api.svc{i}.test']\n"
            if j % 3 == 0:
                r += "    methods: [GET]\n"
            if j % 4 == 0:
                r += f"    paths: ['/v{i % 5}/*', '/pub/x']\n"
            rules.append(r)
        rules.append(f"  - cidrs: [10.0.{t % 256}.0/24]\n    ports: [5432]\n    protocol: tcp\n")
        (root / "tenants" / f"t{t}.yaml").write_text(f"tenant: t{t}\nallow:\n" + "".join(rules))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=500)
    parser.add_argument("--regions", type=int, default=100)
    parser.add_argument("--proposals", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "rules"
        write_rules(rules, args.tenants, args.regions, args.seed)
        t0 = time.perf_counter()
        policy = load_policy_dir(rules)
        t1 = time.perf_counter()
        tenants = effective_rules(policy)
        t2 = time.perf_counter()
        ceiling = load_ceiling(rules / "ceiling.yaml")
        proof = prove_tenants(tenants, ceiling)
        t3 = time.perf_counter()
    latencies = []
    for i in range(args.proposals):
        shape = RuleShape(
            hosts=(f"api.svc{i % args.regions}.test",),
            ports=ports_of([443]),
            methods=frozenset({"GET"}),
            paths=(f"/v{i % 5}/x{i}",),
        )
        start = time.perf_counter()
        excess(shape, ceiling)
        latencies.append(time.perf_counter() - start)
    latencies.sort()

    def ms(q: float) -> float:
        return round(1e3 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 3)

    result = {
        "tenants": args.tenants,
        "regions": args.regions + 1,
        "rules": proof.rules,
        "excesses": len(proof.excesses),
        "load_s": round(t1 - t0, 2),
        "pair_s": round(t2 - t1, 2),
        "prove_s": round(t3 - t2, 2),
        "prove_ms_per_rule": round(1e3 * (t3 - t2) / max(proof.rules, 1), 3),
        "proposal_ms_p50": ms(0.5),
        "proposal_ms_p99": ms(0.99),
    }
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
