"""Broker micro-benchmark: per-request cost of credential injection and of response scrubbing.

Run: `.venv/bin/python bench/brokers.py [--quick] [--json out.json]`.

Rows (each request goes through `Broker.plan`, the call the gateway's addon makes):

- `inject header`: a request carrying an `Authorization: Bearer <placeholder>` to the bound
  host; the broker scans it, reads the secret (`env:`), and returns the header mutation.
- `body scan 1 KiB` / `body scan 1 MiB`: the same with a JSON body of that size: the cost of
  the exfiltration scan over the body (raw, case-free, percent/JSON-escape/base64 decoding).
- `inject body 1 MiB`: a body credential's placeholder replaced inside a 1 MiB JSON body.
- `sigv4 re-sign 1 KiB`: a guest-signed S3 PUT of 1 KiB re-signed with the real key.
- `inject stored (cached)`: `inject header` with the secret from `stored:openai` (a value set
  with `sandgate credentials set`), served from the `stored:` source's memory cache.
- `seal 32 B` / `open 32 B`: AES-256-GCM sealing and opening of one stored value (the cost
  of a `credentials set` and of a cache miss, without the store's I/O).
- `scrub 1 KiB` / `scrub 1 MiB`: `Scrubber.scrub` over a response body, five secrets known
  (each with its base64, percent and JSON forms), one echoed secret per body.
- `scrub 1 MiB base64`: the same over 1 MiB of random base64 text (the automaton's prefilter
  helps least there).
- `scrub stream 100 MiB`: `StreamScrubber` over 100 MiB in 64 KiB chunks, a secret split
  across every chunk boundary; peak memory measured with tracemalloc (Python allocations).

Each figure is the median (p50) and mean of per-iteration wall times (`time.perf_counter_ns`),
throughput is bytes processed / median time. Single process, no network.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from sandgate.brokers import (
    Broker,
    BrokerAllow,
    BrokerRequest,
    Credential,
    Scrubber,
    Secret,
    TenantCredentials,
    default_registry,
)

__all__ = ["BrokerRow", "run_brokers"]

KEY = Secret(b"bench-placeholder-key-0123456789abcdef")
SECRETS = {
    "BENCH_OPENAI": "sk-bench-4f9a2c7e1b3d5f7a9c0e2b4d6f8a0c2e",
    "BENCH_HOOK": "whsec_bench_0123456789abcdef0123",
    "BENCH_AWS": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
}
CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class BrokerRow:
    name: str
    iterations: int
    p50_us: float
    mean_us: float
    bytes: int
    mb_per_s: float | None
    peak_kib: float | None = None


def _credentials() -> tuple[Credential, ...]:
    return tuple(
        Credential.model_validate(c)
        for c in (
            {
                "name": "openai",
                "secret": "env:BENCH_OPENAI",
                "hosts": ["api.openai.com"],
                "inject": {"header": "Authorization", "format": "Bearer {secret}"},
            },
            {
                "name": "hook",
                "secret": "env:BENCH_HOOK",
                "hosts": ["hooks.example.com"],
                "inject": {"body": True, "max_bytes": 2 << 20},
            },
            {
                "name": "aws",
                "secret": "env:BENCH_AWS",
                "hosts": ["*.amazonaws.com"],
                "inject": {
                    "aws_sigv4": {
                        "region": "us-east-1",
                        "service": "s3",
                        "access_key_id": "AKIAIOSFODNN7EXAMPLE",
                    }
                },
            },
        )
    )


def _json_body(size: int, insert: str = "") -> bytes:
    words = "the quick brown fox jumps over the lazy dog " * (size // 44 + 1)
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": words}], "key": insert}
    ).encode()
    excess = len(body) - size
    if excess > 0:
        words = words[: len(words) - excess]
        body = json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": words}], "key": insert}
        ).encode()
    return body


def _requests(broker: Broker) -> dict[str, BrokerRequest]:
    ph = broker.placeholders("t1", "sb1")
    auth = (
        ("host", "api.openai.com"),
        ("authorization", f"Bearer {ph['openai']}"),
        ("content-type", "application/json"),
    )
    s3_auth = (
        f"AWS4-HMAC-SHA256 Credential={ph['aws']}/20261130/us-east-1/s3/aws4_request, "
        f"SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={'0' * 64}"
    )
    body_1k = os.urandom(768).hex().encode()[:1024]
    return {
        "inject header": BrokerRequest("POST", "https", "api.openai.com", 443, "/v1/chat", "", auth, b""),
        "body scan 1 KiB": BrokerRequest(
            "POST", "https", "api.openai.com", 443, "/v1/chat", "", auth, _json_body(1024)
        ),
        "body scan 1 MiB": BrokerRequest(
            "POST", "https", "api.openai.com", 443, "/v1/chat", "", auth, _json_body(1 << 20)
        ),
        "inject body 1 MiB": BrokerRequest(
            "POST",
            "https",
            "hooks.example.com",
            443,
            "/hook",
            "",
            (("host", "hooks.example.com"), ("content-type", "application/json")),
            _json_body(1 << 20, ph["hook"]),
        ),
        "sigv4 re-sign 1 KiB": BrokerRequest(
            "PUT",
            "https",
            "bucket.s3.us-east-1.amazonaws.com",
            443,
            "/dir/object.bin",
            "",
            (
                ("host", "bucket.s3.us-east-1.amazonaws.com"),
                ("x-amz-date", "20261130T010000Z"),
                ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
                ("authorization", s3_auth),
            ),
            body_1k,
        ),
    }


def _timed(samples: list[int], total_bytes: int, name: str, peak: float | None = None) -> BrokerRow:
    mean_ns = statistics.fmean(samples)
    p50_ns = statistics.median(samples)
    per_iteration = total_bytes // len(samples)
    # From the median: other processes on a shared machine inflate the mean, not the work.
    rate = per_iteration / (p50_ns / 1e9) / 1e6 if per_iteration else None
    return BrokerRow(
        name=name,
        iterations=len(samples),
        p50_us=p50_ns / 1e3,
        mean_us=mean_ns / 1e3,
        bytes=per_iteration,
        mb_per_s=rate,
        peak_kib=peak,
    )


async def _bench_decide(broker: Broker, name: str, request: BrokerRequest, iterations: int) -> BrokerRow:
    clock = time.perf_counter_ns
    decision = await broker.plan("t1", "sb1", request)
    if not isinstance(decision, BrokerAllow) or not decision.credentials:
        raise RuntimeError(f"{name}: expected an injection, got {decision!r}")
    samples: list[int] = []
    for _ in range(iterations):
        t0 = clock()
        await broker.plan("t1", "sb1", request)
        samples.append(clock() - t0)
    return _timed(samples, len(request.body or b"") * iterations, name)


def _bench_sync(name: str, fn: Callable[[], object], size: int, iterations: int) -> BrokerRow:
    clock = time.perf_counter_ns
    fn()
    samples: list[int] = []
    for _ in range(iterations):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return _timed(samples, size * iterations, name)


def _scrubber(broker: Broker) -> Scrubber:
    return broker.scrubber("t1", "sb1")


def _response(size: int) -> bytes:
    secret = SECRETS["BENCH_OPENAI"].encode()
    filler = (b'{"id": "chatcmpl", "text": "lorem ipsum dolor sit amet"} ' * (size // 50 + 1))[
        : size - len(secret)
    ]
    half = len(filler) // 2
    return filler[:half] + secret + filler[half:]


def _bench_stream(scrubber: Scrubber, total: int) -> BrokerRow:
    secret = SECRETS["BENCH_OPENAI"].encode()
    half = len(secret) // 2
    filler = (b"lorem ipsum dolor sit amet " * (CHUNK // 27 + 1))[: CHUNK - len(secret)]
    chunk = secret[half:] + filler + secret[:half]
    count = total // len(chunk)
    gc.collect()
    tracemalloc.start()
    stream = scrubber.stream()
    t0 = time.perf_counter_ns()
    sent = 0
    for _ in range(count):
        sent += len(stream.feed(chunk))
    sent += len(stream.flush())
    elapsed = time.perf_counter_ns() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    if secret in stream.flush() or sent <= 0:
        raise RuntimeError("stream scrub lost data")
    row = _timed([elapsed], count * len(chunk), f"scrub stream {total >> 20} MiB")
    return BrokerRow(row.name, 1, row.p50_us, row.mean_us, row.bytes, row.mb_per_s, peak / 1024)


async def run_brokers(quick: bool = False) -> list[BrokerRow]:
    """Every row, in the order of the module docstring."""
    os.environ.update(SECRETS)
    broker = Broker(placeholder_key=KEY)
    broker.configure([TenantCredentials("t1", ("sb1",), _credentials())])
    requests = _requests(broker)
    scale = 10 if quick else 1
    counts = {
        "inject header": 20_000,
        "body scan 1 KiB": 10_000,
        "body scan 1 MiB": 100,
        "inject body 1 MiB": 100,
        "sigv4 re-sign 1 KiB": 10_000,
    }
    rows = [
        await _bench_decide(broker, name, requests[name], max(counts[name] // scale, 10)) for name in counts
    ]
    # Five known secrets: the three above plus two more the tenant used earlier.
    scrubber = Scrubber(
        [(Secret(v), broker.placeholders("t1", "sb1")["openai"]) for v in SECRETS.values()]
        + [(Secret(f"extra-secret-{i}-0123456789abcdef"), "sgph_" + "a" * 32) for i in range(2)]
    )
    for size, n in ((1024, 20_000), (1 << 20, 200)):
        body = _response(size)
        label = "1 KiB" if size == 1024 else "1 MiB"
        rows.append(
            _bench_sync(f"scrub {label}", functools.partial(scrubber.scrub, body), size, max(n // scale, 10))
        )
    noise = base64.b64encode(os.urandom(3 << 18))
    rows.append(
        _bench_sync(
            "scrub 1 MiB base64", functools.partial(scrubber.scrub, noise), len(noise), max(200 // scale, 10)
        )
    )
    rows.append(_bench_stream(scrubber, (10 if quick else 100) << 20))
    await broker.aclose()
    return rows


async def run_stored(quick: bool = False) -> list[BrokerRow]:
    """A `stored:` credential served from memory, and the seal/open cost of one value."""
    from sandgate.brokers.sealing import Keyring, associated_data, new_key
    from sandgate.brokers.sources.stored import StoredSource

    class _Store:
        async def get(self, tenant: str, name: str) -> Secret | None:
            return Secret(SECRETS["BENCH_OPENAI"])

    registry = default_registry().with_source("stored", StoredSource(_Store()))
    broker = Broker(placeholder_key=KEY, secrets=registry)
    creds = tuple(
        c.model_copy(update={"secret": "stored:openai"}) if c.name == "openai" else c for c in _credentials()
    )
    broker.configure([TenantCredentials("t1", ("sb1",), creds)])
    scale = 10 if quick else 1
    rows = [
        await _bench_decide(
            broker, "inject stored (cached)", _requests(broker)["inject header"], 20_000 // scale
        )
    ]
    await broker.aclose()
    keyring = Keyring([("k1", new_key())])
    value, ad = os.urandom(32), associated_data("t1", "openai")
    sealed = keyring.seal(value, ad)
    rows.append(_bench_sync("seal 32 B", functools.partial(keyring.seal, value, ad), 0, 20_000 // scale))
    rows.append(_bench_sync("open 32 B", functools.partial(keyring.open, sealed, ad), 0, 20_000 // scale))
    return rows


def _print(rows: list[BrokerRow]) -> None:
    print(f"{'row':<22} {'iter':>7} {'p50 µs':>10} {'mean µs':>10} {'MB/s':>9} {'peak KiB':>9}")
    for r in rows:
        rate = f"{r.mb_per_s:9.0f}" if r.mb_per_s is not None else f"{'-':>9}"
        peak = f"{r.peak_kib:9.0f}" if r.peak_kib is not None else f"{'-':>9}"
        print(f"{r.name:<22} {r.iterations:>7} {r.p50_us:>10.1f} {r.mean_us:>10.1f} {rate} {peak}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="sandgate broker micro-benchmark")
    p.add_argument("--quick", action="store_true", help="a tenth of the iterations, a 10 MiB stream")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = p.parse_args(argv)
    rows = asyncio.run(run_brokers(quick=args.quick)) + asyncio.run(run_stored(quick=args.quick))
    _print(rows)
    if args.json:
        payload: dict[str, Any] = {"python": sys.version.split()[0], "rows": [asdict(r) for r in rows]}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
