"""`sandgate sandbox update` / `add --replace`: a registered sandbox changes in place, through the
running gateway's admin API, with no gap in identity; `add` of a taken id is refused the same
way with a gateway and without one.

Real parts: a gateway with explicit, transparent and DNS listeners; a guest in a network
namespace behind sandgate's nftables table; an upstream in another namespace; curl in the
guest and httpx on the host looping requests while the tenant changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SANDGATE, records_when, tenant_yaml, write_gateway_files
from support import RecordingUpstream, free_port, wait_for_port
from support.netns import Namespace, in_namespace, netns_lab

pytestmark = [pytest.mark.root, pytest.mark.slow]

TOKEN = "update-token-0123456789abcdef"
NEW_TOKEN = "update-token-new-0123456789ab"
RULE = [{"id": "api", "hosts": ["api.test"], "ports": [80]}]


@dataclass
class Lab:
    up: Namespace
    guest: Namespace
    root: Path
    config: Path
    proxy_port: int
    web: RecordingUpstream

    def sandgate(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SANDGATE, *args, "--config", str(self.config)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **(env or {})},
        )

    def records(self, event: str = "decision") -> list[dict[str, Any]]:
        path = self.root / "state" / "audit" / "audit.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [r for r in map(json.loads, lines) if r.get("event") == event]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with netns_lab() as nl:
        up, guest = nl.add("up"), nl.add("g")
        web = in_namespace(up.name, lambda: RecordingUpstream(up.addr, 80, name="web").start())
        table = f"sgu_{nl.tag}"
        proxy_port, transparent_port = free_port(), free_port()
        config, _ = write_gateway_files(
            tmp_path,
            {
                "t1.yaml": tenant_yaml("t1", RULE, sandbox="static-t1"),
                "t2.yaml": tenant_yaml("t2", RULE, sandbox="static-t2"),
            },
            config={
                "listeners": [
                    {"host": "127.0.0.1", "port": proxy_port},
                    {"mode": "transparent", "host": "0.0.0.0", "port": transparent_port},
                ],
                "dns": {"host": "0.0.0.0", "port": free_port()},
                "resolver": {"hosts": {"api.test": [up.addr]}},
                "address_guard": {"reachable_by_name": [f"10.200.{nl.subnet}.0/24"]},
                "host_rules": {"table": table},
            },
        )
        guest.resolv_conf(guest.host_addr)
        with (tmp_path / "gateway.log").open("wb") as log:
            gateway = subprocess.Popen(
                [SANDGATE, "run", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        try:
            wait_for_port("127.0.0.1", transparent_port, timeout=60)
            yield Lab(up, guest, tmp_path, config, proxy_port, web)
        finally:
            gateway.terminate()
            gateway.wait(20)
            web.stop()
            subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True)


def _guest_loop(guest: Namespace, stop: threading.Event, codes: list[str]) -> None:
    """curl in the guest, one new connection per request, until `stop`."""
    while not stop.is_set():
        r = guest.exec("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "8", "http://api.test/g")
        codes.append(r.stdout.strip() or f"curl exit {r.returncode}")


def _token_loop(port: int, stop: threading.Event, codes: list[str]) -> None:
    """httpx on the host through the explicit proxy, one keep-alive connection, until `stop`."""
    proxy = f"http://tok1:{TOKEN}@127.0.0.1:{port}"
    with httpx.Client(proxy=proxy, timeout=8, trust_env=False) as client:
        while not stop.is_set():
            try:
                codes.append(str(client.get("http://api.test/t").status_code))
            except httpx.HTTPError as e:
                codes.append(type(e).__name__)


def _wait(predicate: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_updating_a_tenant_under_load_leaves_no_request_unidentified(lab: Lab) -> None:
    env = {"TOK": TOKEN}
    add = lab.sandgate(
        "sandbox", "add", "--id", "sb1", "--tenant", "t1", "--interface", lab.guest.host_if,
        "--address", lab.guest.addr,
    )  # fmt: skip
    assert add.returncode == 0, add.stderr
    add = lab.sandgate("sandbox", "add", "--id", "tok1", "--tenant", "t1", "--token", "env:TOK", env=env)
    assert add.returncode == 0, add.stderr

    # The fixture's own probe of the transparent port is a no_identity connect: count from here.
    mark = len(lab.records())
    stop = threading.Event()
    guest_codes: list[str] = []
    token_codes: list[str] = []
    loops = [
        threading.Thread(target=_guest_loop, args=(lab.guest, stop, guest_codes)),
        threading.Thread(target=_token_loop, args=(lab.proxy_port, stop, token_codes)),
    ]
    for t in loops:
        t.start()
    try:
        _wait(lambda: len(guest_codes) >= 3 and len(token_codes) >= 3)
        for sandbox in ("sb1", "tok1"):
            update = lab.sandgate("sandbox", "update", sandbox, "--tenant", "t2")
            assert update.returncode == 0, update.stderr
            assert "changed: tenant" in update.stdout
        before = (len(guest_codes), len(token_codes))
        _wait(lambda: len(guest_codes) >= before[0] + 3 and len(token_codes) >= before[1] + 3)
    finally:
        stop.set()
        for t in loops:
            t.join(30)

    assert set(guest_codes) == {"200"}, guest_codes
    assert set(token_codes) == {"200"}, token_codes

    def answered(records: list[dict[str, Any]], sandbox: str, path: str) -> int:
        return sum(1 for r in records if r.get("sandbox") == sandbox and r.get("path") == path)

    # The audit writer flushes asynchronously: wait for the record of every answered request.
    decisions = records_when(
        lambda: lab.records()[mark:],
        lambda rs: (
            answered(rs, "sb1", "/g") >= len(guest_codes) and answered(rs, "tok1", "/t") >= len(token_codes)
        ),
    )
    assert not [r for r in decisions if r["reason"] == "no_identity"]
    for sandbox in ("sb1", "tok1"):
        tenants = [r["tenant"] for r in decisions if r.get("sandbox") == sandbox]
        # Old tenant, then new tenant, switched once: never a request for neither.
        assert tenants[0] == "t1" and tenants[-1] == "t2", tenants
        switch = tenants.index("t2")
        assert set(tenants[:switch]) == {"t1"} and set(tenants[switch:]) == {"t2"}, tenants
    updates = records_when(lambda: lab.records("sandbox_update"), lambda rs: len(rs) >= 2)
    assert [(u["sandbox"], u["old_tenant"], u["tenant"], u["changed"]) for u in updates] == [
        ("sb1", "t1", "t2", ["tenant"]),
        ("tok1", "t1", "t2", ["tenant"]),
    ]
    assert TOKEN not in (lab.root / "state" / "audit" / "audit.jsonl").read_text()


def test_add_of_a_taken_id_is_refused_alike_with_a_gateway_and_without(lab: Lab, tmp_path: Path) -> None:
    env = {"TOK": TOKEN}
    first = lab.sandgate("sandbox", "add", "--id", "tok1", "--tenant", "t1", "--token", "env:TOK", env=env)
    assert first.returncode == 0, first.stderr
    same = lab.sandgate("sandbox", "add", "--id", "tok1", "--tenant", "t1", "--token", "env:TOK", env=env)
    assert same.returncode == 0, same.stderr  # an identical add changes nothing
    other = lab.sandgate("sandbox", "add", "--id", "tok1", "--tenant", "t2", "--token", "env:TOK", env=env)
    assert other.returncode == 2
    with_gateway = other.stderr

    # The same config with no gateway running: the registry file itself.
    offline = tmp_path / "offline.yaml"
    state = tmp_path / "offline-state"
    offline.write_text(
        lab.config.read_text().replace(str(lab.root / "state"), str(state))
    )  # fmt: skip

    def off(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SANDGATE, *args, "--config", str(offline)],
            capture_output=True, text=True, timeout=60, env={**os.environ, **env},
        )  # fmt: skip

    assert off("sandbox", "add", "--id", "tok1", "--tenant", "t1", "--token", "env:TOK").returncode == 0
    refused = off("sandbox", "add", "--id", "tok1", "--tenant", "t2", "--token", "env:TOK")
    assert refused.returncode == 2
    assert refused.stderr.strip() == with_gateway.strip()
    assert "already registered with other settings (tenant 't1')" in refused.stderr
    assert "sandgate sandbox update tok1" in refused.stderr
    registry = json.loads((state / "sandboxes.json").read_text())
    assert [e["tenant"] for e in registry] == ["t1"]  # not replaced

    # --replace and update change it, offline as online.
    replaced = off("sandbox", "add", "--id", "tok1", "--tenant", "t2", "--token", "env:TOK", "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert [e["tenant"] for e in json.loads((state / "sandboxes.json").read_text())] == ["t2"]
    updated = off("sandbox", "update", "tok1", "--tenant", "t1")
    assert updated.returncode == 0, updated.stderr
    assert [e["tenant"] for e in json.loads((state / "sandboxes.json").read_text())] == ["t1"]
    online = lab.sandgate(
        "sandbox", "add", "--id", "tok1", "--tenant", "t2", "--token", "env:TOK", "--replace", env=env
    )
    assert online.returncode == 0, online.stderr
    assert "changed: tenant" in online.stdout


def test_update_of_an_unknown_sandbox_or_to_an_unknown_tenant_is_refused(lab: Lab) -> None:
    missing = lab.sandgate("sandbox", "update", "nope", "--tenant", "t2")
    assert missing.returncode == 2
    assert "no registered sandbox 'nope'" in missing.stderr
    add = lab.sandgate(
        "sandbox", "add", "--id", "tok1", "--tenant", "t1", "--token", "env:TOK", env={"TOK": TOKEN}
    )
    assert add.returncode == 0, add.stderr
    bad = lab.sandgate("sandbox", "update", "tok1", "--tenant", "ghost")
    assert bad.returncode == 2
    assert "unknown tenant 'ghost'" in bad.stderr
    assert [r["tenant"] for r in json.loads((lab.root / "state" / "sandboxes.json").read_text())] == ["t1"]


def test_moving_a_sandbox_to_a_new_address_moves_its_anti_spoofing_rule(lab: Lab) -> None:
    guest = lab.guest
    add = lab.sandgate(
        "sandbox",
        "add",
        "--id",
        "sb1",
        "--tenant",
        "t1",
        "--interface",
        guest.host_if,
        "--address",
        guest.addr,
    )
    assert add.returncode == 0, add.stderr
    # A second address on the guest's link (a /32 past the lab's /30s), its source from now on.
    new_addr = guest.addr.rsplit(".", 1)[0] + ".250"
    subprocess.run(["ip", "-n", guest.name, "addr", "add", f"{new_addr}/32", "dev", guest.ns_if], check=True)
    subprocess.run(["ip", "route", "add", f"{new_addr}/32", "dev", guest.host_if], check=True)
    try:
        update = lab.sandgate("sandbox", "update", "sb1", "--address", new_addr, "--tenant", "t2")
        assert update.returncode == 0, update.stderr
        ruleset = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True).stdout
        assert new_addr in ruleset and guest.addr not in ruleset
        # The guest moves too: its gateway (also its DNS server) and the default route, from new_addr.
        for route in ([f"{guest.host_addr}/32", "dev", guest.ns_if], ["default", "via", guest.host_addr]):
            subprocess.run(["ip", "-n", guest.name, "route", "replace", *route, "src", new_addr], check=True)
        moved = guest.exec(
            "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5", "http://api.test/moved"
        )
        assert moved.stdout == "200", moved
        # The old address is no identity any more: its packets are dropped before the gateway.
        old = guest.exec("curl", "-sS", "-m", "3", "--interface", guest.addr, f"http://{lab.up.addr}/old")
        assert old.returncode != 0, old
        moves = records_when(lab.records, lambda rs: any(r.get("path") == "/moved" for r in rs))
        assert [r["tenant"] for r in moves if r.get("path") == "/moved"] == ["t2"]
    finally:
        subprocess.run(["ip", "route", "del", f"{new_addr}/32", "dev", guest.host_if], capture_output=True)
