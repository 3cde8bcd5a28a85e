"""Tests for sandgate.policy.overrides: every method a request can mean to its server."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decision import Identity
from sandgate.policy.explain import explain
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.overrides import MAX_READINGS, TooManyReadings, method_readings
from sandgate.policy.policytests import parse_request, run_case_file
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.engine import make_engine
from sandgate.policy.resolver import StaticResolver

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


# --- explain and policy test cases decide the readings as the gateway does ------------------

TENANT = """\
tenant: t
allow:
  - hosts: [api.example.com]
    methods: [GET, HEAD]
    paths: ["/v1/**"]
"""


def _policy(tmp_path: Path) -> PolicySet:
    (tmp_path / "rules" / "tenants").mkdir(parents=True)
    (tmp_path / "rules" / "tenants" / "t.yaml").write_text(TENANT)
    return load_policy_dir(tmp_path / "rules")


async def test_explain_refuses_an_override_the_rules_refuse(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    resolver = StaticResolver({"api.example.com": ["93.184.215.14"]})
    request = parse_request(
        "GET https://api.example.com/v1/x", headers=[("X-HTTP-Method-Override", "DELETE")]
    )
    got = await explain(
        policy, Identity("t", "s"), request, resolver, AddressGuard(), make_engine("embedded")
    )
    assert (got.decision.allowed, got.decision.reason) == (False, Reason.METHOD_NOT_ALLOWED)
    assert "'DELETE' (X-HTTP-Method-Override)" in got.decision.detail
    assert [s.outcome for s in got.steps if s.name == "allow rules"] == ["deny"]
    plain = parse_request("GET https://api.example.com/v1/x", headers=[("X-HTTP-Method-Override", "HEAD")])
    ok = await explain(policy, Identity("t", "s"), plain, resolver, AddressGuard(), make_engine("embedded"))
    assert ok.decision.allowed


def test_a_policy_test_case_decides_the_override_too(tmp_path: Path) -> None:
    _policy(tmp_path)
    cases = tmp_path / "rules" / "tests" / "overrides.yaml"
    cases.parent.mkdir()
    cases.write_text(
        "cases:\n"
        "  - name: an override to DELETE is refused\n"
        "    tenant: t\n"
        "    request: GET https://api.example.com/v1/x\n"
        "    headers: {X-HTTP-Method-Override: DELETE}\n"
        "    expect: {decision: deny, reason: method_not_allowed}\n"
        "  - name: the _method parameter too\n"
        "    tenant: t\n"
        "    request: GET https://api.example.com/v1/x?_method=PUT\n"
        "    expect: {decision: deny, reason: method_not_allowed}\n"
    )
    report = run_case_file(cases)
    assert [(o.name, o.result, o.detail) for o in report.outcomes] == [
        ("an override to DELETE is refused", "pass", ""),
        ("the _method parameter too", "pass", ""),
    ]
