"""Placeholders: deterministic per key, unique per (tenant, sandbox, credential), authenticated, case-free."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.brokers import BrokerConfigError, PlaceholderIndex, PlaceholderMinter, PlaceholderOwner, Secret
from sandgate.brokers.placeholders import PLACEHOLDER_LENGTH, PLACEHOLDER_PATTERN

from .conftest import KEY

SHAPE = re.compile(r"^sgph_[a-z2-7]{32}$")
names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=30)


def test_every_gateway_with_the_same_key_mints_the_same_placeholder() -> None:
    a, b = PlaceholderMinter(KEY), PlaceholderMinter(Secret(KEY.reveal_bytes()))
    assert a.mint("t1", "sb1", "openai") == b.mint("t1", "sb1", "openai")


def test_another_key_mints_another_placeholder() -> None:
    other = PlaceholderMinter(Secret(b"another-gateway-key-0123456789abcdef"))
    assert PlaceholderMinter(KEY).mint("t1", "sb1", "openai") != other.mint("t1", "sb1", "openai")


def test_a_short_key_is_refused() -> None:
    with pytest.raises(BrokerConfigError, match="at least 32 bytes"):
        PlaceholderMinter(Secret(b"short"))


def test_placeholders_are_unique_across_tenants_sandboxes_and_credentials() -> None:
    minter = PlaceholderMinter(KEY)
    triples = list(
        itertools.product([f"t{i}" for i in range(20)], [f"sb{i}" for i in range(20)], ["a", "b", "c"])
    )
    # Field boundaries are length-prefixed: ("ab", "c") and ("a", "bc") differ.
    triples += [("ab", "c", "x"), ("a", "bc", "x"), ("a", "b", "cx"), ("a", "bcx", "")]
    minted = {minter.mint(*t) for t in triples}
    assert len(minted) == len(triples)
    assert all(SHAPE.match(p) for p in minted)


@given(names, names, names)
def test_a_placeholder_has_the_fixed_shape_and_is_genuine(tenant: str, sandbox: str, credential: str) -> None:
    minter = PlaceholderMinter(KEY)
    placeholder = minter.mint(tenant, sandbox, credential)
    assert len(placeholder) == PLACEHOLDER_LENGTH
    assert SHAPE.match(placeholder)
    assert PLACEHOLDER_PATTERN.fullmatch(placeholder.encode())
    assert minter.is_genuine(placeholder)
    assert minter.is_genuine(placeholder.upper())


@given(st.text("abcdefghijklmnopqrstuvwxyz234567", min_size=32, max_size=32))
def test_a_made_up_placeholder_is_not_genuine(body: str) -> None:
    assert not PlaceholderMinter(KEY).is_genuine("sgph_" + body)


@pytest.mark.parametrize(
    "text",
    ["", "sgph_", "sgph_" + "a" * 31, "sgph_" + "a" * 33, "xgph_" + "a" * 32, "sgph_" + "1" * 32],
    ids=["empty", "prefix only", "too short", "too long", "wrong prefix", "not base32"],
)
def test_malformed_placeholders_are_not_genuine(text: str) -> None:
    assert not PlaceholderMinter(KEY).is_genuine(text)


def test_a_placeholder_carries_nothing_of_the_secret() -> None:
    # Minting never sees a secret: the same triple gives the same placeholder whatever the secret is.
    minter = PlaceholderMinter(KEY)
    assert minter.mint.__code__.co_varnames[:4] == ("self", "tenant", "sandbox", "credential")


def test_the_index_finds_owners_in_any_case() -> None:
    minter = PlaceholderMinter(KEY)
    owners = [PlaceholderOwner("t1", "sb1", "openai"), PlaceholderOwner("t1", "sb2", "openai")]
    index = PlaceholderIndex(minter, owners)
    placeholder = minter.mint("t1", "sb1", "openai")
    assert index.owner(placeholder) == owners[0]
    assert index.owner(placeholder.upper()) == owners[0]
    assert index.owner(minter.mint("t2", "sb1", "openai")) is None
    assert index.for_sandbox("t1", "sb2") == {"openai": minter.mint("t1", "sb2", "openai")}
    assert index.placeholder("t1", "sb1", "openai") == placeholder
    assert len(index) == 2
