"""`sandgate policy reload` against a real gateway: it waits for the answer and tells the truth.

The version now in force (and the one before), a refusal with file:line while the old policy
stays, no gateway at all, the SIGHUP fallback when the admin API is off, and one change loaded
once when the file watcher and an explicit reload both see it.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import httpx
import pytest
from conftest import SANDGATE, GatewayFactory, RunningGateway, curl, tenant_yaml, write_gateway_files
from support import RecordingUpstream

pytestmark = pytest.mark.slow


def cli(gw: RunningGateway, *args: str) -> subprocess.CompletedProcess[str]:
    config = str(gw.root / "sandgate.yaml")
    return subprocess.run([SANDGATE, *args, "--config", config], capture_output=True, text=True, timeout=60)


def served_version(gw: RunningGateway) -> str:
    result = cli(gw, "policy", "status", "--format", "json")
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout)["policy_version"])


def reloads(gw: RunningGateway) -> list[dict[str, Any]]:
    return gw.records(event="policy_reload")


def status_code(gw: RunningGateway, url: str) -> str:
    return curl("-o", "/dev/null", "-w", "%{http_code}", "-x", gw.proxy(), url).stdout


def test_reload_waits_and_prints_the_new_version_and_the_one_before(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, config={"reload": {"watch": False}})
    before = served_version(gw)
    gw.write_tenant("t2.yaml", tenant_yaml("t2", [], sandbox="sb2"))
    result = cli(gw, "policy", "reload")
    assert result.returncode == 0, result.stderr
    now = served_version(gw)
    assert now != before
    assert result.stdout.splitlines() == [
        f"reloaded: policy version {now} (was {before})",
        "  2 tenants: t1, t2; 2 sandboxes",
    ]
    assert [r["trigger"] for r in reloads(gw)] == ["admin"], "in force when the command returned"

    again = cli(gw, "policy", "reload", "--format", "json")
    assert again.returncode == 0, again.stderr
    answer = json.loads(again.stdout)
    assert answer["policy_version"] == answer["previous_policy_version"] == now
    assert answer["tenants"] == ["t1", "t2"] and answer["sandboxes"] == 2


@pytest.mark.parametrize("trigger", ["admin", "sighup"], ids=["an admin API reload", "SIGHUP"])
def test_a_change_an_explicit_reload_loaded_is_not_loaded_again_by_the_watcher(
    start_gateway: GatewayFactory, trigger: str
) -> None:
    # The watcher would load the change too, 1.5 s after it settled.
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", [])},
        config={"reload": {"interval_seconds": 0.1, "settle_seconds": 1.5}},
    )
    gw.write_tenant("t2.yaml", tenant_yaml("t2", [], sandbox="sb2"))
    if trigger == "admin":
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))) as c:
            assert c.post("http://sandgate/v1/policy/reload", timeout=30).status_code == 200
    else:
        gw.reload()  # systemctl reload
    deadline = time.monotonic() + 15
    while not reloads(gw):
        assert time.monotonic() < deadline, "the explicit reload is recorded"
        time.sleep(0.05)
    time.sleep(3.0)  # long past the watcher's settle time
    assert [r["trigger"] for r in reloads(gw)] == [trigger], "one change, one reload"
    assert served_version(gw) == reloads(gw)[0]["policy_version"]
    # A later change is still the watcher's to load.
    gw.write_tenant("t3.yaml", tenant_yaml("t3", [], sandbox="sb3"))
    deadline = time.monotonic() + 15
    while len(reloads(gw)) < 2:
        assert time.monotonic() < deadline, "the watcher still loads what nobody else did"
        time.sleep(0.05)
    assert [r["trigger"] for r in reloads(gw)] == [trigger, "file_change"]


def test_a_refused_reload_names_file_and_line_and_the_policy_still_in_force(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, config={"reload": {"watch": False}})
    version = served_version(gw)
    (gw.rules_dir / "base.yaml").write_text("deny:\n  - hots: [x.test]\n")
    result = cli(gw, "policy", "reload")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    first, *errors = result.stderr.splitlines()
    assert first == (
        "sandgate: reload REFUSED: policy reload failed; the previous policy stays in force; "
        f"policy {version} is still in force"
    )
    assert any("base.yaml:2:" in e for e in errors), errors
    assert served_version(gw) == version
    assert status_code(gw, http_upstream.url_for("api.test") + "/x") == "200", "the old rules decide"


def test_a_broken_tenant_file_is_named_with_what_its_tenant_keeps(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", [])}, config={"reload": {"watch": False}})
    gw.write_tenant("t1.yaml", "tenant: t1\nallow:\n  - hots: [api.test]\n")
    result = cli(gw, "policy", "reload")
    assert result.returncode == 2
    assert result.stdout.startswith("reloaded: policy version ")
    assert (
        "BROKEN " in result.stderr and "t1.yaml (tenant t1): serving its last good version" in result.stderr
    )
    assert "t1.yaml:3:" in result.stderr


def test_without_a_gateway_one_line_and_exit_1(tmp_path: Any) -> None:
    config, _ = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [])})
    result = subprocess.run(
        [SANDGATE, "policy", "reload", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"sandgate: no gateway is running (nothing answers on {tmp_path / 'state' / 'admin.sock'}); "
        "nothing was reloaded\n"
    )


def test_with_the_admin_api_off_it_signals_and_says_it_cannot_confirm(
    start_gateway: GatewayFactory,
) -> None:
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", [])}, config={"admin": {"enabled": False}, "reload": {"watch": False}}
    )
    result = cli(gw, "policy", "reload")
    assert result.returncode == 0, result.stderr
    assert f"gateway pid {gw.proc.pid} (SIGHUP); not confirmed" in result.stdout
    deadline = time.monotonic() + 15
    while not any(r["trigger"] == "sighup" for r in reloads(gw)):
        assert time.monotonic() < deadline, "SIGHUP still reloads"
        time.sleep(0.05)
