"""`sandgate policy reload|status`: reload the running gateway(s) and show what each serves.

One machine: SIGHUP to the gateway named in `<state_dir>/gateway.json`. A fleet (`redis:`
configured): one message on the reload channel reaches every gateway sharing the redis,
and each records the version it serves and how its reload went in `<prefix>gateways`;
`policy reload` waits for every live gateway's answer and exits 1 naming each that refused
(or served without a broken file) or did not answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

from redis.exceptions import RedisError

from .config import GatewayConfig, load_config
from .fleet_channel import (
    LIVE_SECONDS,
    FleetKeys,
    GatewayVersion,
    await_gateways,
    gateway_versions,
    publish_reload,
)
from .redis_conn import connect
from .statusfile import read_status

__all__ = ["reload_command", "status_command", "wait_for_fleet"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# How long `policy reload` waits for the fleet's gateways to answer.
FLEET_WAIT_SECONDS = 10.0


def reload_command(config_path: Path | None) -> int:
    """Ask the gateway(s) to reload; 2 when there is no gateway (or redis) to ask."""
    config = load_config(config_path)
    if config.redis is not None:
        try:
            version = asyncio.run(publish_reload(config.redis))
        except RedisError as e:
            print(
                f"sandgate: redis is unreachable ({type(e).__name__}); nothing was reloaded", file=sys.stderr
            )
            return EXIT_USAGE
        print(f"reload published to the fleet (fleet version {version})")
        return wait_for_fleet(config, version)
    status = read_status(config.status_path)
    if status is None:
        print(f"sandgate: no gateway is running (no live {config.status_path})", file=sys.stderr)
        return EXIT_USAGE
    os.kill(int(status["pid"]), signal.SIGHUP)
    print(f"reload signalled to gateway pid {status['pid']} (serving {status.get('policy_version')})")
    return EXIT_OK


def wait_for_fleet(config: GatewayConfig, version: int, wait_seconds: float = FLEET_WAIT_SECONDS) -> int:
    """Print each live gateway's answer to fleet version `version`; 1 when one refused the
    reload, served it without a broken file, or did not answer within `wait_seconds`."""
    assert config.redis is not None
    cfg = config.redis

    async def wait() -> tuple[list[GatewayVersion], list[GatewayVersion]]:
        client = connect(cfg)
        try:
            return await await_gateways(client, FleetKeys.for_prefix(cfg.prefix), version, wait_seconds)
        finally:
            await client.aclose()

    try:
        answered, silent = asyncio.run(wait())
    except RedisError as e:
        print(f"sandgate: redis is unreachable ({type(e).__name__}); answers unknown", file=sys.stderr)
        return EXIT_USAGE
    code = EXIT_OK
    for g in answered:
        state = _reload_state(g)
        print(f"{g.gateway}\tpolicy {g.policy_version}\t{state}")
        if state != "reloaded":
            code = EXIT_FAILED
    for g in silent:
        print(f"{g.gateway}\tdid not answer within {wait_seconds:g}s (fleet version {g.fleet_version})")
        code = EXIT_FAILED
    if code != EXIT_OK:
        print("sandgate: not every gateway serves the reloaded policy (see above)", file=sys.stderr)
    return code


def _reload_state(g: GatewayVersion) -> str:
    """'reloaded', 'REFUSED: <first error>' or 'reloaded WITHOUT <files>' for one gateway."""
    if g.reload is None:
        return "reloaded"
    if not g.reload.ok:
        return "REFUSED: " + (g.reload.errors[0] if g.reload.errors else "unknown error")
    if g.reload.broken_files:
        return "reloaded WITHOUT " + ", ".join(g.reload.broken_files)
    return "reloaded"


def status_command(config_path: Path | None, fmt: str) -> int:
    """Print the policy version of the local gateway, or of every gateway in the fleet."""
    config = load_config(config_path)
    if config.redis is not None:
        return _fleet_status(config, fmt)
    status = read_status(config.status_path)
    if status is None:
        print(f"sandgate: no gateway is running (no live {config.status_path})", file=sys.stderr)
        return EXIT_USAGE
    entry = {"pid": status["pid"], "policy_version": status.get("policy_version")}
    text = f"gateway pid {entry['pid']}: policy {entry['policy_version']}"
    print(json.dumps(entry, indent=2) if fmt == "json" else text)
    return EXIT_OK


def _fleet_status(config: GatewayConfig, fmt: str) -> int:
    assert config.redis is not None
    cfg = config.redis

    async def read() -> tuple[int, list[GatewayVersion]]:
        client = connect(cfg)
        try:
            return await gateway_versions(client, FleetKeys.for_prefix(cfg.prefix))
        finally:
            await client.aclose()

    try:
        version, gateways = asyncio.run(read())
    except RedisError as e:
        print(f"sandgate: redis is unreachable ({type(e).__name__})", file=sys.stderr)
        return EXIT_USAGE
    now = time.time()
    rows = [
        {
            "gateway": g.gateway,
            "fleet_version": g.fleet_version,
            "policy_version": g.policy_version,
            "in_sync": g.fleet_version == version and not g.stale and (g.reload is None or g.reload.ok),
            "stale": g.stale,
            "live": g.live(now),
            "last_reload": None if g.reload is None else g.reload.as_json(),
            "seconds_since_report": round(now - g.updated, 1),
        }
        for g in gateways
    ]
    if fmt == "json":
        print(json.dumps({"fleet_version": version, "gateways": rows}, indent=2))
        return EXIT_OK
    print(f"fleet version {version}")
    for g, r in zip(gateways, rows, strict=True):
        if not r["live"]:
            state = f"gone (no report for {LIVE_SECONDS:g}s)"
        elif r["stale"]:
            state = "stale registry"
        elif g.reload is not None and not g.reload.ok:
            state = "reload REFUSED"
        else:
            state = "in sync" if r["in_sync"] else "behind"
        print(
            f"{r['gateway']}\tfleet {r['fleet_version']}\tpolicy {r['policy_version']}\t{state}"
            f"\t{r['seconds_since_report']}s ago"
        )
        if g.reload is not None:
            for error in g.reload.errors[:3]:
                print(f"  last reload error: {error}")
            for f in g.reload.broken_files:
                print(f"  serving without: {f}")
    return EXIT_OK
