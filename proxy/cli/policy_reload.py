"""`sandgate policy reload|status`: reload the running gateway(s) and show what each serves.

`policy reload` goes through the admin API of the gateway answering on `<state_dir>/admin.sock`
and waits for its answer: the version now in force (and the one before), or the refusal with
its file:line errors while the previous policy stays (exit 2). With `redis:` that gateway also
publishes the reload to the fleet (also when its own files did not load), and the command waits
for every live gateway's answer: each records the version it serves and how its reload went in
`<prefix>gateways`, and the command exits 1 naming each that refused (or serves without a
broken file) or did not answer. Without a local gateway, a fleet host publishes the reload
itself; otherwise the command says that no gateway runs (exit 1). SIGHUP (`systemctl reload`)
still reloads too; only with the admin API disabled does the command fall back to it, and then
it says that it cannot confirm the outcome.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from sandgate.proxy.admin import client as admin_client
from sandgate.proxy.config import GatewayConfig, load_config
from sandgate.proxy.fleet.channel import (
    LIVE_SECONDS,
    FleetKeys,
    GatewayVersion,
    await_gateways,
    gateway_versions,
    publish_reload,
)
from sandgate.proxy.redis.client import connect
from sandgate.proxy.state.statusfile import read_status

__all__ = ["problem_line", "reload_command", "status_command", "wait_for_fleet"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# How long `policy reload` waits for the fleet's gateways to answer.
FLEET_WAIT_SECONDS = 10.0


def reload_command(config_path: Path | None, fmt: str = "text") -> int:
    """Reload the running gateway (or the fleet) and report what is in force now."""
    config = load_config(config_path)
    if admin_client.gateway_running(config):
        return _reload_through_api(config, fmt)
    if config.redis is not None:
        return _publish_to_fleet(config)
    status = read_status(config.status_path) if not config.admin.enabled else None
    if status is not None:
        os.kill(int(status["pid"]), signal.SIGHUP)
        print(
            f"reload signalled to gateway pid {status['pid']} (SIGHUP); not confirmed: the admin API is "
            "disabled (admin.enabled: false), see its log or audit trail for the outcome"
        )
        return EXIT_OK
    print(
        f"sandgate: no gateway is running (nothing answers on {config.admin_socket_path}); "
        "nothing was reloaded",
        file=sys.stderr,
    )
    return EXIT_FAILED


def _reload_through_api(config: GatewayConfig, fmt: str) -> int:
    """POST /v1/policy/reload and wait for the answer; then, in a fleet, for every gateway's."""
    try:
        result = admin_client.reload_policy(config)
    except admin_client.AdminApiError as e:
        if e.status != 422:
            raise
        result = e.body
        if fmt == "json":
            print(json.dumps(result, indent=2))
        print(
            f"sandgate: reload REFUSED: {e.message}; policy {result.get('policy_version', '?')} "
            "is still in force",
            file=sys.stderr,
        )
        print("\n".join(f"  {error}" for error in e.errors), file=sys.stderr)
        _wait_for_fleet_after(config, result)
        return EXIT_USAGE
    if fmt == "json":
        print(json.dumps(result, indent=2))
    else:
        print(_reloaded_text(result))
    code = EXIT_OK
    for problem in result.get("policy_problems", []):
        # Reloaded, but not everything: a broken file is invalid input, as in `policy check`.
        print(f"sandgate: {problem_line(problem)}", file=sys.stderr)
        print("\n".join(f"  {e}" for e in problem["errors"]), file=sys.stderr)
        code = EXIT_USAGE
    return max(code, _wait_for_fleet_after(config, result))


def _reloaded_text(result: dict[str, Any]) -> str:
    """'reloaded: policy version V (was W)', and the tenants and sandboxes it serves."""
    version, previous = result["policy_version"], result.get("previous_policy_version")
    change = "unchanged: the files are as loaded before" if version == previous else f"was {previous}"
    tenants = list(result.get("tenants", []))
    shown = ", ".join(tenants[:8]) + (f", … ({len(tenants) - 8} more)" if len(tenants) > 8 else "")
    return (
        f"reloaded: policy version {version} ({change})\n"
        f"  {len(tenants)} tenants: {shown or '-'}; {result.get('sandboxes', 0)} sandboxes"
    )


def problem_line(problem: dict[str, Any]) -> str:
    """One tenant file that did not load, and what is served for its tenant instead."""
    serving = "its last good version" if problem["kept_last_good"] else "nothing (no_identity)"
    return f"BROKEN {problem['file']} (tenant {problem['tenant'] or '?'}): serving {serving}"


def _wait_for_fleet_after(config: GatewayConfig, result: dict[str, Any]) -> int:
    """In a fleet: every gateway's answer to the reload the local gateway published."""
    if config.redis is None:
        return EXIT_OK
    if result.get("published") is False or "fleet_version" not in result:
        print("sandgate: redis is unreachable: other gateways were not told to reload", file=sys.stderr)
        return EXIT_USAGE
    return wait_for_fleet(config, int(result["fleet_version"]))


def _publish_to_fleet(config: GatewayConfig) -> int:
    """No local gateway: publish the reload to the fleet and wait for its gateways' answers."""
    assert config.redis is not None
    try:
        version = asyncio.run(publish_reload(config.redis))
    except RedisError as e:
        print(f"sandgate: redis is unreachable ({type(e).__name__}); nothing was reloaded", file=sys.stderr)
        return EXIT_USAGE
    print(f"reload published to the fleet (fleet version {version})")
    return wait_for_fleet(config, version)


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
    if not answered and not silent:
        print(
            f"sandgate: no live gateway in the fleet (none reported in the last {LIVE_SECONDS:g}s)",
            file=sys.stderr,
        )
        return EXIT_FAILED
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
