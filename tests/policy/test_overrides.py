"""Tests for sandgate.policy.overrides: every method a request can mean to its server."""

from __future__ import annotations

import pytest

from sandgate.policy.overrides import MAX_READINGS, TooManyReadings, method_readings

READINGS = [
    ("GET", [], "", (), "a request without an override means its own method only"),
    (
        "GET",
        [("X-HTTP-Method-Override", "DELETE")],
        "",
        (("DELETE", "X-HTTP-Method-Override"),),
        "the usual override header adds its method",
    ),
    (
        "POST",
        [("x-http-method", "put")],
        "",
        (("PUT", "x-http-method"),),
        "an override value is upper-cased as frameworks do",
    ),
    (
        "GET",
        [("X-Method-Override", " patch , delete")],
        "",
        (("PATCH", "X-Method-Override"), ("DELETE", "X-Method-Override")),
        "every item of a comma-separated override counts",
    ),
    (
        "POST",
        [],
        "a=1&_method=DELETE",
        (("DELETE", "query parameter _method"),),
        "the _method query parameter",
    ),
    ("GET", [("X-HTTP-Method-Override", "GET")], "", (), "an override naming the same method adds nothing"),
    ("GET", [("X-HTTP-Method-Override", "")], "", (), "an empty override adds nothing"),
    ("GET", [("X-Other", "DELETE")], "_methods=PUT", (), "other names are not overrides"),
]


@pytest.mark.parametrize(
    ("method", "headers", "query", "expected"),
    [c[:4] for c in READINGS],
    ids=[c[4] for c in READINGS],
)
def test_method_readings(
    method: str, headers: list[tuple[str, str]], query: str, expected: tuple[tuple[str, str], ...]
) -> None:
    assert method_readings(method, headers, query) == expected


def test_more_override_methods_than_the_limit_are_refused() -> None:
    names = ",".join(f"M{i}" for i in range(MAX_READINGS + 1))
    with pytest.raises(TooManyReadings, match=f"at most {MAX_READINGS}"):
        method_readings("GET", [("X-HTTP-Method-Override", names)], "")


def test_repeated_override_values_count_once() -> None:
    headers = [("X-HTTP-Method-Override", "DELETE")] * 100
    assert method_readings("GET", headers, "_method=DELETE") == (("DELETE", "X-HTTP-Method-Override"),)
