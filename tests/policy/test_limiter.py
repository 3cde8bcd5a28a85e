"""The limiter's counting math: sliding windows, sandbox and tenant caps, fleet merges."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from sandgate.policy.limiter import CounterKey, Kind, Limiter, WindowCounter
from sandgate.policy.model.tenant import Limits
from sandgate.policy.reasons import Reason


class Clock:
    def __init__(self, now: float = 6000.0) -> None:  # the start of a minute and of an hour-ish window
        self.now = now

    def __call__(self) -> float:
        return self.now


def admitted(limiter: Limiter, limits: Limits, count: int, sandbox: str = "sb1") -> int:
    return sum(limiter.admit("t1", sandbox, limits) is None for _ in range(count))


def test_requests_per_minute_admits_exactly_the_limit_then_refuses_with_retry_after() -> None:
    limiter = Limiter(Clock())
    limits = Limits(requests_per_minute=5)
    assert admitted(limiter, limits, 5) == 5
    refusal = limiter.admit("t1", "sb1", limits)
    assert refusal is not None
    assert (refusal.reason, refusal.limit) == (Reason.RATE_LIMITED, "requests_per_minute")
    assert 1 <= refusal.retry_after <= 120


def test_the_previous_window_counts_by_how_much_it_still_overlaps() -> None:
    clock = Clock(6000.0)
    limiter = Limiter(clock)
    limits = Limits(requests_per_minute=10)
    assert admitted(limiter, limits, 10) == 10
    clock.now = 6060.0 + 30  # half into the next minute: 10 * 0.5 = 5 still count
    assert admitted(limiter, limits, 10) == 5
    clock.now = 6180.0  # two windows on: nothing of it is left
    assert admitted(limiter, limits, 10) == 10


def test_sandboxes_are_limited_apart_and_the_tenant_cap_covers_them_together() -> None:
    limiter = Limiter(Clock())
    limits = Limits(requests_per_minute=3, tenant_requests_per_minute=5)
    assert admitted(limiter, limits, 4, "sb1") == 3
    assert admitted(limiter, limits, 4, "sb2") == 2
    refusal = limiter.admit("t1", "sb3", limits)
    assert refusal is not None and refusal.limit == "tenant_requests_per_minute"


def test_a_declared_body_over_the_cap_is_body_too_large_and_counts_nothing() -> None:
    limiter = Limiter(Clock())
    limits = Limits(request_body_bytes=10, requests_per_minute=1)
    refusal = limiter.admit("t1", "sb1", limits, body_bytes=11)
    assert refusal is not None and refusal.reason is Reason.BODY_TOO_LARGE
    assert limiter.admit("t1", "sb1", limits, body_bytes=10) is None


@pytest.mark.parametrize(
    ("sent", "next_bytes", "refused"),
    [(900, 100, False), (900, 101, True), (1000, 0, True)],
    ids=["a request that just fits", "a request one byte over", "a tunnel once the cap is used up"],
)
def test_egress_bytes_refuse_what_would_pass_the_hour_cap(sent: int, next_bytes: int, refused: bool) -> None:
    limiter = Limiter(Clock())
    limits = Limits(egress_bytes_per_hour=1000)
    assert limiter.admit("t1", "sb1", limits, egress_bytes=sent) is None
    refusal = limiter.admit("t1", "sb1", limits, egress_bytes=next_bytes)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert (refusal.reason, refusal.limit) == (Reason.RATE_LIMITED, "egress_bytes_per_hour")


def test_streamed_bytes_report_the_moment_they_pass_the_cap() -> None:
    limiter = Limiter(Clock())
    limits = Limits(egress_bytes_per_hour=100)
    assert limiter.add_egress("t1", "sb1", limits, 100) is None
    refusal = limiter.add_egress("t1", "sb1", limits, 1)
    assert refusal is not None and refusal.limit == "egress_bytes_per_hour"


def test_no_limits_admit_everything_and_keep_no_counters() -> None:
    limiter = Limiter(Clock())
    assert all(limiter.admit("t1", "sb1", None) is None for _ in range(100))
    assert admitted(limiter, Limits(), 100) == 100
    assert limiter.counters == {}


def test_fleet_totals_merged_in_count_against_the_limit() -> None:
    """Two gateways: each pushes its deltas and learns the other's count from the total."""
    a, b = Limiter(Clock()), Limiter(Clock())
    limits = Limits(requests_per_minute=10)
    fleet: dict[tuple[CounterKey, int], int] = {}

    def sync(limiter: Limiter) -> None:
        for item in limiter.pending(refresh_all=True):
            fleet[(item.key, item.index)] = fleet.get((item.key, item.index), 0) + item.delta
            limiter.merge(item, fleet[(item.key, item.index)])

    assert admitted(a, limits, 6) == 6
    sync(a)
    assert admitted(b, limits, 1) == 1
    sync(b)  # b learns a's 6
    assert admitted(b, limits, 6) == 3
    sync(b)
    sync(a)  # and a learns b's 4
    assert admitted(a, limits, 1) == 0
    assert sum(fleet.values()) == 10


def test_a_gateway_meeting_a_sandbox_after_a_window_boundary_learns_the_previous_window() -> None:
    """The fleet's count from the minute before still weighs; a newcomer must read it too."""
    clock_a, clock_b = Clock(6000.0), Clock(6000.0)
    a, b = Limiter(clock_a), Limiter(clock_b)
    limits = Limits(requests_per_minute=10)
    fleet: dict[tuple[CounterKey, int], int] = {}

    def sync(limiter: Limiter) -> None:
        for item in limiter.pending():
            fleet[(item.key, item.index)] = fleet.get((item.key, item.index), 0) + item.delta
            limiter.merge(item, fleet[(item.key, item.index)])

    assert admitted(a, limits, 8) == 8
    sync(a)
    clock_a.now = clock_b.now = 6066.0  # the next minute, a tenth of it gone: 8 * 0.9 still weighs
    assert b.prepare("t1", "sb1", limits)
    sync(b)
    assert admitted(b, limits, 10) == 2


@pytest.mark.parametrize(
    ("gateways", "share"),
    [(2, 3), (3, 2), (1, 6)],
    ids=[
        "in an outage each of two gateways takes half of what remains (6 of 10)",
        "each of three gateways takes a third, rounded down",
        "a gateway that saw no other takes all of it",
    ],
)
def test_in_an_outage_a_gateway_admits_only_its_share_of_the_remainder(gateways: int, share: int) -> None:
    limiters = [Limiter(Clock()) for _ in range(gateways)]
    limits = Limits(requests_per_minute=10)
    fleet: dict[tuple[CounterKey, int], int] = {}

    def sync(limiter: Limiter) -> None:
        for item in limiter.pending(refresh_all=True):
            fleet[(item.key, item.index)] = fleet.get((item.key, item.index), 0) + item.delta
            limiter.merge(item, fleet[(item.key, item.index)])

    assert admitted(limiters[0], limits, 4) == 4
    for limiter in limiters:
        limiter.prepare("t1", "sb1", limits)
        sync(limiter)  # everyone knows the fleet's 4
    for limiter in limiters:
        limiter.outage_peers = gateways - 1  # redis lost: what LimitSync sets
    during = [admitted(limiter, limits, 10) for limiter in limiters]
    assert during == [share] * gateways
    assert 4 + sum(during) <= 10
    for limiter in limiters:
        limiter.outage_peers = 0  # back: the local view alone again, then the next sync merges
    sync(limiters[0])


def test_a_failed_sync_sends_the_same_delta_again() -> None:
    limiter = Limiter(Clock())
    limits = Limits(requests_per_minute=10)
    admitted(limiter, limits, 3)
    first = limiter.pending()
    assert [item.delta for item in first] == [3]
    # Nothing merged (redis down): the next sync carries the whole delta plus what came since.
    admitted(limiter, limits, 2)
    assert [item.delta for item in limiter.pending()] == [5]


def test_idle_counters_are_dropped_after_two_windows() -> None:
    clock = Clock()
    limiter = Limiter(clock)
    admitted(limiter, Limits(requests_per_minute=10), 1)
    for item in limiter.pending():
        limiter.merge(item, item.delta)
    clock.now += 180
    assert limiter.pending() == []
    assert limiter.counters == {}


def test_retry_after_waits_for_the_current_window_to_weigh_less() -> None:
    counter = WindowCounter(Kind.REQUESTS.window)
    counter.add(6000.0, 10)
    wait = counter.retry_after(6030.0, 10, 1)
    # 30 s left in this window, then 10 * (1 - f) + 1 <= 10 needs f >= 0.1: 6 s more.
    assert wait == 36


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"requests_per_minute": 10, "tenant_requests_per_minute": 5},
            "tenant_requests_per_minute (5) is below",
        ),
        (
            {"egress_bytes_per_hour": 10, "tenant_egress_bytes_per_hour": 5},
            "tenant_egress_bytes_per_hour (5)",
        ),
        ({"requests_per_minute": 0}, "greater than or equal to 1"),
        ({"rate": 5}, "Extra inputs are not permitted"),
    ],
    ids=[
        "a tenant cap below one sandbox's",
        "a tenant byte cap below one sandbox's",
        "zero rpm",
        "unknown key",
    ],
)
def test_bad_limits_are_refused_with_a_message_naming_the_field(fields: dict[str, int], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        Limits.model_validate(fields)
