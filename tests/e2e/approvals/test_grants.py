"""Grants end to end: `sandgate requests approve --scope sandbox|tenant` against a real gateway, a
real upstream on loopback and a real redis-server. A grant allows the next matching request
without asking (that sandbox's, or the tenant's), expires, survives a restart (grants file, or
redis), reaches another gateway through redis and the other worker of two, and never beats a
deny rule or the address guard; a broken grants file keeps the old policy."""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import (
    OTHER_TOKEN,
    OTHER_TOKEN_REF,
    SANDGATE,
    TOKEN_REF,
    GatewayFactory,
    RunningGateway,
)
from support import RecordingUpstream, RedisServer, wait_for_port

pytestmark = pytest.mark.slow


def tenant(port: int) -> str:
    """Tenant t1 (sandboxes sb1, sb2): anything on api.test:`port` is asked about, /secret/** denied."""
    return yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}, {"id": "sb2", "token": OTHER_TOKEN_REF}],
            "ask": [{"id": "api", "hosts": ["api.test"], "ports": [port]}],
            "deny": [{"id": "secret", "hosts": ["api.test"], "paths": ["/secret/**"]}],
        },
        sort_keys=False,
    )


# A grant of every method and path of its host and port, written out (a grant must say so).
EVERYTHING = {"methods": ["*"], "paths": ["*"]}


def sandgate(gw: RunningGateway, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, *args, "--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )


def admin(gw: RunningGateway, method: str, path: str, ok: tuple[int, ...] = (200,)) -> Any:
    """The admin API's answer (straight to its socket: faster than a CLI process per poll)."""
    transport = httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))
    with httpx.Client(transport=transport, base_url="http://sandgate", timeout=10) as c:
        answer = c.request(method, path, json={} if method == "POST" else None)
    assert answer.status_code in ok, answer.text
    return answer.json()


def proxy(gw: RunningGateway, sandbox: str) -> str:
    return gw.proxy(sandbox) if sandbox == "sb1" else gw.proxy(sandbox, OTHER_TOKEN)


def start_curl(gw: RunningGateway, url: str, sandbox: str = "sb1") -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["curl", "-sS", "-m", "30", "-x", proxy(gw, sandbox), "-o", "-", "-w", "\n%{http_code}", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=40)
    body, _, code = out.rpartition("\n")
    return int(code), body


def held(gw: RunningGateway, timeout: float = 15.0) -> dict[str, Any]:
    """The one request held now (waiting until there is one)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in admin(gw, "GET", "/v1/access-requests")["requests"] if r["state"] == "held"]
        if found:
            assert len(found) == 1, found
            return dict(found[0])
        assert time.monotonic() < deadline, "no request was held"
        time.sleep(0.05)


def ask_and_approve(gw: RunningGateway, url: str, *approve: str, sandbox: str = "sb1") -> dict[str, Any]:
    """Send a request that is held, approve it with these options; the decision (released: 200)."""
    curl = start_curl(gw, url, sandbox)
    pending = held(gw)
    out = sandgate(gw, "requests", "approve", pending["id"], *approve, "--format", "json")
    assert out.returncode == 0, out.stderr
    assert finish(curl)[0] == 200
    return dict(json.loads(out.stdout))


def allowed_at_once(gw: RunningGateway, url: str, sandbox: str = "sb1") -> bool:
    """Whether the request is answered 200 without being held (a held one is denied here)."""
    curl = start_curl(gw, url, sandbox)
    deadline = time.monotonic() + 5
    while curl.poll() is None and time.monotonic() < deadline:
        for r in admin(gw, "GET", "/v1/access-requests")["requests"]:
            if r["state"] == "held":
                # 409: decided meanwhile (its client hung up, its time ran out).
                admin(gw, "POST", f"/v1/access-requests/{r['id']}/deny", ok=(200, 409))
        time.sleep(0.05)
    return finish(curl)[0] == 200


def eventually(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def restart(gw: RunningGateway) -> RunningGateway:
    """The same gateway (folder, config, port) started again after it stopped."""
    gw.stop()
    status = gw.root / "state" / "gateway.json"
    status.unlink(missing_ok=True)
    log_path = gw.root / "gateway-restarted.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [SANDGATE, "run", "--config", str(gw.root / "sandgate.yaml")],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=gw.root,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    again = RunningGateway(port=gw.port, root=gw.root, proc=proc, log_path=log_path)
    wait_for_port("127.0.0.1", gw.port, timeout=60)
    if os.environ.get("SANDGATE_WORKERS", "1") != "1":
        # Several workers: the gateway serves once the supervisor wrote its status file.
        eventually(status.exists, timeout=60)
    return again


@pytest.fixture(scope="module")
def shared(start_module_gateway: GatewayFactory, http_upstream: RecordingUpstream) -> RunningGateway:
    return start_module_gateway({"t1.yaml": tenant(http_upstream.port)}, config={"workers": {"count": 1}})


@pytest.fixture
def gw(shared: RunningGateway, http_upstream: RecordingUpstream) -> RunningGateway:
    shared.mark()
    http_upstream.reset()
    return shared


def test_scope_sandbox_grants_that_sandbox_the_next_request_without_asking(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    url = f"http://api.test:{http_upstream.port}/v1/items"
    decided = ask_and_approve(gw, url + "?page=1", "--scope", "sandbox", "--reason", "needs items")
    gid = decided["id"]
    grant = decided["grant"]
    assert (decided["scope"], grant["scope"], grant["sandbox"], grant["host"]) == (
        "sandbox",
        "sandbox",
        "sb1",
        "api.test",
    )
    # Exactly what was asked: its method, its path (the query is no part of it), its port.
    assert (grant["methods"], grant["paths"], grant["port"]) == (["GET"], ["/v1/items"], http_upstream.port)
    assert grant["expires"] is not None, "a sandbox grant has a TTL (approvals.grant_ttl_seconds)"

    assert allowed_at_once(gw, url + "?page=2")
    assert not allowed_at_once(gw, url + "/1"), "the exact path, not a prefix"
    assert not allowed_at_once(gw, url, sandbox="sb2"), "that sandbox's, no other's"
    used = gw.records_until(lambda rs: any(r.get("rule_id") == f"t1/grant/{gid}" for r in rs))
    [by_grant] = [r for r in used if r.get("rule_id") == f"t1/grant/{gid}"]
    assert (by_grant["decision"], by_grant["sandbox"], by_grant["status"]) == ("allow", "sb1", 200)

    listed = json.loads(sandgate(gw, "requests", "grants", "--format", "json").stdout)["grants"]
    assert [(g["id"], g["scope"], g["expired"]) for g in listed] == [(gid, "sandbox", False)]

    # The chain of the approval, every kind of record: asked, grant made, released, grant used.
    query = sandgate(gw, "audit", "query", "--approval", gid, "--format", "json")
    assert query.returncode == 0, query.stderr
    chain = [json.loads(line) for line in query.stdout.splitlines() if line.strip()]
    steps = [(r["event"], r.get("decision") or r.get("action")) for r in chain]
    assert steps == [("decision", "ask"), ("grant", "made"), ("decision", "allow"), ("decision", "allow")]
    made = chain[1]
    assert (made["by"], made["scope"], made["reason"], made["approval_id"]) == (
        made["approved_by"],
        "sandbox",
        "needs items",
        gid,
    )
    assert chain[2]["approval"]["id"] == gid and chain[3]["rule_id"] == f"t1/grant/{gid}"

    # Revoked: asked about again.
    revoked = sandgate(gw, "requests", "revoke", gid)
    assert revoked.returncode == 0, revoked.stderr
    assert not allowed_at_once(gw, url)
    ends = gw.records_until(lambda rs: any(r.get("action") == "revoked" for r in rs), event="grant")
    assert ends[-1]["approval_id"] == gid
    assert sandgate(gw, "requests", "revoke", gid).returncode == 1


def test_a_grant_past_its_ttl_allows_nothing_and_is_recorded_expired(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    url = f"http://api.test:{http_upstream.port}/v1/short"
    # 3 s: a loaded host can take a second between the approval and the next request.
    decided = ask_and_approve(gw, url, "--scope", "sandbox", "--ttl", "3s")
    assert allowed_at_once(gw, url)
    expires = calendar.timegm(time.strptime(decided["grant"]["expires"], "%Y-%m-%dT%H:%M:%SZ"))
    time.sleep(max(0.0, expires - time.time()) + 1.1)  # the listing shows whole seconds
    assert not allowed_at_once(gw, url), "expired: asked about again"
    expired = gw.records_until(lambda rs: any(r.get("action") == "expired" for r in rs), event="grant")
    assert [r["approval_id"] for r in expired if r["action"] == "expired"] == [decided["id"]]


def test_a_ttl_is_refused_with_scope_once_and_capped_by_the_maximum(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    url = f"http://api.test:{http_upstream.port}/v1/cap"
    curl = start_curl(gw, url)
    pending = held(gw)
    once = sandgate(gw, "requests", "approve", pending["id"], "--ttl", "5m")
    assert once.returncode == 2 and "scope sandbox or tenant" in once.stderr
    bad = sandgate(gw, "requests", "approve", pending["id"], "--scope", "sandbox", "--ttl", "soon")
    assert bad.returncode == 2 and "--ttl" in bad.stderr
    out = sandgate(gw, "requests", "approve", pending["id"], "--scope", "sandbox", "--ttl", "400d")
    assert out.returncode == 0, out.stderr
    assert finish(curl)[0] == 200
    grant = json.loads(sandgate(gw, "requests", "grants", "--format", "json").stdout)["grants"][0]
    expires = calendar.timegm(time.strptime(grant["expires"], "%Y-%m-%dT%H:%M:%SZ"))
    assert expires - time.time() < 7 * 86_400 + 60, "capped by approvals.grant_max_ttl_seconds"
    assert sandgate(gw, "requests", "revoke", grant["id"]).returncode == 0


def test_a_grant_never_beats_a_deny_rule_or_the_address_guard(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    """A grants file reviewed in by hand that grants every path of api.test, self.test (the
    gateway's own address) and open.test (in a range the operator opens only to names a rule
    names): the deny rule and the guard still refuse."""
    grants = gw.rules_dir / "tenants" / "t1.grants.yaml"
    grants.write_text(
        yaml.safe_dump(
            {
                "tenant": "t1",
                "grants": [
                    {
                        "id": "0123456789ab0001",
                        "host": "api.test",
                        "port": http_upstream.port,
                        "methods": ["*"],
                        "paths": ["/**"],
                    },
                    {"id": "0123456789ab0002", "host": "self.test", "port": gw.port, **EVERYTHING},
                    {"id": "0123456789ab0004", "host": "open.test", "port": http_upstream.port, **EVERYTHING},
                ],
            }
        )
    )
    try:
        assert sandgate(gw, "policy", "reload").returncode == 0
        base = f"http://api.test:{http_upstream.port}"
        assert allowed_at_once(gw, f"{base}/anything"), "the grants file is in force"
        status, body = finish(start_curl(gw, f"{base}/secret/keys"))
        assert (status, json.loads(body)["reason"]) == (403, "host_denied")
        status, body = finish(start_curl(gw, f"http://self.test:{gw.port}/"))
        assert (status, json.loads(body)["reason"]) == (403, "private_address")
        status, body = finish(start_curl(gw, f"http://open.test:{http_upstream.port}/"))
        assert (status, json.loads(body)["reason"]) == (403, "private_address")
        assert [r.target for r in http_upstream.requests] == ["/anything"]
    finally:
        grants.unlink()
        assert sandgate(gw, "policy", "reload").returncode == 0


def test_a_broken_grants_file_keeps_the_old_policy(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    grants = gw.rules_dir / "tenants" / "t1.grants.yaml"
    url = f"http://api.test:{http_upstream.port}/v1/kept"
    grants.write_text(
        f"tenant: t1\ngrants:\n  - id: 0123456789ab0003\n    host: api.test\n    port: {http_upstream.port}\n"
        '    methods: ["*"]\n    paths: ["*"]\n'
    )
    try:
        assert sandgate(gw, "policy", "reload").returncode == 0
        assert allowed_at_once(gw, url)
        grants.write_text(
            "tenant: t1\ngrants:\n  - id: 0123456789ab0003\n    host: api.test\n    port: 0\n"
            '    methods: ["*"]\n    paths: ["*"]\n'
        )
        out = sandgate(gw, "policy", "reload")
        assert "t1.grants.yaml:5" in out.stdout + out.stderr and "port" in out.stdout + out.stderr
        assert allowed_at_once(gw, url), "the tenant's last good version (with its grants) is kept"
        check = subprocess.run(
            [SANDGATE, "policy", "check", str(gw.rules_dir)], capture_output=True, text=True, timeout=60
        )
        assert check.returncode != 0 and "t1.grants.yaml:5" in check.stdout + check.stderr
    finally:
        grants.unlink()
        assert sandgate(gw, "policy", "reload").returncode == 0


@pytest.fixture
def own(start_gateway: GatewayFactory, http_upstream: RecordingUpstream) -> Iterator[list[RunningGateway]]:
    """Gateways a test restarts (stopped at the end whichever ran last)."""
    started: list[RunningGateway] = []
    yield started
    for g in started:
        g.stop()


def test_scope_tenant_writes_a_reviewed_grants_file_that_survives_a_restart(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, own: list[RunningGateway]
) -> None:
    gw = start_gateway({"t1.yaml": tenant(http_upstream.port)})
    url = f"http://api.test:{http_upstream.port}/v1/team"
    decided = ask_and_approve(gw, url, "--scope", "tenant", "--reason", "the team needs it\nreally")
    gid = decided["id"]
    path = gw.rules_dir / "tenants" / "t1.grants.yaml"
    assert decided["grant"]["origin"] == str(path) and decided["grant"]["expires"] is None
    text = path.read_text()
    parsed = yaml.safe_load(text)
    assert parsed["tenant"] == "t1"
    [entry] = parsed["grants"]
    assert (entry["id"], entry["host"], entry["port"], entry["methods"], entry["paths"]) == (
        gid,
        "api.test",
        http_upstream.port,
        ["GET"],
        ["/v1/team"],
    )
    assert entry["reason"] == "the team needs it\nreally" and entry["approved_by"]
    assert f"# approval {gid}: approved by {entry['approved_by']} at " in text
    assert "# why: the team needs it really" in text
    assert text.startswith("# sandgate-grants-file v1") and "\n# sandgate-grants-file end sha256:" in text
    assert not list(path.parent.glob(".t1.grants.yaml.*")), "no temporary file left behind"
    # Every sandbox of the tenant.
    assert allowed_at_once(gw, url, sandbox="sb2")
    check = subprocess.run([SANDGATE, "policy", "check", str(gw.rules_dir)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr

    again = restart(gw)
    own.append(again)
    assert allowed_at_once(again, url)
    assert allowed_at_once(again, url, sandbox="sb2")


def test_with_redis_a_grant_made_on_one_gateway_allows_on_another_and_survives_a_restart(
    start_gateway: GatewayFactory,
    http_upstream: RecordingUpstream,
    redis_server: RedisServer,
    own: list[RunningGateway],
) -> None:
    config = {"redis": {"url": redis_server.url}}
    a = start_gateway({"t1.yaml": tenant(http_upstream.port)}, config=config)
    b = start_gateway({"t1.yaml": tenant(http_upstream.port)}, config=config)
    url = f"http://api.test:{http_upstream.port}/v1/fleet"
    decided = ask_and_approve(a, url, "--scope", "sandbox")
    assert decided["grant"]["origin"] == "redis"
    eventually(lambda: allowed_at_once(b, url))
    assert not allowed_at_once(b, url, sandbox="sb2")
    # Tenant scope in a fleet: redis, not a file.
    team = f"http://api.test:{http_upstream.port}/v1/fleet-team"
    decided = ask_and_approve(a, team, "--scope", "tenant")
    assert decided["grant"]["origin"] == "redis"
    assert not (a.rules_dir / "tenants" / "t1.grants.yaml").exists()
    eventually(lambda: allowed_at_once(b, team, sandbox="sb2"))
    again = restart(b)
    own.append(again)
    assert allowed_at_once(again, team, sandbox="sb2")
    assert allowed_at_once(again, url)


def test_with_two_workers_a_grant_reaches_the_other_worker(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway({"t1.yaml": tenant(http_upstream.port)}, config={"workers": {"count": 2}})
    url = f"http://api.test:{http_upstream.port}/v1/workers"
    decided = ask_and_approve(gw, url, "--scope", "sandbox")
    assert decided["grant"]["origin"] == "state"
    # New connections land on either worker (SO_REUSEPORT): every one is allowed at once.
    results = [finish(start_curl(gw, url))[0] for _ in range(10)]
    assert results == [200] * 10
    assert (gw.root / "state" / "grants.json").exists()


def test_grants_state_path_is_private(gw: RunningGateway, http_upstream: RecordingUpstream) -> None:
    """The gateway's grants file in its state folder is readable by its owner only."""
    decided = ask_and_approve(gw, f"http://api.test:{http_upstream.port}/v1/private", "--scope", "sandbox")
    path = Path(gw.root / "state" / "grants.json")
    assert path.stat().st_mode & 0o077 == 0
    assert sandgate(gw, "requests", "revoke", decided["id"]).returncode == 0


def test_a_proposal_is_granted_to_its_sandbox_by_default_and_never_once(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    """A sandbox proposes access through the gateway's own endpoint (nothing is held): approved
    with no scope, it is a sandbox grant of exactly its methods and path globs; `once` is refused."""
    proposal = {
        "host": "api.test",
        "port": http_upstream.port,
        "methods": ["GET"],
        "paths": ["/v2/**"],
        "reason": "read v2",
    }
    posted = subprocess.run(
        ["curl", "-sS", "-m", "10", "-x", gw.proxy("sb1"), "--json", json.dumps(proposal)]
        + ["http://sandgate.internal/v1/access-requests"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    pid = json.loads(posted.stdout)["id"]
    once = sandgate(gw, "requests", "approve", pid, "--scope", "once")
    assert once.returncode == 2 and "proposal holds no request to release once" in once.stderr
    out = sandgate(gw, "requests", "approve", pid, "--format", "json")
    assert out.returncode == 0, out.stderr
    decided = json.loads(out.stdout)
    assert (decided["scope"], decided["grant"]["sandbox"], decided["grant"]["paths"]) == (
        "sandbox",
        "sb1",
        ["/v2/**"],
    )
    base = f"http://api.test:{http_upstream.port}"
    assert allowed_at_once(gw, f"{base}/v2/items/1")
    assert not allowed_at_once(gw, f"{base}/v3")
    assert not allowed_at_once(gw, f"{base}/v2/items", sandbox="sb2")
    assert sandgate(gw, "requests", "revoke", pid).returncode == 0


def test_an_expired_tenant_grant_leaves_its_grants_file_and_is_recorded(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    url = f"http://api.test:{http_upstream.port}/v1/brief"
    path = gw.rules_dir / "tenants" / "t1.grants.yaml"
    try:
        decided = ask_and_approve(gw, url, "--scope", "tenant", "--ttl", "2s")
        assert decided["grant"]["expires"] is not None
        assert allowed_at_once(gw, url, sandbox="sb2")
        ends = gw.records_until(
            lambda rs: any(r.get("action") == "expired" for r in rs), event="grant", timeout=15
        )
        [end] = [r for r in ends if r["action"] == "expired"]
        assert (end["approval_id"], end["scope"], end["where"]) == (decided["id"], "tenant", str(path))
        assert yaml.safe_load(path.read_text())["grants"] == []
        assert not allowed_at_once(gw, url)
    finally:
        path.unlink(missing_ok=True)
        assert sandgate(gw, "policy", "reload").returncode == 0


def test_a_hand_edit_cut_before_a_grants_methods_allows_nothing_more_until_it_is_whole(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    """Issue 23: an editor saves a grants file in place with a new grant cut before its
    `methods:` line, and the operator pauses longer than the settle time. The cut grant is no
    grant of every method and path: the file is refused whole (logged with file, line and
    field), the tenant keeps its last good grants, and the otherwise denied path stays denied.
    Once the edit is complete, the grant allows exactly what it names."""
    port = http_upstream.port
    rules = {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        "allow": [
            {"id": "v1", "hosts": ["api.test"], "ports": [port], "methods": ["GET"], "paths": ["/v1/**"]}
        ],
    }
    good = (
        f"tenant: t1\ngrants:\n  - id: 0123456789ab0005\n    host: api.test\n    port: {port}\n"
        '    methods: [GET]\n    paths: ["/kept"]\n'
    )
    gw = start_gateway({"t1.yaml": yaml.safe_dump(rules, sort_keys=False), "t1.grants.yaml": good})
    path = gw.rules_dir / "tenants" / "t1.grants.yaml"
    base = f"http://api.test:{port}"
    with httpx.Client(proxy=gw.proxy("sb1"), timeout=10) as client:

        def status(target: str) -> tuple[int, str | None]:
            answer = client.get(base + target)
            return answer.status_code, answer.headers.get("x-sandgate-reason")

        assert status("/kept") == (200, None)
        assert status("/admin/report") == (403, "path_not_allowed")

        # The hand edit, saved in place, cut before the new grant's `methods:` line (line 8),
        # and left so past the settle time (0.3 s): the watcher loads it.
        reloads = gw.log().count('"policy.reloaded"')
        with path.open("a") as f:
            f.write(f"  - id: 0123456789ab0006\n    host: api.test\n    port: {port}\n")
        eventually(lambda: gw.log().count('"policy.reloaded"') > reloads)
        http_upstream.reset()
        assert [status("/admin/report") for _ in range(20)] == [(403, "path_not_allowed")] * 20
        eventually(lambda: "t1.grants.yaml:8:5: grants.1.methods: missing" in gw.log())
        assert "policy.tenant_load_failed" in gw.log()
        assert status("/v1/items") == (200, None) and status("/kept") == (200, None), "last good grants"
        assert [r.target for r in http_upstream.requests] == ["/v1/items", "/kept"]

        # The edit completed: the grant allows what it names, and nothing more.
        with path.open("a") as f:
            f.write('    methods: [GET]\n    paths: ["/admin/report"]\n')
        eventually(lambda: status("/admin/report") == (200, None))
        assert status("/admin/other") == (403, "path_not_allowed")
        assert client.post(base + "/admin/report").status_code == 403
