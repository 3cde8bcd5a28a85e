"""A registered sandbox has several source addresses, IPv4 and IPv6; what the host rules could
not install is refused with the reason; registry files with one `address` still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandgate.policy.model.source_addresses import MAX_SOURCE_ADDRESSES
from sandgate.proxy.stores.registry import DynamicSandbox, load_registry, save_registry


def test_several_addresses_of_both_families_are_kept_in_canonical_form() -> None:
    sb = DynamicSandbox.model_validate(
        {"id": "a", "tenant": "t1", "interface": "tap0", "addresses": ["10.213.0.2", "FD00:0213:0::2"]}
    )
    assert sb.addresses == ("10.213.0.2", "fd00:213::2")
    assert sb.model_dump(exclude_none=True)["addresses"] == ("10.213.0.2", "fd00:213::2")


def test_a_registry_file_with_one_address_loads_and_is_written_back_as_a_list(tmp_path: Path) -> None:
    path = tmp_path / "sandboxes.json"
    path.write_text(json.dumps([{"id": "old", "tenant": "t1", "interface": "tap0", "address": "10.213.0.2"}]))
    loaded = load_registry(path)
    assert loaded[0].addresses == ("10.213.0.2",)
    save_registry(path, loaded)
    assert json.loads(path.read_text()) == [
        {"id": "old", "tenant": "t1", "interface": "tap0", "addresses": ["10.213.0.2"]}
    ]
    assert load_registry(path) == loaded


def test_a_token_only_entry_dumps_without_addresses() -> None:
    sb = DynamicSandbox(id="t", tenant="t1", token="sha256:" + "0" * 64)
    assert "addresses" not in sb.model_dump(exclude_none=True)


@pytest.mark.parametrize(
    ("addresses", "problem"),
    [
        (["fe80::1"], "fe80::1 is link-local"),
        (["169.254.1.2"], "169.254.1.2 is link-local"),
        (["ff02::1"], "ff02::1 is multicast"),
        (["224.0.0.1"], "224.0.0.1 is multicast"),
        (["::"], ":: is unspecified"),
        (["0.0.0.0"], "0.0.0.0 is unspecified"),
        (["127.0.0.5"], "127.0.0.5 is a loopback address"),
        (["::1"], "::1 is a loopback address"),
        (["255.255.255.255"], "the broadcast address"),
        (["::ffff:10.0.0.2"], "IPv4-mapped spelling: give 10.0.0.2 instead"),
        (["fd00::2%eth0"], "zone index"),
        (["10.0.0.2", "fd00::2", "10.0.0.2"], "address 10.0.0.2 is listed twice"),
        (["fd00::2", "fd00:0::2"], "address fd00::2 is listed twice"),
        (
            [f"10.0.0.{i}" for i in range(1, MAX_SOURCE_ADDRESSES + 2)],
            f"a sandbox has at most {MAX_SOURCE_ADDRESSES}",
        ),
        ("10.0.0.2", "addresses is a list"),
    ],
)
def test_addresses_the_host_rules_cannot_install_are_refused(addresses: object, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        DynamicSandbox.model_validate(
            {"id": "a", "tenant": "t1", "interface": "tap0", "addresses": addresses}
        )


def test_address_and_addresses_together_are_refused() -> None:
    with pytest.raises(ValidationError, match="not address as well"):
        DynamicSandbox.model_validate(
            {"id": "a", "tenant": "t1", "address": "10.0.0.2", "addresses": ["10.0.0.3"]}
        )
