"""Tests for sandgate.policy.trace: the step names, their order, and what a trace keeps."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from sandgate.policy.decide import decide, decide_name
from sandgate.policy.decision import Refusal
from sandgate.policy.steps import DNS_STEPS, REQUEST_STEPS, PathStep
from sandgate.policy.trace import (
    DNS_ORDER,
    REQUEST_ORDER,
    AddressCheck,
    Outcome,
    Step,
    StepName,
    Trace,
    address_checks,
)


def _docstring_steps(function: Callable[..., object]) -> dict[int, str]:
    """The numbered steps of a function's docstring (its evaluation order): number → its line."""
    assert function.__doc__ is not None
    return {int(n): text for n, text in re.findall(r"^\s*(\d)\. (.*)$", function.__doc__, re.M)}


def _names(steps: tuple[PathStep, ...]) -> list[StepName]:
    """The step names of a step list, in order (step 3 runs as two functions)."""
    return list(dict.fromkeys(s.name for s in steps))


PATHS = [(decide, REQUEST_STEPS), (decide_name, DNS_STEPS)]
PATH_IDS = ["decide runs the steps its docstring numbers", "decide_name runs the steps its docstring numbers"]


@pytest.mark.parametrize(("function", "steps"), PATHS, ids=PATH_IDS)
def test_the_steps_are_the_docstring_steps_in_its_order(
    function: Callable[..., object], steps: tuple[PathStep, ...]
) -> None:
    numbers = [name.number for name in _names(steps)]
    assert numbers == sorted(_docstring_steps(function)) == list(range(numbers[0], numbers[0] + len(numbers)))


@pytest.mark.parametrize(
    ("function", "name"),
    [(f, name) for f, steps in PATHS for name in _names(steps)],
    ids=lambda v: f"{v.__name__}'s docstring" if callable(v) else f"names {v} at its step {v.number}",
)
def test_each_docstring_step_names_its_step(function: Callable[..., object], name: StepName) -> None:
    assert name.value in _docstring_steps(function)[name.number].lower()


def test_every_step_name_is_a_step_of_one_of_the_lists() -> None:
    assert set(StepName) == {*_names(REQUEST_STEPS), *_names(DNS_STEPS)}


def test_padding_fills_the_steps_not_taken_in_order() -> None:
    trace = Trace()
    trace.add(StepName.IDENTITY, Outcome.OK, "sandbox s of tenant t")
    trace.add(StepName.ADDRESS_GUARD, Outcome.DENY, "10.0.0.1 is private")
    steps = trace.padded()
    assert [s.name for s in steps] == list(REQUEST_ORDER)
    assert [s.outcome for s in steps] == [Outcome.OK, Outcome.DENY] + [Outcome.NOT_REACHED] * 4
    assert all(s.detail == "" for s in steps[2:])


def test_the_reserved_name_and_credentials_steps_are_listed_only_when_taken() -> None:
    trace = Trace()
    trace.add(StepName.RESERVED_NAME, Outcome.DENY, "sandgate.internal: the gateway's own name")
    assert [s.name for s in trace.padded()] == [StepName.RESERVED_NAME, *REQUEST_ORDER]
    trace = Trace()
    for name in REQUEST_ORDER:
        trace.add(name, Outcome.OK, "")
    trace.add(StepName.CREDENTIALS, Outcome.OK, "bound to api.test:443: key")
    assert [s.name for s in trace.padded()] == [*REQUEST_ORDER, StepName.CREDENTIALS]


def test_a_dns_query_is_padded_with_the_dns_steps() -> None:
    trace = Trace()
    trace.add(StepName.IDENTITY, Outcome.DENY, "no sandbox identity")
    steps = trace.padded(DNS_ORDER)
    assert [(s.name, s.outcome) for s in steps] == [
        (StepName.IDENTITY, Outcome.DENY),
        (StepName.DNS_NAME, Outcome.NOT_REACHED),
    ]


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
