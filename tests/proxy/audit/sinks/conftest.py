"""The SIEM sink tests' sink factory: SiemSinks under tmp_path, closed at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.proxy.audit.sinks.sink import SiemSink
from sandgate.proxy.audit.sinks.transport import Transport

SinkFactory = Callable[..., SiemSink]


@pytest.fixture
def make_sink(tmp_path: Path) -> Iterator[SinkFactory]:
    """SiemSinks under tmp_path (a queue folder per name), closed at teardown."""
    made: list[SiemSink] = []

    def make(transport: Transport, *, name: str = "s1", start: bool = True, **kw: Any) -> SiemSink:
        options: dict[str, Any] = {
            "fmt": "native",
            "max_bytes": 1 << 24,
            "when_full": "drop_newest",
            "batch_size": 50,
            "max_backoff": 0.2,
            "fsync": False,
            **kw,
        }
        sink = SiemSink(name, "test", tmp_path / "sinks" / name, transport, **options)
        made.append(sink)
        if start:
            sink.start()
        return sink

    yield make
    for sink in made:
        sink.close()
