"""The connection table: unidentified connections per source (oldest first), identified ones per
sandbox, the oldest idle one for eviction, and each worker's share of the caps."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sandgate.proxy.config import ConnectionsConfig
from sandgate.proxy.connection_table import ConnectionTable, Shares


@dataclass
class Conn:
    """A connection as eviction sees it: idle or not, closed by the limits or not."""

    quiet: bool = True
    closed: bool = False

    def idle(self) -> bool:
        return self.quiet and not self.closed

    def close(self) -> None:
        self.closed = True


def test_the_table_counts_unidentified_per_source_and_identified_per_sandbox() -> None:
    table = ConnectionTable()
    table.add("c1", "10.0.0.1")
    table.add("c2", "10.0.0.1")
    assert table.per_source == {"10.0.0.1": 2}
    assert table.attribute("c1", "sb1", cap=1)
    assert table.attribute("c1", "sb1", cap=1)  # the same connection again: no change
    assert not table.attribute("c2", "sb1", cap=1)  # would be sb1's second
    # Identified, c1 counts for its sandbox and no longer for its source.
    assert table.per_source == {"10.0.0.1": 1}
    assert table.per_sandbox == {"sb1": 1}
    table.remove("c1")
    assert table.attribute("c2", "sb1", cap=1)
    assert table.per_source == {}
    table.remove("c2")
    table.remove("c2")
    assert (table.per_source, table.per_sandbox, table.conns) == ({}, {}, {})


def test_the_oldest_idle_unidentified_connection_is_the_one_reclaimed() -> None:
    table = ConnectionTable()
    conns = {name: Conn() for name in ("a1", "b1", "a2", "a3")}
    for name, conn in conns.items():
        table.add(name, f"10.0.0.{1 if name[0] == 'a' else 2}", reclaim=conn)
    conns["a1"].quiet = False  # unread bytes, a hook running, or new: about to send
    table.attribute("a2", "sb1", cap=0)  # identified: never reclaimed
    assert table.oldest_idle("10.0.0.1") == "a3"
    assert table.oldest_idle(None) == "b1"
    taken = table.take("b1")
    assert taken.reclaimed and table.per_source == {"10.0.0.1": 2}
    assert table.oldest_idle(None) == "a3"
    assert table.oldest_idle("10.0.0.1", scan=1) is None  # only the oldest is looked at
    assert table.oldest_idle("10.0.0.9") is None


@pytest.mark.parametrize(
    ("workers", "source", "sandbox"),
    [(1, 256, 512), (2, 128, 256), (3, 86, 171), (16, 16, 32)],
    ids=[
        "one worker holds the whole caps",
        "two workers hold half each",
        "three round up (the gateway holds at most N x the share)",
        "sixteen hold a sixteenth each",
    ],
)
def test_each_worker_holds_its_share_of_the_gateways_caps(workers: int, source: int, sandbox: int) -> None:
    shares = Shares.of(ConnectionsConfig(), workers)
    assert (shares.per_source, shares.per_sandbox, shares.per_steered_sandbox) == (source, sandbox, 512)
    assert Shares.of(ConnectionsConfig(max_per_source=0, max_per_sandbox=0), 4) == Shares(0, 0, 0)
