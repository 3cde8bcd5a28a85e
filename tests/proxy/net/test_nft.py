"""Sandbox interface sysctls: written when needed, skipped when they already hold, and a clear
error when /proc/sys is read-only (as containers mount it) and the host has not set them.

A read-only /proc/sys cannot be had here without a container runtime, and root ignores file
modes, so the refused write is simulated by making Path.write_text raise EROFS."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from sandgate.proxy.errors import ConfigError
from sandgate.proxy.net.nft import ensure_sysctl


def sysctls(root: Path, **values: str) -> Path:
    """A fake net/ipv4/conf tree: values like all="0", eth9="2"."""
    for iface, value in values.items():
        (root / "ipv4" / "conf" / iface).mkdir(parents=True, exist_ok=True)
        (root / "ipv4" / "conf" / iface / "rp_filter").write_text(value + "\n")
    return root


def read_only(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    tried: list[Path] = []

    def refuse(self: Path, *args: object, **kwargs: object) -> int:
        tried.append(self)
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Path, "write_text", refuse)
    return tried


def test_a_value_is_written_when_it_does_not_hold(tmp_path: Path) -> None:
    root = sysctls(tmp_path, all="0", eth9="0")
    ensure_sysctl("eth9", "ipv4", "rp_filter", root)
    assert (root / "ipv4/conf/eth9/rp_filter").read_text() == "1\n"


def test_a_value_that_holds_is_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = sysctls(tmp_path, all="0", eth9="1")
    tried = read_only(monkeypatch)
    ensure_sysctl("eth9", "ipv4", "rp_filter", root)
    assert tried == []


def test_a_read_only_proc_is_fine_when_the_host_set_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = sysctls(tmp_path, all="1", eth9="0")
    tried = read_only(monkeypatch)
    ensure_sysctl("eth9", "ipv4", "rp_filter", root)
    assert tried == [root / "ipv4/conf/eth9/rp_filter"]


@pytest.mark.parametrize(("all_value", "iface_value"), [("0", "0"), ("2", "0"), ("1", "2")])
def test_a_read_only_proc_without_the_host_setting_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, all_value: str, iface_value: str
) -> None:
    """rp_filter is the larger of `all` and the interface: 2 (loose) anywhere is not strict."""
    root = sysctls(tmp_path, all=all_value, eth9=iface_value)
    read_only(monkeypatch)
    with pytest.raises(
        ConfigError, match=r"net\.ipv4\.conf\.eth9\.rp_filter=1 \(Read-only file system\).*all"
    ):
        ensure_sysctl("eth9", "ipv4", "rp_filter", root)


def test_disable_ipv6_has_no_host_wide_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel reads disable_ipv6 per interface: `all` = 1 does not turn it off on one that is 0."""
    for iface in ("all", "eth9"):
        (tmp_path / "ipv6" / "conf" / iface).mkdir(parents=True)
        (tmp_path / "ipv6" / "conf" / iface / "disable_ipv6").write_text("1\n" if iface == "all" else "0\n")
    read_only(monkeypatch)
    with pytest.raises(ConfigError, match=r"net\.ipv6\.conf\.eth9\.disable_ipv6=1"):
        ensure_sysctl("eth9", "ipv6", "disable_ipv6", tmp_path)
