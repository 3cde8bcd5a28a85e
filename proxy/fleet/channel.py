"""The fleet's reload channel: one version counter, one pub/sub channel, one gateways hash.

Every change that gateways must pick up (a sandbox registered or removed, a policy reload
asked for) bumps `<prefix>version` and publishes on `<prefix>events`, in one transaction.
Gateways reload on the message and also poll the counter (about once a second), so a
message lost while a gateway was disconnected is caught. Each gateway records what it
serves in `<prefix>gateways` (gateway id → {fleet_version, policy_version, updated, stale,
reload}), `reload` being the result of its last reload: whether it loaded, the errors of a
refusal, and the files it serves without (a broken tenant file). `policy reload` waits
for every live gateway to report the version it published.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from sandgate.proxy.config import RedisConfig
from sandgate.proxy.redis.client import Keys, connect

__all__ = [
    "LIVE_SECONDS",
    "FleetKeys",
    "GatewayVersion",
    "ReloadReport",
    "await_gateways",
    "bump_and_publish",
    "event_message",
    "gateway_versions",
    "publish_reload",
    "publish_reload_with",
    "record_gateway",
]


@dataclass(frozen=True, slots=True)
class FleetKeys:
    """The key names the registry and the reload channel use, under one prefix."""

    sandboxes: str
    version: str
    events: str
    gateways: str
    # A random id set once per redis data set: gone or changed means redis was flushed or replaced.
    epoch: str

    @classmethod
    def for_prefix(cls, prefix: str) -> FleetKeys:
        k = Keys(prefix)
        return cls(
            sandboxes=k("sandboxes"),
            version=k("version"),
            events=k("events"),
            gateways=k("gateways"),
            epoch=k("epoch"),
        )


# A gateway that has not reported for this long (three heartbeats) is taken as gone.
LIVE_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class ReloadReport:
    """A gateway's last reload: loaded or refused (its errors), and the files it serves without."""

    ok: bool
    errors: tuple[str, ...] = ()
    broken_files: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "errors": list(self.errors[:10]), "broken_files": list(self.broken_files)}


@dataclass(frozen=True, slots=True)
class GatewayVersion:
    """What one gateway reported it serves."""

    gateway: str
    fleet_version: int | None
    policy_version: str
    updated: float
    stale: bool
    reload: ReloadReport | None = field(default=None)

    def live(self, now: float) -> bool:
        return now - self.updated < LIVE_SECONDS


def event_message(kind: str) -> str:
    """The message on the events channel (gateways treat any message as "sync now")."""
    return json.dumps({"kind": kind, "time": time.time()})


def bump_and_publish(pipe: Pipeline, keys: FleetKeys, kind: str) -> None:
    """Queue (in a MULTI pipeline) the counter bump and the message that tell gateways to reload."""
    pipe.incr(keys.version)
    pipe.publish(keys.events, event_message(kind))


async def publish_reload_with(client: aioredis.Redis, keys: FleetKeys, kind: str = "policy") -> int:
    """Tell every gateway to reload; returns the new fleet version."""
    async with client.pipeline(transaction=True) as pipe:
        bump_and_publish(pipe, keys, kind)
        version, _receivers = await pipe.execute()
    return int(version)


async def publish_reload(cfg: RedisConfig) -> int:
    """Tell every gateway sharing this redis to reload (the admin API and the CLI call this)."""
    client = connect(cfg)
    try:
        return await publish_reload_with(client, FleetKeys.for_prefix(cfg.prefix))
    finally:
        await client.aclose()


async def record_gateway(
    client: aioredis.Redis,
    keys: FleetKeys,
    gateway: str,
    *,
    fleet_version: int | None,
    policy_version: str,
    stale: bool,
    reload: ReloadReport | None = None,
) -> None:
    """Record what this gateway serves, for `sandgate policy status|reload`."""
    entry = {
        "fleet_version": fleet_version,
        "policy_version": policy_version,
        "updated": time.time(),
        "stale": stale,
        "reload": reload.as_json() if reload is not None else None,
    }
    await client.hset(keys.gateways, gateway, json.dumps(entry))


async def gateway_versions(client: aioredis.Redis, keys: FleetKeys) -> tuple[int, list[GatewayVersion]]:
    """The fleet version and what every gateway last reported (a malformed entry is shown as such)."""
    async with client.pipeline(transaction=True) as pipe:
        pipe.get(keys.version)
        pipe.hgetall(keys.gateways)
        raw_version, raw = await pipe.execute()
    out = []
    for name, value in sorted(raw.items()):
        gateway = name.decode(errors="replace")
        try:
            entry: dict[str, Any] = json.loads(value)
            fv = entry.get("fleet_version")
            reload = entry.get("reload")
            out.append(
                GatewayVersion(
                    gateway=gateway,
                    fleet_version=int(fv) if fv is not None else None,
                    policy_version=str(entry["policy_version"]),
                    updated=float(entry["updated"]),
                    stale=bool(entry.get("stale", False)),
                    reload=ReloadReport(
                        bool(reload["ok"]),
                        tuple(map(str, reload.get("errors", ()))),
                        tuple(map(str, reload.get("broken_files", ()))),
                    )
                    if isinstance(reload, dict)
                    else None,
                )
            )
        except (ValueError, KeyError, TypeError):
            out.append(GatewayVersion(gateway, None, "(malformed entry)", 0.0, False))
    return int(raw_version or 0), out


async def await_gateways(
    client: aioredis.Redis, keys: FleetKeys, version: int, wait_seconds: float
) -> tuple[list[GatewayVersion], list[GatewayVersion]]:
    """Wait (at most `wait_seconds`) until every live gateway reported fleet version `version` or
    later; returns (those that did, live ones that did not answer in time)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        _, gateways = await gateway_versions(client, keys)
        now = time.time()
        live = [g for g in gateways if g.live(now)]
        answered = [g for g in live if g.fleet_version is not None and g.fleet_version >= version]
        if len(answered) == len(live) or time.monotonic() >= deadline:
            return answered, [g for g in live if g not in answered]
        await asyncio.sleep(0.1)
