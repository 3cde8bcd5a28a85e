"""End to end: the lead worker's admin API answers for a gateway of two worker processes.

Workers 0 and 1 of 2 run as the supervisor would start them (same state_dir, SANDGATE_WORKER
set), each on its own explicit port so a test can send a request to one worker.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import OTHER_TOKEN, OTHER_TOKEN_REF, SANDGATE, TOKEN_REF, Gateways, RunningGateway, tenant_yaml
from prometheus_client.parser import text_string_to_metric_families
from support import RecordingUpstream, TestPKI

from sandgate.proxy.audit.collector import AuditCollector
from sandgate.proxy.audit.trail import JsonlFileSink
from sandgate.proxy.state.unix_sockets import ensure_private_folder, internal_socket_folder
from sandgate.proxy.worker_role import ENV as WORKER_ENV

from ..addons.test_credentials import placeholders

pytestmark = pytest.mark.slow


def unix_client(path: Path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://sandgate", timeout=30)


class Pair:
    """Two workers of one gateway and the lead's admin API."""

    def __init__(self, gateways: Gateways, state: Path, upstream: RecordingUpstream) -> None:
        rules = [{"hosts": ["api.test"], "ports": [upstream.port]}]
        tenants = {"t1.yaml": tenant_yaml("t1", rules)}
        self.state = state
        self.collector = start_collector(state)
        # No file watching: what a peer serves changes only when the lead tells it.
        config = {"state_dir": str(state), "reload": {"watch": False}}
        self.workers: list[RunningGateway] = [
            gateways.start(tenants, config=config, env={WORKER_ENV: f"{i}/2"}) for i in range(2)
        ]
        self.lead = unix_client(state / "admin.sock")
        self.peer_socket = state / "workers" / "w1.sock"
        wait_ready(self.lead)

    def close(self) -> None:
        self.lead.close()
        self.collector.close()


def start_collector(state: Path) -> AuditCollector:
    """What the supervisor would run: the audit file's one writer, which the workers forward to
    (a worker stopping without one waits out its audit close timeout)."""
    folder = ensure_private_folder(internal_socket_folder(state))
    sink = JsonlFileSink(state / "audit" / "audit.jsonl", max_bytes=10**9, backups=1)
    collector = AuditCollector(folder / "audit.sock", sink)
    collector.start()
    return collector


def wait_ready(admin: httpx.Client, timeout: float = 30.0) -> None:
    """Until the lead reports both workers ready (the peer's admin socket comes up last)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            workers = admin.get("/v1/status").json().get("workers", [])
            if len(workers) == 2 and all(w["ready"] for w in workers):
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the workers did not become ready"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, pki: TestPKI, http_upstream: RecordingUpstream
) -> Iterator[Pair]:
    folder = tmp_path_factory.mktemp("wa")
    gateways = Gateways(folder, pki)
    p = Pair(gateways, folder / "st", http_upstream)
    yield p
    gateways.close()
    p.close()


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples `name` whose labels include `labels`."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def send(
    gw: RunningGateway,
    upstream: RecordingUpstream,
    count: int,
    *,
    sandbox: str = "sb1",
    token: str | None = None,
) -> list[int]:
    proxy = gw.proxy(sandbox, token) if token else gw.proxy()
    with httpx.Client(proxy=proxy, timeout=10) as c:
        return [c.get(f"{upstream.url_for('api.test')}/w{i}").status_code for i in range(count)]


def test_metrics_on_the_lead_sum_the_decisions_of_both_workers(
    pair: Pair, http_upstream: RecordingUpstream
) -> None:
    allowed = "sandgate_decisions_total"
    before = pair.lead.get("/metrics").text
    w0, w1 = pair.workers
    assert send(w0, http_upstream, 2) == [200, 200]
    assert send(w1, http_upstream, 3) == [200] * 3
    text = pair.lead.get("/metrics").text
    grown = metric(text, allowed, tenant="t1", decision="allow") - metric(
        before, allowed, tenant="t1", decision="allow"
    )
    assert grown == 5
    assert metric(text, "sandgate_workers") == 2
    assert metric(text, "sandgate_workers_ready") == 2
    # The policy version is the gateway's: one sample, value 1, not one per worker summed.
    infos = [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "sandgate_policy_version_info"
    ]
    assert len(infos) == 1 and infos[0].value == 1
    # Each worker's own count is on its private socket (the lead's own socket shows the sum).
    with unix_client(pair.peer_socket) as peer:
        own = peer.get("/metrics").text
    assert metric(own, allowed, tenant="t1", decision="allow") < metric(
        text, allowed, tenant="t1", decision="allow"
    )


def test_readiness_on_the_lead_is_every_worker_s(pair: Pair) -> None:
    ready = pair.lead.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"]["workers_ready"] is True
    assert ready.json()["workers"] == {"count": 2, "ready": [0, 1]}


def test_status_on_the_lead_lists_every_worker(pair: Pair) -> None:
    status = pair.lead.get("/v1/status").json()
    workers = status["workers"]
    assert [w["index"] for w in workers] == [0, 1]
    assert [w["pid"] for w in workers] == [gw.proc.pid for gw in pair.workers]
    assert all(w["ready"] and w["answered"] for w in workers)
    assert {w["policy_version"] for w in workers} == {status["policy_version"]}


def test_a_sandbox_registered_through_the_lead_is_usable_on_the_peer_at_once(
    pair: Pair, http_upstream: RecordingUpstream
) -> None:
    peer = pair.workers[1]
    assert send(peer, http_upstream, 1, sandbox="reg1", token=OTHER_TOKEN) == [407]
    resp = pair.lead.post("/v1/sandboxes", json={"id": "reg1", "tenant": "t1", "token": OTHER_TOKEN_REF})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert [(w["index"], w["ok"]) for w in body["workers"]] == [(0, True), (1, True)]
    assert {w["policy_version"] for w in body["workers"]} == {body["policy_version"]}
    # Straight to the peer's port, right after the answer: no wait for a file watcher.
    assert send(peer, http_upstream, 1, sandbox="reg1", token=OTHER_TOKEN) == [200]
    removed = pair.lead.delete("/v1/sandboxes/reg1")
    assert removed.status_code == 200, removed.text
    assert send(peer, http_upstream, 1, sandbox="reg1", token=OTHER_TOKEN) == [407]


def test_a_policy_reload_through_the_lead_reloads_every_worker(pair: Pair) -> None:
    resp = pair.lead.post("/v1/policy/reload")
    assert resp.status_code == 200, resp.text
    assert [(w["index"], w["ok"]) for w in resp.json()["workers"]] == [(0, True), (1, True)]
    with unix_client(pair.peer_socket) as peer:
        last = peer.get("/v1/status").json()["last_reload"]
    assert (last["ok"], last["trigger"]) == (True, "admin")
    # Both reloaded; the gateway's trail records the reload once (the lead's record).
    deadline = time.monotonic() + 5
    while not admin_reloads(pair.state) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    (record,) = admin_reloads(pair.state)
    # Written once both had it: each worker's answer is in it.
    workers = record["workers"]
    assert isinstance(workers, list)
    assert [(w["index"], w["ok"]) for w in workers] == [(0, True), (1, True)]


def admin_reloads(state: Path) -> list[dict[str, object]]:
    path = state / "audit" / "audit.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    records = [json.loads(line) for line in lines]
    return [r for r in records if r.get("event") == "policy_reload" and r.get("trigger") == "admin"]


def test_the_peers_private_socket_changes_nothing(pair: Pair) -> None:
    with unix_client(pair.peer_socket) as peer:
        refused = peer.post("/v1/policy/reload")
        assert refused.status_code == 403
        assert "private socket" in refused.json()["error"]
        assert peer.post("/v1/sandboxes", json={"id": "x", "tenant": "t1"}).status_code == 403
    assert pair.peer_socket.stat().st_mode & 0o777 == 0o600
    # The lead's public API has no internal routes.
    assert pair.lead.post("/internal/v1/reload", json={"what": "policy", "trigger": "x"}).status_code == 404


def test_a_peer_that_does_not_answer_is_named_and_never_counted_as_done(
    tmp_path: Path, pki: TestPKI, http_upstream: RecordingUpstream
) -> None:
    gateways = Gateways(tmp_path, pki)
    p = Pair(gateways, tmp_path / "st", http_upstream)
    try:
        peer = p.workers[1]
        os.kill(peer.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            # Not ready as a gateway: the sandboxes steered to worker 1 would not be served.
            ready = p.lead.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["checks"]["workers_ready"] is False
            assert ready.json()["workers"] == {"count": 2, "ready": [0]}
            text = p.lead.get("/metrics").text
            assert time.monotonic() - started < 5
            assert metric(text, "sandgate_workers") == 2
            assert metric(text, "sandgate_workers_ready") == 1
            workers = p.lead.get("/v1/status").json()["workers"]
            assert workers[1]["answered"] is False and "did not answer" in workers[1]["error"]
        finally:
            os.kill(peer.proc.pid, signal.SIGCONT)
        peer.stop()
        resp = p.lead.post("/v1/policy/reload")
        assert resp.status_code == 503
        body = resp.json()
        assert "worker 1 is not running" in body["error"]
        assert [(w["index"], w["ok"]) for w in body["workers"]] == [(0, True), (1, False)]
        added = p.lead.post("/v1/sandboxes", json={"id": "reg2", "tenant": "t1", "token": OTHER_TOKEN_REF})
        assert added.status_code == 503 and "worker 1" in added.json()["error"]
        cred = p.lead.put("/v1/credentials/t1/key", json={"value": "v-0123456789"})
        assert cred.status_code == 503 and "worker 1" in cred.json()["error"]
        assert "v-0123456789" not in cred.text
    finally:
        p.close()
        gateways.close()


STORED = "sk-live-STORED-0123456789abcdef"
ROTATED = "sk-live-ROTATED-9876543210fedcba"


def stored_tenant(port: int) -> str:
    return yaml.safe_dump(
        {
            "tenant": "acme",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "allow": [{"hosts": ["api.test"], "ports": [port], "inspect": True}],
            "credentials": [
                {
                    "name": "openai",
                    "secret": "stored:openai",
                    "hosts": ["api.test"],
                    "ports": [port],
                    "env": "OPENAI_API_KEY",
                    "inject": {"header": "Authorization", "format": "Bearer {secret}"},
                }
            ],
        },
        sort_keys=False,
    )


def injected(gw: RunningGateway, state: Path, upstream: RecordingUpstream, placeholder: str) -> str | None:
    """The Authorization the upstream got for one request through `gw` with the placeholder."""
    upstream.reset()
    ca = ssl.create_default_context(cafile=str(state / "ca" / "mitmproxy-ca-cert.pem"))
    with httpx.Client(proxy=gw.proxy(), verify=ca, timeout=10) as c:
        resp = c.get(f"{upstream.url_for('api.test')}/v1", headers={"Authorization": f"Bearer {placeholder}"})
    assert resp.status_code == 200, resp.text
    assert STORED not in resp.text and ROTATED not in resp.text
    return upstream.requests[0].header("Authorization") if upstream.requests else None


def test_a_credential_rotated_through_the_lead_is_used_by_the_peer_at_once(
    tmp_path: Path, pki: TestPKI, https_upstream: RecordingUpstream
) -> None:
    gateways = Gateways(tmp_path, pki)
    state = tmp_path / "st"
    # The peer learns of the change only from the lead: no file watching, a cache kept 300 s.
    config = {"state_dir": str(state), "reload": {"watch": False, "interval_seconds": 600}}

    def set_value(root: Path) -> None:
        done = subprocess.run(
            [
                SANDGATE,
                "credentials",
                "set",
                "--tenant",
                "acme",
                "openai",
                "--config",
                str(root / "sandgate.yaml"),
            ],
            input=STORED + "\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr

    tenants = {"acme.yaml": stored_tenant(https_upstream.port)}
    collector = start_collector(state)
    try:
        w0 = gateways.start(tenants, config=config, env={WORKER_ENV: "0/2"}, prepare=set_value)
        w1 = gateways.start(tenants, config=config, env={WORKER_ENV: "1/2"})
        with unix_client(state / "admin.sock") as lead:
            wait_ready(lead)
            ph = placeholders(w0, "sb1")["OPENAI_API_KEY"]
            assert injected(w1, state, https_upstream, ph) == f"Bearer {STORED}"  # now cached on the peer
            resp = lead.put("/v1/credentials/acme/openai", json={"value": ROTATED})
            assert resp.status_code == 200, resp.text
            assert ROTATED not in resp.text
        assert injected(w1, state, https_upstream, ph) == f"Bearer {ROTATED}"
        assert injected(w0, state, https_upstream, ph) == f"Bearer {ROTATED}"
    finally:
        gateways.close()
        collector.close()
