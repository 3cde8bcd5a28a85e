"""Healthchecks and probes ask only /healthz and /readyz, carry no token, and a real gateway
configured with the deployments' admin settings answers them (and nothing else) without one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from conftest import GatewayFactory, tenant_yaml
from support import free_port, wait_for_port
from support.deployfiles import DEPLOY, yaml_docs

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


def test_the_compose_healthcheck_asks_a_probe_path_without_a_token() -> None:
    test = compose_healthcheck()
    assert test[0] == "CMD"
    text = " ".join(test[1:])
    assert not SECRET_WORDS.search(text), text
    urls = re.findall(r"https?://[^'\"\s]+", text)
    assert urls and {httpx.URL(u).path for u in urls} <= PROBE_PATHS, urls


def test_the_daemonset_probes_are_plain_gets_of_probe_paths() -> None:
    probes = daemonset_probes()
    assert set(probes) == {"startupProbe", "livenessProbe", "readinessProbe"}
    for name, probe in probes.items():
        assert set(probe) & {"exec", "grpc", "tcpSocket"} == set(), name
        get = probe["httpGet"]
        assert "httpHeaders" not in get, f"{name} carries headers: probes need no token"
        assert get["path"] in PROBE_PATHS, name
        assert get.get("scheme", "HTTP") == "HTTP", name


def test_a_real_gateway_answers_the_probes_as_written_and_nothing_else_without_a_token(
    start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    compose_admin = yaml_docs(DEPLOY / "compose" / "gateway.yaml")[0]["admin"]
    host, _, listen_port = compose_admin["listen"].rpartition(":")
    token = tmp_path / "admin.token"
    token.write_text("probe-test-token-0123456789abcdef")
    token.chmod(0o600)
    port = free_port()
    start_gateway(
        {"t1.yaml": tenant_yaml("t1", [])},
        config={"admin": {"listen": f"{host}:{port}", "token": f"file:{token}"}},
    )
    wait_for_port(host, port, timeout=30)
    # The compose healthcheck's own command line, pointed at this gateway's admin port.
    argv = [arg.replace(f":{listen_port}/", f":{port}/") for arg in compose_healthcheck()[1:]]
    assert argv[0] == "python"
    check = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    # The DaemonSet's probes, as the kubelet sends them (no headers).
    for name, probe in daemonset_probes().items():
        get = probe["httpGet"]
        resp = httpx.get(f"http://{host}:{port}{get['path']}", timeout=5)
        assert resp.status_code == 200, (name, resp.text)
    # Anything else still needs the token: the probes' freedom is exactly those two paths.
    assert httpx.get(f"http://{host}:{port}/v1/status", timeout=5).status_code == 401
    assert httpx.get(f"http://{host}:{port}/metrics", timeout=5).status_code == 401
