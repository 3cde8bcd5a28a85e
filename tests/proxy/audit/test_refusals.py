"""Refusals at connect: one audit record per source, limit and window, with its count."""

from __future__ import annotations

from typing import Any

from sandgate.proxy.audit.refusals import RefusalAudit


async def test_a_flood_from_one_source_becomes_one_record_per_window() -> None:
    emitted: list[dict[str, Any]] = []

    async def emit(record: dict[str, Any]) -> bool:
        emitted.append(record)
        return True

    audit = RefusalAudit(emit, max_keys=2)

    def make(source: str, count: int) -> dict[str, Any]:
        return {"client": source, "connections": count}

    for _ in range(500):
        audit.refused("10.0.0.1", "max_per_source", make)
    audit.refused("10.0.0.2", "max_per_source", make)
    audit.refused("10.0.0.2", "fd headroom", make)  # a third key: over max_keys, shares "*"
    audit.refused("10.0.0.3", "fd headroom", make)
    assert emitted == []
    await audit.flush()
    assert sorted(emitted, key=lambda r: r["client"]) == [
        {"client": "*", "connections": 2},
        {"client": "10.0.0.1", "connections": 500},
        {"client": "10.0.0.2", "connections": 1},
    ]
    emitted.clear()
    await audit.flush()
    assert emitted == []  # a quiet window writes nothing
