"""SigV4 re-signing: the AWS published get-vanilla vector, and botocore's signer as an independent oracle."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any
from urllib.parse import urlsplit

import botocore.auth
import pytest
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sandgate.brokers import (
    BrokerAllow,
    BrokerDenial,
    BrokerRequest,
    DenialCause,
    PlaceholderMinter,
    TenantCredentials,
    apply_mutations,
    default_registry,
)
from sandgate.brokers.providers.sigv4 import canonical_query, canonical_uri, parse_authorization, sign

from ..conftest import KEY, Clock, MemorySource, credential, make_broker

AKID = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SESSION = "FwoGZXIvYXdzEJr//////////session-token-example"
PLACEHOLDER = PlaceholderMinter(KEY).mint("t1", "sb1", "aws")
GUEST_TIME = dt.datetime(2026, 11, 30, 1, 0, 0, tzinfo=dt.UTC)
GATEWAY_TIME = dt.datetime(2026, 11, 30, 1, 0, 7, tzinfo=dt.UTC)


def test_the_aws_get_vanilla_vector() -> None:
    """aws-sig-v4-test-suite/get-vanilla: GET / to example.amazonaws.com, service `service`, us-east-1."""
    signature = sign(
        method="GET",
        path="/",
        query="",
        headers=[("Host", "example.amazonaws.com"), ("X-Amz-Date", "20150830T123600Z")],
        signed_headers=["host", "x-amz-date"],
        payload_hash=hashlib.sha256(b"").hexdigest(),
        region="us-east-1",
        service="service",
        access_key_id="AKIDEXAMPLE",
        secret_access_key="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        timestamp="20150830T123600Z",
    )
    assert signature.canonical_request == (
        "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    assert signature.string_to_sign == (
        "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
        "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63"
    )
    assert signature.signature == "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
    assert signature.authorization == (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
    )


def botocore_sign(
    monkeypatch: pytest.MonkeyPatch,
    when: dt.datetime,
    creds: Credentials,
    service: str,
    region: str,
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
) -> AWSRequest:
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: when.replace(tzinfo=None))
    req = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
    signer_class = botocore.auth.S3SigV4Auth if service == "s3" else botocore.auth.SigV4Auth
    signer_class(creds, service, region).add_auth(req)
    return req


CASES: list[tuple[str, str, str, str, dict[str, str], bytes, bool]] = [
    (
        "a GET with an unsorted, repeated and encoded query",
        "execute-api",
        "GET",
        "https://abc123.execute-api.eu-west-1.amazonaws.com/prod/items?b=2&a=1&a=0&q=x%20y%2Fz&tilde=~&empty=",
        {},
        b"",
        False,
    ),
    (
        "a JSON POST with a target header",
        "dynamodb",
        "POST",
        "https://dynamodb.eu-west-1.amazonaws.com/",
        {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "DynamoDB_20120810.ListTables"},
        b'{"Limit": 5}',
        False,
    ),
    (
        "an S3 PUT with an encoded key and a session token",
        "s3",
        "PUT",
        "https://bucket.s3.eu-west-1.amazonaws.com/dir/a%20file%2Bplus.txt",
        {"Content-Type": "text/plain"},
        b"hello world",
        True,
    ),
    (
        "an S3 GET with a subresource query",
        "s3",
        "GET",
        "https://bucket.s3.eu-west-1.amazonaws.com/?list-type=2&prefix=a%2Fb",
        {},
        b"",
        False,
    ),
    (
        "a non-S3 path with dot segments and double slashes",
        "execute-api",
        "GET",
        "https://abc123.execute-api.eu-west-1.amazonaws.com/prod//a/./b/../c",
        {},
        b"",
        False,
    ),
    (
        "a request with extra headers and spaces in values",
        "sts",
        "POST",
        "https://sts.eu-west-1.amazonaws.com/",
        {
            "Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
            "X-Amz-Meta-Note": "  two   spaces  ",
        },
        b"Action=GetCallerIdentity&Version=2011-06-15",
        True,
    ),
]


@pytest.mark.parametrize(
    ("service", "method", "url", "headers", "body", "session"),
    [c[1:] for c in CASES],
    ids=[f"{c[0]} is re-signed as botocore signs it" for c in CASES],
)
async def test_resigning_matches_botocore(
    monkeypatch: pytest.MonkeyPatch,
    service: str,
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    session: bool,
) -> None:
    region = "eu-west-1"
    # The guest signs with its placeholder as the key id and any secret key.
    guest = botocore_sign(
        monkeypatch,
        GUEST_TIME,
        Credentials(PLACEHOLDER, "guest-has-no-real-key"),
        service,
        region,
        method,
        url,
        headers,
        body,
    )
    parts = urlsplit(url)
    sent_headers = (("host", parts.netloc), *((k, v) for k, v in guest.headers.items()))
    broker_request = BrokerRequest(
        method, "https", parts.hostname or "", 443, parts.path, parts.query, sent_headers, body
    )

    spec: dict[str, Any] = {"region": region, "service": service, "access_key_id": AKID}
    if session:
        spec["session_token_ref"] = "mem:session"
    memory = MemorySource(aws=SECRET_KEY, session=SESSION)
    cred = credential(name="aws", secret="mem:aws", hosts=[parts.hostname], inject={"aws_sigv4": spec})
    broker = make_broker(
        default_registry().with_source("mem", memory),
        [TenantCredentials("t1", ("sb1",), (cred,))],
        clock=Clock(GATEWAY_TIME.timestamp()),
    )
    decision = await broker.plan("t1", "sb1", broker_request)
    assert isinstance(decision, BrokerAllow), decision
    assert decision.injectors == ("aws_sigv4",)
    ours = dict((k.lower(), v) for k, v in apply_mutations(broker_request, decision.mutations).headers)

    # The oracle: botocore signing the same request with the real key at the gateway's time. The
    # gateway signs the headers the guest signed (botocore did not sign the Accept-Encoding it adds).
    guest_signed = parse_authorization(guest.headers["Authorization"])
    assert guest_signed is not None and guest_signed.access_key_id == PLACEHOLDER
    expected = botocore_sign(
        monkeypatch,
        GATEWAY_TIME,
        Credentials(AKID, SECRET_KEY, SESSION if session else None),
        service,
        region,
        method,
        url,
        headers,
        body,
    )
    assert ours["authorization"] == expected.headers["Authorization"]
    assert ours["x-amz-date"] == expected.headers["X-Amz-Date"] == "20261130T010007Z"
    assert ours.get("x-amz-security-token") == (SESSION if session else None)
    assert PLACEHOLDER not in str(ours)


def aws_broker(memory: MemorySource, **spec: Any) -> Any:
    cred = credential(
        name="aws",
        secret="mem:aws",
        hosts=["*.amazonaws.com"],
        inject={"aws_sigv4": {"region": "us-east-1", "service": "s3", **spec}},
    )
    return make_broker(
        default_registry().with_source("mem", memory), [TenantCredentials("t1", ("sb1",), (cred,))]
    )


def guest_request(body: bytes | None, **headers: str) -> BrokerRequest:
    auth = f"AWS4-HMAC-SHA256 Credential={PLACEHOLDER}/20261130/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature={'0' * 64}"
    extra = tuple((k.replace("_", "-"), v) for k, v in headers.items())
    return BrokerRequest(
        "PUT",
        "https",
        "b.s3.amazonaws.com",
        443,
        "/k",
        "",
        (("host", "b.s3.amazonaws.com"), ("Authorization", auth), *extra),
        body,
    )


@pytest.mark.parametrize(
    ("body", "headers", "cause"),
    [
        (None, {}, DenialCause.BODY_TOO_LARGE),
        (b"x", {"x_amz_content_sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"}, DenialCause.UNSIGNABLE),
    ],
    ids=[
        "a streamed body without a declared hash cannot be signed",
        "signed streaming chunks cannot be re-signed",
    ],
)
async def test_requests_that_cannot_be_re_signed_are_denied(
    body: bytes | None, headers: dict[str, str], cause: DenialCause
) -> None:
    decision = await aws_broker(MemorySource(aws=SECRET_KEY), access_key_id=AKID).plan(
        "t1", "sb1", guest_request(body, **headers)
    )
    assert isinstance(decision, BrokerDenial)
    assert decision.cause is cause


async def test_a_streamed_body_with_a_declared_hash_is_signed() -> None:
    req = guest_request(None, x_amz_content_sha256="UNSIGNED-PAYLOAD")
    decision = await aws_broker(MemorySource(aws=SECRET_KEY), access_key_id=AKID).plan("t1", "sb1", req)
    assert isinstance(decision, BrokerAllow)
    assert decision.body_guard is not None


@pytest.mark.parametrize(
    ("secret", "spec", "key_id"),
    [
        (f"{AKID}:{SECRET_KEY}", {}, AKID),
        (SECRET_KEY, {"access_key_id_ref": "mem:akid"}, "AKIAREFERENCED000001"),
    ],
    ids=["the key id may live in the secret as KEYID:SECRET", "the key id may come from its own reference"],
)
async def test_key_id_sources(secret: str, spec: dict[str, Any], key_id: str) -> None:
    memory = MemorySource(aws=secret, akid="AKIAREFERENCED000001")
    decision = await aws_broker(memory, **spec).plan("t1", "sb1", guest_request(b"data"))
    assert isinstance(decision, BrokerAllow)
    auth = dict(
        (k.lower(), v) for k, v in apply_mutations(guest_request(b"data"), decision.mutations).headers
    )["authorization"]
    assert auth.startswith(f"AWS4-HMAC-SHA256 Credential={key_id}/")
    # The guest's own session token is removed when the credential has none.
    assert "x-amz-security-token" not in auth


@pytest.mark.parametrize(
    ("path", "service", "expected"),
    [
        ("", "execute-api", "/"),
        ("/a b", "execute-api", "/a%20b"),
        ("/a%20b", "execute-api", "/a%2520b"),
        ("/a%20b", "s3", "/a%20b"),
        ("//a/./b/../c/", "execute-api", "/a/c/"),
    ],
    ids=[
        "an empty path",
        "a raw space",
        "an encoded space is encoded again",
        "s3 keeps the path as sent",
        "dot segments go",
    ],
)
def test_canonical_uri(path: str, service: str, expected: str) -> None:
    assert canonical_uri(path, service) == expected


def test_canonical_query_sorts_and_re_encodes() -> None:
    assert canonical_query("b=2&a=y z&a=1&c&d=%7e") == "a=1&a=y%20z&b=2&c=&d=~"


@pytest.mark.parametrize(
    "value",
    [
        "Bearer x",
        "AWS4-HMAC-SHA256 Credential=a/b/c/d, SignedHeaders=host, Signature=00",
        "AWS4-HMAC-SHA256 junk",
    ],
    ids=["a bearer token", "a scope without aws4_request", "junk"],
)
def test_non_sigv4_authorization_is_not_parsed(value: str) -> None:
    assert parse_authorization(value) is None
