"""The files under deploy/ stay in step with the code that reads them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import REPO

from sandgate.proxy.config import load_config
from sandgate.proxy.net.nft import SandboxInterface, render_ruleset


def test_the_sandbox_host_config_loads_with_transparent_and_dns_listeners() -> None:
    config = load_config(REPO / "deploy" / "sandgate-host.yaml")
    assert {listener.mode for listener in config.listeners} == {"regular", "transparent"}
    assert config.dns is not None
    assert config.rules_path == (REPO / "rules").resolve()


def test_the_rendered_ruleset_is_valid_nftables() -> None:
    text = render_ruleset(
        [SandboxInterface("tap0", ("10.213.0.2", "fd00:213::2")), SandboxInterface("tap1", ("10.213.0.6",))],
        [(8081, 8053)],
    )
    check = subprocess.run(["nft", "-c", "-f", "-"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    assert "iifname @ifaces meta nfproto ipv4 iifname . ip saddr != @sources4 drop" in text
    assert '"tap0" . fd00:213::2' in text
    assert render_ruleset([], [(8081, 8053)]) == ""


def test_the_scripts_are_executable() -> None:
    for script in ("deploy/install.sh", "deploy/quickstart.sh", "tests/run.sh", ".ci/run"):
        assert (REPO / script).stat().st_mode & 0o111, script
        assert Path(REPO / script).read_text().startswith("#!/usr/bin/env bash")
