"""End to end: the address guard is the operator's, never the tenant's (issue 10, items 1-3).

A real gateway, real curl and httpx clients, recording upstreams on loopback; the gateway's
own-address tests put addresses on a veth inside a namespace this test creates.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import ATTACKER_IP, UPSTREAM_IP, GatewayFactory, RunningGateway, curl, tenant_yaml
from support import RecordingUpstream
from support.netns import Namespace, in_namespace, ip, netns_lab

# Literal destinations a tenant with `cidrs: [0.0.0.0/0, ::/0]` tries; none may be dialled.
NEVER = [
    "127.0.0.1",
    UPSTREAM_IP,
    "169.254.169.254",
    "0.0.0.0",
    "[::1]",
    "[::]",
    "[::ffff:127.0.0.1]",
    f"[::ffff:{UPSTREAM_IP}]",
    "[::ffff:169.254.169.254]",
    "[64:ff9b::7f00:2]",
    "[2002:7f00:2::]",
    "2130706434",
    "0x7f.2",
    "10.0.0.1",
    "100.64.0.1",
    "[fd00::1]",
]


@pytest.fixture(scope="module")
def shared_broad(start_module_gateway: GatewayFactory, http_upstream: RecordingUpstream) -> RunningGateway:
    rules = [{"id": "internet", "cidrs": ["0.0.0.0/0", "::/0"], "ports": [80, http_upstream.port]}]
    return start_module_gateway({"t1.yaml": tenant_yaml("t1", rules)})


@pytest.fixture
def broad(shared_broad: RunningGateway) -> RunningGateway:
    """The module's gateway whose tenant allows every address; `records()` shows this test's."""
    shared_broad.mark()
    return shared_broad


def test_a_broad_cidr_through_the_explicit_proxy_never_opens_an_internal_address(
    broad: RunningGateway, http_upstream: RecordingUpstream, attacker_upstream: RecordingUpstream
) -> None:
    """One gateway for the whole list (a gateway per address would take minutes)."""
    outcomes = {}
    for host in NEVER:
        result = curl("-x", broad.proxy(), "-i", f"http://{host}:{http_upstream.port}/latest/")
        head, _, body = result.stdout.partition("\n\n")
        reason = next(
            (
                h.split(":", 1)[1].strip()
                for h in head.splitlines()
                if h.lower().startswith("x-sandgate-reason:")
            ),
            None,
        )
        record = broad.record(json.loads(body)["decision_id"]) if body.startswith("{") else {}
        outcomes[host] = (head.split(" ", 2)[1] if head else result.stderr, reason, record.get("reason"))
    assert outcomes == {host: ("403", "private_address", "private_address") for host in NEVER}
    assert http_upstream.connections == [] and attacker_upstream.connections == []


def test_the_metadata_path_of_the_issue_is_refused(broad: RunningGateway) -> None:
    result = curl(
        "-x", broad.proxy(), "-o", "/dev/null", "-w", "%{http_code}", "http://169.254.169.254/latest/"
    )
    assert result.stdout == "403"
    assert broad.records(1)[-1]["reason"] == "private_address"


def test_report_mode_does_not_relax_the_guard_for_a_broad_cidr(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    rules = [{"cidrs": ["0.0.0.0/0"], "ports": [http_upstream.port]}]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules, mode="report")})
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        resp = c.get(f"http://{UPSTREAM_IP}:{http_upstream.port}/x")
    assert (resp.status_code, resp.headers["X-Sandgate-Reason"]) == (403, "private_address")
    assert http_upstream.connections == []


def test_an_operator_range_opens_to_a_tenant_cidr_naming_it_but_never_the_gateway_itself(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, attacker_upstream: RecordingUpstream
) -> None:
    rules = [{"id": "loop", "cidrs": ["127.0.0.0/8"], "ports": [http_upstream.port]}]
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", rules)},
        config={"address_guard": {"tenant_reachable": [f"{UPSTREAM_IP}/32", "127.0.0.1/32"]}},
    )
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        opened = c.get(f"http://{UPSTREAM_IP}:{http_upstream.port}/opened")
        not_listed = c.get(f"http://{ATTACKER_IP}:{http_upstream.port}/not-listed")
        own = c.get(f"http://127.0.0.1:{gw.port}/own")
    assert opened.status_code == 200
    assert [r.target for r in http_upstream.requests] == ["/opened"]
    assert (not_listed.status_code, not_listed.headers["X-Sandgate-Reason"]) == (403, "private_address")
    assert (own.status_code, own.headers["X-Sandgate-Reason"]) == (403, "private_address")
    assert attacker_upstream.connections == []


def test_hosts_star_reaches_no_internal_name(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    """`*` is any name at a public address: the operator's by-name range (127/8 in these tests)
    stays closed to it, while a rule naming the host still reaches it. (An IP literal is no name:
    the guard refuses this one first; a public literal gets host_not_allowed, see test_decide.)"""
    rules = [
        {"id": "everything", "hosts": ["*"], "ports": [http_upstream.port]},
        {"id": "named", "hosts": ["open.test"], "ports": [http_upstream.port]},
    ]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)})
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        star = c.get(f"{http_upstream.url_for('api.test')}/star")
        self_name = c.get(f"http://self.test:{http_upstream.port}/self")
        meta = c.get(f"http://meta.test:{http_upstream.port}/meta")
        literal = c.get(f"http://{UPSTREAM_IP}:{http_upstream.port}/literal")
        named = c.get(f"{http_upstream.url_for('open.test')}/named")
    assert [
        (r.status_code, r.headers.get("X-Sandgate-Reason")) for r in (star, self_name, meta, literal)
    ] == [
        (403, "private_address"),
        (403, "private_address"),
        (403, "private_address"),
        (403, "private_address"),
    ]
    assert named.status_code == 200
    assert [r.target for r in http_upstream.requests] == ["/named"]


# --- the gateway's own addresses: every address of every interface, kept current (item 3) --


@pytest.fixture
def own_lab() -> Iterator[tuple[str, str, Namespace]]:
    """A namespace on a veth whose host side holds two addresses of a test range (198.18.N.0/24,
    reserved for benchmarks: nothing else on this machine uses it) and the upstream inside at .9."""
    with netns_lab() as nl:
        ns = nl.add("own")
        prefix = f"198.18.{secrets.randbelow(256)}"
        ip("addr", "add", f"{prefix}.1/24", "dev", ns.host_if)
        ip("addr", "add", f"{prefix}.2/24", "dev", ns.host_if)
        ip("-n", ns.name, "addr", "add", f"{prefix}.9/24", "dev", ns.ns_if)
        yield prefix, ns.host_if, ns


def test_the_gateway_own_secondary_and_new_addresses_are_refused(
    start_gateway: GatewayFactory, own_lab: tuple[str, str, Namespace]
) -> None:
    prefix, host_if, ns = own_lab
    inside = in_namespace(ns.name, lambda: RecordingUpstream(f"{prefix}.9", 8080, name="inside").start())
    on_host = RecordingUpstream(f"{prefix}.2", 8080, name="on-host").start()
    later = None
    try:
        rules = [{"id": "bench", "cidrs": [f"{prefix}.0/24"], "ports": [8080]}]
        gw = start_gateway(
            {"t1.yaml": tenant_yaml("t1", rules)},
            config={"address_guard": {"tenant_reachable": [f"{prefix}.0/24"], "refresh_seconds": 30}},
        )
        with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
            reachable = c.get(f"http://{prefix}.9:8080/inside")
            secondary = c.get(f"http://{prefix}.2:8080/secondary")
            primary = c.get(f"http://{prefix}.1:8080/primary")
        assert reachable.status_code == 200, "an opened address of the range is reachable"
        assert (secondary.status_code, secondary.headers["X-Sandgate-Reason"]) == (403, "private_address")
        assert (primary.status_code, primary.headers["X-Sandgate-Reason"]) == (403, "private_address")
        detail = gw.record(secondary.json()["decision_id"])
        assert on_host.connections == [], "the gateway never dialled its own secondary address"

        # An address added while the gateway runs is its own from the next netlink event.
        ip("addr", "add", f"{prefix}.3/24", "dev", host_if)
        later = RecordingUpstream(f"{prefix}.3", 8080, name="later").start()
        deadline = time.monotonic() + 10
        status = 0
        while time.monotonic() < deadline:
            with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
                status = c.get(f"http://{prefix}.3:8080/added").status_code
            if status == 403:
                break
            time.sleep(0.2)
        assert status == 403, "a new interface address is refused after the refresh"
        assert "own_addresses.changed" in gw.log()
        assert detail["reason"] == "private_address"
    finally:
        inside.stop()
        on_host.stop()
        if later is not None:
            later.stop()
        subprocess.run(["ip", "addr", "del", f"{prefix}.3/24", "dev", host_if], capture_output=True)
