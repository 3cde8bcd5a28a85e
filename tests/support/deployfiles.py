"""Helpers for reading the deployment files the way their runtimes would."""

from __future__ import annotations

import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from conftest import REPO

from sandgate.proxy.cli import _parser

DEPLOY = REPO / "deploy"
ENV_REF = re.compile(r"^env:([A-Za-z_][A-Za-z0-9_]*)$")


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    """Every non-empty document of a YAML file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def parse_cli(argv: list[str]) -> Any:
    """The argparse namespace the real `sandgate` command would get (SystemExit if invalid)."""
    assert Path(argv[0]).name == "sandgate", argv
    return _parser().parse_args(argv[1:])


def env_refs(config_text: str) -> set[str]:
    """Every `env:VAR` secret reference in a gateway config."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, str) and (m := ENV_REF.match(node)):
            found.add(m.group(1))

    walk(yaml.safe_load(config_text))
    return found


def under(path: PurePosixPath | Path, folder: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(folder))


def unit_entries(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as section → key → values (keys may repeat, as systemd allows)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path}: key outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not key=value: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def split_command(text: str) -> list[str]:
    return shlex.split(text)
