"""Stored credentials end to end: `sandgate credentials set`, a real gateway with `secret: stored:NAME`.

One machine (the sealed file) and a fleet (a real redis-server): the upstream gets the real
value, the guest, the audit trail and the log never do; a rotation reaches the next requests
without a restart; a removal fails closed; a cached value costs no redis round trip.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from conftest import SANDGATE, TOKEN_REF, UPSTREAM_IP, GatewayFactory, RunningGateway
from support import RecordingUpstream, RedisServer
from support.pki import TestPKI

from .addons.test_credentials import client, placeholders

pytestmark = pytest.mark.slow

VALUE = "sk-live-STORED-0123456789abcdef"
ROTATED = "sk-live-ROTATED-9876543210fedcba"


def cli(config: Path, *args: str, stdin: str = "") -> None:
    out = subprocess.run(
        [SANDGATE, "credentials", *args, "--config", str(config)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "SANDGATE_HOME"},
    )
    assert out.returncode == 0, out.stderr
    assert VALUE not in out.stdout + out.stderr and ROTATED not in out.stdout + out.stderr


def tenant_file(port: int) -> str:
    return yaml.safe_dump(
        {
            "tenant": "acme",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "allow": [{"hosts": ["api.test"], "ports": [port], "inspect": True}],
            "credentials": [
                {
                    "name": "openai",
                    "secret": "stored:openai",
                    "hosts": ["api.test"],
                    "ports": [port],
                    "env": "OPENAI_API_KEY",
                    "inject": {"header": "Authorization", "format": "Bearer {secret}"},
                }
            ],
        },
        sort_keys=False,
    )


def start(
    start_gateway: GatewayFactory, upstream: RecordingUpstream, config: dict[str, Any]
) -> RunningGateway:
    def prepare(root: Path) -> None:
        if "redis" in config:
            cli(root / "sandgate.yaml", "add-key")  # a fleet's keys are made once, explicitly
        cli(root / "sandgate.yaml", "set", "--tenant", "acme", "openai", stdin=VALUE + "\n")

    return start_gateway({"acme.yaml": tenant_file(upstream.port)}, config=config, prepare=prepare)


def authorization_seen(gw: RunningGateway, upstream: RecordingUpstream, placeholder: str) -> tuple[int, str]:
    """One request with the placeholder: (guest status, the Authorization the upstream got)."""
    upstream.reset()
    with client(gw) as c:
        resp = c.get(
            f"{upstream.url_for('api.test')}/v1/models", headers={"Authorization": f"Bearer {placeholder}"}
        )
    assert VALUE not in resp.text and ROTATED not in resp.text, "a stored value reached the guest"
    got = upstream.requests[0].header("Authorization") if upstream.requests else None
    return resp.status_code, got or resp.headers.get("X-Sandgate-Reason", "")


def wait_for(gw: RunningGateway, upstream: RecordingUpstream, ph: str, want: tuple[int, str]) -> None:
    deadline = time.monotonic() + 10
    while (got := authorization_seen(gw, upstream, ph)) != want:
        assert time.monotonic() < deadline, f"still {got}, want {want}"
        time.sleep(0.1)


def assert_no_secret_in_audit_or_log(gw: RunningGateway) -> None:
    for text in (gw.audit_path.read_text(), gw.log()):
        assert VALUE not in text and ROTATED not in text


@pytest.fixture(params=["local", "fleet"])
def mode(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "local":
        return {}
    server: RedisServer = request.getfixturevalue("redis_server")
    return {"redis": {"url": server.url}}


def test_a_stored_value_is_injected_rotated_and_removed_without_restart(
    start_gateway: GatewayFactory, https_upstream: RecordingUpstream, mode: dict[str, Any]
) -> None:
    gw = start(start_gateway, https_upstream, mode)
    config = gw.root / "sandgate.yaml"
    ph = placeholders(gw, "sb1")["OPENAI_API_KEY"]
    assert authorization_seen(gw, https_upstream, ph) == (200, f"Bearer {VALUE}")

    cli(config, "rotate", "--tenant", "acme", "openai", stdin=ROTATED)
    wait_for(gw, https_upstream, ph, (200, f"Bearer {ROTATED}"))

    cli(config, "remove", "--tenant", "acme", "openai")
    wait_for(gw, https_upstream, ph, (403, "internal_error"))
    assert https_upstream.requests == [], "nothing reached the upstream once the value was removed"
    assert (
        "stored credential openai of tenant acme is not set"
        " (`sandgate credentials set --tenant acme openai` sets it)" in gw.log()
    )
    raw = (gw.root / "state" / "credentials.sealed.json").read_bytes() if not mode else b""
    assert VALUE.encode() not in raw
    assert_no_secret_in_audit_or_log(gw)


def test_a_cached_stored_value_costs_no_redis_round_trip(
    start_gateway: GatewayFactory, https_upstream: RecordingUpstream, redis_server: RedisServer
) -> None:
    gw = start(start_gateway, https_upstream, {"redis": {"url": redis_server.url}})
    ph = placeholders(gw, "sb1")["OPENAI_API_KEY"]
    assert authorization_seen(gw, https_upstream, ph) == (200, f"Bearer {VALUE}")
    r = redis.Redis.from_url(redis_server.url)
    watcher = redis.Redis.from_url(redis_server.url)
    requests, marker = 20, "end-of-measured-window"
    try:
        # MONITOR sees every command with its key: other readers (fleet sync's GET of the epoch,
        # the registry's HGETALL) may fall in the window and are not the store's reads.
        with watcher.monitor() as monitor:  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            with client(gw) as c:
                for _ in range(requests):
                    resp = c.get(
                        f"{https_upstream.url_for('api.test')}/v1/models",
                        headers={"Authorization": f"Bearer {ph}"},
                    )
                    assert resp.status_code == 200
            r.echo(marker)
            seen = []
            while marker not in (command := monitor.next_command()["command"]):
                seen.append(command)
    finally:
        r.close()
        watcher.close()
    # Reads of the store's hash (its writes are EVALSHA, as are the fleet audit stream's batches).
    reads = [
        cmd
        for cmd in seen
        if cmd.split()[0].upper() in STORE_READS and cmd.split()[1].endswith("credentials")
    ]
    assert reads == [], f"{requests} requests made redis reads of the store: {reads}"


STORE_READS = ("HGET", "HGETALL", "HMGET", "GET")


def test_a_gateway_that_loses_redis_keeps_serving_its_cached_value(
    start_gateway: GatewayFactory, https_upstream: RecordingUpstream, redis_server: RedisServer
) -> None:
    gw = start(start_gateway, https_upstream, {"redis": {"url": redis_server.url}})
    ph = placeholders(gw, "sb1")["OPENAI_API_KEY"]
    assert authorization_seen(gw, https_upstream, ph) == (200, f"Bearer {VALUE}")
    redis_server.kill()
    assert authorization_seen(gw, https_upstream, ph) == (200, f"Bearer {VALUE}")
    assert_no_secret_in_audit_or_log(gw)


def _leak(value: str, *, compressed: bool) -> tuple[bytes, list[tuple[str, str]]]:
    """A response that hands `value` back in its body, a redirect and a cookie."""
    body = json.dumps({"your_key": value}).encode()
    headers = [
        ("Location", f"https://api.test/callback?key={value}"),
        ("Set-Cookie", f"session={value}; Secure"),
    ]
    if compressed:
        return gzip.compress(body), [*headers, ("Content-Encoding", "gzip")]
    return body, headers


def _changes_seen(gw: RunningGateway) -> int:
    return gw.log().count('"credentials.changed"')


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_a_stored_value_echoed_before_any_injection_reaches_the_guest_as_its_placeholder(
    start_gateway: GatewayFactory, pki: TestPKI, mode: dict[str, Any], compressed: bool
) -> None:
    body, headers = _leak(VALUE, compressed=compressed)
    with RecordingUpstream(
        UPSTREAM_IP, tls=pki, name="leaky", status=302, body=body, headers=headers
    ) as leaky:
        gw = start(start_gateway, leaky, mode)
        ph = placeholders(gw, "sb1")["OPENAI_API_KEY"]

        def fetch() -> tuple[str, str, str]:
            with client(gw) as c:  # no placeholder: nothing is injected, the host echoes anyway
                resp = c.get(f"{leaky.url_for('api.test')}/v1/whoami")
            assert resp.status_code == 302
            return resp.text, resp.headers["location"], resp.headers["set-cookie"]

        text, location, cookie = fetch()  # the fresh gateway's first request
        assert VALUE not in text + location + cookie, "the stored value reached the guest"
        assert ph in text and ph in location and ph in cookie

        # Rotated at run time: once the gateway saw the change, the next echo is scrubbed too.
        seen = _changes_seen(gw)
        cli(gw.root / "sandgate.yaml", "rotate", "--tenant", "acme", "openai", stdin=ROTATED)
        leaky.body, leaky.extra_headers = (
            _leak(ROTATED, compressed=compressed)[0],
            tuple(_leak(ROTATED, compressed=compressed)[1]),
        )
        deadline = time.monotonic() + 10
        while _changes_seen(gw) == seen:
            assert time.monotonic() < deadline, "the gateway never noticed the rotation"
            time.sleep(0.05)
        text, location, cookie = fetch()
        assert ROTATED not in text + location + cookie, "the rotated value reached the guest"
        assert ph in text and ph in location and ph in cookie
        assert_no_secret_in_audit_or_log(gw)
