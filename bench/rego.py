"""Rego benchmark: decision latency (allowlist + Rego, cache hit and miss) and bundle build time
at 10, 1,000 and 10,000 tenants, every one of them with Rego, for two policy shapes:

- minimal: the tenant's own module with two rules (methods on one host, a path prefix on
  another), no data;
- realistic: the tenant's own module (a header rule) using two of the shipped examples
  (methods and paths) configured by its own `data:`; its bundle holds the operator's
  decision module, three modules and its data.

- build: `load_policy_dir` of the whole rules directory with an empty compile cache (every
  tenant compiled, in worker processes, then loaded), and a reload after one tenant's module
  changed (one compiled, the rest reused). RSS growth is the resident memory the loaded
  policy costs.
- latency: `decide()` for a random tenant and request (75 % allowed, 25 % denied by the
  tenant's Rego), resolver answers cached, driven with `coroutine.send(None)` like
  bench/matcher.py (no event-loop scheduling in the figure). "miss": no decision cache, every
  call evaluates the tenant's (loaded) bundle, for a tenant drawn uniformly (the worst case
  for the CPU caches: each bundle is ~90 KB) or Zipf-like (s = 1). "miss + bundle load": the tenant's bundle is
  not loaded yet (first request, or evicted from the engine's bounded set). "hit": the
  cache warmed with the same requests. "allowlist only": Rego switched off, for comparison.
- RSS per 1,000 loaded: resident memory of loaded bundles (the engine keeps at most
  `max_loaded_bundles`, 1,000 by default).

    .venv/bin/python bench/rego.py                 # both shapes at 10, 1,000, 10,000 tenants
    .venv/bin/python bench/rego.py --tenants 10 1000 --shape minimal --samples 20000
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from matcher import run_sync  # bench/: the sibling script

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import decide
from sandgate.policy.decision import EgressRequest, Identity, Phase
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.rego import compiler as rego_compile
from sandgate.policy.rego.cache import CachingEngine, DecisionCache
from sandgate.policy.rego.embedded import EmbeddedEngine
from sandgate.policy.rego.protocol import PolicyEngine
from sandgate.policy.resolver import CachingResolver, StaticResolver

REPO = Path(__file__).resolve().parents[1]
HOSTS = {"api.example.com": ["93.184.215.14"], "pypi.org": ["151.101.0.223"]}

TENANT = """tenant: {name}
sandboxes:
  - id: {name}-1
    token: sha256:{digest}
allow:
  - hosts: [api.example.com]
  - hosts: [pypi.org]
rego: [{name}.rego, ../rego/examples/methods.rego, ../rego/examples/paths.rego]
data:
  methods:
    pypi.org: [GET, HEAD]
    api.example.com: [GET, POST]
  paths:
    api.example.com: ["/v1/{name}/**", "/v1/public/*"]
"""

MODULE = """package sandgate.tenants.{name}

import rego.v1

import data.sandgate.examples.methods
import data.sandgate.examples.paths

deny contains d if some d in methods.deny

deny contains d if some d in paths.deny

deny contains "{name} sends no debug tokens" if input.request.headers["x-debug-token"]
"""


MINIMAL_TENANT = """tenant: {name}
sandboxes:
  - id: {name}-1
    token: sha256:{digest}
allow:
  - hosts: [api.example.com]
  - hosts: [pypi.org]
rego: [{name}.rego]
"""

MINIMAL_MODULE = """package sandgate.tenants.{name}

import rego.v1

deny contains "{name}: only GET and HEAD to pypi.org" if {{
	input.phase == "request"
	input.dest.host == "pypi.org"
	not input.request.method in {{"GET", "HEAD"}}
}}

deny contains "{name}: only /v1/{name}/ on api.example.com" if {{
	input.phase == "request"
	input.dest.host == "api.example.com"
	not startswith(input.request.path, "/v1/{name}/")
}}
"""


def make_rules(root: Path, tenants: int, shape: str = "realistic") -> Path:
    """A rules directory: the shipped Rego and `tenants` tenants with Rego of the given shape."""
    shutil.copytree(REPO / "rules" / "rego", root / "rego")
    shutil.copy(REPO / "rules" / "base.yaml", root / "base.yaml")
    folder = root / "tenants"
    folder.mkdir()
    tenant, module = (MINIMAL_TENANT, MINIMAL_MODULE) if shape == "minimal" else (TENANT, MODULE)
    for i in range(tenants):
        name = f"t{i:05d}"
        (folder / f"{name}.yaml").write_text(tenant.format(name=name, digest=f"{i:064x}"))
        (folder / f"{name}.rego").write_text(module.format(name=name))
    return root


def rss_mb() -> float:
    """Resident memory now (not the peak)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def build(rules: Path, tenants: int, store: Path) -> tuple[PolicySet, dict[str, float]]:
    """Cold build into an empty store, a reload with one tenant changed, a reload with none."""
    rego_compile.use_store(store)
    start = time.perf_counter()
    policy = load_policy_dir(rules)
    cold = time.perf_counter() - start
    changed = rules / "tenants" / "t00000.rego"
    changed.write_text(changed.read_text() + "\n# changed\n")
    start = time.perf_counter()
    policy = load_policy_dir(rules)
    one = time.perf_counter() - start
    start = time.perf_counter()
    policy = load_policy_dir(rules)
    none = time.perf_counter() - start
    assert all(t.rego is not None and t.rego.bundle_file is not None for t in policy.tenants.values())
    return policy, {
        "cold_s": cold,
        "per_tenant_ms": cold / tenants * 1000,
        "reload_one_s": one,
        "reload_none_s": none,
    }


def requests(
    tenants: int, count: int, rng: random.Random, skew: float = 0.0
) -> list[tuple[Identity, EgressRequest, bool]]:
    """(identity, request, expected allowed): 75 % allowed, 25 % denied by Rego. Tenants are
    drawn uniformly, or with `skew` > 0 Zipf-like (tenant k weighs 1/(k+1)^skew): a few busy
    tenants and a long tail, as sandboxes' traffic usually is."""
    weights = [1 / (k + 1) ** skew for k in range(tenants)] if skew else None
    picks = rng.choices(range(tenants), weights, k=count) if weights else None
    out = []
    for i in range(count):
        name = f"t{picks[i] if picks else rng.randrange(tenants):05d}"
        kind = rng.random()
        headers = (("Accept", "application/json"), ("User-Agent", f"agent/{rng.randrange(3)}"))
        if kind < 0.375:
            r = EgressRequest(
                Phase.REQUEST,
                "pypi.org",
                443,
                "https",
                "GET",
                f"/simple/p{rng.randrange(50)}/",
                "pypi.org",
                headers=headers,
            )
            ok = True
        elif kind < 0.75:
            path = f"/v1/{name}/items/{rng.randrange(50)}"
            r = EgressRequest(
                Phase.REQUEST,
                "api.example.com",
                443,
                "https",
                "POST",
                path,
                "api.example.com",
                headers=headers,
                body_size=200,
            )
            ok = True
        elif kind < 0.875:
            r = EgressRequest(
                Phase.REQUEST, "pypi.org", 443, "https", "PUT", "/simple/", "pypi.org", headers=headers
            )
            ok = False
        else:
            r = EgressRequest(
                Phase.REQUEST,
                "api.example.com",
                443,
                "https",
                "GET",
                "/v1/other/x",
                "api.example.com",
                headers=headers,
            )
            ok = False
        out.append((Identity(name, f"{name}-1"), r, ok))
    return out


def warm_query(name: str) -> tuple[Identity, EgressRequest, bool]:
    """An allowed request of tenant `name` (loads its bundle)."""
    request = EgressRequest(Phase.REQUEST, "pypi.org", 443, "https", "GET", "/simple/", "pypi.org")
    return Identity(name, f"{name}-1"), request, True


def latency(
    policy: PolicySet, engine: PolicyEngine, queries: list[tuple[Identity, EgressRequest, bool]]
) -> dict[str, float]:
    """p50/p99 in microseconds; checks every decision is the expected one."""
    resolver = CachingResolver(StaticResolver(HOSTS))
    guard = AddressGuard()
    for host in HOSTS:  # warm the resolver cache
        asyncio.run(resolver.resolve(host))
    samples = []
    gc.disable()
    try:
        for identity, request, ok in queries:
            t0 = time.perf_counter_ns()
            d = run_sync(decide(policy, identity, request, resolver, guard, engine=engine))
            samples.append(time.perf_counter_ns() - t0)
            if d.allowed != ok:
                raise AssertionError(f"{identity.tenant} {request.method} {request.host}{request.path}: {d}")
    finally:
        gc.enable()
    samples.sort()
    n = len(samples)
    return {
        "p50_us": samples[n // 2] / 1000,
        "p99_us": samples[int(n * 0.99)] / 1000,
        "mean_us": sum(samples) / n / 1000,
    }


def without_rego(policy: PolicySet) -> PolicySet:
    tenants = {k: dataclasses.replace(t, rego=None) for k, t in policy.tenants.items()}
    return dataclasses.replace(policy, tenants=tenants)


def row(tenants: int, samples: int, seed: int, shape: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sandgate-bench-rego-") as tmp:
        rules = make_rules(Path(tmp) / "rules", tenants, shape)
        policy, built = build(rules, tenants, Path(tmp) / "store")
        queries = requests(tenants, samples, random.Random(seed))
        gc.collect()
        before = rss_mb()
        warm = EmbeddedEngine(max_loaded=tenants)
        latency(policy, warm, [warm_query(name) for name in policy.tenants])  # load every bundle
        built["rss_mb_per_1000"] = (rss_mb() - before) / tenants * 1000
        miss = latency(policy, warm, queries)
        skewed = latency(policy, warm, requests(tenants, samples, random.Random(seed + 1), skew=1.0))
        cold = latency(policy, EmbeddedEngine(max_loaded=1), queries[: min(2000, samples)])
        cached = CachingEngine(EmbeddedEngine(max_loaded=tenants), DecisionCache(max(10_000, samples)))
        latency(policy, cached, queries)  # warm
        hit = latency(policy, cached, queries)
        base = latency(without_rego(policy), EmbeddedEngine(), [(i, r, True) for i, r, _ in queries])
    return {
        "tenants": tenants,
        "shape": shape,
        "build": built,
        "miss": miss,
        "miss_zipf": skewed,
        "cold": cold,
        "hit": hit,
        "allowlist_only": base,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| policy | tenants | build, cold | per tenant | reload, 1 changed | reload, none changed | RSS per 1,000 loaded "
        "| miss p50 / p99 | miss, Zipf tenants p50 / p99 | miss + bundle load p50 / p99 | hit p50 / p99 "
        "| allowlist only p50 / p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b, m, c, h, a = r["build"], r["miss"], r["cold"], r["hit"], r["allowlist_only"]
        z = r["miss_zipf"]
        # Below 1,000 tenants the figure is the interpreter's fixed cost, not the bundles'.
        rss = f"{b['rss_mb_per_1000']:.0f} MB" if r["tenants"] >= 1_000 else "-"
        lines.append(
            f"| {r['shape']} | {r['tenants']:,} | {b['cold_s']:.2f} s | {b['per_tenant_ms']:.2f} ms | {b['reload_one_s']:.2f} s "
            f"| {b['reload_none_s']:.2f} s | {rss} "
            f"| {m['p50_us']:.0f} / {m['p99_us']:.0f} µs | {z['p50_us']:.0f} / {z['p99_us']:.0f} µs "
            f"| {c['p50_us']:.0f} / {c['p99_us']:.0f} µs "
            f"| {h['p50_us']:.1f} / {h['p99_us']:.1f} µs | {a['p50_us']:.1f} / {a['p99_us']:.1f} µs |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tenants", type=int, nargs="+", default=[10, 1_000, 10_000])
    p.add_argument("--samples", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--shape", choices=("minimal", "realistic", "both"), default="both")
    p.add_argument("--one", nargs=2, metavar=("TENANTS", "SHAPE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        # One row in this process, so its memory figure is its own.
        print(json.dumps(row(int(args.one[0]), args.samples, args.seed, args.one[1])))
        return
    shapes = ["minimal", "realistic"] if args.shape == "both" else [args.shape]
    rows = []
    for shape in shapes:
        for n in args.tenants:
            print(f"{shape}, {n} tenants ...", file=sys.stderr, flush=True)
            cmd = [sys.executable, __file__, "--one", str(n), shape, "--samples", str(args.samples)]
            done = subprocess.run(
                [*cmd, "--seed", str(args.seed)], check=True, capture_output=True, text=True
            )
            rows.append(json.loads(done.stdout))
            print(done.stdout.strip(), file=sys.stderr, flush=True)
    print(markdown(rows))


if __name__ == "__main__":
    main()
