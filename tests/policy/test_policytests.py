"""Tests for sandgate.policy.policytests, and the shipped Rego and its tests passing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.policy.decision import Phase
from sandgate.policy.errors import PolicyLoadError
from sandgate.policy.matcher import UNPARSEABLE_PATH
from sandgate.policy.policytests import (
    WHOLE_INPUT_HINT,
    parse_request,
    rego_test_modules,
    run_case_file,
    run_rego_dir,
)

REPO = Path(__file__).parents[2]
DATA = Path(__file__).parents[1] / "data"


def test_every_shipped_rego_test_passes() -> None:
    reports = run_rego_dir(rego_test_modules([REPO / "rules" / "rego"]), {})
    outcomes = [(r.source, o.name, o.result, o.detail) for r in reports for o in r.outcomes]
    assert len(outcomes) >= 30
    assert [o for o in outcomes if o[2] != "pass"] == []
    sources = {Path(r.source).name for r in reports}
    assert {"sandgate_test.rego", "methods_test.rego", "paths_test.rego", "hours_test.rego"} <= sources
    assert {"body_size_test.rego", "github_orgs_test.rego", "mcp_arguments_test.rego"} <= sources


def test_the_shipped_cases_pass() -> None:
    report = run_case_file(REPO / "rules" / "tests" / "demo.yaml")
    assert [(o.name, o.result) for o in report.outcomes if o.result != "pass"] == []
    assert len(report.outcomes) >= 5


def test_the_fixture_cases_pass() -> None:
    report = run_case_file(DATA / "rego" / "good" / "tests" / "acme.yaml")
    assert [o for o in report.outcomes if o.result != "pass"] == []


def test_failing_cases_say_what_was_expected_and_where() -> None:
    report = run_case_file(DATA / "policytests" / "failing.yaml")
    by_name = {o.name: o for o in report.outcomes}
    wrong = by_name["expects allow, gets a rego denial"]
    assert wrong.result == "fail"
    assert wrong.detail.endswith(
        "expected allow, got deny policy_denied, rule acme/rego (acme writes only to its own repositories)"
    )
    assert wrong.detail.startswith(str(DATA / "policytests" / "failing.yaml") + ":")
    assert by_name["a sandbox that does not exist"].result == "error"
    assert by_name["passes"].result == "pass"


def test_a_failing_rego_test_fails_and_an_unevaluable_one_errors() -> None:
    reports = run_rego_dir(rego_test_modules([DATA / "policytests" / "rego"]), {})
    results = {o.name: (o.result, o.detail) for r in reports for o in r.outcomes}
    assert len(reports) == 2
    assert results["test_passes"] == ("pass", "")
    assert results["test_fails"] == ("fail", "undefined")
    assert results["test_whole_input_replaced"][0] in ("fail", "error")
    assert WHOLE_INPUT_HINT in results["test_whole_input_replaced"][1]


def test_a_case_file_that_does_not_validate_raises_with_its_position(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "cases:\n  - name: x\n    tenant: t\n    request: GET https://a.example.com/\n    expect: {decison: allow}\n"
    )
    with pytest.raises(PolicyLoadError) as info:
        run_case_file(path)
    assert f"{path}:5:14: cases.0.expect.decison: unknown key (did you mean 'decision'?)" in str(info.value)


@pytest.mark.parametrize(
    ("text", "phase", "host", "port", "method", "path", "query"),
    [
        ("GET https://API.Example.com/a/../b?x=1", Phase.REQUEST, "api.example.com", 443, "GET", "/b", "x=1"),
        ("post http://a.example.com:8080", Phase.REQUEST, "a.example.com", 8080, "POST", "/", None),
        ("CONNECT a.example.com:8443", Phase.CONNECT, "a.example.com", 8443, None, None, None),
        ("CONNECT a.example.com", Phase.CONNECT, "a.example.com", 443, None, None, None),
        ("GET https://[2606:4700::1]/", Phase.REQUEST, "2606:4700::1", 443, "GET", "/", None),
        (
            "GET https://a.example.com/a%2Fb",
            Phase.REQUEST,
            "a.example.com",
            443,
            "GET",
            UNPARSEABLE_PATH,
            None,
        ),
    ],
    ids=[
        "a URL is normalised like the gateway does",
        "an explicit port and no path",
        "CONNECT with a port",
        "CONNECT defaults to 443",
        "an IPv6 literal",
        "an ambiguous path is marked unparseable",
    ],
)
def test_parse_request(
    text: str, phase: Phase, host: str, port: int, method: str | None, path: str | None, query: str | None
) -> None:
    r = parse_request(text)
    assert (r.phase, r.host, r.port, r.method, r.path, r.query) == (phase, host, port, method, path, query)


@pytest.mark.parametrize("text", ["GET", "GET a.example.com/x", "GET ftp://a/", "CONNECT :443"])
def test_parse_request_refuses_what_is_not_a_request(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        parse_request(text)
