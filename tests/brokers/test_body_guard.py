"""A streamed request body is checked chunk by chunk: a placeholder split across chunks is still caught."""

from __future__ import annotations

import base64

import pytest

from sandgate.brokers import (
    BrokerAllow,
    BrokerDenial,
    DenialCause,
    PlaceholderMinter,
    SecretRegistry,
    TenantCredentials,
)

from .conftest import KEY, MemorySource, credential, header_credential, make_broker, request

MINTER = PlaceholderMinter(KEY)
OPENAI = MINTER.mint("t1", "sb1", "openai")
HOOK = MINTER.mint("t1", "sb1", "hook")
FOREIGN = MINTER.mint("t2", "x", "openai")


@pytest.fixture
def memory() -> MemorySource:
    return MemorySource(openai="sk-openai-0123456789", hook="hook-secret-0123456789")


def pct(text: str) -> str:
    return "".join(f"%{ord(c):02X}" for c in text)


CASES = [
    (
        "an own placeholder to an unbound host",
        "evil.example",
        OPENAI.encode(),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        False,
    ),
    (
        "a percent-encoded placeholder to an unbound host",
        "evil.example",
        pct(OPENAI).encode(),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        False,
    ),
    (
        "a base64 placeholder to an unbound host",
        "evil.example",
        base64.b64encode(b"k=" + OPENAI.encode()),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        False,
    ),
    (
        "an upper-case placeholder to an unbound host",
        "evil.example",
        OPENAI.upper().encode(),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        False,
    ),
    (
        "a header credential's placeholder in its bound host's body",
        "api.openai.com",
        OPENAI.encode(),
        DenialCause.MISPLACED,
        ("openai",),
        False,
    ),
    (
        "a body credential's placeholder in a streamed body",
        "a.hooks.example.com",
        HOOK.encode(),
        DenialCause.BODY_TOO_LARGE,
        ("hook",),
        False,
    ),
    (
        "another tenant's placeholder",
        "api.openai.com",
        FOREIGN.encode(),
        DenialCause.FOREIGN_PLACEHOLDER,
        (),
        True,
    ),
]


@pytest.mark.parametrize(
    ("host", "payload", "cause", "names", "foreign"),
    [c[1:] for c in CASES],
    ids=[f"{c[0]}, split across chunks, is denied" for c in CASES],
)
async def test_a_streamed_placeholder_is_denied_in_the_chunk_that_completes_it(
    registry: SecretRegistry,
    host: str,
    payload: bytes,
    cause: DenialCause,
    names: tuple[str, ...],
    foreign: bool,
) -> None:
    broker = make_broker(
        registry,
        [
            TenantCredentials(
                "t1",
                ("sb1",),
                (
                    header_credential("openai"),
                    credential(
                        name="hook", secret="mem:hook", hosts=["*.hooks.example.com"], inject={"body": True}
                    ),
                ),
            ),
            TenantCredentials("t2", ("x",), (header_credential("openai"),)),
        ],
    )
    decision = await broker.plan("t1", "sb1", request(host, body=None, body_too_large=True))
    assert isinstance(decision, BrokerAllow)
    guard = decision.body_guard
    assert guard is not None
    middle = len(payload) // 2
    assert guard.feed(b"x" * 70_000 + payload[:middle]) is None
    denial = guard.feed(payload[middle:] + b"." * 1000)
    assert isinstance(denial, BrokerDenial)
    assert (denial.cause, denial.credentials, denial.foreign) == (cause, names, foreign)


async def test_a_clean_stream_passes(registry: SecretRegistry) -> None:
    broker = make_broker(registry, [TenantCredentials("t1", ("sb1",), (header_credential("openai"),))])
    decision = await broker.plan("t1", "sb1", request("evil.example", body=None))
    assert isinstance(decision, BrokerAllow) and decision.body_guard is not None
    for _ in range(50):
        assert decision.body_guard.feed(b"sgph_ lorem ipsum " * 4000) is None


async def test_a_buffered_body_needs_no_guard(registry: SecretRegistry) -> None:
    broker = make_broker(registry, [TenantCredentials("t1", ("sb1",), (header_credential("openai"),))])
    assert await broker.plan("t1", "sb1", request("evil.example", body=b"hello")) == BrokerAllow()
