"""A supervisor's audit collector on a socket in the test's folder, writing `audit.jsonl` there
(for the tests of the collector and of the workers' forwarding sink)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.proxy.audit.collector import AuditCollector
from sandgate.proxy.audit.trail import JsonlFileSink


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "workers" / "audit.sock"


@pytest.fixture
def collector(tmp_path: Path, sock: Path) -> Iterator[AuditCollector]:
    c = AuditCollector(sock, JsonlFileSink(tmp_path / "audit.jsonl", max_bytes=10**9, backups=1))
    c.start()
    yield c
    c.close()
