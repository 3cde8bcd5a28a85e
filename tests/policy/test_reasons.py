"""The reason codes are a contract: every member is documented in the README's table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sandgate.policy.reasons import Reason

README = Path(__file__).resolve().parents[2] / "README.md"


def _documented_codes() -> set[str]:
    """The codes in the first column of the README's reason table (`a` or `a` / `b`)."""
    section = README.read_text().split("## Reason codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)`(?: / `([a-z_]+)`)?", section, re.M)
    return {code for row in rows for code in row if code}


@pytest.mark.parametrize("reason", list(Reason), ids=lambda r: f"{r.value} is documented in the README")
def test_every_reason_code_is_documented(reason: Reason) -> None:
    assert reason.value in _documented_codes()


def test_the_readme_documents_no_code_the_enum_lacks() -> None:
    assert _documented_codes() <= {r.value for r in Reason}
