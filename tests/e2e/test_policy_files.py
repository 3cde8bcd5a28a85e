"""Policy files under faults, through real gateways: a broken tenant takes only itself, a
file rewritten in place is never loaded half-written, a fresh clone starts."""

from __future__ import annotations

import random
import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import (
    OTHER_TOKEN,
    OTHER_TOKEN_REF,
    REPO,
    SANDGATE,
    TOKEN,
    GatewayFactory,
    RunningGateway,
    tenant_yaml,
    write_gateway_files,
)
from support import RecordingUpstream

from sandgate.policy.model.loader import load_policy_dir

BROKEN = "tenant: a\nsandboxes:\n  - id: sb1\n    token: sha256:00\nallow: []\n"  # bad digest


def admin(gw: RunningGateway) -> httpx.Client:
    sock = str(gw.root / "state" / "admin.sock")
    return httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://sandgate", timeout=10)


def wait_for(check: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def rules_for(port: int, host: str = "api.test") -> list[dict[str, object]]:
    return [{"hosts": [host], "ports": [port]}]


def test_a_gateway_starts_with_a_broken_tenant_and_serves_the_others(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    good = tenant_yaml("b", rules_for(http_upstream.port), sandbox="sb2", token_ref=OTHER_TOKEN_REF)
    gw = start_gateway({"a.yaml": BROKEN, "b.yaml": good})
    url = f"http://api.test:{http_upstream.port}/x"
    with httpx.Client(proxy=gw.proxy("sb2", OTHER_TOKEN), timeout=10) as c:
        assert c.get(url).status_code == 200
    with httpx.Client(proxy=gw.proxy("sb1", TOKEN), timeout=10) as c:
        assert c.get(url).status_code == 407  # the broken tenant has no policy: no_identity
    with admin(gw) as api:
        st = api.get("/v1/status").json()
        metrics = api.get("/metrics").text
    (problem,) = st["policy_problems"]
    assert problem["file"].endswith("tenants/a.yaml") and problem["tenant"] == "a"
    assert problem["kept_last_good"] is False and "sha256: needs 64 hex digits" in problem["errors"][0]
    assert 'sandgate_policy_file_errors{file="' in metrics and 'kept="false",tenant="a"} 1.0' in metrics
    (record,) = gw.records(1, event="policy_reload")
    assert record["trigger"] == "start" and record["tenant_errors"][0]["tenant"] == "a"
    status = subprocess.run(
        [SANDGATE, "policy", "status", "--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert status.returncode == 0
    assert "BROKEN" in status.stdout and "tenants/a.yaml (tenant a): serving nothing" in status.stdout
    assert "policy.tenant_load_failed" in gw.log()


def test_strict_mode_refuses_to_start_on_any_broken_tenant(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    good = tenant_yaml("b", rules_for(http_upstream.port), sandbox="sb2", token_ref=OTHER_TOKEN_REF)
    gw = start_gateway({"a.yaml": BROKEN, "b.yaml": good}, config={"strict_policy": True}, expect_exit=True)
    assert gw.proc.returncode == 2 and "the policy is invalid, not starting" in gw.log()
    config, _ = write_gateway_files(tmp_path / "flag", {"a.yaml": BROKEN, "b.yaml": good})
    run = subprocess.run(
        [SANDGATE, "run", "--strict", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "a.yaml" in run.stderr


def test_a_tenant_broken_at_reload_keeps_its_last_good_version_while_another_changes(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    port = http_upstream.port
    gw = start_gateway(
        {
            "a.yaml": tenant_yaml("a", rules_for(port)),
            "b.yaml": tenant_yaml("b", rules_for(port), sandbox="sb2", token_ref=OTHER_TOKEN_REF),
        }
    )
    url = f"http://api.test:{port}/x"
    a = httpx.Client(proxy=gw.proxy("sb1", TOKEN), timeout=10)
    b = httpx.Client(proxy=gw.proxy("sb2", OTHER_TOKEN), timeout=10)
    with a, b:
        assert a.get(url).status_code == 200 and b.get(url).status_code == 200
        gw.write_tenant("a.yaml", BROKEN)
        gw.write_tenant(
            "b.yaml", tenant_yaml("b", rules_for(port, "open.test"), sandbox="sb2", token_ref=OTHER_TOKEN_REF)
        )
        wait_for(lambda: b.get(url).status_code == 403)
        assert a.get(url).status_code == 200  # a is served at its last good version
        assert b.get(f"http://open.test:{port}/x").status_code == 200
    with admin(gw) as api:
        (problem,) = api.get("/v1/status").json()["policy_problems"]
    assert problem["tenant"] == "a" and problem["kept_last_good"] is True


def test_a_fresh_clone_without_the_demo_token_starts_and_says_so(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    def shipped_rules(root: Path) -> None:
        shutil.rmtree(root / "rules")
        shutil.copytree(REPO / "rules", root / "rules", ignore=shutil.ignore_patterns("*.token"))

    gw = start_gateway({}, prepare=shipped_rules)
    with admin(gw) as api:
        st = api.get("/v1/status").json()
    assert st["ready"] is True and st["tenants"] == 1 and st["sandboxes"] == 0
    assert st["policy_problems"] == []
    (notice,) = st["policy_notices"]
    assert "demo-1.token does not exist yet" in notice
    # Creating the token turns the sandbox on, without a restart.
    token = gw.rules_dir / "tenants" / "demo-1.token"
    token.write_text("fresh-demo-token-0123456789abcdef\n")
    token.chmod(0o600)
    with admin(gw) as api:
        wait_for(lambda: api.get("/v1/status").json()["sandboxes"] == 1)


@pytest.mark.slow
def test_a_rules_file_rewritten_in_place_is_never_loaded_half_written(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    """The writer pauses mid-file (the half it wrote parses and allows what the rest denies);
    every request is decided on a policy that existed on disk as a whole."""
    port = http_upstream.port
    allow = [{"hosts": ["api.test"], "ports": [port]}]
    deny = [{"hosts": ["api.test"], "paths": ["/secret/**"]}]

    def variant(n: int) -> tuple[str, str]:
        """(the part written before the pause, the rest) of version n of tenant a."""
        head = tenant_yaml("a", allow) + f"# rewrite {n}\n"
        return head, yaml.safe_dump({"deny": deny})

    b_file = tenant_yaml("b", allow, sandbox="sb2", token_ref=OTHER_TOKEN_REF)
    gw = start_gateway(
        {"a.yaml": tenant_yaml("a", allow, deny=deny), "b.yaml": b_file},
        config={"reload": {"interval_seconds": 0.1, "settle_seconds": 1.0}},
    )
    rewrites = 6
    # The versions of every whole file the test writes: the only ones a decision may carry.
    whole = tmp_path / "whole"
    shutil.copytree(gw.rules_dir, whole)
    versions = {load_policy_dir(whole, isolate=True).version}
    for n in range(1, rewrites + 1):
        head, tail = variant(n)
        (whole / "tenants" / "a.yaml").write_text(head + tail)
        versions.add(load_policy_dir(whole, isolate=True).version)

    stop = threading.Event()
    statuses: dict[str, Counter[int]] = {"secret": Counter(), "b": Counter()}

    def traffic(name: str, proxy: str, url: str) -> None:
        with httpx.Client(proxy=proxy, timeout=10) as c:
            while not stop.is_set():
                statuses[name][c.get(url).status_code] += 1

    threads = [
        threading.Thread(target=traffic, args=("secret", gw.proxy(), f"http://api.test:{port}/secret/x")),
        threading.Thread(
            target=traffic, args=("b", gw.proxy("sb2", OTHER_TOKEN), f"http://api.test:{port}/ok")
        ),
    ]
    for t in threads:
        t.start()
    rng = random.Random(7)
    path = gw.rules_dir / "tenants" / "a.yaml"
    try:
        for n in range(1, rewrites + 1):
            head, tail = variant(n)
            with path.open("w") as f:  # in place: truncate, write half, pause, finish
                f.write(head)
                f.flush()
                time.sleep(rng.uniform(0.1, 0.4))
                f.write(tail)
            time.sleep(rng.uniform(0.2, 0.6))
        time.sleep(1.5)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    assert statuses["secret"][200] == 0, statuses
    assert statuses["secret"][403] > 20
    assert set(statuses["b"]) == {200}, statuses
    # Every record written, the last requests' too (the answer goes out before its record).
    decided = {r["policy_version"] for r in gw.settled() if r["phase"] == "request"}
    assert decided <= versions, decided - versions
    reloads = gw.records(event="policy_reload")
    assert {r["policy_version"] for r in reloads} <= versions
