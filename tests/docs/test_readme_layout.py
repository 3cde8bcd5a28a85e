"""The README's Layout tree names every package, and nothing that is gone."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def layout_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Layout\n") :]
    start = section.index("```text\n") + len("```text\n")
    return section[start : section.index("\n```", start)]


def listed_packages() -> set[str]:
    """`top/` lines and the indented `sub/` lines under them, as paths."""
    found: set[str] = set()
    top = ""
    for line in layout_block().splitlines():
        m = re.match(r"^(\s*)(\w+)/\s", line)
        if not m:
            continue
        if m.group(1):
            found.add(f"{top}/{m.group(2)}")
        else:
            top = m.group(2)
            found.add(top)
    return found


def source_packages() -> set[str]:
    return {
        str(init.parent.relative_to(REPO))
        for top in ("policy", "brokers", "proxy")
        for init in (REPO / top).rglob("__init__.py")
    }


def test_every_package_is_in_the_layout_tree() -> None:
    assert source_packages() - listed_packages() == set()


def test_the_layout_tree_names_no_package_that_is_gone() -> None:
    listed = {p for p in listed_packages() if "/" in p}
    assert listed - source_packages() == set()
