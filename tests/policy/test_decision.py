"""Decision values: the zero value denies, and a denial derived from an allowing decision."""

from __future__ import annotations

import dataclasses

import pytest

from sandgate.policy.decision import Decision, Mode, Refusal
from sandgate.policy.reasons import Reason

ALLOWED = Decision(
    allowed=True,
    reason=Reason.ALLOWED,
    rule_id="api",
    policy_version="v42",
    mode=Mode.REPORT,
    report_only=True,
    inspect=True,
    address="127.0.0.2",
    raw_tcp=True,
    detail="matched api",
    refused=(Refusal("10.0.0.1", "10.0.0.1 is private", "private"),),
)


def test_the_zero_value_denies_with_internal_error() -> None:
    zero = Decision()
    assert (zero.allowed, zero.reason, zero.verdict) == (False, Reason.INTERNAL_ERROR, "deny")


def test_as_denial_keeps_rule_version_mode_and_address_and_sets_reason_and_detail() -> None:
    denial = ALLOWED.as_denial(Reason.RATE_LIMITED, "requests_per_minute")
    assert denial == Decision(
        reason=Reason.RATE_LIMITED,
        rule_id="api",
        policy_version="v42",
        mode=Mode.REPORT,
        address="127.0.0.2",
    )
    assert denial.detail == "requests_per_minute"


def test_as_denial_drops_what_only_an_allow_means() -> None:
    denial = ALLOWED.as_denial(Reason.HEADER_TOO_LARGE)
    assert (denial.allowed, denial.report_only, denial.inspect, denial.raw_tcp) == (
        False,
        False,
        False,
        False,
    )
    assert denial.refused == ()
    assert denial.detail == ""
    assert denial.verdict == "deny"


def test_as_denial_leaves_the_original_unchanged() -> None:
    ALLOWED.as_denial(Reason.BODY_TOO_LARGE, "request_body_bytes")
    assert ALLOWED.allowed and ALLOWED.reason is Reason.ALLOWED and ALLOWED.detail == "matched api"
    with pytest.raises(dataclasses.FrozenInstanceError):
        ALLOWED.reason = Reason.RATE_LIMITED  # type: ignore[misc]
