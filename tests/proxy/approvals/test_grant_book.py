"""GrantBook over a real state-file store: a store that stays unreadable drops the snapshot
(a grant revoked meanwhile must not go on allowing), and a read that works brings it back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from sandgate.policy.model.grants import Grant, Grants
from sandgate.proxy.approvals import grants as grants_module
from sandgate.proxy.approvals.grants import STALE_SECONDS, GrantBook, GrantStoreError, StateFileGrants


async def test_an_unreadable_store_drops_the_snapshot_after_a_while_and_a_good_read_restores_it(
    tmp_path: Path,
) -> None:
    store = StateFileGrants(tmp_path / "grants.json")
    published: list[Grants] = []
    records: list[dict[str, Any]] = []

    async def emit(record: dict[str, Any]) -> bool:
        records.append(record)
        return True

    book = GrantBook(store, published.append, emit, sweep=False)
    await book.add(Grant(id="a" * 28, tenant="t1", sandbox="sb1", host="api.test", port=443, at=time.time()))
    assert len(book.grants) == 1 and len(published[-1]) == 1

    good = store.path.read_text()
    store.path.write_text("{not json")
    with pytest.raises(GrantStoreError):
        await book.refresh(force=True)
    now = time.monotonic()
    assert not book.unreadable(now), "a blip keeps the snapshot"
    assert len(book.grants) == 1
    assert book.unreadable(now + STALE_SECONDS)
    assert len(book.grants) == 0 and len(published[-1]) == 0, "stale: nothing allowed by a grant"

    store.path.write_text(good)
    assert await book.refresh()
    assert len(book.grants) == 1 and len(published[-1]) == 1


async def test_a_store_failing_in_any_way_ages_the_snapshot_in_the_refresh_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only GrantStoreError: a read that raises anything else must not keep a snapshot
    (and the grants revoked meanwhile) in force for as long as the store stays broken."""
    store = StateFileGrants(tmp_path / "grants.json")

    async def emit(record: dict[str, Any]) -> bool:
        return True

    book = GrantBook(store, lambda grants: None, emit, sweep=False, refresh_seconds=0.02)
    await book.add(Grant(id="b" * 28, tenant="t1", sandbox="sb1", host="api.test", port=443, at=time.time()))

    async def broken() -> object:
        raise RuntimeError("a store bug, not a GrantStoreError")

    monkeypatch.setattr(grants_module, "STALE_SECONDS", 0.2)
    await book.start()
    monkeypatch.setattr(store, "token", broken)
    try:
        deadline = time.monotonic() + 5
        while len(book.grants) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    finally:
        await book.stop()
    assert len(book.grants) == 0, "the snapshot outlived STALE_SECONDS of failed reads"
