"""The guests' endpoint in transparent mode, in real network namespaces: a guest without proxy
settings finds `sandgate.internal` through the gateway's DNS listener, proposes, polls and is
approved through the admin API; the name is never looked up upstream nor dialled, and TLS to
it is refused.

Topology: `up` (HTTP :80 and DNS :53, both counting what reaches them) and `g1` (the guest of
sandbox sb1, registered with `sandgate sandbox add`, so sandgate's nftables table steers it).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SANDGATE, records_when, tenant_yaml, write_gateway_files
from support import RecordingUpstream, ScriptedDNSServer, free_port, wait_for_port
from support.netns import Namespace, in_namespace, netns_lab

pytestmark = [pytest.mark.root, pytest.mark.slow]

NAME = "sandgate.internal"
ENDPOINT = f"http://{NAME}/v1/access-requests"
ADDRESS = "169.254.77.77"


@dataclass
class Lab:
    g1: Namespace
    root: Path
    config: Path
    web: RecordingUpstream
    dns: ScriptedDNSServer

    def curl(self, *args: str) -> tuple[int, str]:
        """(status, body) of a request from the guest; status 0 when no answer came."""
        out = self.g1.exec("curl", "-sS", "-m", "8", "-o", "-", "-w", "\n%{http_code}", *args, timeout=30)
        body, _, code = out.stdout.rpartition("\n")
        return int(code or 0), body

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        transport = httpx.HTTPTransport(uds=str(self.root / "state" / "admin.sock"))
        with httpx.Client(transport=transport, base_url="http://sandgate", timeout=10) as c:
            return c.request(method, path, **kwargs)

    def records(self, done: Any) -> list[dict[str, Any]]:
        audit = self.root / "state" / "audit" / "audit.jsonl"

        def read() -> list[dict[str, Any]]:
            lines = audit.read_text().splitlines() if audit.exists() else []
            return [json.loads(line) for line in lines if '"event":"decision"' in line]

        return records_when(read, done)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("endpoint-transparent")
    with netns_lab() as nl:
        up, g1 = nl.add("up"), nl.add("g1")
        web = in_namespace(up.name, lambda: RecordingUpstream(up.addr, 80, name="web").start())
        # The upstream DNS knows the reserved name too: were the gateway ever to ask, it would show.
        records = {"api.test": [up.addr], NAME: [up.addr]}
        dns = in_namespace(up.name, lambda: ScriptedDNSServer(up.addr, 53, records=records, ttl=60).start())
        t1 = tenant_yaml(
            "t1",
            [
                {"id": "open", "hosts": ["api.test"], "ports": [80], "methods": ["GET"], "paths": ["/open"]},
                # Any public name on 443: lets the gateway look up names (not this one).
                {"id": "any", "hosts": ["*"], "ports": [443]},
            ],
            sandbox="static-sb1",
        )
        transparent_port, dns_port = free_port(), free_port()
        config, _ = write_gateway_files(
            root,
            {"t1.yaml": t1},
            config={
                "listeners": [
                    {"host": "127.0.0.1", "port": free_port()},
                    {"mode": "transparent", "host": "0.0.0.0", "port": transparent_port},
                ],
                "dns": {"host": "0.0.0.0", "port": dns_port},
                "resolver": {"hosts": {}, "nameservers": [f"{up.addr}:53"], "ipv6": False},
                "address_guard": {"reachable_by_name": [f"10.200.{nl.subnet}.0/24"]},
                "host_rules": {"table": f"sgt_{nl.tag}"},
                "workers": {"count": 1},
            },
        )
        with (root / "gateway.log").open("wb") as log:
            gateway = subprocess.Popen(
                [SANDGATE, "run", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        try:
            wait_for_port("127.0.0.1", transparent_port, timeout=30)
            added = subprocess.run(
                [SANDGATE, "sandbox", "add", "--interface", g1.host_if, "--address", g1.addr]
                + ["--tenant", "t1", "--id", "sb1", "--config", str(config)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert added.returncode == 0, added.stderr
            g1.resolv_conf(g1.host_addr)
            _wait_for_registry(root)
            yield Lab(g1, root, config, web, dns)
        finally:
            subprocess.run(
                [SANDGATE, "sandbox", "remove", "sb1", "--config", str(config)], capture_output=True
            )
            gateway.terminate()
            gateway.wait(20)
            web.stop()
            dns.stop()
            subprocess.run(["nft", "delete", "table", "inet", f"sgt_{nl.tag}"], capture_output=True)


def _wait_for_registry(root: Path) -> None:
    status, registry = root / "state" / "gateway.json", root / "state" / "sandboxes.json"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready = status.exists() and "+" in json.loads(status.read_text()).get("policy_version", "")
        if ready and registry.exists() and len(json.loads(registry.read_text())) == 1:
            return
        time.sleep(0.1)
    raise AssertionError("the sandbox was not registered in time")


def test_the_guest_reaches_the_endpoint_through_the_gateways_dns_answer(lab: Lab) -> None:
    resolved = lab.g1.exec("getent", "ahostsv4", NAME)
    assert resolved.returncode == 0 and resolved.stdout.split()[0] == ADDRESS, resolved.stdout

    proposal = {"host": "api.test", "port": 80, "methods": ["POST"], "paths": ["/v1/**"], "reason": "uploads"}
    status, body = lab.curl(
        "-X", "POST", "-H", "Content-Type: application/json", "-d", json.dumps(proposal), ENDPOINT
    )
    assert status == 202, body
    created = json.loads(body)
    assert created["state"] == "pending" and created["poll"] == f"{ENDPOINT}/{created['id']}"
    status, body = lab.curl(created["poll"])
    assert status == 200 and json.loads(body)["state"] == "pending"

    [listed] = [
        r for r in lab.admin("GET", "/v1/access-requests").json()["requests"] if r["id"] == created["id"]
    ]
    assert (listed["kind"], listed["sandbox"], listed["note"]) == ("proposal", "sb1", "uploads")
    assert (
        lab.admin("POST", f"/v1/access-requests/{created['id']}/approve", json={"by": "alice"}).status_code
        == 200
    )
    status, body = lab.curl(created["poll"])
    assert status == 200 and json.loads(body)["state"] == "approved"

    records = lab.records(lambda rs: any(r.get("approval_id") == created["id"] for r in rs))
    [asked] = [r for r in records if r.get("approval_id") == created["id"]]
    assert (asked["decision"], asked["sandbox"], asked["dest"]["host"]) == ("ask", "sb1", "api.test")
    assert lab.dns.count(NAME) == 0, "the reserved name is never looked up upstream"
    assert lab.web.requests == []


def test_a_transparent_denial_carries_a_proposal_accepted_as_is(lab: Lab) -> None:
    status, body = lab.curl("http://api.test/v1/reports?key=s3cret")
    assert status == 403, body
    denial = json.loads(body)
    assert denial["reason"] == "path_not_allowed" and "s3cret" not in body
    ask = denial["ask"]
    assert ask["endpoint"] == ENDPOINT
    assert ask["proposal"] == {"host": "api.test", "port": 80, "methods": ["GET"], "paths": ["/v1/reports"]}
    status, body = lab.curl(
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "-d",
        json.dumps(ask["proposal"]),
        ask["endpoint"],
    )
    assert status == 202, body
    assert lab.web.requests == []


def test_tls_and_other_ports_on_the_name_are_refused_and_never_dialled(lab: Lab) -> None:
    status, _ = lab.curl(f"https://{NAME}/")
    assert status == 0, "the handshake is closed"
    records = lab.records(lambda rs: any(r["reason"] == "reserved_host" and r["phase"] == "tls" for r in rs))
    assert any(r["reason"] == "reserved_host" and r["decision"] == "deny" for r in records)
    status, body = lab.curl(f"http://{NAME}:8080/")
    assert status in (0, 403), body  # no rule names port 8080: closed at connect, or refused
    # The name's address on port 80 with another Host is no way around the rules.
    status, body = lab.curl("-H", "Host: api.test", f"http://{ADDRESS}/v1/x")
    assert status == 403, body
    assert lab.dns.count(NAME) == 0
    assert lab.web.requests == []
