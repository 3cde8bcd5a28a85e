"""The redis outage state: one object every redis user reports to; transitions logged once."""

from __future__ import annotations

import pytest
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from sandgate.proxy.redis.outage import RedisOutage


def test_an_outage_is_logged_once_when_it_begins_and_once_when_it_ends() -> None:
    outage = RedisOutage("fleet")
    with structlog.testing.capture_logs() as logs:
        assert outage.reached("grants") is False  # up already: nothing to say
        assert outage.failed("fleet.registry", RedisConnectionError("refused"), version=3) is True
        since = outage.since
        assert outage.failed("limits", TimeoutError()) is False
        assert since is not None and (outage.down, outage.since) == (True, since)
        assert (outage.down_for() or -1) >= 0
        assert outage.reached("limits") is True
        assert outage.reached("grants") is False
    assert (outage.down, outage.since, outage.down_for()) == (False, None, None)
    assert outage.outages == 1
    assert [(e["event"], e["user"]) for e in logs] == [
        ("redis.down", "fleet.registry"),
        ("redis.up", "limits"),
    ]
    assert logs[0]["error"] == "ConnectionError" and logs[0]["version"] == 3 and logs[0]["server"] == "fleet"


def test_track_reports_a_redis_or_os_error_as_down_and_anything_else_that_leaves_as_reached() -> None:
    outage = RedisOutage("fleet")
    with pytest.raises(OSError, match="unreachable"), outage.track("audit_stream"):
        raise OSError("unreachable")
    assert [outage.down] == [True]
    with outage.track("grants"):
        pass
    assert [outage.down] == [False]
    with pytest.raises(ResponseError), outage.track("grants"):
        raise ResponseError("redis answered with an error")
    assert [outage.down] == [True]  # a RedisError: the users fail closed on it, so it counts
    with pytest.raises(ValueError, match="not about redis"), outage.track("grants"):
        raise ValueError("not about redis")
    assert [outage.down] == [True]  # neither: the state stays as it was
