"""End to end: a real `sandgate run` between real clients (httpx, curl) and real upstreams."""

from __future__ import annotations

import json
import ssl
from datetime import datetime
from typing import Any

import httpx
import pytest
from conftest import ATTACKER_IP, TOKEN, UPSTREAM_IP, GatewayFactory, RunningGateway, curl, tenant_yaml
from support import RecordingUpstream, TestPKI

pytestmark = pytest.mark.slow


def allow_rules(http_port: int, https_port: int) -> list[dict[str, object]]:
    return [
        {"id": "api-plain", "hosts": ["api.test"], "ports": [http_port]},
        {"id": "api-tls", "hosts": ["api.test"], "ports": [https_port], "inspect": True},
        {"id": "pass", "hosts": ["pass.test"], "ports": [https_port]},
        {
            "id": "api-read",
            "hosts": ["*.api.test"],
            "ports": [https_port],
            "methods": ["GET"],
            "paths": ["/v1/**"],
        },
        {"id": "by-ip", "cidrs": [f"{UPSTREAM_IP}/32"], "ports": [http_port]},
        # Allowed by name, but resolving to the gateway itself and to the metadata service.
        {"id": "traps", "hosts": ["self.test", "meta.test"], "ports": [8080]},
    ]


@pytest.fixture(scope="module")
def shared_gateway(
    start_module_gateway: GatewayFactory, http_upstream: RecordingUpstream, https_upstream: RecordingUpstream
) -> RunningGateway:
    rules = allow_rules(http_upstream.port, https_upstream.port)
    deny = [{"id": "no-admin", "hosts": ["api.test"], "paths": ["/admin/**"]}]
    # The operator opens the upstream's address to tenants whose cidr names it (rule by-ip).
    guard = {"address_guard": {"tenant_reachable": [f"{UPSTREAM_IP}/32"]}}
    return start_module_gateway({"t1.yaml": tenant_yaml("t1", rules, deny=deny)}, config=guard)


@pytest.fixture
def gateway(shared_gateway: RunningGateway) -> RunningGateway:
    """The module's gateway (its tests only send requests); `records()` shows this test's."""
    shared_gateway.mark()
    return shared_gateway


def client(gw: RunningGateway, *, verify: ssl.SSLContext | str | bool = True) -> httpx.Client:
    ctx = verify
    if verify is True:
        ctx = ssl.create_default_context(cafile=str(gw.ca_file))
    return httpx.Client(proxy=gw.proxy(), verify=ctx, timeout=10)


def assert_denied(resp: httpx.Response, reason: str, gw: RunningGateway) -> dict[str, Any]:
    assert resp.status_code == 403
    assert resp.headers["X-Sandgate-Reason"] == reason
    body = resp.json()
    assert body["error"] == "egress denied"
    assert body["reason"] == reason
    record = gw.record(str(body["decision_id"]))
    assert record["reason"] == reason
    assert record["decision"] == "deny"
    return record


def test_allowed_plain_http_reaches_upstream_without_the_proxy_token(
    gateway: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    with client(gateway) as c:
        resp = c.get(f"{http_upstream.url_for('api.test')}/hello?key=secret-value")
    assert resp.status_code == 200
    assert resp.json()["path"] == "/hello?key=secret-value"
    (req,) = http_upstream.requests
    assert req.header("Proxy-Authorization") is None
    assert req.header("Host") == f"api.test:{http_upstream.port}"
    (rec,) = gateway.records(1)
    assert (rec["decision"], rec["reason"], rec["rule_id"], rec["tenant"], rec["sandbox"]) == (
        "allow",
        "allowed",
        "t1/allow/api-plain",
        "t1",
        "sb1",
    )
    assert rec["dest"] == {"host": "api.test", "ip": UPSTREAM_IP, "port": http_upstream.port, "sni": None}
    assert rec["path"] == "/hello?key=REDACTED", "query values never reach the audit trail"
    assert rec["status"] == 200 and rec["bytes"]["down"] > 0


def test_denied_host_gets_403_json_and_no_upstream_connection(
    gateway: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    with client(gateway) as c:
        resp = c.get(f"{http_upstream.url_for('open.test')}/x")
    rec = assert_denied(resp, "host_not_allowed", gateway)
    assert resp.json()["host"] == "open.test"
    assert rec["dest"]["host"] == "open.test"
    assert http_upstream.connections == []


def test_denied_connect_gets_403_and_no_upstream_connection(
    gateway: RunningGateway, https_upstream: RecordingUpstream
) -> None:
    result = curl(
        "-x",
        gateway.proxy(),
        "-o",
        "/dev/null",
        "-w",
        "%{http_connect}",
        f"{https_upstream.url_for('open.test')}/",
    )
    assert result.stdout == "403"
    (rec,) = gateway.records(1)
    assert (rec["phase"], rec["reason"]) == ("connect", "host_not_allowed")
    assert https_upstream.connections == []


def test_intercepted_https_is_decided_per_request(
    gateway: RunningGateway, https_upstream: RecordingUpstream
) -> None:
    base = https_upstream.url_for("api.test")
    with client(gateway) as c:
        ok = c.get(f"{base}/v2/anything")
        denied = c.get(f"{base}/admin/users")
    assert ok.status_code == 200
    assert_denied(denied, "host_denied", gateway)
    assert [r.target for r in https_upstream.requests] == ["/v2/anything"]
    phases = [(r["phase"], r["decision"]) for r in gateway.records(4)]
    assert phases == [("connect", "allow"), ("tls", "allow"), ("request", "allow"), ("request", "deny")]


@pytest.mark.parametrize(
    ("method", "path", "reason"),
    [
        ("GET", "/v1/items", "allowed"),
        ("POST", "/v1/items", "method_not_allowed"),
        ("GET", "/v2/items", "path_not_allowed"),
        ("GET", "/v1/../v2/items", "path_not_allowed"),
        ("GET", "/v1/a%2F..%2F..%2Fv2", "path_not_allowed"),
    ],
    ids=[
        "a GET under /v1 is allowed",
        "a POST is refused by method",
        "a path outside /v1 is refused",
        "dot segments are resolved before matching",
        "an encoded slash never matches an allow glob",
    ],
)
def test_method_and_path_rules_need_interception(
    gateway: RunningGateway, https_upstream: RecordingUpstream, method: str, path: str, reason: str
) -> None:
    url = f"{https_upstream.url_for('x.api.test')}"
    result = curl(
        "-x",
        gateway.proxy(),
        "--cacert",
        str(gateway.ca_file),
        "--path-as-is",
        "-X",
        method,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        url + path,
    )
    assert result.stdout == ("200" if reason == "allowed" else "403")
    assert gateway.records(3)[-1]["reason"] == reason


def test_passthrough_tunnel_is_not_intercepted(
    gateway: RunningGateway, https_upstream: RecordingUpstream, pki: TestPKI
) -> None:
    # The client trusts only the upstream's own CA: this works only if the gateway does not intercept.
    with client(gateway, verify=pki.client_context()) as c:
        resp = c.get(f"{https_upstream.url_for('pass.test')}/through")
    assert resp.status_code == 200
    assert resp.json()["server"] == "https-upstream"
    assert https_upstream.connections[0].sni == "pass.test"


def test_sni_that_differs_from_the_connect_host_is_refused(
    gateway: RunningGateway, https_upstream: RecordingUpstream
) -> None:
    # CONNECT pass.test (allowed, passthrough) but a ClientHello for api.test.
    port = https_upstream.port
    result = curl(
        "-x",
        gateway.proxy(),
        "-k",
        "--connect-to",
        f"api.test:{port}:pass.test:{port}",
        f"https://api.test:{port}/",
    )
    assert result.returncode != 0
    records = gateway.records(2)
    assert [(r["phase"], r["reason"]) for r in records] == [("connect", "allowed"), ("tls", "sni_mismatch")]
    assert records[1]["dest"]["sni"] == "api.test"
    assert https_upstream.connections == []


@pytest.mark.parametrize(
    "scheme", ["http", "https"], ids=["in an absolute-form request", "inside an intercepted tunnel"]
)
def test_host_header_that_differs_from_the_destination_is_refused(
    gateway: RunningGateway, http_upstream: RecordingUpstream, https_upstream: RecordingUpstream, scheme: str
) -> None:
    up = http_upstream if scheme == "http" else https_upstream
    with client(gateway) as c:
        resp = c.get(f"{up.url_for('api.test')}/x", headers={"Host": "other.test"})
    assert_denied(resp, "host_mismatch", gateway)
    assert up.requests == []


def test_one_keepalive_connection_is_decided_request_by_request(
    gateway: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    # curl reuses one proxy connection for all three URLs (httpx would open one per origin).
    urls = [
        f"{http_upstream.url_for('api.test')}/1",
        f"http://{UPSTREAM_IP}:{http_upstream.port}/2",
        f"{http_upstream.url_for('open.test')}/3",
        f"{http_upstream.url_for('api.test')}/4",
    ]
    outputs = [arg for url in urls for arg in ("-o", "/dev/null", url)]
    result = curl("-x", gateway.proxy(), "-w", "%{http_code} %{num_connects}\n", *outputs)
    assert result.stdout.split() == ["200", "1", "200", "0", "403", "0", "200", "0"]
    assert [r.target for r in http_upstream.requests] == ["/1", "/2", "/4"]
    records = gateway.records(4)
    assert [r["rule_id"] for r in records] == [
        "t1/allow/api-plain",
        "t1/allow/by-ip",
        None,
        "t1/allow/api-plain",
    ]
    assert len({r["client"] for r in records}) == 1, "all went over one client connection"


@pytest.mark.parametrize(
    "host",
    [
        "2130706433",
        "0x7f000001",
        "0x7f.1",
        "0177.0.0.1",
        "127.1",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "169.254.169.254",
        "[fd00:ec2::254]",
        "self.test",
        "meta.test",
        "100.64.0.1",
        "0.0.0.0",
        "[::1]",
    ],
    ids=lambda h: f"{h} is refused",
)
def test_numeric_and_ipv6_tricks_cannot_reach_internal_addresses(gateway: RunningGateway, host: str) -> None:
    result = curl("-x", gateway.proxy(), "-o", "/dev/null", "-w", "%{http_code}", f"http://{host}:8080/")
    assert result.stdout == "403"
    assert gateway.records(1)[-1]["reason"] == "private_address"


def test_a_covering_cidr_rule_opens_an_internal_address_by_ip(
    gateway: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    with client(gateway) as c:
        resp = c.get(f"http://{UPSTREAM_IP}:{http_upstream.port}/by-ip")
        other = c.get(f"http://{ATTACKER_IP}:{http_upstream.port}/by-ip")
    assert resp.status_code == 200
    assert_denied(other, "private_address", gateway)


def test_report_mode_allows_and_records_would_deny(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    # open.test is on loopback, which these tests open by name (reachable_by_name): only to
    # names a rule names, so the rule names it, on another port.
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", [{"hosts": ["open.test"], "ports": [1]}], mode="report")}
    )
    with client(gw) as c:
        resp = c.get(f"{http_upstream.url_for('open.test')}/learn")
        unnamed = c.get(f"{http_upstream.url_for('api.test')}/unnamed")
        internal = c.get("http://169.254.169.254/latest/meta-data/")
    assert resp.status_code == 200
    assert unnamed.status_code == 403, "a by-name range opens only to names a rule names, report mode or not"
    assert internal.status_code == 403, "report mode never relaxes the operator's address guard"
    records = gw.records(3)
    assert [(r["decision"], r["reason"], r["mode"]) for r in records] == [
        ("would_deny", "port_not_allowed", "report"),
        ("deny", "private_address", "report"),
        ("deny", "private_address", "report"),
    ]


def test_dns_rebinding_cannot_switch_the_dialled_address(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, attacker_upstream: RecordingUpstream
) -> None:
    from support import ScriptedDNSServer

    with ScriptedDNSServer(records={"rebind.test": [[UPSTREAM_IP], [ATTACKER_IP]]}, ttl=0) as dns:
        rules = [{"hosts": ["rebind.test"], "ports": [http_upstream.port]}]
        gw = start_gateway(
            {"t1.yaml": tenant_yaml("t1", rules)},
            config={
                "resolver": {"hosts": {}, "nameservers": [f"127.0.0.1:{dns.port}"], "ipv6": False},
                "address_guard": {"reachable_by_name": [f"{UPSTREAM_IP}/32"]},
            },
        )
        with client(gw) as c:
            first = c.get(f"{http_upstream.url_for('rebind.test')}/first")
        with client(gw) as c:
            second = c.get(f"{http_upstream.url_for('rebind.test')}/second")
        assert dns.count("rebind.test", "A") == 2, "one lookup per decision, by the gateway only"
    assert first.status_code == 200
    assert [r.target for r in http_upstream.requests] == ["/first"]
    assert_denied(second, "private_address", gw)
    assert attacker_upstream.connections == []
    assert gw.records(2)[0]["dest"]["ip"] == UPSTREAM_IP


def test_every_decision_has_exactly_one_well_formed_record(
    gateway: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    with client(gateway) as c:
        statuses = [
            c.get(f"{http_upstream.url_for(h)}/{i}").status_code
            for i, h in enumerate(["api.test", "open.test"] * 5)
        ]
    assert statuses == [200, 403] * 5
    records = gateway.records(10)
    assert len(records) == 10
    assert len({r["decision_id"] for r in records}) == 10
    required = {
        "time",
        "decision_id",
        "tenant",
        "sandbox",
        "phase",
        "client",
        "dest",
        "method",
        "path",
        "decision",
        "reason",
        "rule_id",
        "policy_version",
        "mode",
        "credentials",
        "bytes",
        "duration_ms",
    }
    for r in records:
        assert required <= r.keys()
        assert datetime.fromisoformat(r["time"]).tzinfo is not None
        json.dumps(r)
    assert TOKEN not in gateway.audit_path.read_text()
    assert TOKEN not in gateway.log()


def test_an_absolute_form_target_inside_a_tunnel_must_name_the_approved_host(
    gateway: RunningGateway, https_upstream: RecordingUpstream
) -> None:
    """Servers obey an absolute-form target over Host (RFC 9112 3.2.2): it is checked too."""
    import base64
    import socket

    port = https_upstream.port
    auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    results = []
    for target in (f"https://other.example:{port}/x", f"https://api.test:{port}/y"):
        raw = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
        raw.sendall(
            f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        assert b" 200 " in raw.recv(4096)
        tls = ssl.create_default_context(cafile=str(gateway.ca_file)).wrap_socket(
            raw, server_hostname="api.test"
        )
        tls.sendall(f"GET {target} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
        tls.close()
        results.append(data.split(b"\r\n", 1)[0])
    assert results == [b"HTTP/1.1 403 Forbidden", b"HTTP/1.1 200 OK"]
    assert [r.target for r in https_upstream.requests] == ["/y"], (
        "forwarded in origin-form, to the approved host only"
    )
