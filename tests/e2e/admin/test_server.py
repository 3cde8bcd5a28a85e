"""The admin API of a real gateway: unix socket and TCP, auth, stores, errors, the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SANDGATE, GatewayFactory, RunningGateway, tenant_yaml, write_gateway_files
from support import RecordingUpstream, free_port

from sandgate.brokers import Secret
from sandgate.proxy.config import load_config
from sandgate.proxy.runtime import Gateway

pytestmark = pytest.mark.slow

ADMIN_TOKEN = "admin-token-0123456789abcdef-xyz"
SECRET_VALUE = "sk-live-DO-NOT-LEAK-4f1c9a7e"


def socket_path(gw: RunningGateway) -> Path:
    return gw.root / "state" / "admin.sock"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin.token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(ADMIN_TOKEN + "\n")
    return path


def unix_client(path: Path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://sandgate", timeout=10)


@pytest.fixture
def gateway(start_gateway: GatewayFactory, http_upstream: RecordingUpstream) -> RunningGateway:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    return start_gateway({"t1.yaml": tenant_yaml("t1", rules)})


@pytest.fixture
def admin(gateway: RunningGateway) -> Iterator[httpx.Client]:
    with unix_client(socket_path(gateway)) as c:
        yield c


@pytest.fixture(scope="module")
def shared_gateway(start_module_gateway: GatewayFactory, http_upstream: RecordingUpstream) -> RunningGateway:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    return start_module_gateway({"t1.yaml": tenant_yaml("t1", rules)})


@pytest.fixture
def shared_admin(shared_gateway: RunningGateway) -> Iterator[httpx.Client]:
    """The admin API of the module's gateway, for requests that change nothing in it."""
    with unix_client(socket_path(shared_gateway)) as c:
        yield c


def test_health_readiness_and_status_on_the_unix_socket(gateway: RunningGateway, admin: httpx.Client) -> None:
    path = socket_path(gateway)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    health = admin.get("/healthz")
    assert health.status_code == 200 and health.json()["pid"] == gateway.proc.pid
    ready = admin.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ready": True, "checks": {"policy_loaded": True, "listeners_bound": True}}
    st = admin.get("/v1/status").json()
    assert st["pid"] == gateway.proc.pid
    assert st["listeners"] == [f"127.0.0.1:{gateway.port}"]
    assert st["tenants"] == 1 and st["sandboxes"] == 1
    assert st["reload_failures"] == 0 and st["last_reload"] is None
    assert isinstance(st["policy_version"], str) and st["audit_queue_depth"] >= 0
    # One machine: the local sealed credential store, empty.
    creds = admin.get("/v1/credentials")
    assert creds.status_code == 200 and creds.json() == {"credentials": []}
    assert gateway.stop() == 0
    assert not path.exists(), "the socket is removed on exit"


def test_readiness_includes_redis_when_configured(start_gateway: GatewayFactory, redis_server: Any) -> None:
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", [])}, config={"redis": {"url": redis_server.url}})
    with unix_client(socket_path(gw)) as c:
        assert c.get("/readyz").json()["checks"]["redis"] is True
        redis_server.kill()
        resp = c.get("/readyz")
        assert resp.status_code == 503
        assert resp.json()["checks"] == {"policy_loaded": True, "listeners_bound": True, "redis": False}
        assert c.get("/healthz").status_code == 200, "alive, only not ready"


def test_tcp_needs_the_bearer_token(start_gateway: GatewayFactory, token_file: Path) -> None:
    port = free_port()
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", [])},
        config={"admin": {"listen": f"127.0.0.1:{port}", "token": f"file:{token_file}"}},
    )
    base = f"http://127.0.0.1:{port}"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_TOKEN}):
        resp = httpx.get(f"{base}/v1/status", headers=headers)
        assert resp.status_code == 401, headers
        assert resp.json() == {"error": "missing or wrong bearer token", "field": None}
    assert httpx.get(f"{base}/nope").status_code == 401, "unauthenticated callers learn nothing"
    # Probes carry no token: health and readiness answer, without the pid; a wrong token is still refused.
    assert httpx.get(f"{base}/healthz").json() == {"status": "alive"}
    assert httpx.get(f"{base}/readyz").status_code == 200
    assert httpx.get(f"{base}/healthz", headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = httpx.get(f"{base}/v1/status", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert ok.status_code == 200 and ok.json()["pid"] == gw.proc.pid
    with unix_client(socket_path(gw)) as c:
        assert c.get("/v1/status").status_code == 200, "the socket's file mode is its guard"
        assert c.get("/v1/status", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/v1/status", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200
    assert ADMIN_TOKEN not in gw.log()


def test_listen_without_a_token_is_a_config_error(start_gateway: GatewayFactory) -> None:
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", [])},
        config={"admin": {"listen": f"127.0.0.1:{free_port()}"}},
        expect_exit=True,
    )
    assert gw.proc.returncode == 2
    assert "admin.listen needs admin.token" in gw.log()
    assert "sandgate.yaml" in gw.log()


def test_a_live_gateways_socket_is_not_taken_over(
    start_gateway: GatewayFactory, gateway: RunningGateway
) -> None:
    second = start_gateway(
        {"t1.yaml": tenant_yaml("t1", [])},
        config={"admin": {"socket": str(socket_path(gateway))}},
        expect_exit=True,
    )
    # A listener that cannot start: exit 1, in one line that says what to do.
    assert second.proc.returncode == 1
    assert second.log().strip().splitlines()[-1] == (
        f"sandgate: admin socket {socket_path(gateway)}: another gateway answers on it "
        "(same state_dir?): stop it, or give this one its own state_dir"
    )
    with unix_client(socket_path(gateway)) as c:
        assert c.get("/healthz").json()["pid"] == gateway.proc.pid


def test_the_admin_api_is_not_reachable_through_the_proxy(
    start_gateway: GatewayFactory, token_file: Path
) -> None:
    port = free_port()
    # Even a tenant rule naming the admin port: the gateway's own address is refused.
    rules = [{"hosts": ["self.test"], "ports": [port]}]
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", rules)},
        config={"admin": {"listen": f"127.0.0.1:{port}", "token": f"file:{token_file}"}},
    )
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        for url in (f"http://127.0.0.1:{port}/v1/status", f"http://self.test:{port}/v1/status"):
            resp = c.get(url, headers=auth)
            assert resp.status_code == 403, url
            assert resp.headers["X-Sandgate-Reason"] in ("host_not_allowed", "private_address"), url
    # Origin-form admin paths sent to the proxy listener itself are not the admin API.
    direct = httpx.get(f"http://127.0.0.1:{gw.port}/v1/status", headers=auth)
    assert direct.status_code != 200 and "policy_version" not in direct.text
    with unix_client(socket_path(gw)) as c:
        assert c.get("/v1/status").json()["active_connections"] >= 0


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{not json", 400, None),
        (b'{"id": "n1", "address": "10.9.0.2"}', 422, "tenant"),
        (b'{"id": "n1", "tenant": "t1", "address": "not-an-ip"}', 422, "addresses"),
        (b'{"id": "N 1", "tenant": "t1", "address": "10.9.0.2"}', 422, "id"),
        (b'{"id": "n1", "tenant": "t1", "address": "10.9.0.2", "tokn": "x"}', 422, "tokn"),
        (b'{"id": "n1", "tenant": "nobody", "address": "10.9.0.2"}', 422, "tenant"),
    ],
    ids=[
        "unreadable JSON is a 400",
        "a missing tenant is named",
        "a bad address is named",
        "a bad id is named",
        "an unknown key is named",
        "an unknown tenant is named",
    ],
)
def test_bad_sandbox_payloads_name_the_field(
    shared_admin: httpx.Client, body: bytes, status: int, field: str | None
) -> None:
    resp = shared_admin.post("/v1/sandboxes", content=body)
    assert resp.status_code == status
    assert resp.json()["field"] == field
    assert resp.json()["error"]
    assert shared_admin.get("/v1/sandboxes").json() == {"sandboxes": []}, "nothing was registered"


def test_unknown_routes_and_wrong_methods_answer_json(shared_admin: httpx.Client) -> None:
    resp = shared_admin.get("/v1/nothing")
    assert resp.status_code == 404 and resp.json() == {"error": "no such endpoint", "field": None}
    resp = shared_admin.delete("/v1/status")
    assert resp.status_code == 405 and resp.json()["error"] == "method not allowed"
    assert resp.headers["content-type"].startswith("application/json")


def test_a_sandbox_added_through_the_api_is_registered_and_in_force(
    gateway: RunningGateway, admin: httpx.Client
) -> None:
    before = admin.get("/v1/status").json()
    entry = {"id": "api-sb", "tenant": "t1", "address": "10.77.0.2"}
    resp = admin.post("/v1/sandboxes", json=entry)
    assert resp.status_code == 201, resp.text
    # One `address` (the form before several existed) is accepted and answered as a list.
    stored = {"id": "api-sb", "tenant": "t1", "addresses": ["10.77.0.2"]}
    assert resp.json()["sandbox"] == stored
    assert admin.get("/v1/sandboxes").json() == {"sandboxes": [stored]}
    registry = json.loads((gateway.root / "state" / "sandboxes.json").read_text())
    assert registry == [stored]
    after = admin.get("/v1/status").json()
    assert after["sandboxes"] == before["sandboxes"] + 1
    assert after["policy_version"] != before["policy_version"]
    assert after["policy_version"] == resp.json()["policy_version"]
    assert after["last_reload"]["ok"] is True and after["last_reload"]["trigger"] == "admin:sandbox_add"
    assert admin.post("/v1/sandboxes", json=entry).status_code == 201, "adding the same entry is idempotent"
    conflict = admin.post("/v1/sandboxes", json={**entry, "address": "10.77.0.3"})
    assert conflict.status_code == 409 and "already registered" in conflict.json()["error"]
    taken = admin.post("/v1/sandboxes", json={**entry, "id": "other"})
    assert taken.status_code == 409 and "10.77.0.2" in taken.json()["error"]

    removed = admin.delete("/v1/sandboxes/api-sb")
    assert removed.status_code == 200 and removed.json()["policy_version"] == before["policy_version"]
    assert admin.get("/v1/sandboxes").json() == {"sandboxes": []}
    assert admin.get("/v1/status").json()["sandboxes"] == before["sandboxes"]
    again = admin.delete("/v1/sandboxes/api-sb")
    assert again.status_code == 404 and again.json()["field"] == "id"


def sandgate(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SANDGATE, *args], capture_output=True, text=True, input=stdin, timeout=60)


def test_policy_reload_and_status_through_the_cli(gateway: RunningGateway) -> None:
    config = str(gateway.root / "sandgate.yaml")
    status = sandgate("policy", "status", "--config", config, "--format", "json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["pid"] == gateway.proc.pid

    gateway.write_tenant("t2.yaml", tenant_yaml("t2", [], sandbox="sb2"))
    reload = sandgate("policy", "reload", "--config", config)
    assert reload.returncode == 0, reload.stderr
    assert reload.stdout.startswith("reloaded: policy version ")
    text = sandgate("policy", "status", "--config", config)
    # The file watcher may reload the same change after the CLI did: either is the last reload.
    assert "2 tenants" in text.stdout
    assert "last reload: ok (admin" in text.stdout or "last reload: ok (file_change" in text.stdout
    assert _reload_record(gateway, "admin")["result"] == "ok"

    # A broken tenant file: the reload goes through for the rest, t2 keeps its last good version,
    # and the CLI says so with exit 2.
    gateway.write_tenant("t2.yaml", "tenant: t2\nallow:\n  - hots: [api.test]\n")
    broken = sandgate("policy", "reload", "--config", config)
    assert broken.returncode == 2
    assert (
        "BROKEN" in broken.stderr and "t2.yaml:3:" in broken.stderr and "last good version" in broken.stderr
    )
    st = json.loads(sandgate("policy", "status", "--config", config, "--format", "json").stdout)
    assert st["last_reload"]["ok"] is True and st["last_reload"]["broken_files"][0].endswith("t2.yaml")
    assert st["tenants"] == 2 and st["policy_problems"][0]["kept_last_good"] is True

    # A broken operator file fails the reload whole: the policy in force stays.
    (gateway.rules_dir / "base.yaml").write_text("deny:\n  - hots: [x.test]\n")
    failed = sandgate("policy", "reload", "--config", config)
    assert failed.returncode == 2
    assert "policy reload failed" in failed.stderr and "base.yaml:2:" in failed.stderr
    st = json.loads(sandgate("policy", "status", "--config", config, "--format", "json").stdout)
    assert st["reload_failures"] >= 1 and st["last_reload"]["ok"] is False

    gateway.stop()
    gone = sandgate("policy", "status", "--config", config)
    assert gone.returncode == 2 and "no gateway is running" in gone.stderr


def _reload_record(gateway: RunningGateway, trigger: str) -> dict[str, Any]:
    """The one policy_reload record of `trigger`, waiting up to 15 s for the audit writer."""
    deadline = time.monotonic() + 15
    while True:
        found = [r for r in gateway.records(event="policy_reload") if r["trigger"] == trigger]
        if found or time.monotonic() > deadline:
            assert len(found) == 1, f"{trigger} reloads: {found}"
            return found[0]
        time.sleep(0.05)


async def test_credential_values_are_write_only(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    config_path, _ = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [])})
    gateway = Gateway(load_config(config_path))
    store = gateway.credential_store  # the local sealed file
    task = asyncio.create_task(gateway.run(signals=False))
    seen: list[str] = []
    try:
        await asyncio.wait_for(gateway.ready.wait(), 20)
        transport = httpx.AsyncHTTPTransport(uds=str(tmp_path / "state" / "admin.sock"))
        async with httpx.AsyncClient(transport=transport, base_url="http://sandgate") as c:

            async def call(method: str, path: str, **kw: Any) -> httpx.Response:
                resp = await c.request(method, path, **kw)
                seen.append(resp.text)
                return resp

            first = await call("PUT", "/v1/credentials/t1/github", json={"value": SECRET_VALUE})
            assert first.status_code == 200
            assert first.json()["credential"]["version"] == 1
            rotated = await call("PUT", "/v1/credentials/t1/github", json={"value": SECRET_VALUE + "-2"})
            assert rotated.json()["credential"]["version"] == 2
            assert (await store.get("t1", "github")) == Secret(SECRET_VALUE + "-2")
            listed = (await call("GET", "/v1/credentials", params={"tenant": "t1"})).json()
            assert [(c["name"], c["version"]) for c in listed["credentials"]] == [("github", 2)]
            assert set(listed["credentials"][0]) == {"tenant", "name", "version", "updated"}
            assert (await call("GET", "/v1/credentials", params={"tenant": "t9"})).json()["credentials"] == []

            bad = await call("PUT", "/v1/credentials/t1/github", json={"value": SECRET_VALUE, "note": "x"})
            assert bad.status_code == 422 and bad.json()["field"] == "note"
            wrong_type = await call("PUT", "/v1/credentials/t1/github", json={"value": 12345})
            assert wrong_type.status_code == 422 and wrong_type.json()["field"] == "value"
            unknown = await call("PUT", "/v1/credentials/nobody/github", json={"value": SECRET_VALUE})
            assert unknown.status_code == 404 and unknown.json()["field"] == "tenant"
            bad_name = await call("PUT", "/v1/credentials/t1/Bad%20Name", json={"value": SECRET_VALUE})
            assert bad_name.status_code == 422 and bad_name.json()["field"] == "name"

            assert (await call("DELETE", "/v1/credentials/t1/github")).status_code == 200
            missing = await call("DELETE", "/v1/credentials/t1/github")
            assert missing.status_code == 404 and missing.json()["field"] == "name"
    finally:
        gateway.shutdown()
        await asyncio.wait_for(task, 20)
    output = capfd.readouterr()
    audit = (tmp_path / "state" / "audit" / "audit.jsonl").read_text()
    for text in (*seen, output.out, output.err, audit):
        assert SECRET_VALUE not in text
    assert "admin.credential_set" in output.out + output.err, "the change itself is logged"
