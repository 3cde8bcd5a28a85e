"""README.md's blocks follow the convention the walkthrough runner relies on (fast, no root)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO
from support.readme_blocks import ConsoleStep, ReadmeError, console_steps, missing_output, read_blocks


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "README.md"
    path.write_text(text)
    return path


def test_the_readme_follows_the_convention() -> None:
    blocks = read_blocks(REPO / "README.md")
    assert any(b.runnable for b in blocks)
    # The Tests section states the convention in one line.
    assert (
        "<!-- illustration: " in (REPO / "README.md").read_text().split("## Tests", 1)[1].split("\n## ", 1)[0]
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("```\nls\n```\n", "name the fence's language"),
        ("<!-- illustration -->\n```sh\nls\n```\n", "say why it is an illustration"),
        ("<!-- illustration:   -->\n```sh\nls\n```\n", "say why it is an illustration"),
        ("<!-- skip: later -->\n```sh\nls\n```\n", "unknown marker 'skip'"),
        ("<!-- background -->\n```sh\nserve\n```\n", "says what it serves"),
        ("<!-- illustration: why -->\n```yaml\na: 1\n```\n", "never run"),
        ("```text\n$ sandgate policy check\nok\n```\n", "make it console"),
        ("```console\nno prompt here\n```\n", "without a `$ ` command"),
        ("```sh\nls\n", "never closed"),
    ],
    ids=[
        "a fence without a language is refused",
        "an illustration without a reason is refused",
        "an illustration with a blank reason is refused",
        "an unknown marker is refused",
        "a background block must say what it serves",
        "a marker on a block that never runs is refused",
        "commands in a text block are refused",
        "a console block without a command is refused",
        "an unclosed fence is refused",
    ],
)
def test_blocks_the_runner_cannot_classify_are_refused(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ReadmeError, match=re.escape(problem)):
        read_blocks(write(tmp_path, text))


def test_an_unmarked_shell_block_is_run_and_a_marked_one_is_not(tmp_path: Path) -> None:
    blocks = read_blocks(
        write(
            tmp_path,
            "intro\n```sh\nls\n```\n<!-- illustration: needs systemd -->\n```sh\nsystemctl start x\n```\n"
            "<!-- background: waits for 127.0.0.1:8080 -->\n```sh\nserve\n```\n```yaml\na: 1\n```\n",
        )
    )
    assert [(b.line, b.runnable, b.marker) for b in blocks] == [
        (2, True, None),
        (6, False, "illustration"),
        (10, True, "background"),
        (13, False, None),
    ]
    assert blocks[1].marker_arg == "needs systemd"
    assert blocks[2].waits_for == ("127.0.0.1", 8080)


def test_a_console_block_splits_into_commands_and_their_output(tmp_path: Path) -> None:
    (block,) = read_blocks(write(tmp_path, "```console\n$ a --long \\\n    b\nout 1\n...\nout 2\n$ c\n```\n"))
    assert [(s.command, s.expected) for s in console_steps(block)] == [
        ("a --long \\\n    b", ("out 1", "...", "out 2")),
        ("c", ()),
    ]


@pytest.mark.parametrize(
    ("output", "missing"),
    [
        ("deny: private_address\n  request GET x\n  2 address   guard deny  why\n", None),
        ("deny: private_address\n", "2 address guard deny why"),
        ("  2 address guard deny why\ndeny: private_address\n", "2 address guard deny why"),
        ("", "deny: private_address"),
    ],
    ids=[
        "every shown line printed in order, spacing aside, passes",
        "a shown line never printed is reported",
        "shown lines printed out of order are reported",
        "no output at all is reported",
    ],
)
def test_console_output_is_compared_line_by_line_in_order(output: str, missing: str | None) -> None:
    step = ConsoleStep(
        "sandgate policy explain", ("deny: private_address", "  ...", "2 address guard deny  why")
    )
    assert missing_output(step, output) == missing
