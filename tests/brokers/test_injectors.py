"""Each injector puts the secret exactly where its credential says, and nowhere else."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from sandgate.brokers import (
    BrokerAllow,
    BrokerDenial,
    DenialCause,
    PlaceholderMinter,
    SecretRegistry,
    TenantCredentials,
    apply_mutations,
)
from sandgate.brokers.request import BrokerRequest

from .conftest import KEY, MemorySource, credential, make_broker, request

SECRET = 's3cr3t/with+special&chars="x"'
MINTER = PlaceholderMinter(KEY)
P = MINTER.mint("t1", "sb1", "c")


@pytest.fixture
def memory() -> MemorySource:
    return MemorySource(c=SECRET, pair="deploy-user:pa55-word-0123")


CASES: list[tuple[str, dict[str, Any], BrokerRequest, dict[str, Any]]] = [
    (
        "a header template replaces the guest's header",
        {"inject": {"header": "Authorization", "format": "Bearer {secret}"}},
        request("api.example.com", headers=(("Authorization", f"Bearer {P}"),)),
        {"headers": [("Authorization", f"Bearer {SECRET}")]},
    ),
    (
        "a custom header takes the bare secret",
        {"inject": {"header": "X-Api-Key"}},
        request("api.example.com", headers=(("x-api-key", P.upper()),)),
        {"headers": [("X-Api-Key", SECRET)]},
    ),
    (
        "basic auth with a configured username",
        {"inject": {"basic": {"username": "deploy"}}},
        request(
            "api.example.com",
            headers=(("Authorization", "Basic " + base64.b64encode(f"deploy:{P}".encode()).decode()),),
        ),
        {"headers": [("Authorization", "Basic " + base64.b64encode(f"deploy:{SECRET}".encode()).decode())]},
    ),
    (
        "basic auth with user:password in the secret",
        {"secret": "mem:pair", "inject": {"basic": {}}},
        request(
            "api.example.com",
            headers=(("Authorization", "Basic " + base64.b64encode(f"x:{P}".encode()).decode()),),
        ),
        {"headers": [("Authorization", "Basic " + base64.b64encode(b"deploy-user:pa55-word-0123").decode())]},
    ),
    (
        "a query parameter is replaced in place, duplicates dropped",
        {"inject": {"query": "api_key"}},
        request("api.example.com", query=f"a=1&api_key={P}&b=2&api_key=guest"),
        {"query": "a=1&api_key=s3cr3t%2Fwith%2Bspecial%26chars%3D%22x%22&b=2"},
    ),
    (
        "an always-on query credential adds its parameter",
        {"inject": {"query": "api_key"}, "apply": "always"},
        request("api.example.com", query="a=1"),
        {"query": "a=1&api_key=s3cr3t%2Fwith%2Bspecial%26chars%3D%22x%22"},
    ),
    (
        "an always-on header credential replaces a guest key without a placeholder",
        {"inject": {"header": "X-Api-Key"}, "apply": "always"},
        request("api.example.com", headers=(("X-Api-Key", "guest-own"),)),
        {"headers": [("X-Api-Key", SECRET)]},
    ),
    (
        "a JSON body gets the JSON-escaped secret",
        {"inject": {"body": True}},
        request(
            "api.example.com",
            headers=(("Content-Type", "application/json"),),
            body=json.dumps({"token": P, "n": 1}).encode(),
        ),
        {"body": json.dumps({"token": SECRET, "n": 1}).encode()},
    ),
    (
        "a form body gets the form-encoded secret",
        {"inject": {"body": True}},
        request(
            "api.example.com",
            headers=(("Content-Type", "application/x-www-form-urlencoded"),),
            body=f"token={P}&a=b".encode(),
        ),
        {"body": b"token=s3cr3t%2Fwith%2Bspecial%26chars%3D%22x%22&a=b"},
    ),
    (
        "a text body gets the raw secret, every occurrence",
        {"inject": {"body": True}},
        request(
            "api.example.com", headers=(("Content-Type", "text/plain"),), body=f"{P} and {P.upper()}".encode()
        ),
        {"body": f"{SECRET} and {SECRET}".encode()},
    ),
]


@pytest.mark.parametrize(("fields", "req", "expect"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_injection(
    registry: SecretRegistry, fields: dict[str, Any], req: BrokerRequest, expect: dict[str, Any]
) -> None:
    cred = credential(**{"name": "c", "secret": "mem:c", "hosts": ["api.example.com"], **fields})
    broker = make_broker(registry, [TenantCredentials("t1", ("sb1",), (cred,))])
    decision = await broker.plan("t1", "sb1", req)
    assert isinstance(decision, BrokerAllow), decision
    assert decision.credentials == ("c",)
    assert decision.injectors == (cred.kind,)
    applied = apply_mutations(req, decision.mutations)
    if "headers" in expect:
        names = {k.lower() for k, _ in expect["headers"]}
        got = [(k, v) for k, v in applied.headers if k.lower() in names]
        assert got == expect["headers"]
    assert ("Accept-Encoding", "identity") in applied.headers
    assert applied.query == expect.get("query", req.query)
    assert applied.body == expect.get("body", req.body)
    assert SECRET not in repr(decision)


async def test_an_always_credential_stays_off_unbound_hosts(registry: SecretRegistry) -> None:
    cred = credential(
        name="c", secret="mem:c", hosts=["api.example.com"], inject={"header": "X-Api-Key"}, apply="always"
    )
    broker = make_broker(registry, [TenantCredentials("t1", ("sb1",), (cred,))])
    assert await broker.plan("t1", "sb1", request("other.example.com")) == BrokerAllow()
    assert await broker.plan("t1", "sb1", request("api.example.com", port=8443)) == BrokerAllow()


async def test_a_streamed_body_for_a_body_credential_is_checked_by_the_guard(
    registry: SecretRegistry,
) -> None:
    cred = credential(name="c", secret="mem:c", hosts=["api.example.com"], inject={"body": True})
    broker = make_broker(registry, [TenantCredentials("t1", ("sb1",), (cred,))])
    decision = await broker.plan("t1", "sb1", request("api.example.com", body=None, body_too_large=True))
    assert isinstance(decision, BrokerAllow)
    assert decision.body_guard is not None
    assert decision.body_guard.feed(b"x" * 1000 + P[:10].encode()) is None
    denial = decision.body_guard.feed(P[10:].encode())
    assert denial == BrokerDenial(DenialCause.BODY_TOO_LARGE, ("c",), ("body",))
    assert decision.body_guard.feed(b"more") == denial
