"""Connection limits: the per-source key, eviction at connect (the per-source share, the fd
marks), identified connections per sandbox, unread bytes, and mitmproxy's seams."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import pytest
from mitmproxy import master, options
from mitmproxy.addons import proxyserver

from sandgate.proxy.addons import h2_guard as h2guard
from sandgate.proxy.addons.connection_limits import ConnectionLimits, check_seams
from sandgate.proxy.addons.guest_peer import source_key, unread
from sandgate.proxy.audit.refusals import RefusalAudit
from sandgate.proxy.config import ConnectionsConfig
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.startup.fd_budget import FdBudget


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("10.200.0.2", 5000), "10.200.0.2"),
        (("::ffff:10.200.0.2", 5000, 0, 0), "10.200.0.2"),
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:bbbb::7", 5000, 0, 0), "2001:db8:1:2::/64"),
        (None, "-"),
    ],
    ids=[
        "an IPv4 source is its address",
        "an IPv4-mapped IPv6 source is the IPv4 address",
        "an IPv6 source is its /64",
        "another address in the same /64 is the same source",
        "no peer is one unknown source",
    ],
)
def test_source_key(peer: tuple[object, ...] | None, key: str) -> None:
    assert source_key(peer) == key


@dataclass
class Conn:
    """A connection as eviction sees it: idle or not, closed by the limits or not."""

    quiet: bool = True
    closed: bool = False

    def idle(self) -> bool:
        return self.quiet and not self.closed

    def close(self) -> None:
        self.closed = True


class FixedBudget(FdBudget):
    """An fd budget whose count the test sets."""

    def __init__(self, limit: int) -> None:
        super().__init__(10, limit)
        self.open = 0

    def fresh_estimate(self) -> int:
        return self.open


def _limits(cfg: ConnectionsConfig, *, workers: int = 1) -> tuple[ConnectionLimits, list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []

    async def emit(record: dict[str, Any]) -> bool:
        records.append(record)
        return True

    policy = SimpleNamespace(version="v1", identify_address=lambda _ip: None)
    ctx = cast(GatewayContext, SimpleNamespace(refusals=RefusalAudit(emit), policy=policy))
    limits = ConnectionLimits(ctx, cfg, proxyserver.Proxyserver(), workers=workers)
    limits.budget = FixedBudget(1024)
    return limits, records


def _admit(limits: ConnectionLimits, key: str, source: str, conn: Conn) -> bool:
    return limits.admit_front(key, (source, 40000), "regular", conn)


async def test_a_source_at_its_share_trades_its_oldest_idle_connection_for_a_new_one() -> None:
    limits, records = _limits(ConnectionsConfig(max_per_source=4), workers=2)  # 2 on this worker
    old, busy = Conn(), Conn(quiet=False)
    assert _admit(limits, "k1", "10.0.0.1", busy)
    assert _admit(limits, "k2", "10.0.0.1", old)
    assert _admit(limits, "k3", "10.0.0.2", Conn())  # another source is not touched
    assert _admit(limits, "k4", "10.0.0.1", Conn(quiet=False))
    assert old.closed and not busy.closed
    assert limits.table.per_source == {"10.0.0.1": 2, "10.0.0.2": 1}
    # None idle (each is about to send): admitted all the same; the sweep trims it later.
    assert _admit(limits, "k5", "10.0.0.1", Conn(quiet=False))
    assert limits.table.per_source["10.0.0.1"] == 3
    busy.quiet = True
    assert limits.trim() == 1
    assert [conn.closed for conn in (old, busy)] == [True, True]
    assert limits.table.per_source["10.0.0.1"] == 2
    assert (limits.evicted, limits.refused) == (2, 0)
    await limits.refusals.flush()
    assert [(r["client"], r["detail"], r["connections"]) for r in records] == [
        ("10.0.0.1", "connections.max_per_source (4), oldest idle connection closed", 2)
    ]


def test_identified_connections_leave_the_source_count_for_their_sandbox_share() -> None:
    limits, _ = _limits(ConnectionsConfig(max_per_source=2, max_per_sandbox=4), workers=2)
    for i in range(5):
        assert _admit(limits, f"k{i}", "10.0.0.1", Conn(quiet=False))
        if i < 4:
            # Many sandboxes behind one address: each identified one frees the source's count.
            assert limits.attribute_front(f"k{i}", f"sb{i % 2}")
    assert limits.table.per_source == {"10.0.0.1": 1}
    assert limits.table.per_sandbox == {"sb0": 2, "sb1": 2}
    assert not limits.attribute_front("k4", "sb0")  # sb0's share on this worker: 429 then
    assert limits.evicted == 0


async def test_past_the_hard_fd_mark_a_new_connection_takes_the_place_of_the_oldest_idle_one() -> None:
    limits, records = _limits(ConnectionsConfig())
    budget = cast(FixedBudget, limits.budget)
    flood = [Conn() for _ in range(3)]
    for i, conn in enumerate(flood):
        assert _admit(limits, f"f{i}", f"10.0.0.{i}", conn)
    budget.open = budget.hard  # past the hard mark from here on
    assert _admit(limits, "new", "10.0.1.1", Conn(quiet=False))
    assert [c.closed for c in flood] == [True, False, False]
    # The reclaimed connection's descriptor is not counted while it closes: one out, one in.
    assert _admit(limits, "new2", "10.0.1.2", Conn(quiet=False))
    assert [c.closed for c in flood] == [True, False, False]
    limits.release_front("f0", upstream=False)
    budget.open = budget.hard + 10
    for conn in flood[1:]:
        conn.quiet = False
    assert not _admit(limits, "refused", "10.0.1.3", Conn())  # none idle: closed at connect
    assert (limits.evicted, limits.refused) == (1, 0)  # admit_front's refusal is mitmproxy's to count
    await limits.refusals.flush()
    assert [(r["client"], r["detail"].split(", ")[-1]) for r in records] == [
        ("10.0.0.0", "oldest idle connection closed")
    ]


async def test_unread_bytes_in_the_stream_or_the_socket_mean_not_idle() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader, writer = await asyncio.open_connection(sock=ours)
        assert not unread(reader, writer)
        theirs.sendall(b"GET / HTTP/1.1\r\n")
        await asyncio.sleep(0.05)  # asyncio has read it into the stream's buffer
        assert unread(reader, writer)
        await reader.read(100)
        assert not unread(reader, writer)
        transport = writer.transport
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()
        theirs.sendall(b"Host: x\r\n")
        await asyncio.sleep(0.05)  # left in the socket: FIONREAD
        assert unread(reader, writer)
        writer.close()
    assert unread(object(), object()), "what cannot be told is never taken for idle"


@pytest.mark.parametrize(
    ("limit", "soft", "hard"),
    [(1024, 512, 768), (20_000, 18_000, 19_000), (1_048_576, 943_719, 996_148)],
    ids=[
        "a small limit keeps at least 512 and 256",
        "20,000 keeps 10 % and 5 %",
        "a large limit keeps 10 % and 5 %",
    ],
)
def test_fd_budget_marks(limit: int, soft: int, hard: int) -> None:
    budget = FdBudget(10, limit)
    assert (budget.soft, budget.hard) == (soft, hard)


async def test_mitmproxy_still_has_the_seams_the_idle_sweep_and_http2_guard_use() -> None:
    m = master.Master(options.Options())
    m.addons.add(proxyserver.Proxyserver())
    check_seams()
    h2guard.check_seam(m.options)  # a real HttpLayer: the guard is installed and sends GOAWAY
