"""The gates holding `ask` decisions in process (taddons, tflow): released once, refused without a
store (transparent mode, no approvals), capped per sandbox, never left open by a fault."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import TOKEN, TOKEN_REF
from mitmproxy import http
from mitmproxy.proxy.layers.http._hooks import HttpRequestHeadersHook
from mitmproxy.test import tflow
from support.inprocess import InProcess, in_process, proxy_flow

from sandgate.proxy.addons.dial_guard import DialGuard
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.identify import Identify
from sandgate.proxy.addons.pipeline import Shared
from sandgate.proxy.addons.request_gate import RequestGate
from sandgate.proxy.addons.tunnel_gate import TunnelGate
from sandgate.proxy.approvals import Approvals, State
from sandgate.proxy.audit.intents import CUT_BY_EXIT, IntentJournal, read_leftovers
from sandgate.proxy.metrics import METRICS

HOSTS = {"api.test": ["127.0.0.2"]}
PORT = 8080
TENANT = yaml.safe_dump(
    {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        "ask": [{"id": "api", "hosts": ["api.test"], "ports": [PORT]}],
    }
)


@pytest.fixture
def approvals() -> Approvals:
    return Approvals(timeout=30, max_held=1)


@pytest.fixture
def gw(tmp_path: Path, approvals: Approvals) -> Iterator[InProcess]:
    with in_process(
        tmp_path,
        {"t1.yaml": TENANT},
        HOSTS,
        {Identify, TunnelGate, RequestGate, DialGuard},
        shared=Shared(approvals=approvals),
    ) as running:
        yield running


async def start(gw: InProcess, path: str) -> tuple[http.HTTPFlow, asyncio.Task[None]]:
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(client, f"http://api.test:{PORT}{path}", sandbox="sb1", token=TOKEN)
    return flow, asyncio.create_task(gw.hook(HttpRequestHeadersHook(flow)))


async def until_held(approvals: Approvals, count: int) -> None:
    for _ in range(200):
        if approvals.held() >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} requests were not held")


async def test_an_approved_request_goes_on_as_an_allowed_one(gw: InProcess, approvals: Approvals) -> None:
    flow, hook = await start(gw, "/v1")
    await until_held(approvals, 1)
    assert not hook.done() and flow.response is None
    [held] = approvals.listing()
    approvals.settle(held.id, approve=True, by="alice", reason=None)
    await asyncio.wait_for(hook, 5)
    assert flow.response is None
    assert flow.request.host == "127.0.0.2", "dialled at the checked address"
    pending = Exchange.of(flow).pending
    assert pending is not None
    decision = pending[1]
    assert (decision.allowed, decision.approval) == (True, (held.id, "alice"))
    [record] = gw.records()
    assert (record["decision"], record["approval_id"]) == ("ask", held.id)


async def test_past_the_cap_the_next_request_is_refused_at_once(gw: InProcess, approvals: Approvals) -> None:
    first, hook = await start(gw, "/one")
    await until_held(approvals, 1)
    second, other = await start(gw, "/two")
    await asyncio.wait_for(other, 5)
    assert (
        second.response is not None and second.response.headers["X-Sandgate-Reason"] == "approval_queue_full"
    )
    [held] = approvals.listing()
    approvals.settle(held.id, approve=False, by=None, reason=None)
    await asyncio.wait_for(hook, 5)
    assert first.response is not None and first.response.headers["X-Sandgate-Reason"] == "approval_denied"


async def test_a_cancelled_hold_is_never_left_open(gw: InProcess, approvals: Approvals) -> None:
    flow, hook = await start(gw, "/v1")
    await until_held(approvals, 1)
    [held] = approvals.listing()
    hook.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hook
    assert held.state is State.EXPIRED and approvals.listing() == []
    assert Exchange.of(flow).pending is None


async def test_without_a_store_an_ask_is_refused_approval_required(tmp_path: Path) -> None:
    with in_process(
        tmp_path, {"t1.yaml": TENANT}, HOSTS, {Identify, TunnelGate, RequestGate, DialGuard}
    ) as gw:
        flow, hook = await start(gw, "/v1")
        await asyncio.wait_for(hook, 5)
        assert flow.response is not None and flow.response.status_code == 403
        assert flow.response.headers["X-Sandgate-Reason"] == "approval_required"
        [record] = gw.records()
        assert (record["decision"], record["reason"]) == ("deny", "approval_required")


def _decisions(reason: str) -> float:
    sample = METRICS.registry.get_sample_value(
        "sandgate_decisions_total",
        {"tenant": "t1", "reason": reason, "phase": "request", "decision": "deny"},
    )
    return sample or 0.0


async def test_a_hold_journals_its_end_until_that_record_is_written_and_counts_nothing_more(
    gw: InProcess, approvals: Approvals, tmp_path: Path
) -> None:
    journal = IntentJournal(tmp_path / "journal", pid=4343)
    gw.ctx.audit._journal = journal
    errors_before, denied_before = _decisions("internal_error"), _decisions("approval_denied")
    _, hook = await start(gw, "/v1")
    await until_held(approvals, 1)
    # While held, the journal holds the end a death would leave: refused, cut by the exit.
    [left] = read_leftovers(journal.path.parent, lambda pid: False)
    [cut] = left.records
    assert (cut["decision"], cut["reason"], cut["error"]) == ("deny", "internal_error", CUT_BY_EXIT)
    [held] = approvals.listing()
    assert cut["approval"]["id"] == held.id
    approvals.settle(held.id, approve=False, by=None, reason=None)
    await asyncio.wait_for(hook, 5)
    # The denial is queued: the intent stays open until that record is written, then closes.
    records = gw.records()
    assert [(r["decision"], r["reason"]) for r in records] == [
        ("ask", "approval_required"),
        ("deny", "approval_denied"),
    ]
    assert journal.open_intents == 0
    # The label names are right (the denial is counted), and the journaled end is not counted.
    assert _decisions("approval_denied") == denied_before + 1
    assert _decisions("internal_error") == errors_before
