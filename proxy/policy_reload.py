"""`sandgate policy reload|status`: reload the running gateway(s) and show what each serves.

One machine: SIGHUP to the gateway named in `<state_dir>/gateway.json`. A fleet (`redis:`
configured): one message on the reload channel reaches every gateway sharing the redis,
and each records the version it serves in `<prefix>gateways`.
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
from .fleet_channel import FleetKeys, GatewayVersion, gateway_versions, publish_reload
from .redis_conn import connect
from .statusfile import read_status

__all__ = ["reload_command", "status_command"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


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
        return EXIT_OK
    status = read_status(config.status_path)
    if status is None:
        print(f"sandgate: no gateway is running (no live {config.status_path})", file=sys.stderr)
        return EXIT_USAGE
    os.kill(int(status["pid"]), signal.SIGHUP)
    print(f"reload signalled to gateway pid {status['pid']} (serving {status.get('policy_version')})")
    return EXIT_OK


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
            "in_sync": g.fleet_version == version and not g.stale,
            "stale": g.stale,
            "seconds_since_report": round(now - g.updated, 1),
        }
        for g in gateways
    ]
    if fmt == "json":
        print(json.dumps({"fleet_version": version, "gateways": rows}, indent=2))
        return EXIT_OK
    print(f"fleet version {version}")
    for r in rows:
        state = "stale registry" if r["stale"] else ("in sync" if r["in_sync"] else "behind")
        print(
            f"{r['gateway']}\tfleet {r['fleet_version']}\tpolicy {r['policy_version']}\t{state}"
            f"\t{r['seconds_since_report']}s ago"
        )
    return EXIT_OK
