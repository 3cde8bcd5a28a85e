"""The audit trail's time stamps: what datetime's RFC 3339 rendering gives, the second reused."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from sandgate.proxy.audit.records import format_time


def by_datetime(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@given(st.floats(min_value=-1e9, max_value=4e9, allow_nan=False))
def test_any_time_is_rendered_as_datetime_renders_it(epoch: float) -> None:
    assert format_time(epoch) == by_datetime(epoch)


def test_times_at_the_edges_of_a_millisecond_and_a_second_round_as_datetime_does() -> None:
    # Half a microsecond below the next second rounds up into it; the cached second must follow.
    for epoch in (1.9999995, 1764700000.9999996, 1764700000.0004995, 1764700001.0, 0.0, -0.0000004):
        assert format_time(epoch) == by_datetime(epoch), epoch
    assert format_time(1764700000.9999996) == "2025-12-02T18:26:41.000Z"
    assert format_time(1764700000.5) == "2025-12-02T18:26:40.500Z"  # back a second: not the cached one
