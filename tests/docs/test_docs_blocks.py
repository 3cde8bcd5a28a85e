"""The manual's pages under docs/ follow the README's block convention, and are read in the
order of mkdocs.yml's nav (fast, no root; tests/e2e/docs/test_docs_walkthrough.py runs them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO
from support.readme_blocks import ReadmeError, manual_pages, nav_pages, read_blocks

DOCS = REPO / "docs"


def label(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", manual_pages(REPO), ids=label)
def test_every_block_of_a_manual_page_is_classified(page: Path) -> None:
    # An unmarked shell block runs; anything the runner could not classify is refused here.
    read_blocks(page, label(page))


def test_the_manual_is_read_in_nav_order_and_has_runnable_blocks() -> None:
    pages = manual_pages(REPO)
    assert pages[0] == DOCS / "index.md"
    assert [label(p) for p in pages[: len(nav_pages(REPO / "mkdocs.yml"))]] == [
        f"docs/{p}" for p in nav_pages(REPO / "mkdocs.yml")
    ]
    assert not any(p.is_relative_to(DOCS / "tools") for p in pages)
    # The walkthrough has something to run (the upgrade checks, at least).
    assert any(b.runnable for p in pages for b in read_blocks(p, label(p)))


def test_the_generated_references_hold_no_command() -> None:
    for page in sorted((DOCS / "reference").glob("*.md")):
        assert not any(b.is_shell for b in read_blocks(page, label(page))), page


def test_a_page_left_out_of_the_nav_is_still_read(tmp_path: Path) -> None:
    (tmp_path / "docs" / "tools").mkdir(parents=True)
    (tmp_path / "mkdocs.yml").write_text("nav:\n  - Home: index.md\n  - Part:\n      - part/a.md\n")
    for page in ("index.md", "part/a.md", "stray.md", "tools/notes.md"):
        (tmp_path / "docs" / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "docs" / page).write_text("# page\n")
    assert [str(p.relative_to(tmp_path / "docs")) for p in manual_pages(tmp_path)] == [
        "index.md",
        "part/a.md",
        "stray.md",
    ]


def test_an_unmarked_command_hidden_in_a_page_is_refused_with_its_path(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# ops\n\n```text\n$ sandgate stop\n```\n")
    with pytest.raises(ReadmeError, match=re.escape("docs/operations/page.md:3: a text block with `$ `")):
        read_blocks(page, "docs/operations/page.md")
