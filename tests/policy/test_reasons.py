"""The reason codes are a contract: each has a meaning and statuses beside the enum, and the
manual's reason-code page (docs/reference/reason-codes.md) says the same, row for row."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.policy.reasons import MEANINGS, Reason, main, markdown_table
from sandgate.proxy.mitm import wire_errors
from sandgate.proxy.respond import status_for

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "reason-codes.md"


def _section() -> str:
    return PAGE.read_text()


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def _rows(lines: list[str]) -> dict[str, tuple[str, str]]:
    """code → (status cell, meaning) for each `| \\`code\\` | status | meaning |` row."""
    rows: dict[str, tuple[str, str]] = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, f"a reason row has code, status and meaning: {line!r}"
        code, status, meaning = cells
        assert code.startswith("`") and code.endswith("`"), f"a code cell is one `code`: {line!r}"
        assert code[1:-1] not in rows, f"{code} is documented twice"
        rows[code[1:-1]] = (status, meaning)
    return rows


def _documented() -> dict[str, tuple[str, str]]:
    return _rows(_table_lines(_section()))


def _generated() -> dict[str, tuple[str, str]]:
    return _rows(_table_lines(markdown_table()))


@pytest.mark.parametrize("reason", list(Reason), ids=lambda r: f"{r.value} has a one-line meaning")
def test_every_reason_has_a_meaning(reason: Reason) -> None:
    text = MEANINGS[reason].text
    assert text.strip() == text and text
    # One line, and nothing that would split a Markdown table cell.
    assert "\n" not in text and "|" not in text


def test_meanings_name_no_code_the_enum_lacks() -> None:
    assert set(MEANINGS) == set(Reason)


@pytest.mark.parametrize("reason", list(Reason), ids=lambda r: f"{r.value} is documented in the manual")
def test_every_reason_code_is_documented(reason: Reason) -> None:
    assert reason.value in _documented(), "run `.venv/bin/python docs/tools/reference.py`"


@pytest.mark.parametrize(
    "reason", list(Reason), ids=lambda r: f"the manual says what MEANINGS says of {r.value}"
)
def test_the_manual_row_matches_the_meaning(reason: Reason) -> None:
    assert _documented()[reason.value] == _generated()[reason.value]


def test_the_manual_documents_no_code_the_enum_lacks() -> None:
    assert set(_documented()) <= {r.value for r in Reason}


def test_the_manual_table_is_the_generated_one() -> None:
    """Same header, same rows, same order: the table is pasted from the generator."""
    assert _table_lines(_section()) == _table_lines(markdown_table())


def test_the_generator_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--markdown"]) == 0
    assert capsys.readouterr().out == markdown_table() + "\n"


@pytest.mark.parametrize(
    "reason", list(Reason), ids=lambda r: f"a refusal with {r.value} has a stated status"
)
def test_the_answered_status_is_a_stated_one(reason: Reason) -> None:
    """`status_for` (proxy/respond.py) answers a non-policy code with a status MEANINGS states,
    and a code stated as 403 only with 403."""
    statuses = MEANINGS[reason].statuses
    if status_for(reason) != 403:
        assert status_for(reason) in statuses
    if statuses == (403,):
        assert status_for(reason) == 403


@pytest.mark.parametrize(
    "failure",
    [f for f in vars(wire_errors).values() if isinstance(f, wire_errors.Failure) and f.reason],
    ids=lambda f: f"a wire failure ({f.text}) answers a status its reason states",
)
def test_wire_failures_answer_stated_statuses(failure: wire_errors.Failure) -> None:
    assert failure.reason is not None
    assert failure.status in MEANINGS[failure.reason].statuses
