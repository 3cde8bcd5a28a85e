"""README.md's fenced blocks, and those of the manual's pages under docs/, read the way
tests/docs/ runs them.

The convention (stated once here, and in one line of README's Tests section), the same for
README.md and every page of docs/:

- Every fence names a language. Shell blocks are `sh` (or `bash`/`shell`); a transcript of
  commands and their output is `console` (`$ ` starts a command); output, files and formats
  are `text`, `http`, `yaml`, `json`, ...
- Every shell or console block is run by tests/e2e/docs/test_readme_walkthrough.py, top to
  bottom, in one shell session, unless the line just before its fence is a marker:
  - `<!-- illustration: WHY -->`: not run; WHY (say what it needs: systemd, a cluster, ...)
    is required.
  - `<!-- background: waits for HOST:PORT -->`: run in the background (a server the reader
    leaves running in a terminal); the next block starts once HOST:PORT accepts connections.
- A block in another language whose lines start with `$ ` holds commands: it is refused, so a
  command cannot hide from the runner as "text".

README.md runs as one session (tests/e2e/docs/test_readme_walkthrough.py); the pages of docs/ run
as another, in the order of mkdocs.yml's nav (`manual_pages`), as a reader goes through the
manual (tests/e2e/docs/test_docs_walkthrough.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "SHELL_LANGUAGES",
    "Block",
    "ConsoleStep",
    "ReadmeError",
    "console_steps",
    "manual_pages",
    "missing_output",
    "nav_pages",
    "read_blocks",
]

SHELL_LANGUAGES = frozenset({"sh", "bash", "shell", "console"})
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>[a-z-]+)\s*(?::\s*(?P<arg>.*?))?\s*-->\s*$")
_WAITS_FOR = re.compile(r"^waits for (?P<host>[0-9.]+|localhost):(?P<port>\d+)$")


class ReadmeError(ValueError):
    """A block the runner cannot classify; the message names its line."""


@dataclass(frozen=True)
class Block:
    """One fenced block: `line` is the 1-based line of its opening fence."""

    line: int
    language: str
    text: str
    marker: str | None = None  # "illustration" or "background"
    marker_arg: str = ""

    @property
    def is_shell(self) -> bool:
        return self.language in SHELL_LANGUAGES

    @property
    def runnable(self) -> bool:
        return self.is_shell and self.marker != "illustration"

    @property
    def waits_for(self) -> tuple[str, int]:
        """The address a background block serves on."""
        m = _WAITS_FOR.match(self.marker_arg)
        assert m is not None, self.marker_arg
        return m["host"], int(m["port"])


@dataclass(frozen=True)
class ConsoleStep:
    """One `$ command` of a console block and the output lines shown after it."""

    command: str
    expected: tuple[str, ...]


def read_blocks(path: Path, name: str | None = None) -> list[Block]:
    """Every fenced block of a Markdown file, checked against the convention above; errors name
    the file as `name` (default: its file name)."""
    label = name or path.name
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start, fence, language = i, m["fence"], m["info"].strip().split(" ")[0]
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(m["indent"]) :] if lines[i].startswith(m["indent"]) else lines[i])
            i += 1
        if i == len(lines):
            raise ReadmeError(f"{label}:{start + 1}: a fence that is never closed")
        i += 1
        blocks.append(_classify(label, start, lines, language, "\n".join(body) + "\n"))
    return blocks


def _classify(label: str, start: int, lines: list[str], language: str, text: str) -> Block:
    where = f"{label}:{start + 1}"
    if not language:
        raise ReadmeError(f"{where}: name the fence's language (sh for commands, text for output)")
    marker = _MARKER.match(lines[start - 1]) if start > 0 else None
    kind, arg = (marker["kind"], marker["arg"] or "") if marker else (None, "")
    block = Block(start + 1, language, text, kind, arg)
    if not block.is_shell:
        if kind is not None:
            raise ReadmeError(f"{where}: a {kind} marker on a {language} block, which is never run")
        if any(line.startswith("$ ") for line in text.splitlines()):
            raise ReadmeError(f"{where}: a {language} block with `$ ` commands: make it console (or sh)")
        return block
    if kind == "illustration" and not arg:
        raise ReadmeError(f"{where}: say why it is an illustration: <!-- illustration: needs ... -->")
    if kind == "background" and not _WAITS_FOR.match(arg):
        raise ReadmeError(
            f"{where}: a background block says what it serves: <!-- background: waits for HOST:PORT -->"
        )
    if kind not in (None, "illustration", "background"):
        raise ReadmeError(f"{where}: unknown marker {kind!r} (illustration or background)")
    if language == "console" and not console_steps(block):
        raise ReadmeError(f"{where}: a console block without a `$ ` command")
    return block


def console_steps(block: Block) -> list[ConsoleStep]:
    """The commands of a console block (a trailing `\\` continues one) and their output."""
    steps: list[ConsoleStep] = []
    command: list[str] = []
    expected: list[str] = []
    continued = False
    for line in block.text.splitlines():
        if continued:
            command.append(line)
            continued = line.endswith("\\")
        elif line.startswith("$ "):
            if command:
                steps.append(ConsoleStep("\n".join(command), tuple(expected)))
            command, expected = [line[2:]], []
            continued = line.endswith("\\")
        elif command:
            expected.append(line)
    if command:
        steps.append(ConsoleStep("\n".join(command), tuple(expected)))
    return steps


def _normalised(line: str) -> str:
    return re.sub(r"\s+", " ", line).strip()


def missing_output(step: ConsoleStep, output: str) -> str | None:
    """The first line a console step shows that `output` lacks (each on a line of its own,
    in order, whitespace runs equal, `...` skipping any lines), or None when all are there."""
    actual = [_normalised(x) for x in output.splitlines()]
    pos = 0
    for want in (_normalised(x) for x in step.expected):
        if not want or want == "...":
            continue
        while pos < len(actual) and want not in actual[pos]:
            pos += 1
        if pos == len(actual):
            return want
        pos += 1
    return None


def nav_pages(mkdocs_yml: Path) -> list[str]:
    """The pages mkdocs.yml's nav lists, in order, as paths relative to its docs_dir."""
    config = yaml.safe_load(mkdocs_yml.read_text())
    found: list[str] = []

    def visit(entry: Any) -> None:
        if isinstance(entry, str):
            found.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                visit(value)
        elif isinstance(entry, list):
            for item in entry:
                visit(item)

    visit(config.get("nav", []))
    return [page for page in found if page.endswith(".md")]


def manual_pages(repo: Path) -> list[Path]:
    """The manual's pages in reading order: mkdocs.yml's nav, then any page under docs/ it
    leaves out (sorted; the strict site build refuses those, but their blocks still count).
    docs/tools/ holds the reference generator, not pages."""
    docs = repo / "docs"
    listed = [docs / page for page in nav_pages(repo / "mkdocs.yml")]
    others = sorted(
        p for p in docs.rglob("*.md") if p not in listed and p.relative_to(docs).parts[0] != "tools"
    )
    return [*listed, *others]
