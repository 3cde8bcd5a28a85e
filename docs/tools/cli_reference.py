"""The CLI reference page from the argparse tree: every command, its usage, its arguments.

Read through argparse's own formatter (usage lines at a fixed width, invocations such as
`-n N, --lines N` as `--help` prints them), so the page says what `sandgate ... --help` says.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from md_text import cell, prose

__all__ = ["cli_page"]

# Usage lines wrap at this width whatever the terminal: the page must not depend on it.
WIDTH = 100


@dataclass(frozen=True)
class _Command:
    parser: argparse.ArgumentParser
    depth: int  # 0: `sandgate`, 1: `sandgate run`, 2: `sandgate policy check`
    help: str  # the one line its parent's --help shows for it
    subcommands: tuple[_Command, ...]

    @property
    def anchor(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.parser.prog.lower()).strip("-")

    @property
    def link(self) -> str:
        return f"[`{self.parser.prog}`](#{self.anchor})"

    def walk(self) -> Iterator[_Command]:
        yield self
        for sub in self.subcommands:
            yield from sub.walk()


def cli_page(
    parser: argparse.ArgumentParser,
    intro: str,
    exit_codes: str,
    named_choices: Mapping[frozenset[str], str] | None = None,
) -> str:
    """The page: the exit-code contract, every command in a table, then one section each.

    `named_choices` says a long set of choices in a few words (all the reason codes: "a
    [reason code](reason-codes.md)") instead of listing them.
    """
    named = dict(named_choices or {})
    root = _Command(parser, 0, "", _subcommands(parser, 1))
    commands = root.subcommands
    out = ["# CLI reference", "", intro.strip(), ""]
    out += ["## Exit codes {#exit-codes}", "", exit_codes.strip(), ""]
    out += ["## Commands {#commands}", "", "| command | what it does |", "|---|---|"]
    for top in commands:
        out += [f"| {c.link} | {cell(c.help)} |" for c in top.walk() if not c.subcommands]
    out.append("")
    out += _section(root, named)
    for top in commands:
        for command in top.walk():
            out += _section(command, named)
    return "\n".join(out).rstrip() + "\n"


def _subcommands(parser: argparse.ArgumentParser, depth: int) -> tuple[_Command, ...]:
    """A parser's subcommands, in the order they were added, each with its own."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            pseudo = {a.dest: a.help or "" for a in action._choices_actions}
            return tuple(
                _Command(sub, depth, pseudo.get(name, ""), _subcommands(sub, depth + 1))
                for name, sub in action.choices.items()
            )
    return ()


def _section(command: _Command, named: Mapping[frozenset[str], str]) -> list[str]:
    parser = command.parser
    out = [f"{'#' * min(1 + max(command.depth, 1), 4)} `{parser.prog}` {{#{command.anchor}}}", ""]
    if command.help:
        out += [prose(_sentence(command.help)), ""]
    if parser.description:
        out += [prose(parser.description), ""]
    out += ["```text", _usage(parser), "```", ""]
    if command.subcommands:
        out += ["| subcommand | what it does |", "|---|---|"]
        out += [f"| {sub.link} | {cell(sub.help)} |" for sub in command.subcommands]
        out.append("")
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if _shown(a)]
        if not actions:
            continue
        title = group.title or ""
        if title not in ("positional arguments", "options"):
            out += [f"{title[:1].upper()}{title[1:]}:", ""]
        out += ["| argument | description |", "|---|---|"]
        out += [f"| `{_invocation(parser, a)}` | {_describe(parser, a, named)} |" for a in actions]
        out.append("")
    for exclusive in parser._mutually_exclusive_groups:
        names = [f"`{a.option_strings[-1]}`" for a in exclusive._group_actions if a.option_strings]
        out += ["At most one of " + ", ".join(names) + ".", ""]
    return out


def _shown(action: argparse.Action) -> bool:
    if action.help == argparse.SUPPRESS:
        return False
    return not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(parser.prog, width=WIDTH)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = _formatter(parser)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def _invocation(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    return _formatter(parser)._format_action_invocation(action)


def _describe(
    parser: argparse.ArgumentParser, action: argparse.Action, named: Mapping[frozenset[str], str]
) -> str:
    """Its help, then what argparse knows that the help may not say: choices (unless the
    invocation shows them), default, required; as one table cell."""
    parts = [cell(_sentence(_formatter(parser)._expand_help(action)))] if action.help else []
    if action.choices is not None and action.metavar is not None:
        choices = frozenset(str(c) for c in action.choices)
        if choices in named:
            parts.append(f"One of the {named[choices]}.")
        else:
            parts.append("One of " + ", ".join(f"`{c}`" for c in action.choices) + ".")
    if action.required and action.option_strings:
        parts.append("Required.")
    default = _default(action)
    if default is not None and "default" not in (action.help or ""):
        parts.append(f"Default: `{default}`.")
    if isinstance(action, argparse._AppendAction):
        parts.append("Repeatable.")
    return " ".join(parts)


def _default(action: argparse.Action) -> str | None:
    value = action.default
    if value is None or value == argparse.SUPPRESS or value == []:
        return None
    if isinstance(
        action, argparse._StoreTrueAction | argparse._StoreFalseAction | argparse._StoreConstAction
    ):
        return None
    return str(value)


def _sentence(text: str) -> str:
    """One line as a sentence: a capital first, a full stop last."""
    text = " ".join(text.split())
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "?", "!", ":")) else text + "."
