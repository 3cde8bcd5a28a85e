"""YAML files with positions: every value keeps the line and column it came from.

Validation errors from pydantic are mapped back to `file:line:column: field: problem`,
with a "did you mean" for misspelt keys.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sandgate.policy.errors import PolicyLoadError, PolicySetError, SourceLocation

__all__ = ["YamlDocument", "load_yaml", "parse_yaml", "validate"]

Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class YamlDocument:
    """A parsed YAML document and where each of its values starts."""

    file: str
    data: Any
    positions: Mapping[Loc, tuple[int, int]]
    # SHA-256 of the text that was parsed: policy versions hash what was loaded, not what is on disk now.
    digest: str = ""
    # A salvaged document (sandgate.policy.model.salvage) lost list items: (key, index now) → index
    # as written, so positions and field names still name what the author wrote.
    renumbered: Mapping[tuple[str | int, int], int] = field(default_factory=dict)
    # The path it is loaded as when that is not `file`: a file checked where it is to go, without
    # copying it there (`policy check FILE`). Paths written in it are relative to that folder.
    placed_at: str | None = None

    @property
    def placed(self) -> str:
        """The path this document is loaded as: `placed_at`, else its own file."""
        return self.placed_at if self.placed_at is not None else self.file

    @property
    def folder(self) -> Path:
        """The folder the paths written in this document (Rego modules, token files) are relative to."""
        return Path(self.placed).parent

    def written(self, loc: Loc) -> Loc:
        """`loc` as it is written in the file (the same, unless list items were dropped)."""
        if len(loc) >= 2 and isinstance(loc[1], int):
            index = self.renumbered.get((loc[0], loc[1]))
            if index is not None:
                return (loc[0], index, *loc[2:])
        return loc

    def locate(self, loc: Loc) -> SourceLocation:
        """The position of `loc`, or of its nearest ancestor that has one."""
        loc = self.written(loc)
        for end in range(len(loc), -1, -1):
            pos = self.positions.get(loc[:end])
            if pos is not None:
                return SourceLocation(self.file, pos[0], pos[1])
        return SourceLocation(self.file)

    def field_name(self, loc: Loc) -> str:
        """The dotted field name of `loc` as written (`allow.2.hosts.0`)."""
        return _dotted(self.written(loc))


def load_yaml(path: Path) -> YamlDocument:
    """Read and parse one YAML file; errors name the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyLoadError(SourceLocation(str(path)), "", f"cannot read: {e}") from e
    return parse_yaml(text, str(path))


# libyaml's parser when PyYAML was built with it (about ten times faster: 10,000 tenant files
# load in seconds, not minutes); it reports the same marks.
_Loader: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# A policy file is small; this bounds what aliases can expand to ("billion laughs").
MAX_NODES = 200_000
# No policy value nests this deep; far deeper input would exhaust Python's stack.
MAX_DEPTH = 64


def parse_yaml(text: str, file: str) -> YamlDocument:
    """Parse YAML text into plain values plus a position map."""
    try:
        return _parse(text, file, _Loader)
    except yaml.YAMLError as e:
        if _Loader is yaml.SafeLoader:
            raise _from_yaml_error(e, file) from None
        first = e
    # libyaml's messages are terse ("found undefined alias"): the pure parser names the culprit,
    # unless the text nests too deep for it (libyaml stops at 1,000 levels; it recurses).
    raise _yaml_error(text, file, first)


def _yaml_error(text: str, file: str, first: yaml.YAMLError) -> PolicyLoadError:
    try:
        _parse(text, file, yaml.SafeLoader)
    except yaml.YAMLError as e:
        return _from_yaml_error(e, file)
    except RecursionError:
        return _from_yaml_error(first, file)
    return PolicyLoadError(SourceLocation(file), "", "invalid YAML")


def _from_yaml_error(e: yaml.YAMLError, file: str) -> PolicyLoadError:
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = SourceLocation(file, mark.line + 1, mark.column + 1) if mark else SourceLocation(file)
        return PolicyLoadError(where, "", f"invalid YAML: {e.problem or e.context}")
    return PolicyLoadError(SourceLocation(file), "", f"invalid YAML: {e}")


def _parse(text: str, file: str, loader_type: type[yaml.SafeLoader] | type[yaml.CSafeLoader]) -> YamlDocument:
    loader = loader_type(text)
    try:
        node = loader.get_single_node()
        builder = _Builder(loader, file)
        data = builder.build(node, ()) if node is not None else None
    finally:
        loader.dispose()
    return YamlDocument(file, data, builder.positions, hashlib.sha256(text.encode()).hexdigest())


class _Builder:
    """Turns a node tree into plain values, recording positions; refuses alias cycles."""

    def __init__(self, loader: yaml.SafeLoader | yaml.CSafeLoader, file: str) -> None:
        self.loader = loader
        self.file = file
        self.positions: dict[Loc, tuple[int, int]] = {}
        self._active: set[int] = set()
        self._count = 0

    def _where(self, node: yaml.Node) -> SourceLocation:
        return SourceLocation(self.file, node.start_mark.line + 1, node.start_mark.column + 1)

    def build(self, node: yaml.Node, loc: Loc) -> Any:
        self._count += 1
        if self._count > MAX_NODES:
            raise PolicyLoadError(
                self._where(node), _dotted(loc), f"more than {MAX_NODES} values (alias bomb?)"
            )
        self.positions.setdefault(loc, (node.start_mark.line + 1, node.start_mark.column + 1))
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            if len(loc) >= MAX_DEPTH:
                raise PolicyLoadError(
                    self._where(node), _dotted(loc), f"nested deeper than {MAX_DEPTH} levels"
                )
            if id(node) in self._active:
                raise PolicyLoadError(self._where(node), _dotted(loc), "an alias refers to itself")
            self._active.add(id(node))
            try:
                return (
                    self._mapping(node, loc)
                    if isinstance(node, yaml.MappingNode)
                    else self._sequence(node, loc)
                )
            finally:
                self._active.discard(id(node))
        return self.loader.construct_object(node, deep=True)

    def _sequence(self, node: yaml.SequenceNode, loc: Loc) -> list[Any]:
        return [self.build(item, (*loc, i)) for i, item in enumerate(node.value)]

    def _mapping(self, node: yaml.MappingNode, loc: Loc) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = self.loader.construct_object(key_node, deep=True)
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise PolicyLoadError(self._where(key_node), _dotted(loc), f"key {key!r} must be a string")
            if key in out:
                raise PolicyLoadError(self._where(key_node), _dotted((*loc, key)), "duplicate key")
            out[key] = self.build(value_node, (*loc, key))
            # A mapping entry is reported where its key is written, the line a reader looks for.
            self.positions[(*loc, key)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        return out


def validate[M: BaseModel](model: type[M], doc: YamlDocument) -> M:
    """Validate a document against a model; raise every problem with its position."""
    try:
        return model.model_validate(doc.data if doc.data is not None else {})
    except ValidationError as e:
        errors = [_to_load_error(model, doc, err) for err in e.errors(include_url=False)]
        raise (errors[0] if len(errors) == 1 else PolicySetError(errors)) from None


def _to_load_error(model: type[BaseModel], doc: YamlDocument, err: Any) -> PolicyLoadError:
    loc: Loc = tuple(err["loc"])
    # pydantic puts union member names and validator tags into loc; keep the data path only.
    path = _data_path(doc, loc)
    problem = str(err["msg"])
    if err["type"] == "extra_forbidden":
        problem = "unknown key" + _suggest(model, path)
    elif err["type"] == "missing":
        problem = "required field is missing"
    elif problem.startswith("Value error, "):
        problem = problem.removeprefix("Value error, ")
    return PolicyLoadError(doc.locate(path), doc.field_name(path), problem)


def _data_path(doc: YamlDocument, loc: Loc) -> Loc:
    out: list[str | int] = []
    for part in loc:
        candidate = (*out, part)
        if candidate in doc.positions or part not in ("function-after", "function-before"):
            if isinstance(part, str) and "[" in part:
                continue  # a union tag such as "list[str]"
            out.append(part)
    return tuple(out)


def _suggest(model: type[BaseModel], path: Loc) -> str:
    """`: did you mean 'x'?` for a misspelt key, looked up in the model at that path."""
    if not path or not isinstance(path[-1], str):
        return ""
    fields = _fields_at(model, path[:-1])
    close = difflib.get_close_matches(path[-1], fields, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (expected one of: {', '.join(sorted(fields))})"


def _fields_at(model: type[BaseModel], path: Loc) -> list[str]:
    current: Any = model
    for part in path:
        if isinstance(part, int):
            continue
        info = current.model_fields.get(part) if hasattr(current, "model_fields") else None
        if info is None:
            return []
        current = _inner_model(info.annotation)
        if current is None:
            return []
    return list(current.model_fields) if hasattr(current, "model_fields") else []


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc)
