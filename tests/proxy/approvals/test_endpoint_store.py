"""The pending store's proposals: open with nobody held, capped with held requests, expired at
their deadline, decided once, their guest note cleaned."""

from __future__ import annotations

import asyncio
import time

import pytest

from sandgate.proxy.approvals import AccessRequest, Approvals, QueueFull, SettleError, State
from sandgate.proxy.approvals.store import NOTE_MAX, clean_note


class Recording(Approvals):
    """A store that keeps what `_opened` was told (the hook announcers attach to)."""

    def __init__(self, **kwargs: float) -> None:
        super().__init__(timeout=kwargs.get("timeout", 30), max_held=int(kwargs.get("max_held", 2)))
        self.opened: list[AccessRequest] = []

    def _opened(self, request: AccessRequest) -> None:
        self.opened.append(request)


def propose(store: Approvals, sandbox: str = "sb1", note: str | None = "need docs") -> AccessRequest:
    return store.propose(
        tenant="t1",
        sandbox=sandbox,
        host="docs.test",
        port=443,
        methods=("GET",),
        paths=("/v1/*", "/q?token=abc"),
        note=note,
    )


def test_a_proposal_is_open_pending_and_shown_with_its_fields() -> None:
    store = Recording()
    request = propose(store)
    assert request.state is State.PENDING and request.kind == "proposal"
    assert store.held() == 0, "nobody is held on a proposal"
    assert store.open_for("sb1") == 1
    assert [r.id for r in store.listing()] == [request.id]
    assert store.opened == [request]
    view = request.view()
    assert view["kind"] == "proposal"
    assert view["methods"] == ["GET"]
    assert view["paths"][0] == "/v1/*"
    assert "abc" not in view["paths"][1], "a query value is redacted like a held request's"
    assert view["note"] == "need docs"
    assert view["state"] == "pending"


@pytest.mark.asyncio
async def test_held_requests_call_the_hook_and_carry_the_default_kind() -> None:
    store = Recording()
    held = store.hold(
        tenant="t1",
        sandbox="sb1",
        phase="connect",
        host="a.test",
        port=443,
        method=None,
        path=None,
        rule_id=None,
    )
    assert store.opened == [held]
    view = held.view()
    assert (
        view["kind"] == "held" and view["methods"] is None and view["paths"] is None and view["note"] is None
    )
    store.drop(held)


def test_proposals_count_against_the_cap_with_held_requests() -> None:
    store = Recording(max_held=2)
    propose(store)
    store.hold(
        tenant="t1",
        sandbox="sb1",
        phase="connect",
        host="a.test",
        port=443,
        method=None,
        path=None,
        rule_id=None,
    )
    with pytest.raises(QueueFull):
        propose(store)
    propose(store, sandbox="sb2")  # another sandbox has its own cap


def test_a_proposal_expires_at_its_deadline() -> None:
    store = Recording(timeout=0.05)
    request = propose(store)
    time.sleep(0.1)
    assert store.listing() == []
    assert store.get(request.id) is request and request.state is State.EXPIRED
    with pytest.raises(SettleError) as e:
        store.settle(request.id, approve=True, by="op", reason=None)
    assert e.value.status == 409


def test_every_end_is_told_once_and_a_late_expiry_waited_its_timeout() -> None:
    store = Recording(timeout=0.05)
    ended: list[tuple[str, State]] = []
    store.on_closed.append(lambda r: ended.append((r.id, r.state)))

    def broken(request: AccessRequest) -> None:
        raise RuntimeError("a listener that raises stops no other")

    store.on_closed.insert(0, broken)
    late, decided = propose(store), propose(store, "sb2")
    store.settle(decided.id, approve=False, by="op", reason=None)
    time.sleep(0.2)  # noticed well after its deadline
    store.expire()
    store.expire()
    assert ended == [(decided.id, State.DENIED), (late.id, State.EXPIRED)]
    assert late.waited == pytest.approx(0.05, abs=0.005), "its deadline, not when the sweep came"


@pytest.mark.asyncio
async def test_a_proposal_is_decided_once() -> None:
    store = Recording()
    request = propose(store)
    decided = store.settle(request.id, approve=True, by="op", reason="fine")
    assert decided.state is State.APPROVED and decided.by == "op"
    await asyncio.wait_for(request.done.wait(), 1)
    with pytest.raises(SettleError) as e:
        store.settle(request.id, approve=False, by="op", reason=None)
    assert e.value.status == 409
    assert store.open_for("sb1") == 0


def test_the_note_is_cleaned_and_capped() -> None:
    assert clean_note(None) is None
    assert clean_note("  \x00\x1b[31m ") == "[31m"
    assert clean_note("a\r\nb\tc\u202ed") == "a b cd"
    assert clean_note("\x07\x08") is None
    assert len(clean_note("x" * (NOTE_MAX * 3)) or "") == NOTE_MAX
