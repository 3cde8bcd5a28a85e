"""Broker decisions end to end: exfiltration attempts are denied with exact outcomes; rotation; fail closed."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from sandgate.brokers import (
    Broker,
    BrokerAllow,
    BrokerConfigError,
    BrokerDenial,
    DenialCause,
    PlaceholderMinter,
    Secret,
    SecretRegistry,
    TenantCredentials,
    apply_mutations,
)
from sandgate.policy.reasons import Reason

from .conftest import KEY, OPENAI_SECRET, MemorySource, credential, header_credential, make_broker, request

MAPS_SECRET = "AIzaSyD-maps-key-0123456789"
HOOK_SECRET = "whsec_hook_0123456789abcdef"
SCOPED_SECRET = "scoped-secret-0123456789"

MINTER = PlaceholderMinter(KEY)
OPENAI = MINTER.mint("t1", "sb1", "openai")
MAPS = MINTER.mint("t1", "sb1", "maps")
HOOK = MINTER.mint("t1", "sb1", "hook")
SCOPED = MINTER.mint("t1", "sb1", "scoped")
OPENAI_SB2 = MINTER.mint("t1", "sb2", "openai")
OPENAI_T2 = MINTER.mint("t2", "x", "openai")
UNKNOWN = MINTER.mint("t9", "zz", "openai")


def pct(text: str) -> str:
    return "".join(f"%{ord(c):02X}" for c in text)


def t1_credentials() -> tuple[Any, ...]:
    return (
        header_credential("openai"),
        credential(name="maps", secret="mem:maps", hosts=["maps.googleapis.com"], inject={"query": "key"}),
        credential(
            name="hook",
            secret="mem:hook",
            hosts=["*.hooks.example.com"],
            inject={"body": True, "max_bytes": 1024},
        ),
        credential(
            name="scoped",
            secret="mem:scoped",
            hosts=["api.scoped.example"],
            paths=["/v1"],
            methods=["POST"],
            inject={"header": "X-Api-Key"},
        ),
    )


@pytest.fixture
def memory() -> MemorySource:
    return MemorySource(openai=OPENAI_SECRET, maps=MAPS_SECRET, hook=HOOK_SECRET, scoped=SCOPED_SECRET)


@pytest.fixture
async def broker(registry: SecretRegistry, memory: MemorySource) -> Broker:
    broker = make_broker(
        registry,
        [
            TenantCredentials("t1", ("sb1", "sb2"), t1_credentials()),
            TenantCredentials("t2", ("x",), (header_credential("openai"),)),
        ],
    )
    await broker.refresh()  # what the gateway does at start; requests then read only what they inject
    memory.reads = 0
    return broker


EVIL = "evil.example"
DENIALS: list[tuple[str, Any, DenialCause, tuple[str, ...], tuple[str, ...]]] = [
    (
        "a placeholder in the path to an unbound host",
        request(EVIL, f"/{OPENAI}"),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        ("path",),
    ),
    (
        "a placeholder in the query",
        request(EVIL, "/", query=f"q={OPENAI}"),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        ("query:q",),
    ),
    (
        "a placeholder in a JSON body",
        request(EVIL, "/", body=json.dumps({"k": OPENAI}).encode()),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        ("body",),
    ),
    (
        "a placeholder in a header",
        request(EVIL, "/", headers=(("X-Key", OPENAI),)),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        ("header:x-key",),
    ),
    (
        "a percent-encoded placeholder",
        request(EVIL, "/", query=f"q={pct(OPENAI)}"),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        ("query:q",),
    ),
    (
        "a base64 placeholder in the body",
        request(EVIL, "/", body=base64.b64encode(OPENAI.encode())),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        ("body:encoded",),
    ),
    (
        "a placeholder with changed case",
        request(EVIL, "/", headers=(("X-Key", OPENAI.upper()),)),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        ("header:x-key",),
    ),
    (
        "a placeholder in basic auth",
        request(
            EVIL,
            "/",
            headers=(("Authorization", "Basic " + base64.b64encode(f"u:{OPENAI}".encode()).decode()),),
        ),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        ("header:authorization",),
    ),
    (
        "a placeholder in the host name",
        request(f"{OPENAI}.{EVIL}", "/"),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        ("host", "header:host"),
    ),
    (
        "a placeholder to a bound host's subdomain",
        request("x.api.openai.com", "/", headers=(("Authorization", f"Bearer {OPENAI}"),)),
        DenialCause.UNBOUND_HOST,
        ("openai",),
        ("header:authorization",),
    ),
    (
        "a bound host on the wrong port",
        request(port=8443, headers=(("Authorization", f"Bearer {OPENAI}"),)),
        DenialCause.UNBOUND_PORT,
        ("openai",),
        ("header:authorization",),
    ),
    (
        "a bound host over plain http",
        request(scheme="http", port=443, headers=(("Authorization", f"Bearer {OPENAI}"),)),
        DenialCause.UNBOUND_SCHEME,
        ("openai",),
        ("header:authorization",),
    ),
    (
        "a bound host with the wrong method",
        request("api.scoped.example", "/v1/x", method="GET", headers=(("X-Api-Key", SCOPED),)),
        DenialCause.UNBOUND_METHOD,
        ("scoped",),
        ("header:x-api-key",),
    ),
    (
        "a bound host outside the path prefix",
        request("api.scoped.example", "/v10", headers=(("X-Api-Key", SCOPED),)),
        DenialCause.UNBOUND_PATH,
        ("scoped",),
        ("header:x-api-key",),
    ),
    (
        "a dot-segment escape from the path prefix",
        request("api.scoped.example", "/v1/../admin", headers=(("X-Api-Key", SCOPED),)),
        DenialCause.UNBOUND_PATH,
        ("scoped",),
        ("header:x-api-key",),
    ),
    (
        "an unreadable path",
        request("api.scoped.example", "/v1/a%2Fb", headers=(("X-Api-Key", SCOPED),)),
        DenialCause.UNBOUND_PATH,
        ("scoped",),
        ("header:x-api-key",),
    ),
    (
        "a header credential's placeholder in the body of its bound host",
        request(
            body=json.dumps({"prompt": OPENAI}).encode(), headers=(("Authorization", f"Bearer {OPENAI}"),)
        ),
        DenialCause.MISPLACED,
        ("openai",),
        ("body",),
    ),
    (
        "a header credential's placeholder in another header",
        request(headers=(("X-Other", OPENAI),)),
        DenialCause.MISPLACED,
        ("openai",),
        ("header:x-other",),
    ),
    (
        "a header credential's placeholder in the query",
        request(query=f"k={OPENAI}"),
        DenialCause.MISPLACED,
        ("openai",),
        ("query:k",),
    ),
    (
        "a query credential's placeholder in another parameter",
        request("maps.googleapis.com", "/maps", query=f"key={MAPS}&q={MAPS}"),
        DenialCause.MISPLACED,
        ("maps",),
        ("query:q",),
    ),
    (
        "a body credential's placeholder base64-encoded",
        request("a.hooks.example.com", "/", body=base64.b64encode(HOOK.encode())),
        DenialCause.MISPLACED,
        ("hook",),
        ("body:encoded",),
    ),
    (
        "a body credential's placeholder in a header",
        request("a.hooks.example.com", "/", headers=(("X-Hook", HOOK),)),
        DenialCause.MISPLACED,
        ("hook",),
        ("header:x-hook",),
    ),
    (
        "a body credential's placeholder in a body over its cap",
        request("a.hooks.example.com", "/", body=HOOK.encode() + b" " * 1024),
        DenialCause.BODY_TOO_LARGE,
        ("hook",),
        ("body",),
    ),
]


@pytest.mark.parametrize(
    ("req", "cause", "names", "where"),
    [d[1:] for d in DENIALS],
    ids=[f"{d[0]} is denied ({d[2]})" for d in DENIALS],
)
async def test_exfiltration_attempts_are_denied(
    broker: Broker,
    memory: MemorySource,
    req: Any,
    cause: DenialCause,
    names: tuple[str, ...],
    where: tuple[str, ...],
) -> None:
    decision = await broker.plan("t1", "sb1", req)
    assert decision == BrokerDenial(cause, credentials=names, where=where)
    expected_reason = (
        Reason.BODY_TOO_LARGE if cause is DenialCause.BODY_TOO_LARGE else Reason.CREDENTIAL_HOST_MISMATCH
    )
    assert decision.reason is expected_reason
    assert memory.reads == 0  # Decided before any secret was read.


FOREIGN: list[tuple[str, str, str, tuple[str, ...], tuple[str, ...]]] = [
    (
        "another sandbox's placeholder to its own bound host",
        "api.openai.com",
        OPENAI_SB2,
        ("openai",),
        ("t1/sb2",),
    ),
    ("another sandbox's placeholder to an unbound host", EVIL, OPENAI_SB2, ("openai",), ("t1/sb2",)),
    ("another tenant's placeholder", "api.openai.com", OPENAI_T2, (), ("t2/x",)),
    (
        "a genuine placeholder of a sandbox this gateway does not know",
        "api.openai.com",
        UNKNOWN,
        (),
        ("unknown",),
    ),
    ("another tenant's placeholder in upper case", "api.openai.com", OPENAI_T2.upper(), (), ("t2/x",)),
]


@pytest.mark.parametrize(
    ("host", "placeholder", "names", "owners"),
    [f[1:] for f in FOREIGN],
    ids=[f"{f[0]} is denied as foreign" for f in FOREIGN],
)
async def test_foreign_placeholders_are_denied_and_flagged(
    broker: Broker, host: str, placeholder: str, names: tuple[str, ...], owners: tuple[str, ...]
) -> None:
    decision = await broker.plan(
        "t1", "sb1", request(host, headers=(("Authorization", f"Bearer {placeholder}"),))
    )
    assert decision == BrokerDenial(
        DenialCause.FOREIGN_PLACEHOLDER,
        credentials=names,
        where=("header:authorization",),
        foreign=True,
        foreign_owners=owners,
    )
    # The guest cannot tell a genuine placeholder of someone else from a forgery.
    assert decision.reason is Reason.UNKNOWN_PLACEHOLDER


OTHER_KEY_PLACEHOLDER = PlaceholderMinter(Secret("another-gateway-key-" + "k" * 32)).mint(
    "t1", "sb1", "openai"
)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


NOT_MINTED_HERE = [
    (
        "minted under another gateway's key",
        {"headers": (("Authorization", f"Bearer {OTHER_KEY_PLACEHOLDER}"),)},
    ),
    ("another key's, in upper case", {"headers": (("X-Key", OTHER_KEY_PLACEHOLDER.upper()),)}),
    ("forged", {"headers": (("X", "sgph_" + "a" * 32),)}),
    ("truncated", {"headers": (("X", OPENAI[:-10]),)}),
    ("extended by one character", {"headers": (("Authorization", f"Bearer {OPENAI}a"),)}),
    ("the shortest shape", {"headers": (("X", "sgph_abcdefgh"),)}),
    ("in the query", {"query": f"key={OTHER_KEY_PLACEHOLDER}"}),
    ("percent-encoded in the query", {"query": "key=" + OTHER_KEY_PLACEHOLDER.replace("_", "%5F")}),
    ("in a header name", {"headers": ((f"X-{OTHER_KEY_PLACEHOLDER}", "1"),)}),
    ("in a JSON body", {"body": json.dumps({"k": OTHER_KEY_PLACEHOLDER}).encode()}),
    (
        "base64 in basic auth",
        {"headers": (("Authorization", "Basic " + _b64(f"u:{OTHER_KEY_PLACEHOLDER}")),)},
    ),
]


@pytest.mark.parametrize(
    "parts",
    [p for _, p in NOT_MINTED_HERE],
    ids=[f"a placeholder {n} is unknown" for n, _ in NOT_MINTED_HERE],
)
async def test_a_placeholder_this_gateway_did_not_mint_is_refused(
    broker: Broker, memory: MemorySource, parts: dict[str, Any]
) -> None:
    decision = await broker.plan("t1", "sb1", request(EVIL, **parts))
    assert isinstance(decision, BrokerDenial)
    assert (decision.cause, decision.reason) == (DenialCause.UNKNOWN_PLACEHOLDER, Reason.UNKNOWN_PLACEHOLDER)
    assert decision.foreign and "not minted here" in decision.foreign_owners


@pytest.mark.parametrize(
    "text",
    ["sgph_", "sgph_log", "see sgph_abcdefg.", "prefix sgph_ then text", "sgph-" + "a" * 32],
    ids=["the bare prefix", "a short word", "seven characters", "prefix and a space", "another separator"],
)
async def test_text_too_short_to_be_a_placeholder_passes(broker: Broker, text: str) -> None:
    decision = await broker.plan("t1", "sb1", request(EVIL, headers=(("X", text),), body=text.encode()))
    assert decision == BrokerAllow()


async def test_a_request_without_placeholders_passes_untouched(broker: Broker, memory: MemorySource) -> None:
    decision = await broker.plan("t1", "sb1", request(headers=(("Authorization", "Bearer guest-own-key"),)))
    assert decision == BrokerAllow()
    assert memory.reads == 0


async def test_a_sandbox_unknown_to_the_broker_gets_no_credentials(broker: Broker) -> None:
    decision = await broker.plan("t3", "sb", request(headers=(("Authorization", f"Bearer {OPENAI}"),)))
    assert isinstance(decision, BrokerDenial)
    assert decision.foreign


async def test_the_bound_request_gets_the_secret_and_the_guest_header_is_replaced(broker: Broker) -> None:
    req = request(headers=(("Authorization", f"Bearer {OPENAI}"), ("authorization", "Bearer second-copy")))
    decision = await broker.plan("t1", "sb1", req)
    assert isinstance(decision, BrokerAllow)
    assert (decision.credentials, decision.injectors) == (("openai",), ("header",))
    applied = apply_mutations(req, decision.mutations)
    assert applied.headers == (
        ("host", "api.openai.com"),
        ("Authorization", f"Bearer {OPENAI_SECRET}"),
        ("Accept-Encoding", "identity"),
    )
    assert OPENAI_SECRET not in repr(decision)


# --- rotation and failure --------------------------------------------------------------


async def test_a_rotated_file_secret_is_used_by_the_next_request(tmp_path: Path) -> None:
    secret_file = tmp_path / "openai.key"
    secret_file.write_text("first-secret-0123456789")
    secret_file.chmod(0o600)
    cred = header_credential("openai", secret="file:openai.key")
    broker = Broker(placeholder_key=KEY)
    broker.configure([TenantCredentials("t1", ("sb1",), (cred,), base_dir=tmp_path)])
    req = request(headers=(("Authorization", f"Bearer {OPENAI}"),))
    first = await broker.plan("t1", "sb1", req)
    assert isinstance(first, BrokerAllow)
    assert ("Authorization", "Bearer first-secret-0123456789") in apply_mutations(
        req, first.mutations
    ).headers
    secret_file.write_text("second-secret-0123456789")
    second = await broker.plan("t1", "sb1", req)
    assert isinstance(second, BrokerAllow)
    assert ("Authorization", "Bearer second-secret-0123456789") in apply_mutations(
        req, second.mutations
    ).headers
    # Both values are scrubbed from responses: the old one may still be echoed by a request in flight.
    scrubber = broker.scrubber("t1", "sb1")
    assert (
        scrubber.scrub(b"first-secret-0123456789 second-secret-0123456789") == f"{OPENAI} {OPENAI}".encode()
    )
    await broker.aclose()


@pytest.mark.parametrize(
    ("values", "detail"),
    [
        ({}, "memory secret openai is not set"),
        ({"openai": "short"}, "shorter than 8 bytes"),
    ],
    ids=["a missing secret fails closed", "a secret too short to scrub fails closed"],
)
async def test_an_unavailable_secret_denies_with_internal_error(
    registry: SecretRegistry,
    memory: MemorySource,
    values: dict[str, str],
    detail: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    memory.values = values
    broker = make_broker(registry, [TenantCredentials("t1", ("sb1",), (header_credential("openai"),))])
    with capture_logs() as events, caplog.at_level(logging.DEBUG):
        decision = await broker.plan("t1", "sb1", request(headers=(("Authorization", f"Bearer {OPENAI}"),)))
    assert isinstance(decision, BrokerDenial)
    assert (decision.reason, decision.cause, decision.credentials) == (
        Reason.INTERNAL_ERROR,
        DenialCause.SECRET_UNAVAILABLE,
        ("openai",),
    )
    assert detail in decision.detail
    # Resolving the tenant's secrets before its first request found it missing (logged once).
    assert [e["event"] for e in events] == ["broker.secret_unresolved", "broker.secret_unavailable"]
    assert all(e["credential"] == "openai" for e in events)
    assert "short" not in repr(events) or "shorter" in repr(events)


async def test_secrets_never_reach_logs_denials_or_reprs(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    secrets = [OPENAI_SECRET, MAPS_SECRET, HOOK_SECRET]
    texts: list[str] = []
    with capture_logs() as events, caplog.at_level(logging.DEBUG):
        for req in [
            request(headers=(("Authorization", f"Bearer {OPENAI}"),)),
            request("maps.googleapis.com", "/m", query=f"key={MAPS}"),
            request(
                "a.hooks.example.com",
                "/",
                body=f'{{"t": "{HOOK}"}}'.encode(),
                headers=(("Content-Type", "application/json"),),
            ),
            request(EVIL, headers=(("X", OPENAI),)),
        ]:
            decision = await broker.plan("t1", "sb1", req)
            texts += [repr(decision), str(decision)]
    texts += [caplog.text, repr(events), repr(broker.scrubber("t1", "sb1"))]
    for text in texts:
        for secret in secrets:
            assert secret not in text


# --- configuration ---------------------------------------------------------------------


def test_two_always_credentials_for_one_header_on_overlapping_hosts_are_refused(
    registry: SecretRegistry,
) -> None:
    a = header_credential("a", apply="always", hosts=["*.openai.com"])
    b = header_credential("b", apply="always", hosts=["api.openai.com"])
    with pytest.raises(BrokerConfigError, match="both apply always"):
        make_broker(registry, [TenantCredentials("t1", ("sb1",), (a, b))])


def test_a_secret_scheme_without_a_source_is_refused() -> None:
    broker = Broker(placeholder_key=KEY, secrets=SecretRegistry({}))
    with pytest.raises(BrokerConfigError, match="no secret source for 'mem:'"):
        broker.configure([TenantCredentials("t1", ("sb1",), (header_credential("openai"),))])


def test_a_failed_configure_keeps_the_previous_credentials(broker: Broker) -> None:
    before = broker.placeholders("t1", "sb1")
    with pytest.raises(BrokerConfigError, match="declared twice"):
        broker.configure(
            [TenantCredentials("t1", ("sb1",), (header_credential("a"), header_credential("a")))]
        )
    assert broker.placeholders("t1", "sb1") == before
    assert set(before) == {"openai", "maps", "hook", "scoped"}


async def test_a_removed_sandbox_placeholder_becomes_foreign(
    broker: Broker, registry: SecretRegistry
) -> None:
    broker.configure([TenantCredentials("t1", ("sb1",), t1_credentials())])
    decision = await broker.plan("t1", "sb1", request(headers=(("Authorization", f"Bearer {OPENAI_SB2}"),)))
    assert isinstance(decision, BrokerDenial)
    assert decision.foreign_owners == ("unknown",)


async def test_two_placeholders_for_one_managed_header_conflict(registry: SecretRegistry) -> None:
    org = header_credential("openai-org")
    broker = make_broker(registry, [TenantCredentials("t1", ("sb1",), (header_credential("openai"), org))])
    org_placeholder = MINTER.mint("t1", "sb1", "openai-org")
    req = request(
        headers=(("Authorization", f"Bearer {OPENAI}"), ("Authorization", f"Bearer {org_placeholder}"))
    )
    decision = await broker.plan("t1", "sb1", req)
    assert decision == BrokerDenial(DenialCause.CONFLICT, ("openai", "openai-org"), ("header:authorization",))
    assert decision.reason is Reason.INVALID_REQUEST
