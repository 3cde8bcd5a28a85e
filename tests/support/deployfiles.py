"""Helpers for reading the deployment files the way their runtimes would."""

from __future__ import annotations

import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from conftest import REPO

from sandgate.proxy.cli.parser import build_parser

DEPLOY = REPO / "deploy"
ENV_REF = re.compile(r"^env:([A-Za-z_][A-Za-z0-9_]*)$")
SECRET_REF = re.compile(r"^(env|file):(.+)$")


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    """Every non-empty document of a YAML file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def parse_cli(argv: list[str]) -> Any:
    """The argparse namespace the real `sandgate` command would get (SystemExit if invalid)."""
    assert Path(argv[0]).name == "sandgate", argv
    return build_parser().parse_args(argv[1:])


def secret_refs(config_text: str) -> set[tuple[str, str]]:
    """Every `env:VAR` and `file:PATH` reference in a gateway config, as (scheme, value)."""
    found: set[tuple[str, str]] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, str) and (m := SECRET_REF.match(node)):
            found.add((m.group(1), m.group(2)))

    walk(yaml.safe_load(config_text))
    return found


def env_refs(config_text: str) -> set[str]:
    """Every `env:VAR` secret reference in a gateway config."""
    found = {value for scheme, value in secret_refs(config_text) if scheme == "env"}
    assert all(ENV_REF.match(f"env:{v}") for v in found), found
    return found


def file_refs(config_text: str) -> set[str]:
    """Every `file:PATH` secret reference in a gateway config."""
    return {value for scheme, value in secret_refs(config_text) if scheme == "file"}


def read_dotenv(path: Path) -> dict[str, str]:
    """A compose `.env` file as compose reads the forms create-env.sh writes: `K=V` and
    `K="V"`, where a double-quoted value turns `\\n` into a newline."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not KEY=VALUE: {line!r}"
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace("\\n", "\n")
        values[key] = value
    return values


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
