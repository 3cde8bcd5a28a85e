"""Healthchecks and probes: `sandgate status` (the compose healthcheck, the DaemonSet's
startup probe) and plain GETs of /healthz and /readyz (its liveness and readiness probes).
None carries a token; each is run, as written, against a real gateway configured with the
deployments' admin settings, and only the probe paths answer without a token."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
from conftest import SANDGATE, GatewayFactory, tenant_yaml
from support import free_port, wait_for_port
from support.deployfiles import DEPLOY, parse_cli, yaml_docs

PROBE_PATHS = {"/healthz", "/readyz"}
SECRET_WORDS = re.compile(r"authorization|bearer|token|SANDGATE_", re.IGNORECASE)


def compose_healthcheck() -> list[str]:
    test: list[str] = yaml_docs(DEPLOY / "compose" / "compose.yaml")[0]["services"]["sandgate"][
        "healthcheck"
    ]["test"]
    return test


def daemonset_probes() -> dict[str, dict[str, Any]]:
    ds = next(d for d in yaml_docs(DEPLOY / "k8s" / "daemonset.yaml") if d["kind"] == "DaemonSet")
    ctr = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "sandgate")
    return {k: v for k, v in ctr.items() if k.endswith("Probe")}


def status_command(argv: list[str]) -> Any:
    """The parsed `sandgate status` command line of a check (it must be one, and carry no secret)."""
    assert not SECRET_WORDS.search(" ".join(argv)), argv
    args = parse_cli(argv)
    assert args.command == "status" and not args.wait, argv
    return args


def test_the_compose_healthcheck_is_sandgate_status_on_the_mounted_config() -> None:
    test = compose_healthcheck()
    assert test[0] == "CMD"
    args = status_command(test[1:])
    assert str(args.config) == "/etc/sandgate/gateway.yaml"


def test_the_daemonset_starts_on_sandgate_status_then_probes_plain_gets() -> None:
    probes = daemonset_probes()
    assert set(probes) == {"startupProbe", "livenessProbe", "readinessProbe"}
    startup = probes.pop("startupProbe")
    assert set(startup) & {"httpGet", "grpc", "tcpSocket"} == set()
    args = status_command(startup["exec"]["command"])
    assert str(args.config) == "/etc/sandgate/config/gateway.yaml"
    assert startup["timeoutSeconds"] >= 5, "a Python process needs more than the 1 s default"
    for name, probe in probes.items():
        assert set(probe) & {"exec", "grpc", "tcpSocket"} == set(), name
        get = probe["httpGet"]
        assert "httpHeaders" not in get, f"{name} carries headers: probes need no token"
        assert get["path"] in PROBE_PATHS, name
        assert get.get("scheme", "HTTP") == "HTTP", name


def run_check(argv: list[str], config: Path) -> subprocess.CompletedProcess[str]:
    """A check's command line as written, with its --config pointed at the test gateway's."""
    argv = list(argv)
    argv[argv.index("--config") + 1] = str(config)
    assert argv[0] == "sandgate"
    return subprocess.run([SANDGATE, *argv[1:]], capture_output=True, text=True, timeout=60)


def test_a_real_gateway_answers_the_checks_as_written_and_nothing_else_without_a_token(
    start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    compose_admin = yaml_docs(DEPLOY / "compose" / "gateway.yaml")[0]["admin"]
    host = compose_admin["listen"].rpartition(":")[0]
    token = tmp_path / "admin.token"
    token.write_text("probe-test-token-0123456789abcdef")
    token.chmod(0o600)
    port = free_port()
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", [])},
        config={"admin": {"listen": f"{host}:{port}", "token": f"file:{token}"}},
    )
    wait_for_port(host, port, timeout=30)
    config = gw.root / "sandgate.yaml"
    checks = {
        "compose": compose_healthcheck()[1:],
        "k8s startup": daemonset_probes()["startupProbe"]["exec"]["command"],
    }
    for name, argv in checks.items():
        check = run_check(argv, config)
        assert check.returncode == 0, (name, check.stderr)
    # The DaemonSet's HTTP probes, as the kubelet sends them (no headers).
    for name, probe in daemonset_probes().items():
        if "httpGet" in probe:
            resp = httpx.get(f"http://{host}:{port}{probe['httpGet']['path']}", timeout=5)
            assert resp.status_code == 200, (name, resp.text)
    # Anything else still needs the token: the probes' freedom is exactly those two paths.
    assert httpx.get(f"http://{host}:{port}/v1/status", timeout=5).status_code == 401
    assert httpx.get(f"http://{host}:{port}/metrics", timeout=5).status_code == 401
    # A stopped gateway fails the checks, with the reason.
    assert gw.stop() == 0
    for name, argv in checks.items():
        check = run_check(argv, config)
        assert check.returncode == 1, name
        assert check.stderr.startswith("sandgate: no gateway answers on "), (name, check.stderr)
