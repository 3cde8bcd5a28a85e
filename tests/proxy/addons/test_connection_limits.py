"""Connection limits: the per-source key, the counting table, and mitmproxy's seams."""

from __future__ import annotations

import pytest
from mitmproxy import master, options
from mitmproxy.addons import proxyserver

from sandgate.proxy.addons import h2_guard as h2guard
from sandgate.proxy.addons.connection_limits import ConnectionTable, check_seams, source_key
from sandgate.proxy.fd_budget import FdBudget


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


def test_the_table_counts_per_source_and_per_sandbox_and_forgets_on_close() -> None:
    table = ConnectionTable()
    table.add("c1", "10.0.0.1")
    table.add("c2", "10.0.0.1")
    assert table.attribute("c1", "sb1", cap=1)
    assert table.attribute("c1", "sb1", cap=1)  # the same connection again: no change
    assert not table.attribute("c2", "sb1", cap=1)  # would be sb1's second
    assert table.per_source == {"10.0.0.1": 2}
    assert table.per_sandbox == {"sb1": 1}
    table.remove("c1")
    assert table.attribute("c2", "sb1", cap=1)
    table.remove("c2")
    table.remove("c2")
    assert (table.per_source, table.per_sandbox, table.conns) == ({}, {}, {})


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
