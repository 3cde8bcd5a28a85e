"""GrantBook over a real state-file store: a store that stays unreadable drops the snapshot
(a grant revoked meanwhile must not go on allowing), and a read that works brings it back."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from sandgate.policy.model.grants import Grant, Grants
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
