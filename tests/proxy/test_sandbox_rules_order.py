"""`sandgate sandbox add` in a fleet: the host's anti-spoofing rules for a new interface are in
place before its address identifies a sandbox anywhere, and go back when registering fails.

The nftables side is recorded, not applied (the rules themselves are tested in real namespaces
in test_transparent.py); the order around the registration is what is checked here."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.proxy.cli import sandbox as sandbox_cli
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.stores.registry import DynamicSandbox

OLD = DynamicSandbox(id="old", tenant="t1", interface="tap-old", addresses=("10.213.0.2",))
NEW = DynamicSandbox(id="new", tenant="t1", interface="tap-new", addresses=("10.213.0.6",))


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[object]:
    seen: list[object] = []
    monkeypatch.setattr(sandbox_cli, "apply_host_rules", lambda _cfg, sbs: seen.append([s.id for s in sbs]))
    monkeypatch.setattr(sandbox_cli, "registered", lambda _cfg: [])
    return seen


def config(tmp_path: Path) -> GatewayConfig:
    return GatewayConfig(state_dir=str(tmp_path), base_dir=str(tmp_path))


def test_rules_are_installed_before_the_sandbox_is_registered(calls: list[object], tmp_path: Path) -> None:
    def add() -> str:
        calls.append("registered")
        return "ok"

    assert sandbox_cli._rules_first(config(tmp_path), NEW, [OLD], add) == "ok"
    assert calls == [["old", "new"], "registered"]


def test_a_failed_registration_takes_the_new_rules_back(calls: list[object], tmp_path: Path) -> None:
    def add() -> None:
        raise RuntimeError("redis is unreachable")

    with pytest.raises(RuntimeError):
        sandbox_cli._rules_first(config(tmp_path), NEW, [OLD], add)
    assert calls == [["old", "new"], ["old"]]
