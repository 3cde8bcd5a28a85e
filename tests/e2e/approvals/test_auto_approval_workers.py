"""`approvals.auto: within_ceiling` with two workers: what the ceiling proves harmless is approved
whichever worker holds it. A real gateway under its supervisor (`workers: {count: 2}`), a real
upstream on loopback, real httpx guests, each request on a connection of its own so that the
kernel (SO_REUSEPORT) spreads them over both workers; each worker's own counters (its private
admin socket) say which worker approved how many."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import TOKEN, GatewayFactory, RunningGateway
from prometheus_client.parser import text_string_to_metric_families
from support import RecordingUpstream

from sandgate.proxy.admin.peers import peer_socket
from sandgate.proxy.worker_role import WorkerRole

from .test_auto_approval import ENDPOINT, ceiling, tenant

pytestmark = pytest.mark.slow

AUTO = "auto:within_ceiling"
BATCH = 8
# Batches until both workers approved some: all 8 connections of a batch land on one worker
# with probability 1/128, five batches in a row on the same one almost never.
MAX_BATCHES = 5


@pytest.fixture(scope="module")
def shared(
    start_module_gateway: GatewayFactory, http_upstream: RecordingUpstream, tmp_path_factory: Any
) -> RunningGateway:
    path: Path = tmp_path_factory.mktemp("ceiling") / "ceiling.yaml"
    path.write_text(ceiling(http_upstream.port))
    approvals = {
        "auto": "within_ceiling",
        "ceiling": str(path),
        # A request left waiting (the bug) ends in seconds, not the default minute.
        "ask_timeout_seconds": 5,
        "max_held_per_sandbox": 64,
        "proposals_per_minute": 1000,
    }
    return start_module_gateway(
        {"t1.yaml": tenant(http_upstream.port)}, config={"approvals": approvals, "workers": {"count": 2}}
    )


@pytest.fixture
def gw(shared: RunningGateway, http_upstream: RecordingUpstream) -> RunningGateway:
    shared.mark()
    http_upstream.reset()
    return shared


def unix_client(path: Path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://sandgate", timeout=30)


def lead(gw: RunningGateway) -> httpx.Client:
    """The gateway's admin API (worker 0's public socket)."""
    return unix_client(gw.root / "state" / "admin.sock")


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples `name` whose labels include `labels`."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def per_worker(gw: RunningGateway, name: str, **labels: str) -> tuple[float, float]:
    """(worker 0's, worker 1's) count: the lead's /metrics is the gateway's sum, worker 1's own
    is on its private socket."""
    with lead(gw) as c:
        total = metric(c.get("/metrics").text, name, **labels)
    with unix_client(peer_socket(gw.root / "state", WorkerRole(1, 2))) as c:
        own = metric(c.get("/metrics").text, name, **labels)
    return total - own, own


def grown(before: tuple[float, float], after: tuple[float, float]) -> tuple[int, int]:
    return int(after[0] - before[0]), int(after[1] - before[1])


def on_a_new_connection(gw: RunningGateway, method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One request on a connection of its own: the kernel picks a worker for each."""
    with httpx.Client(proxy=gw.proxy("sb1", TOKEN), timeout=20) as client:
        return client.request(method, url, **kwargs)


def until_both_workers(
    gw: RunningGateway, send: Callable[[int], httpx.Response], settle: Callable[[list[httpx.Response]], None]
) -> tuple[list[httpx.Response], tuple[int, int]]:
    """Batches of `send(i)` at once (each batch `settle`d before counting), until each worker
    auto-approved at least one; every answer, and how many each worker approved."""
    before = per_worker(gw, "sandgate_approval_auto_total", result="approved")
    answers: list[httpx.Response] = []
    counts = (0, 0)
    with ThreadPoolExecutor(BATCH) as pool:
        for _ in range(MAX_BATCHES):
            batch = list(pool.map(send, range(len(answers), len(answers) + BATCH)))
            settle(batch)
            answers.extend(batch)
            counts = grown(before, per_worker(gw, "sandgate_approval_auto_total", result="approved"))
            if min(counts) > 0:
                break
    return answers, counts


def decided(gw: RunningGateway, ids: list[str], timeout: float = 10.0) -> dict[str, str]:
    """Each access request's state, once none is pending any more (or at `timeout`)."""
    deadline = time.monotonic() + timeout
    with lead(gw) as admin:
        while True:
            states = {i: str(admin.get(f"/v1/access-requests/{i}").json().get("state")) for i in ids}
            if "pending" not in states.values() or time.monotonic() > deadline:
                return states
            time.sleep(0.05)


def test_held_requests_on_every_worker_are_released_without_a_person(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    base = f"http://api.test:{http_upstream.port}/auto"
    outcomes = per_worker(gw, "sandgate_approval_outcomes_total", outcome="approved")
    # The answers come once released: nothing to wait for before counting.
    answers, counts = until_both_workers(
        gw, lambda i: on_a_new_connection(gw, "GET", f"{base}/r{i}"), lambda batch: None
    )
    sent = len(answers)
    assert [a.status_code for a in answers] == [200] * sent, [a.text for a in answers if a.status_code != 200]
    assert sorted(r.target for r in http_upstream.requests) == sorted(f"/auto/r{i}" for i in range(sent))
    # Both workers held some, and each approved its own: the counts add up to what was sent.
    assert min(counts) > 0 and sum(counts) == sent, counts
    assert (
        sum(grown(outcomes, per_worker(gw, "sandgate_approval_outcomes_total", outcome="approved"))) == sent
    )
    # One record per step, tied by the approval id: the ask, and the release approved `by` auto.
    records = gw.records_until(lambda rs: sum(1 for r in rs if r.get("approval")) >= sent)
    asks = Counter(r["approval_id"] for r in records if r["decision"] == "ask")
    ends = Counter(r["approval"]["id"] for r in records if r.get("approval"))
    assert len(asks) == sent and set(asks.values()) == {1} and ends == asks
    for r in records:
        if r.get("approval"):
            assert (r["decision"], r["status"], r["approval"]["by"]) == ("allow", 200, AUTO)
    assert "approval.auto_not_applied" not in gw.log()


def test_proposals_on_every_worker_become_grants_without_a_person(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    port = http_upstream.port

    def propose(i: int) -> httpx.Response:
        body = {"host": "api.test", "port": port, "methods": ["GET"], "paths": [f"/auto/p{i}/**"]}
        return on_a_new_connection(gw, "POST", ENDPOINT, json=body)

    def settle(batch: list[httpx.Response]) -> None:
        # A proposal is answered `pending` at once; the approval follows.
        decided(gw, [a.json()["id"] for a in batch if a.status_code == 202])

    answers, counts = until_both_workers(gw, propose, settle)
    assert [a.status_code for a in answers] == [202] * len(answers), [a.text for a in answers]
    ids = [a.json()["id"] for a in answers]
    states = decided(gw, ids, timeout=0)
    assert set(states.values()) == {"approved"}, states
    assert min(counts) > 0 and sum(counts) == len(ids), counts
    with lead(gw) as admin:
        grants = {g["id"]: g for g in admin.get("/v1/grants").json()["grants"]}
    for i in ids:
        assert (grants[i]["sandbox"], grants[i]["by"]) == ("sb1", AUTO)
    # Each grant is in force on every worker: requests on new connections go upstream.
    reads = [on_a_new_connection(gw, "GET", f"http://api.test:{port}/auto/p{n}/x") for n in range(len(ids))]
    assert [r.status_code for r in reads] == [200] * len(ids)
    # One record per step, tied by the approval id: the ask, the grant made, the proposal's end.
    made = gw.records_until(lambda rs: len(rs) >= len(ids), event="grant")
    assert Counter(r["approval_id"] for r in made if r["action"] == "made") == Counter(ids)
    assert {r["by"] for r in made} == {AUTO}
    records = gw.records_until(
        lambda rs: sum(1 for r in rs if r.get("approval") and r.get("proposal")) >= len(ids)
    )
    asks = Counter(r["approval_id"] for r in records if r["decision"] == "ask")
    ends = [r for r in records if r.get("approval") and r.get("proposal")]
    assert asks == Counter(ids)
    assert Counter(r["approval"]["id"] for r in ends) == Counter(ids)
    assert {(r["decision"], r["approval"]["by"]) for r in ends} == {("allow", AUTO)}


def test_a_worker_s_private_socket_still_approves_nothing(gw: RunningGateway) -> None:
    """The fix is not a door: worker 1's socket refuses the operator's approve route as before."""
    with unix_client(peer_socket(gw.root / "state", WorkerRole(1, 2))) as peer:
        refused = peer.post("/v1/access-requests/0123456789abcdef/approve", json={"by": AUTO})
    assert refused.status_code == 403 and "private socket" in refused.json()["error"]
