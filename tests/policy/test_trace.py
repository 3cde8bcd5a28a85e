"""Tests for sandgate.policy.trace: the step names, their order, and what a trace keeps."""

from __future__ import annotations

import re

import pytest

from sandgate.policy.decide import decide
from sandgate.policy.decision import Refusal
from sandgate.policy.trace import AddressCheck, Outcome, Step, StepName, Trace, address_checks


def _docstring_steps() -> dict[int, str]:
    """The numbered steps of `decide`'s docstring (the evaluation order): number → its line."""
    assert decide.__doc__ is not None
    return {int(n): text for n, text in re.findall(r"^\s*(\d)\. (.*)$", decide.__doc__, re.M)}


def test_the_steps_are_the_docstring_steps_in_its_order() -> None:
    steps = _docstring_steps()
    assert sorted(steps) == [s.number for s in StepName] == list(range(1, len(StepName) + 1))


@pytest.mark.parametrize("name", list(StepName), ids=lambda n: f"step {n.number} of the docstring names {n}")
def test_each_docstring_step_names_its_step(name: StepName) -> None:
    assert name.value in _docstring_steps()[name.number].lower()


def test_padding_fills_the_steps_not_taken_in_order() -> None:
    trace = Trace()
    trace.add(StepName.IDENTITY, Outcome.OK, "sandbox s of tenant t")
    trace.add(StepName.ADDRESS_GUARD, Outcome.DENY, "10.0.0.1 is private")
    steps = trace.padded()
    assert [s.name for s in steps] == list(StepName)
    assert [s.outcome for s in steps] == [Outcome.OK, Outcome.DENY] + [Outcome.NOT_REACHED] * 4
    assert all(s.detail == "" for s in steps[2:])


def test_a_step_as_json_names_its_number() -> None:
    step = Step(
        StepName.RESOLVE, Outcome.OK, "a.test → 192.0.2.1", addresses=(AddressCheck("192.0.2.1", "dial"),)
    )
    assert step.as_dict() == {
        "step": 5,
        "name": "resolve",
        "outcome": "ok",
        "detail": "a.test → 192.0.2.1",
        "rule_id": None,
        "origin": None,
        "addresses": [{"address": "192.0.2.1", "result": "dial", "why": ""}],
    }


def test_addresses_before_the_dialled_one_are_refused_and_after_it_not_checked() -> None:
    refused = (Refusal("10.0.0.1", "10.0.0.1 is private", "private"),)
    got = address_checks(("10.0.0.1", "192.0.2.1", "192.0.2.2"), refused, "192.0.2.1")
    assert got == (
        AddressCheck("10.0.0.1", "refused", "10.0.0.1 is private"),
        AddressCheck("192.0.2.1", "dial"),
        AddressCheck("192.0.2.2", "not checked"),
    )


def test_refusals_past_the_kept_ones_still_read_as_refused() -> None:
    got = address_checks(("10.0.0.1", "10.0.0.2"), (Refusal("10.0.0.1", "private", "private"),), None)
    assert got[1] == AddressCheck("10.0.0.2", "refused", "refused (not kept: too many refusals)")


def test_the_dialled_address_is_found_in_any_spelling() -> None:
    got = address_checks(("2001:DB8::1",), (), "2001:db8::1")
    assert got == (AddressCheck("2001:DB8::1", "dial"),)
