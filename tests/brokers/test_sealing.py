"""Sealing stored values (AES-256-GCM keyring) and the `stored:` source's cache."""

from __future__ import annotations

import base64
from dataclasses import replace

import pytest

from sandgate.brokers import Secret, SecretReferenceError, SecretRegistry, SecretUnavailable, parse_ref
from sandgate.brokers.errors import KeyringError, SealingError
from sandgate.brokers.sealing import (
    KEY_BYTES,
    Keyring,
    associated_data,
    format_key_line,
    new_key,
    next_key_id,
    parse_keyring,
)
from sandgate.brokers.sources.stored import StoredSource
from sandgate.brokers.tenant_credentials import TenantCredentials, compile_tenant

from .conftest import Clock, credential

VALUE = b"sk-live-STORED-0123456789abcdef"
AD = associated_data("acme", "openai")


def ring(*ids: str) -> Keyring:
    return Keyring([(i, bytes([n]) * KEY_BYTES) for n, i in enumerate(ids, start=1)])


def test_a_sealed_value_opens_and_holds_no_plaintext() -> None:
    keys = ring("k1")
    sealed = keys.seal(VALUE, AD)
    assert sealed.key_id == "k1" and len(sealed.nonce) == 12
    assert VALUE not in sealed.ciphertext and len(sealed.ciphertext) == len(VALUE) + 16
    assert keys.open(sealed, AD) == VALUE


def test_every_seal_uses_a_fresh_nonce() -> None:
    keys = ring("k1")
    nonces = {keys.seal(VALUE, AD).nonce for _ in range(50)}
    assert len(nonces) == 50


@pytest.mark.parametrize(
    "change",
    ["flip a ciphertext bit", "flip a nonce bit", "truncate the tag"],
    ids=lambda c: f"data altered by '{c}' does not open",
)
def test_tampered_data_is_refused(change: str) -> None:
    keys = ring("k1")
    sealed = keys.seal(VALUE, AD)
    if change == "flip a ciphertext bit":
        sealed = replace(sealed, ciphertext=bytes([sealed.ciphertext[0] ^ 1]) + sealed.ciphertext[1:])
    elif change == "flip a nonce bit":
        sealed = replace(sealed, nonce=bytes([sealed.nonce[0] ^ 1]) + sealed.nonce[1:])
    else:
        sealed = replace(sealed, ciphertext=sealed.ciphertext[:-1])
    with pytest.raises(SealingError, match="altered, or moved") as info:
        keys.open(sealed, AD)
    assert VALUE.decode() not in str(info.value)


@pytest.mark.parametrize(
    ("tenant", "name"),
    [("other", "openai"), ("acme", "github"), ("acme\x00openai", "")],
    ids=["a value moved to another tenant does not open", "a value moved to another name does not open",
         "a NUL in a name cannot forge the associated data"],
)  # fmt: skip
def test_a_value_is_bound_to_its_tenant_and_name(tenant: str, name: str) -> None:
    keys = ring("k1")
    sealed = keys.seal(VALUE, AD)
    with pytest.raises(SealingError):
        keys.open(sealed, associated_data(tenant, name))


def test_an_unknown_key_id_is_named_without_the_value() -> None:
    sealed = ring("k1").seal(VALUE, AD)
    with pytest.raises(SealingError, match="key k1, which is not in the keyring") as info:
        ring("k2").open(sealed, AD)
    assert VALUE.decode() not in str(info.value)


def test_rotation_new_writes_use_the_newest_and_old_values_still_open() -> None:
    old = ring("k1")
    sealed_old = old.seal(VALUE, AD)
    both = ring("k1", "k2")
    sealed_new = both.seal(VALUE, AD)
    assert sealed_new.key_id == "k2"
    assert both.open(sealed_old, AD) == VALUE
    # Re-sealed with the newest key, the old key can go.
    resealed = both.seal(both.open(sealed_old, AD), AD)
    only_new = Keyring([("k2", bytes([2]) * KEY_BYTES)])
    assert only_new.open(resealed, AD) == VALUE
    with pytest.raises(SealingError):
        only_new.open(sealed_old, AD)


def test_the_key_file_format_round_trips_newest_last() -> None:
    k1, k2 = new_key(), new_key()
    text = f"# store keys\n{format_key_line('k1', k1)}\n\n{format_key_line('k2', k2)}\n"
    keys = parse_keyring(text, "store.keys")
    assert keys.ids == ("k1", "k2") and keys.newest == "k2"
    assert Keyring([("k2", k2)]).open(keys.seal(VALUE, AD), AD) == VALUE
    assert "k1" in repr(keys) and base64.b64encode(k1).decode() not in repr(keys)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("k1\n", r"store.keys:1: expected 'id:base64key'"),
        ("k1:!!!\n", r"store.keys:1: key k1 is not valid base64"),
        ("k1:" + base64.b64encode(b"short").decode(), r"key k1 is 5 bytes; AES-256 needs 32"),
        (
            f"k1:{base64.b64encode(bytes(32)).decode()}\nk1:{base64.b64encode(bytes(32)).decode()}",
            "appears twice",
        ),
        ("bad id:" + base64.b64encode(bytes(32)).decode(), "is not 1-32 letters"),
        ("# only a comment\n", "store.keys: holds no key"),
    ],
    ids=[
        "a line without a colon",
        "bad base64",
        "a short key",
        "a duplicate id",
        "a bad id",
        "no key at all",
    ],
)
def test_a_bad_key_file_is_refused_with_file_and_line(text: str, message: str) -> None:
    with pytest.raises(KeyringError, match=message):
        parse_keyring(text, "store.keys")


def test_next_key_ids_count_up() -> None:
    assert next_key_id([]) == "k1"
    assert next_key_id(["k1", "custom", "k7"]) == "k8"


# --- the stored: reference and source ------------------------------------------------------


def test_stored_references_name_a_credential_of_the_declaring_tenant_only() -> None:
    assert parse_ref("stored:openai").value == "openai"
    with pytest.raises(SecretReferenceError, match="stored: needs a credential name"):
        parse_ref("stored:other/openai")
    compiled = compile_tenant(
        TenantCredentials(
            tenant="acme",
            sandboxes=("sb1",),
            credentials=(
                credential(
                    name="openai", secret="stored:openai", hosts=["api.test"], inject={"header": "X-Key"}
                ),
            ),
        )
    )
    assert str(compiled.by_name["openai"].ref("stored:openai")) == "stored:acme/openai"


class MemoryStore:
    """A real in-memory store for the source, counting reads; `fail` makes reads raise."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], str] = {}
        self.reads = 0
        self.fail = False

    async def get(self, tenant: str, name: str) -> Secret | None:
        self.reads += 1
        if self.fail:
            raise ConnectionError("store down")
        value = self.values.get((tenant, name))
        return None if value is None else Secret(value)


async def test_the_source_reads_once_then_serves_from_memory_until_invalidated() -> None:
    store = MemoryStore()
    store.values[("acme", "openai")] = "v1"
    source = StoredSource(store)
    registry = SecretRegistry({"stored": source})
    ref = parse_ref("stored:openai").for_tenant("acme")
    for _ in range(100):
        assert (await registry.get(ref)).reveal() == "v1"
    assert store.reads == 1
    store.values[("acme", "openai")] = "v2"
    assert (await registry.get(ref)).reveal() == "v1"
    source.invalidate()
    assert (await registry.get(ref)).reveal() == "v2"
    assert store.reads == 2


async def test_an_unset_value_is_unavailable_and_another_tenants_is_not_visible() -> None:
    store = MemoryStore()
    store.values[("other", "openai")] = "theirs"
    source = StoredSource(store)
    with pytest.raises(SecretUnavailable, match="stored credential openai of tenant acme is not set"):
        await source.get(parse_ref("stored:openai").for_tenant("acme"))
    with pytest.raises(SecretUnavailable, match="not qualified"):
        await source.get(parse_ref("stored:openai"))


async def test_a_down_store_keeps_the_cached_value_and_fails_closed_for_others() -> None:
    store = MemoryStore()
    store.values[("acme", "openai")] = "v1"
    clock = Clock(0.0)
    source = StoredSource(store, ttl=60, clock=clock)
    ref = parse_ref("stored:openai").for_tenant("acme")
    assert (await source.get(ref)).reveal() == "v1"
    store.fail = True
    clock.advance(61)  # expired: read again, the store fails, the last good value stays
    assert (await source.get(ref)).reveal() == "v1"
    reads = store.reads
    assert (await source.get(ref)).reveal() == "v1"
    assert store.reads == reads, "a failed refresh is not retried on every request"
    with pytest.raises(SecretUnavailable, match="store down"):
        await source.get(parse_ref("stored:github").for_tenant("acme"))
    source.invalidate()  # a change event: the cached value may be stale, so nothing is served
    with pytest.raises(SecretUnavailable):
        await source.get(ref)
