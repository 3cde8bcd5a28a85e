"""The start-up banner of a real gateway: listeners, tenants, sandboxes and how each is
reached (never with its token), the CA, the audit trail, the admin socket; and `--version`."""

from __future__ import annotations

import json
import os
import subprocess
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from conftest import SANDGATE, TOKEN_REF, GatewayFactory, RunningGateway
from support import free_port_run
from support.processes import gateway_status, wait_until

pytestmark = pytest.mark.slow

FILE_TOKEN = "file-token-0123456789abcdef-SECRET"
ENV_TOKEN = "env-token-0123456789abcdef-SECRET"


def tenant(name: str, sandbox: dict[str, object]) -> str:
    return yaml.safe_dump({"tenant": name, "sandboxes": [sandbox], "allow": []}, sort_keys=False)


TENANTS = {
    "t1.yaml": tenant("t1", {"id": "d-sha", "token": TOKEN_REF}),
    "t2.yaml": tenant("t2", {"id": "b-file", "token": "file:b-file.token"}),
    "t3.yaml": tenant("t3", {"id": "a-env", "token": "env:SANDGATE_TEST_BANNER_TOKEN"}),
    "t4.yaml": tenant("t4", {"id": "c-addr", "addresses": ["10.213.9.2"]}),
    **{f"t{i}.yaml": tenant(f"t{i}", {"id": f"x{i}", "token": TOKEN_REF}) for i in (5, 6, 7)},
}


def write_token(root: Path) -> None:
    path = root / "rules" / "tenants" / "b-file.token"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(FILE_TOKEN + "\n")


def ready_log(gw: RunningGateway, last: str = "gateway.ready") -> str:
    """The log once it holds `last` (the block's last line follows the event), and 0.2 s more
    (for a block that should not come)."""
    deadline = time.monotonic() + 30
    while last not in gw.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    return gw.log()


def test_the_console_banner_names_everything_an_operator_needs(
    start_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDGATE_TEST_BANNER_TOKEN", ENV_TOKEN)
    gw = start_gateway(TENANTS, config={"log": {"format": "console"}}, prepare=write_token)
    log = ready_log(gw, "  admin socket ")
    state = gw.root / "state"
    block = log[log.index("\nsandgate ") + 1 :].split("\n\n")[0].splitlines()
    assert block[0].startswith(f"sandgate {version('sandgate')} serves (pid {gw.proc.pid}, policy version ")
    assert block[1:] == [
        f"  proxy listener  127.0.0.1:{gw.port}",
        "  tenants (7)     t1, t2, t3, t4, t5, and 2 more",
        "  sandboxes (7)",
        f"                  a-env (tenant t3): proxy http://a-env:<token from $SANDGATE_TEST_BANNER_TOKEN>@127.0.0.1:{gw.port}",
        f"                  b-file (tenant t2): proxy http://b-file:<token from rules/tenants/b-file.token>@127.0.0.1:{gw.port}",
        "                  c-addr (tenant t4): transparent from 10.213.9.2",
        f"                  d-sha (tenant t1): proxy http://d-sha:<the token whose sha256 is {TOKEN_REF[7:19]}...>@127.0.0.1:{gw.port}",
        f"                  x5 (tenant t5): proxy http://x5:<the token whose sha256 is {TOKEN_REF[7:19]}...>@127.0.0.1:{gw.port}",
        "                  and 2 more (sandgate sandbox list)",
        f"  CA certificate  {state / 'ca' / 'mitmproxy-ca-cert.pem'}",
        f"  audit trail     {state / 'audit' / 'audit.jsonl'}",
        f"  admin socket    {state / 'admin.sock'}",
    ]
    assert FILE_TOKEN not in log and ENV_TOKEN not in log


def test_the_json_event_carries_the_same_facts_and_no_block(
    start_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDGATE_TEST_BANNER_TOKEN", ENV_TOKEN)
    dns_port = 0  # any free port: the event names the bound one
    gw = start_gateway(TENANTS, config={"dns": {"host": "127.0.0.1", "port": dns_port}}, prepare=write_token)
    log = ready_log(gw)
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert len(lines) == len(log.strip().splitlines()), "a JSON log holds JSON lines only: no block"
    (event,) = [e for e in lines if e["event"] == "gateway.ready"]
    state = gw.root / "state"
    assert event["version"] == version("sandgate")
    assert event["listeners"][0] == f"regular@127.0.0.1:{gw.port}"
    assert event["listeners"][1].startswith("dns@127.0.0.1:") and not event["listeners"][1].endswith(":0")
    assert (event["tenants"], event["sandboxes"]) == (7, 7)
    assert event["tenant_ids"] == [f"t{i}" for i in range(1, 8)]
    assert event["sandbox_ids"] == ["a-env", "b-file", "c-addr", "d-sha", "x5", "x6", "x7"]
    assert event["ca_cert"] == str(state / "ca" / "mitmproxy-ca-cert.pem")
    assert event["audit"] == str(state / "audit" / "audit.jsonl")
    assert event["admin"] == [f"unix:{state / 'admin.sock'}"]


def test_with_workers_the_supervisor_prints_one_block_under_its_own_pid(
    start_gateway: GatewayFactory,
) -> None:
    """Each worker logs its `gateway.ready`; the block (for people) is printed once, when every
    worker serves, naming the pid that stops the gateway (the supervisor's) and the workers'."""
    dns = free_port_run(2, "127.0.0.1")
    gw = start_gateway(
        {"t1.yaml": TENANTS["t1.yaml"]},
        config={"log": {"format": "console"}, "dns": {"host": "127.0.0.1", "port": dns}},
        env={"SANDGATE_WORKERS": "2"},
    )
    status = wait_until(lambda: gateway_status(gw), "both workers to serve")
    log = wait_until(lambda: gw.log() if "\nsandgate " in gw.log() else None, "the block")
    time.sleep(0.5)  # a second block, if any, would follow
    log = gw.log()
    assert log.count("gateway.ready") == 2, "each worker's event"
    heads = [line for line in log.splitlines() if " serves (pid " in line]
    assert len(heads) == 1, heads
    assert heads[0].startswith(f"sandgate {version('sandgate')} serves (pid {gw.proc.pid}, policy version ")
    block = log[log.index("\nsandgate ") + 1 :].split("\n\n")[0].splitlines()
    first, second = status["worker_pids"]
    state = gw.root / "state"
    assert block[1:] == [
        f"  workers         2 (pids {first}, {second})",
        f"  proxy listener  127.0.0.1:{gw.port}",
        f"  DNS listener    127.0.0.1:{dns}-{dns + 1} (worker i on {dns} + i)",
        "  tenants (1)     t1",
        "  sandboxes (1)",
        f"                  d-sha (tenant t1): proxy http://d-sha:<the token whose sha256 is {TOKEN_REF[7:19]}...>@127.0.0.1:{gw.port}",
        f"  CA certificate  {state / 'ca' / 'mitmproxy-ca-cert.pem'}",
        f"  audit trail     {state / 'audit' / 'audit.jsonl'}",
        f"  admin socket    {state / 'admin.sock'}",
    ]


def test_version_prints_the_installed_versions_and_exits_0() -> None:
    proc = subprocess.run([SANDGATE, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.startswith(
        f"sandgate {version('sandgate')} (mitmproxy {version('mitmproxy')}, Python "
    )
