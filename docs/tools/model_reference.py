"""A reference page from pydantic models: one section per model, one table row per field.

The structure, types and constraints come from the models' JSON Schema (what `sandgate policy
schema` prints); defaults and descriptions from the fields themselves. A field without a
description falls back to the comment lines right above it in the source, so what the code
already says is not lost. Sections are in the order the schema meets them (depth first, in
field order), each model once; the output depends on nothing but the code (defaults made by a
factory are computed with no environment variable set).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from md_text import cell, prose
from pydantic import BaseModel
from pydantic.fields import FieldInfo

__all__ = ["Root", "models_page", "yaml_flow"]


@dataclass(frozen=True)
class Root:
    """A top-level model of a page: its heading, its anchor, and prose shown before its table."""

    model: type[BaseModel]
    title: str
    anchor: str
    intro: str = ""


@dataclass
class _Section:
    name: str  # the JSON Schema definition name (the class name)
    schema: Mapping[str, Any]
    paths: list[tuple[str, str]] = field(default_factory=list)  # (path, title of its root)
    root: Root | None = None


def models_page(
    title: str,
    intro: str,
    roots: Sequence[Root],
    *,
    section_title: Callable[[str, str], str],
    section_anchor: Callable[[str, str], str],
    sub_level: int,
    show_where: bool,
) -> str:
    """The whole page: each root's section, then (after it) each model first met under it.

    `section_title(name, path)` and `section_anchor(name, path)` name a model's section from
    its class name and the first path it appears at.
    """
    classes = _model_classes(r.model for r in roots)
    sections: dict[str, _Section] = {}
    order: list[tuple[Root, list[str]]] = []
    defs: dict[str, Any] = {}
    for root in roots:
        schema = root.model.model_json_schema()
        defs.update({**schema.get("$defs", {}), root.model.__name__: schema})
        met: list[str] = []
        sections.setdefault(root.model.__name__, _Section(root.model.__name__, schema, root=root))
        _walk(root.model.__name__, "", root, defs, sections, met, classes)
        order.append((root, met))

    def link(name: str) -> str:
        if name not in sections:  # not a model (an enum): its values, in place
            return type_text(defs[name], link)
        s = sections[name]
        if s.root is not None:
            return f"[{s.root.title}](#{s.root.anchor})"
        first = s.paths[0][0]
        return f"[{section_title(name, first)}](#{section_anchor(name, first)})"

    out = [f"# {title}", "", intro.strip(), ""]
    for root, met in order:
        out += _model_section(
            sections[root.model.__name__],
            classes,
            link,
            f"## {root.title} {{#{root.anchor}}}",
            root.intro,
        )
        for name in met:
            s = sections[name]
            first = s.paths[0][0]
            heading = f"{'#' * sub_level} {section_title(name, first)} {{#{section_anchor(name, first)}}}"
            where = ""
            if show_where:
                where = "In " + ", ".join(f"`{path}` ({of.lower()})" for path, of in s.paths) + "."
            out += _model_section(s, classes, link, heading, where)
    return "\n".join(out).rstrip() + "\n"


def _walk(
    name: str,
    prefix: str,
    root: Root,
    defs: Mapping[str, Any],
    sections: dict[str, _Section],
    met: list[str],
    classes: Mapping[str, type[BaseModel]],
) -> None:
    """Record every model under `name` (depth first, in field order) with the paths it has."""
    schema = defs[name]
    for key, node in schema.get("properties", {}).items():
        if _excluded(classes[name], key):
            continue
        path = f"{prefix}{key}"
        for ref, suffix in _refs(node):
            if ref not in classes:
                continue  # not a model: an enum, shown in place
            where = f"{path}{suffix}"
            new = ref not in sections
            if new:
                sections[ref] = _Section(ref, defs[ref])
                met.append(ref)
            section = sections[ref]
            if section.root is None:
                section.paths.append((where, root.title))
            if new:
                _walk(ref, f"{where}.", root, defs, sections, met, classes)


def _refs(node: Mapping[str, Any], suffix: str = "") -> Iterator[tuple[str, str]]:
    """The models a schema node refers to, each with the path suffix that reaches it."""
    if "$ref" in node:
        yield node["$ref"].rsplit("/", 1)[1], suffix
    for key in ("anyOf", "oneOf", "allOf"):
        for alt in node.get(key, ()):
            yield from _refs(alt, suffix)
    if isinstance(node.get("items"), Mapping):
        yield from _refs(node["items"], suffix + "[]")
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from _refs(node["additionalProperties"], suffix + ".*")


def _model_section(
    section: _Section,
    classes: Mapping[str, type[BaseModel]],
    link: Callable[[str], str],
    heading: str,
    lead: str,
) -> list[str]:
    cls = classes[section.name]
    out = [heading, ""]
    if lead:
        out += [lead.strip(), ""]
    doc = inspect.cleandoc(cls.__doc__) if cls.__doc__ else ""
    if doc:
        out += [prose(doc), ""]
    rows = [
        (key, node) for key, node in section.schema.get("properties", {}).items() if not _excluded(cls, key)
    ]
    if not rows:
        return out
    required = set(section.schema.get("required", ()))
    out += ["| key | type | default | description |", "|---|---|---|---|"]
    for key, node in rows:
        info = cls.model_fields[key]
        default = "required" if key in required else _default_text(key, info)
        text = _description(cls, key, info) or _model_summary(node, classes)
        cells = [f"`{key}`", type_text(node, link), default, cell(text)]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return out


def _excluded(cls: type[BaseModel], key: str) -> bool:
    info = cls.model_fields.get(key)
    return info is not None and bool(info.exclude)


# --- types -------------------------------------------------------------------------------------


def type_text(node: Mapping[str, Any], link: Callable[[str], str]) -> str:
    """A schema node in words: `list of string`, `integer 1–65535`, a link to a model."""
    if "$ref" in node:
        return link(node["$ref"].rsplit("/", 1)[1])
    for key in ("anyOf", "oneOf"):
        if key in node:
            alts = [type_text(alt, link) for alt in node[key]]
            # null last: "string or null" reads as an optional string.
            alts = [a for a in alts if a != "null"] + [a for a in alts if a == "null"]
            unique = list(dict.fromkeys(alts))
            joined = " or ".join(unique) if len(unique) <= 2 else "one of " + ", ".join(unique)
            return joined
    if "const" in node:
        return f"`{yaml_flow(node['const'])}`"
    if "enum" in node:
        values = [f"`{yaml_flow(v)}`" for v in node["enum"]]
        return " or ".join(values) if len(values) <= 2 else "one of " + ", ".join(values)
    kind = node.get("type")
    if kind == "array":
        items = node.get("items")
        text = "list of " + type_text(items, link) if isinstance(items, Mapping) else "list"
        return text + _bounds(node.get("minItems"), node.get("maxItems"), "item")
    if kind == "object":
        if isinstance(node.get("patternProperties"), Mapping):
            ((pattern, value),) = node["patternProperties"].items()
            return f"map of keys matching `{_code(pattern)}` to {type_text(value, link)}"
        mapped = node.get("additionalProperties")
        if isinstance(mapped, Mapping) and mapped:
            return "map of string to " + type_text(mapped, link)
        return "map"
    if kind == "string":
        text = "string"
        if "pattern" in node:
            text += f" matching `{_code(node['pattern'])}`"
        return text + _bounds(node.get("minLength"), node.get("maxLength"), "character")
    if kind in ("integer", "number"):
        return str(kind) + _range(node)
    if kind in ("boolean", "null"):
        return str(kind)
    return "any"


def _bounds(low: int | None, high: int | None, unit: str) -> str:
    if low is None and high is None:
        return ""
    if low is not None and high is not None:
        return f" ({low}–{high} {unit}s)"
    if low is not None:
        return f" (at least {low} {unit}{'s' if low != 1 else ''})"
    return f" (at most {high} {unit}s)"


def _range(node: Mapping[str, Any]) -> str:
    low, high = node.get("minimum"), node.get("maximum")
    xlow, xhigh = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if low is not None and high is not None:
        return f" {_num(low)}–{_num(high)}"
    parts = []
    if low is not None:
        parts.append(f"≥ {_num(low)}")
    if xlow is not None:
        parts.append(f"> {_num(xlow)}")
    if high is not None:
        parts.append(f"≤ {_num(high)}")
    if xhigh is not None:
        parts.append(f"< {_num(xhigh)}")
    return " " + ", ".join(parts) if parts else ""


def _num(value: float) -> str:
    return str(value)


# --- defaults and descriptions ---------------------------------------------------------------


def _default_text(key: str, info: FieldInfo) -> str:
    if info.default_factory is not None:
        with _no_environment():
            value = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return "its defaults"
    if isinstance(value, list | tuple) and value and all(isinstance(v, BaseModel) for v in value):
        value = [v.model_dump(mode="json") for v in value]
    text = f"`{_code(yaml_flow(value))}`"
    if "bytes" in key and isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        text += f" ({_binary(value)})"
    return text


def _binary(value: int) -> str:
    for unit in ("GiB", "MiB", "KiB"):
        size = 1024 ** ("KMG".index(unit[0]) + 1)
        if value % size == 0:
            return f"{value // size} {unit}"
    return f"{value} bytes"


@contextlib.contextmanager
def _no_environment() -> Iterator[None]:
    """Run a default factory as on a machine with no environment: the page is the same anywhere."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.update(saved)


def yaml_flow(value: Any) -> str:
    """A value as YAML flow text, quoted only where YAML would read it as something else."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        plain = bool(value) and not re.search(r"[{}\[\],#&*!|>'\"%@`]|: |^[\s:?-]|\s$", value)
        return value if plain and yaml.safe_load(value) == value else json.dumps(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{yaml_flow(k)}: {yaml_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple | set | frozenset):
        return "[" + ", ".join(yaml_flow(v) for v in value) + "]"
    return json.dumps(str(value))


def _description(cls: type[BaseModel], key: str, info: FieldInfo) -> str:
    if info.description:
        return info.description
    return _comment_above(cls, key)


def _model_summary(node: Mapping[str, Any], classes: Mapping[str, type[BaseModel]]) -> str:
    """For a field that is one model (or none): the first sentence of that model's docstring."""
    refs = [ref for ref, suffix in _refs(node) if suffix in ("", "[]") and ref in classes]
    if len(refs) != 1 or not classes[refs[0]].__doc__:
        return ""
    doc = inspect.cleandoc(classes[refs[0]].__doc__ or "").split("\n\n")[0]
    return " ".join(doc.split()).split(". ")[0].rstrip(".") + "."


def _comment_above(cls: type[BaseModel], key: str) -> str:
    """The comment lines right above a field's line, in the class that declares it."""
    owner = next((c for c in cls.__mro__ if key in inspect.get_annotations(c)), None)
    if owner is None:
        return ""
    lines = inspect.getsource(owner).splitlines()
    declared = re.compile(rf"^\s+{re.escape(key)}\s*:")
    for i, line in enumerate(lines):
        if declared.match(line):
            above: list[str] = []
            j = i - 1
            while j >= 0 and lines[j].strip().startswith("#"):
                above.insert(0, lines[j].strip().lstrip("#").strip())
                j -= 1
            return " ".join(above)
    return ""


def _code(text: str) -> str:
    """Text for a code span inside a table cell (a pipe would split the cell)."""
    return text.replace("|", "\\|")


def _model_classes(roots: Iterable[type[BaseModel]]) -> dict[str, type[BaseModel]]:
    """Every model class reachable from the roots' field annotations, by class name."""
    found: dict[str, type[BaseModel]] = {}

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if found.setdefault(tp.__name__, tp) is not tp:
                raise ValueError(f"two models named {tp.__name__}: their sections would clash")
            if tp.__name__ in seen:
                return
            seen.add(tp.__name__)
            for info in tp.model_fields.values():
                visit(info.annotation)
            return
        for arg in typing.get_args(tp):
            visit(arg)

    seen: set[str] = set()
    for root in roots:
        visit(root)
    return found
