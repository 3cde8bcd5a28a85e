"""Identity in regular mode: Basic proxy credentials, checked in constant time, never guessed."""

from __future__ import annotations

import base64

import pytest
from conftest import OTHER_TOKEN, OTHER_TOKEN_REF, TOKEN, GatewayFactory, RunningGateway, curl, tenant_yaml
from support import RecordingUpstream

from sandgate.proxy.addons.guest_peer import parse_proxy_authorization

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Basic " + base64.b64encode(b"sb1:tok").decode(), ("sb1", "tok")),
        ("basic " + base64.b64encode(b"sb1:to:k").decode(), ("sb1", "to:k")),
        ("Bearer tok", None),
        ("Basic !!!notbase64", None),
        ("Basic " + base64.b64encode(b"no-colon").decode(), None),
        ("Basic " + base64.b64encode(b":tok").decode(), None),
        (None, None),
    ],
    ids=[
        "a basic credential is split at the first colon",
        "the scheme is case-insensitive and the token may hold colons",
        "another scheme is refused",
        "invalid base64 is refused",
        "a credential without a colon is refused",
        "an empty sandbox id is refused",
        "a missing header is refused",
    ],
)
def test_parse_proxy_authorization(value: str | None, expected: tuple[str, str] | None) -> None:
    assert parse_proxy_authorization(value) == expected


@pytest.fixture(scope="module")
def shared_gateway(start_module_gateway: GatewayFactory, http_upstream: RecordingUpstream) -> RunningGateway:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    return start_module_gateway(
        {
            "t1.yaml": tenant_yaml("t1", rules),
            "t2.yaml": tenant_yaml("t2", [], sandbox="sb2", token_ref=OTHER_TOKEN_REF),
        }
    )


@pytest.fixture
def gateway(shared_gateway: RunningGateway) -> RunningGateway:
    """The module's gateway; `records()` shows this test's records only."""
    shared_gateway.mark()
    return shared_gateway


def _status(gw: RunningGateway, proxy: str, url: str, *extra: str) -> tuple[str, str]:
    result = curl("-x", proxy, "-D", "-", "-o", "/dev/null", "-w", "%{http_code}", *extra, url)
    return result.stdout[-3:], result.stdout


@pytest.mark.parametrize(
    ("sandbox", "token"),
    [(None, None), ("sb1", "wrong-token-0123456789"), ("sb9", TOKEN), ("sb2", TOKEN), ("sb1", OTHER_TOKEN)],
    ids=[
        "no credential",
        "a wrong token",
        "an unknown sandbox",
        "sandbox 2 with sandbox 1's token",
        "sandbox 1 with sandbox 2's token",
    ],
)
def test_a_missing_or_wrong_credential_gets_407(
    gateway: RunningGateway, http_upstream: RecordingUpstream, sandbox: str | None, token: str | None
) -> None:
    proxy = gateway.proxy(sandbox, token) if sandbox and token else gateway.bare_proxy
    code, headers = _status(gateway, proxy, f"{http_upstream.url_for('api.test')}/x")
    assert code == "407"
    assert 'Proxy-Authenticate: Basic realm="sandgate"' in headers
    (rec,) = gateway.records(1)
    assert (rec["reason"], rec["tenant"], rec["sandbox"]) == ("no_identity", None, None)
    assert http_upstream.connections == []


def test_the_tenant_comes_from_the_credential_never_from_headers(
    gateway: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    url = f"{http_upstream.url_for('api.test')}/x"
    # sb2's tenant allows nothing; headers claiming tenant t1 change nothing.
    code, _ = _status(
        gateway, gateway.proxy("sb2", OTHER_TOKEN), url, "-H", "X-Sandgate-Tenant: t1", "-H", "X-Tenant: t1"
    )
    assert code == "403"
    (rec,) = gateway.records(1)
    assert (rec["tenant"], rec["sandbox"], rec["reason"]) == ("t2", "sb2", "host_not_allowed")


def test_connect_needs_the_credential_too(gateway: RunningGateway) -> None:
    result = curl(
        "-x", gateway.bare_proxy, "-o", "/dev/null", "-w", "%{http_connect}", "https://api.test:443/"
    )
    assert result.stdout == "407"
    assert gateway.records(1)[0]["phase"] == "connect"
