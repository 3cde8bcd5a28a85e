"""Mutations apply in order; a set header replaces every client copy, in any case."""

from __future__ import annotations

from sandgate.brokers import (
    BrokerRequest,
    RemoveHeader,
    Secret,
    SetBody,
    SetHeader,
    SetQuery,
    apply_mutations,
)


def test_mutations_apply_in_order_and_replace_rather_than_merge() -> None:
    req = BrokerRequest(
        "POST",
        "https",
        "api.example.com",
        443,
        "/x",
        "a=1",
        (
            ("Host", "api.example.com"),
            ("authorization", "guest-1"),
            ("X-Keep", "k"),
            ("AUTHORIZATION", "guest-2"),
            ("X-Drop", "d"),
        ),
        b"old",
    )
    applied = apply_mutations(
        req,
        [
            SetHeader("Authorization", Secret("Bearer real")),
            RemoveHeader("x-drop"),
            SetQuery(Secret("a=2")),
            SetBody(Secret(b"new")),
        ],
    )
    assert applied.headers == (("Host", "api.example.com"), ("X-Keep", "k"), ("Authorization", "Bearer real"))
    assert (applied.query, applied.body) == ("a=2", b"new")
    assert "real" not in repr(applied)
