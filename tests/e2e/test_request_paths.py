"""End to end: a real gateway in front of a real nginx with default settings.

What the rules matched is what nginx receives, so nginx's own reading of a path (slashes
merged, every escape decoded, then dot segments resolved) cannot take a request somewhere
the rules did not allow; method overrides are decided like the methods they name.
"""

from __future__ import annotations

import base64
import socket
import subprocess
from collections.abc import Iterator

import pytest
from conftest import SANDGATE, TOKEN, UPSTREAM_IP, RunningGateway, curl, tenant_yaml, write_gateway_files
from support import NginxServer, TestPKI, wait_for_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI) -> Iterator[NginxServer]:
    with NginxServer(tmp_path_factory.mktemp("nginx"), UPSTREAM_IP, tls=pki) as server:
        yield server


@pytest.fixture(autouse=True)
def _forget_requests(nginx: NginxServer) -> None:
    nginx.reset()


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, pki: TestPKI, nginx: NginxServer
) -> Iterator[RunningGateway]:
    """One gateway for the module: api.test allows GET and HEAD under /v1 (plain and TLS);
    open.test allows everything but /admin/** and DELETE; x.api.test has no path rules."""
    assert nginx.tls_port is not None
    allow = [
        {
            "id": "v1",
            "hosts": ["api.test"],
            "ports": [nginx.port, nginx.tls_port],
            "methods": ["GET", "HEAD"],
            "paths": ["/v1/**"],
        },
        {"id": "open", "hosts": ["open.test"], "ports": [nginx.port]},
        {"id": "no-path-rules", "hosts": ["x.api.test"], "ports": [nginx.port]},
    ]
    deny = [
        {"id": "no-admin", "hosts": ["open.test"], "paths": ["/admin/**"]},
        {"id": "no-delete", "hosts": ["open.test"], "methods": ["DELETE"]},
    ]
    root = tmp_path_factory.mktemp("gateway")
    config, port = write_gateway_files(
        root,
        {"t1.yaml": tenant_yaml("t1", allow, deny=deny)},
        config={"upstream": {"trusted_ca": str(pki.ca_file)}},
    )
    log_path = root / "gateway.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [SANDGATE, "run", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    gw = RunningGateway(port=port, root=root, proc=proc, log_path=log_path)
    try:
        wait_for_port("127.0.0.1", port, timeout=30)
        yield gw
    finally:
        gw.stop()


def send(
    gw: RunningGateway, url: str, *, method: str = "GET", headers: tuple[str, ...] = ()
) -> tuple[str, str]:
    """(status, X-Sandgate-Reason) for one request through the gateway, path sent as is."""
    args = ["-x", gw.proxy(), "--cacert", str(gw.ca_file), "--path-as-is", "-X", method, "-o", "/dev/null"]
    for header in headers:
        args += ["-H", header]
    result = curl(*args, "-w", "%{http_code} %header{x-sandgate-reason}", url)
    status, _, reason = result.stdout.partition(" ")
    return status, reason


def raw_proxy_request(gw: RunningGateway, target: str, host: str) -> bytes:
    """One absolute-form request with the target byte for byte (curl would drop a fragment)."""
    auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(
            f"GET {target} HTTP/1.1\r\nHost: {host}\r\nProxy-Authorization: Basic {auth}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


# --- paths nginx would read elsewhere never reach it ------------------------------------

REFUSED = [
    (
        "api.test",
        "/v1//../admin",
        "path_not_allowed",
        "an empty segment cannot climb out of an allowed subtree",
    ),
    ("api.test", "/v1/x//../../admin", "path_not_allowed", "an empty segment deeper down cannot either"),
    ("api.test", "/v1//", "path_not_allowed", "an empty segment matches no allow glob"),
    ("api.test", "/v1/..;/admin", "path_not_allowed", "a tomcat-style dot-dot with parameters is refused"),
    ("open.test", "//admin/x", "host_denied", "a leading double slash cannot escape a deny glob"),
    ("open.test", "/x//admin", "host_denied", "an empty segment hits every deny glob"),
    ("open.test", "/admin", "host_denied", "a deny glob for a subtree covers its base path"),
    ("open.test", "/ADMIN/x", "host_denied", "a deny glob holds in another letter case"),
    ("open.test", "/admin;x/y", "host_denied", "path parameters cannot escape a deny glob"),
    ("open.test", "/%2561dmin/x", "host_denied", "a double-encoded letter cannot escape a deny glob"),
    ("open.test", "/x/..%2Fadmin", "host_denied", "an encoded slash hits every deny glob"),
]


@pytest.mark.parametrize(("host", "path", "reason"), [c[:3] for c in REFUSED], ids=[c[3] for c in REFUSED])
def test_a_path_nginx_would_read_elsewhere_never_reaches_it(
    gateway: RunningGateway, nginx: NginxServer, host: str, path: str, reason: str
) -> None:
    assert send(gateway, nginx.url_for(host) + path) == ("403", reason)
    assert nginx.requests() == []


def test_an_empty_segment_cannot_climb_out_of_an_allowed_subtree_inside_a_tls_tunnel(
    gateway: RunningGateway, nginx: NginxServer
) -> None:
    assert send(gateway, nginx.url_for("api.test", tls=True) + "/v1//../admin") == ("403", "path_not_allowed")
    assert send(gateway, nginx.url_for("api.test", tls=True) + "/v1/ok") == ("200", "")
    assert [(r.raw, r.location) for r in nginx.requests()] == [("/v1/ok", "v1")]


FORWARDED = [
    ("api.test", "/v1/a/./b/../%7euser", "/v1/a/~user", "v1", "the upstream gets the path the rules matched"),
    ("api.test", "/v1", "/v1", "other", "an allow glob for a subtree covers its base path"),
    ("x.api.test", "/v1//x", "/v1//x", "v1", "an ambiguous path passes as sent where no path rule applies"),
]


@pytest.mark.parametrize(
    ("host", "path", "received", "location"), [c[:4] for c in FORWARDED], ids=[c[4] for c in FORWARDED]
)
def test_the_upstream_receives_what_was_decided(
    gateway: RunningGateway, nginx: NginxServer, host: str, path: str, received: str, location: str
) -> None:
    assert send(gateway, nginx.url_for(host) + path) == ("200", "")
    assert [(r.raw, r.location) for r in nginx.requests()] == [(received, location)]


def test_a_fragment_never_reaches_the_upstream(gateway: RunningGateway, nginx: NginxServer) -> None:
    base = nginx.url_for("api.test")
    response = raw_proxy_request(gateway, f"{base}/v1/#/../../admin", f"api.test:{nginx.port}")
    assert response.startswith(b"HTTP/1.1 200 ") and response.endswith(b"v1 /v1/\n")
    response = raw_proxy_request(
        gateway, f"{nginx.url_for('x.api.test')}/x?q=1#frag", f"x.api.test:{nginx.port}"
    )
    assert response.startswith(b"HTTP/1.1 200 ")
    assert [r.raw for r in nginx.requests()] == ["/v1/", "/x?q=1"]


# --- method overrides are decided like the methods they name ----------------------------

OVERRIDES = [
    ("api.test", "GET", "/v1/x", ("X-HTTP-Method-Override: DELETE",), "403", "method_not_allowed",
     "an override header cannot turn an allowed GET into a DELETE"),
    ("api.test", "GET", "/v1/x", ("X-HTTP-Method: POST",), "403", "method_not_allowed",
     "the x-http-method header is an override too"),
    ("api.test", "GET", "/v1/x?_method=PUT", (), "403", "method_not_allowed",
     "the _method query parameter is an override too"),
    ("api.test", "GET", "/v1/x", ("X-Method-Override: head",), "200", "",
     "an override naming another allowed method passes"),
    ("open.test", "GET", "/x", ("X-HTTP-Method-Override: DELETE",), "403", "host_denied",
     "an override meets the deny rule for its method"),
    ("open.test", "delete", "/x", (), "403", "host_denied",
     "a lower case method is decided upper-cased"),
    ("open.test", "GET", "/x", ("X-HTTP-Method-Override: A,B,C,D,E",), "400", "invalid_request",
     "more override methods than the limit are refused"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("host", "method", "path", "headers", "status", "reason"),
    [c[:6] for c in OVERRIDES],
    ids=[c[6] for c in OVERRIDES],
)
def test_method_overrides_are_decided_like_the_methods_they_name(
    gateway: RunningGateway,
    nginx: NginxServer,
    host: str,
    method: str,
    path: str,
    headers: tuple[str, ...],
    status: str,
    reason: str,
) -> None:
    assert send(gateway, nginx.url_for(host) + path, method=method, headers=headers) == (status, reason)
    assert len(nginx.requests()) == (1 if status == "200" else 0)


def test_a_refused_override_is_audited_with_the_method_it_named(
    gateway: RunningGateway, nginx: NginxServer
) -> None:
    gateway.mark()  # the answer goes out before its record: wait for this request's own
    assert send(
        gateway, nginx.url_for("api.test") + "/v1/x", headers=("X-HTTP-Method-Override: DELETE",)
    ) == (
        "403",
        "method_not_allowed",
    )
    (record,) = gateway.records(1)
    assert record["reason"] == "method_not_allowed"
    assert (record["method"], record["decision"]) == ("GET", "deny")
    assert "'DELETE' (X-HTTP-Method-Override)" in record["detail"]
