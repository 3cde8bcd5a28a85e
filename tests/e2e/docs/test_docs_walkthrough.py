"""Every command in the manual under docs/ runs: its pages' shell blocks, in the order of
mkdocs.yml's nav, in one shell session, as a reader going through the manual would type them.

The convention is README's (tests/support/readme_blocks.py: `sh`/`console` blocks run unless
marked `<!-- illustration: WHY -->`; `<!-- background: waits for HOST:PORT -->` serves in the
background), and so is the machine: the walkthrough, its stand-in internet and its session
come from tests/e2e/docs/test_readme_walkthrough.py, loaded here as a module, so both manuals run
on the same fresh machine. Pages run as one session, after the README's has ended: a page may
use what an earlier page in the nav started or set (a gateway, an exported variable).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import REPO
from support.readme_blocks import Block, manual_pages, read_blocks


def _readme_walkthrough() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sandgate_readme_walkthrough", Path(__file__).with_name("test_readme_walkthrough.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_walkthrough = _readme_walkthrough()
# The README walkthrough's machine: namespaces, a stand-in internet, a fresh copy of the repository.
internet = _walkthrough.internet

# The runner names each block by one number (its logs, the failure it reports): a page's blocks
# are numbered PAGE_STRIDE * (its place in the nav) + their line.
PAGE_STRIDE = 100_000


@dataclass(frozen=True)
class Located:
    """A block of one page, renumbered for the runner."""

    page: str
    block: Block

    @property
    def key(self) -> int:
        return self.block.line

    def where(self, line: int) -> str:
        return f"{self.page}:{line % PAGE_STRIDE}"


def manual_blocks() -> list[Located]:
    """Every block of the manual, in reading order, each numbered uniquely."""
    located = []
    for n, page in enumerate(manual_pages(REPO), start=1):
        name = str(page.relative_to(REPO))
        for block in read_blocks(page, name):
            located.append(Located(name, replace(block, line=n * PAGE_STRIDE + block.line)))
    return located


def where(blocks: list[Located], key: str) -> str:
    found = next((b for b in blocks if str(b.key) == key.strip()), None)
    return found.where(found.key) if found else f"block {key!r}"


@pytest.mark.root
@pytest.mark.slow
def test_every_docs_block_runs_in_nav_order_on_a_fresh_machine(internet: Any) -> None:
    # `internet` is the README walkthrough's `Internet`, a class of a module loaded by path.
    located = manual_blocks()
    runnable = [b for b in located if b.block.runnable]
    # The manual's runnable blocks (upgrades' pre-flight check, ...) are what this test runs.
    assert runnable, "no page under docs/ has a runnable block: nothing of the manual would be run"
    world = internet
    try:
        result = _walkthrough.run_walkthrough(world, [b.block for b in located])
    except AssertionError as e:
        current = (world.run_dir / "current").read_text()
        raise AssertionError(f"{where(located, current)}: {e}") from None
    run_dir: Path = world.run_dir
    failed = run_dir / "failed"
    if failed.exists() or not (run_dir / "finished").exists():
        key, status, command = (
            ([*failed.read_text().splitlines(), "", "", ""])[:3] if failed.exists() else ("?", "?", "?")
        )
        background = "\n".join(
            _walkthrough._block_log(run_dir, str(b.key)) for b in located if b.block.marker == "background"
        )
        pytest.fail(
            f"{where(located, key)}: `{command}` exited {status}\n{_walkthrough._block_log(run_dir, key)}\n"
            f"walkthrough output:\n{result.stdout}\nbackground blocks:\n{background}"
        )
    problems = [
        p
        for b in runnable
        if b.block.language == "console"
        for p in _walkthrough.console_mismatches(b.block, run_dir, b.where(b.key))
    ]
    assert not problems, "\n".join(problems)
    # `policy push` (the Rego page) reached the OPA server the manual names.
    assert "tenants" in world.opa.data


def test_blocks_are_numbered_apart_and_named_by_page_and_line() -> None:
    located = manual_blocks()
    assert len({b.key for b in located}) == len(located)
    upgrades = [b for b in located if b.page == "docs/operations/upgrades.md" and b.block.runnable]
    assert upgrades, "the upgrade checks are the manual's runnable example"
    text = (REPO / upgrades[0].page).read_text().splitlines()
    line = int(upgrades[0].where(upgrades[0].key).rsplit(":", 1)[1])
    assert text[line - 1].startswith("```")
