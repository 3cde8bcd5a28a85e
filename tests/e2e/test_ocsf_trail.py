"""OCSF events of a real gateway's real trail: every line the gateway wrote maps to events that
the published OCSF 1.8.0 schema accepts, every class shows up, a secret an upstream echoes back
is recorded once as a finding, and `sandgate audit query --format ocsf` prints the same events."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import threading
from typing import Any

import dns.message
import dns.query
import dns.rcode
import httpx
import pytest
import yaml
from conftest import SANDGATE, TOKEN, TOKEN_REF, GatewayFactory, RunningGateway
from support import RecordingUpstream, free_port
from support.ocsf_schema import validate_event
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage

from sandgate.proxy.audit.ocsf.events import ocsf_events

pytestmark = pytest.mark.slow

REAL = "sk-live-OCSF-REALSECRET-0123456789"
# The DNS guest: a sandbox known by its (loopback) source address.
DNS_GUEST = "127.0.0.5"


def _tenant(https_port: int, http_port: int) -> str:
    return yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}, {"id": "dns-guest", "addresses": [DNS_GUEST]}],
            "allow": [
                {"hosts": ["api.test", "open.test"], "ports": [https_port], "inspect": True},
                {"hosts": ["open.test"], "ports": [http_port]},
            ],
            "credentials": [
                {
                    "name": "openai",
                    "secret": "env:SANDGATE_TEST_SECRET",
                    "hosts": ["api.test"],
                    "ports": [https_port],
                    "env": "OPENAI_API_KEY",
                    "inject": {"header": "Authorization", "format": "Bearer {secret}"},
                }
            ],
        },
        sort_keys=False,
    )


@pytest.fixture(scope="module")
def gateway(
    start_module_gateway: GatewayFactory, https_upstream: RecordingUpstream, http_upstream: RecordingUpstream
) -> RunningGateway:
    return start_module_gateway(
        {"t1.yaml": _tenant(https_upstream.port, http_upstream.port)},
        config={"dns": {"host": "127.0.0.1", "port": free_port()}},
        env={"SANDGATE_TEST_SECRET": REAL},
    )


def _client(gw: RunningGateway) -> httpx.Client:
    return httpx.Client(
        proxy=gw.proxy("sb1", TOKEN), verify=ssl.create_default_context(cafile=str(gw.ca_file)), timeout=10
    )


def _dns_port(gw: RunningGateway) -> int:
    config = yaml.safe_load((gw.root / "sandgate.yaml").read_text())
    return int(config["dns"]["port"])


def _ask(gw: RunningGateway, name: str) -> int:
    """The listener's response code to an A query for `name` from the DNS guest."""
    query = dns.message.make_query(name, "A")
    reply = dns.query.udp(query, "127.0.0.1", port=_dns_port(gw), source=DNS_GUEST, timeout=5)
    return int(reply.rcode())


def _lines(gw: RunningGateway) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gw.audit_path.read_text().splitlines()]


def _traffic(gw: RunningGateway, https_upstream: RecordingUpstream, http_upstream: RecordingUpstream) -> None:
    """An upstream that sends the secret back (twice in a small answer, twice in a streamed
    one), a denied request, a placeholder sent to a host it is not bound to, a denied
    CONNECT, two DNS queries and a reload."""
    placeholder = gw.placeholders("sb1")["OPENAI_API_KEY"]
    auth = {"Authorization": f"Bearer {placeholder}"}
    with _client(gw) as c:
        try:
            https_upstream.body = json.dumps({"leak": REAL, "again": REAL}).encode()
            echoed = c.get(f"{https_upstream.url_for('api.test')}/v1/echo", headers=auth)
            assert (
                echoed.status_code == 200 and echoed.text.count(placeholder) == 2 and REAL not in echoed.text
            )
            # Over 1 MiB: streamed to the guest (a secret mid-stream and one in the tail held last).
            https_upstream.body = (b"x" * 1_000_000 + REAL.encode()) * 2
            big = c.get(f"{https_upstream.url_for('api.test')}/v1/big", headers=auth)
            assert big.content.count(placeholder.encode()) == 2 and big.content.endswith(placeholder.encode())
        finally:
            https_upstream.body = None
        assert c.get("http://denied.test/").status_code == 403
        misplaced = c.post(f"{http_upstream.url_for('open.test')}/collect", content=placeholder.encode())
        assert misplaced.status_code == 403
        with pytest.raises(httpx.ProxyError):
            c.get("https://denied.test/")
    assert _ask(gw, "api.test") == dns.rcode.NOERROR
    assert _ask(gw, "exfil-4a6f.denied.test") == dns.rcode.NXDOMAIN
    gw.reload()
    gw.records_until(bool, event="policy_reload")


@pytest.fixture(scope="module")
def trail(
    gateway: RunningGateway, https_upstream: RecordingUpstream, http_upstream: RecordingUpstream
) -> list[dict[str, Any]]:
    """The gateway's trail once the traffic above is written."""
    _traffic(gateway, https_upstream, http_upstream)
    gateway.records_until(lambda rs: len(rs) >= 2, event="finding")
    gateway.settled()
    return _lines(gateway)


def test_every_line_of_a_real_trail_maps_to_valid_ocsf_events(trail: list[dict[str, Any]]) -> None:
    classes: dict[int, int] = {}
    uids: list[str] = []
    for line in trail:
        for event in ocsf_events(line):
            validate_event(event)
            classes[event["class_uid"]] = classes.get(event["class_uid"], 0) + 1
            uids.append(event["metadata"]["uid"])
    assert {4001, 4002, 4003, 2004, 5019} <= set(classes), classes
    assert len(uids) == len(set(uids)), "an event uid is unique"


def test_the_kinds_of_traffic_map_to_their_classes(trail: list[dict[str, Any]]) -> None:
    events = [e for line in trail for e in ocsf_events(line)]
    http = {
        (e["http_request"].get("url", {}).get("path"), e["status_detail"])
        for e in events
        if e["class_uid"] == 4002
    }
    assert {
        ("/v1/echo", "allowed"),
        ("/", "host_not_allowed"),
        ("/collect", "credential_host_mismatch"),
    } <= http
    connects = {
        (e["dst_endpoint"].get("hostname"), e["activity_name"]) for e in events if e["class_uid"] == 4001
    }
    assert {("api.test", "Open"), ("denied.test", "Refuse")} <= connects
    dns_events = {(e["query"]["hostname"], e["rcode"]) for e in events if e["class_uid"] == 4003}
    assert dns_events == {("api.test", "NoError"), ("exfil-4a6f.denied.test", "NXDomain")}
    findings = {e["finding_info"]["types"][0] for e in events if e["class_uid"] == 2004}
    assert findings == {"credential_misuse", "dns_exfiltration", "secret_scrubbed"}


def test_an_echoed_secret_is_recorded_once_per_response_as_a_finding_of_its_exchange(
    trail: list[dict[str, Any]],
) -> None:
    exchanges = {r["path"]: r["decision_id"] for r in trail if r.get("event") == "decision" and r.get("path")}
    findings = [r for r in trail if r.get("event") == "finding"]
    assert sorted((f["of"], f["count"]) for f in findings) == sorted(
        [(exchanges["/v1/echo"], 2), (exchanges["/v1/big"], 2)]
    )
    for found in findings:
        assert found["kind"] == "secret_scrubbed"
        assert (found["credentials"], found["counts"], found["scope"]) == (
            ["openai"],
            {"openai": found["count"]},
            "response",
        )
        assert (found["tenant"], found["sandbox"]) == ("t1", "sb1")
        (event,) = ocsf_events(found)
        assert event["metadata"]["correlation_uid"] == found["of"]
    assert REAL not in json.dumps(trail)


def test_a_response_without_a_secret_records_no_finding(
    gateway: RunningGateway, trail: list[dict[str, Any]], https_upstream: RecordingUpstream
) -> None:
    gateway.mark()
    with _client(gateway) as c:
        # Scrubbed (the tenant has a secret), but the echo holds none: nothing injected.
        quiet = c.get(f"{https_upstream.url_for('api.test')}/v1/quiet", headers={"X-Note": "no secret here"})
    assert quiet.status_code == 200 and "no secret here" in quiet.text
    gateway.records_until(lambda rs: any(r.get("path") == "/v1/quiet" for r in rs))
    assert gateway.settled(event="finding") == []


def test_audit_query_prints_the_same_ocsf_events(
    gateway: RunningGateway, trail: list[dict[str, Any]]
) -> None:
    out = subprocess.run(
        [SANDGATE, "audit", "query", "--format", "ocsf", "--config", str(gateway.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    printed = [json.loads(line) for line in out.stdout.splitlines()]
    decisions = [r for r in _lines(gateway) if r.get("event") == "decision"]
    assert printed == [e for r in decisions for e in ocsf_events(r)]
    finding = subprocess.run(
        [SANDGATE, "audit", "query", "--format", "ocsf", "--event", "finding"]
        + ["--config", str(gateway.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    events = [json.loads(line) for line in finding.stdout.splitlines()]
    assert [e["finding_info"]["types"] for e in events] == [["secret_scrubbed"]] * 2


class _WebSocketEcho:
    """An HTTPS WebSocket server that sends back, as one message, the Authorization it got."""

    def __init__(self, pki: Any) -> None:
        self.ctx = pki.server_context()
        self.sock = socket.create_server(("127.0.0.2", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                with self.ctx.wrap_socket(conn, server_side=True) as tls:
                    ws = WSConnection(ConnectionType.SERVER)
                    ws.receive_data(tls.recv(65536))
                    for event in ws.events():
                        if isinstance(event, Request):
                            auth = dict(event.extra_headers).get(b"authorization", b"").decode()
                            tls.sendall(ws.send(AcceptConnection()))
                            tls.sendall(ws.send(TextMessage(data=f"you sent: {auth}")))
                    tls.recv(65536)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


def test_a_secret_scrubbed_from_a_websocket_session_is_recorded_when_it_ends(
    start_gateway: GatewayFactory, pki: Any
) -> None:
    server = _WebSocketEcho(pki)
    try:
        tenant = yaml.safe_load(_tenant(server.port, server.port))
        tenant["allow"] = [{"hosts": ["api.test"], "ports": [server.port], "websocket": True}]
        gw = start_gateway({"t1.yaml": yaml.safe_dump(tenant)}, env={"SANDGATE_TEST_SECRET": REAL})
        placeholder = gw.placeholders("sb1")["OPENAI_API_KEY"]
        proxy_auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
        raw = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
        raw.sendall(
            f"CONNECT api.test:{server.port} HTTP/1.1\r\nHost: api.test\r\n"
            f"Proxy-Authorization: Basic {proxy_auth}\r\n\r\n".encode()
        )
        assert b" 200 " in raw.recv(4096)
        tls = ssl.create_default_context(cafile=str(gw.ca_file)).wrap_socket(raw, server_hostname="api.test")
        ws = WSConnection(ConnectionType.CLIENT)
        auth = [(b"authorization", f"Bearer {placeholder}".encode())]
        tls.sendall(ws.send(Request(host=f"api.test:{server.port}", target="/ws", extra_headers=auth)))
        texts: list[str] = []
        while not texts:
            data = tls.recv(65536)
            assert data, "the connection closed before a message arrived"
            ws.receive_data(data)
            texts += [e.data for e in ws.events() if isinstance(e, TextMessage)]
        assert texts == [f"you sent: Bearer {placeholder}"]
        assert not gw.settled(event="finding"), "recorded when the session ends, not per message"
        tls.close()
    finally:
        server.close()
    (found,) = gw.records_until(bool, event="finding")
    (upgrade,) = [r for r in gw.records() if r["phase"] == "request" and r["path"] == "/ws"]
    assert (found["of"], found["scope"], found["counts"]) == (
        upgrade["decision_id"],
        "websocket",
        {"openai": 1},
    )
    for event in ocsf_events(found):
        validate_event(event)
    assert REAL not in gw.audit_path.read_text()
