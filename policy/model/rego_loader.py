"""Load the Rego part of a rules directory: module files, tenant data, compiled programs.

- `rules/rego/*.rego` (not `*_test.rego`, not subfolders): the operator's modules, which
  every tenant with Rego gets; `sandgate.rego` there defines data.sandgate.decision.
- A tenant's `rego:` lists modules (paths relative to its file) in package
  `sandgate.tenants.<tenant>` (or below it), or files of the operator's library under
  `rules/rego/` (the examples). Nothing else: one OPA server can then hold every tenant
  without one tenant's module reaching into another's.
- A tenant's `data:` becomes data.tenants.<tenant> (JSON values only).
Only tenants with `rego:` or `data:` get a program; the others are decided by the allowlist.
Every problem is reported as file:line:column.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

from sandgate.policy.errors import PolicyLoadError, SourceLocation
from sandgate.policy.model.tenant import TenantFile
from sandgate.policy.model.yamlsource import YamlDocument
from sandgate.policy.rego.compiler import compile_programs
from sandgate.policy.rego.program import RegoModule, RegoProgram, tenant_package
from sandgate.policy.rego.source import line_column, module_facts
from sandgate.policy.rego.source import ref_text as _dotted

__all__ = ["RegoLoad", "load_rego", "operator_modules_dir", "rego_watch_files"]


@dataclass(frozen=True, slots=True)
class RegoLoad:
    """The programs by tenant, every module file used, and a digest of them for the version."""

    programs: dict[str, RegoProgram]
    files: tuple[str, ...]
    digests: tuple[str, ...]


def operator_modules_dir(rules_dir: Path) -> Path:
    return rules_dir / "rego"


def rego_watch_files(rules_dir: Path) -> list[Path]:
    """Rego files inside the rules directory (operator's and tenants'), for the reload watcher."""
    out: list[Path] = []
    for sub in ("rego", "tenants"):
        folder = rules_dir / sub
        if folder.is_dir():
            out += sorted(p for p in folder.rglob("*.rego") if p.is_file())
    return out


# Scans of module texts, kept across loads: a reload rescans only what changed.
_facts = functools.lru_cache(maxsize=65_536)(module_facts)


class _Modules:
    """Module files read once per load, with their scans (the same file serves many tenants)."""

    def __init__(self) -> None:
        self._by_path: dict[str, RegoModule | PolicyLoadError] = {}

    def get(self, path: Path, operator: bool) -> RegoModule | PolicyLoadError:
        key = os.path.normpath(path)
        found = self._by_path.get(key)
        if found is None:
            found = self._read(key, operator)
            self._by_path[key] = found
        return found

    def _read(self, key: str, operator: bool) -> RegoModule | PolicyLoadError:
        try:
            text = Path(key).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            return PolicyLoadError(SourceLocation(key), "", f"cannot read: {e}")
        return RegoModule(key, text, _facts(text), operator=operator)


def load_rego(
    rules_dir: Path, tenants: Sequence[tuple[YamlDocument, TenantFile]], errors: list[PolicyLoadError]
) -> RegoLoad:
    """Read, check and compile the Rego of every tenant that has some; problems go to `errors`."""
    wanted = [(doc, t) for doc, t in tenants if t.rego or t.data is not None]
    if not wanted:
        return RegoLoad({}, (), ())
    found_errors: list[PolicyLoadError] = []
    result = _load(rules_dir, wanted, found_errors)
    errors.extend(found_errors)
    return result


def _load(
    rules_dir: Path, wanted: list[tuple[YamlDocument, TenantFile]], errors: list[PolicyLoadError]
) -> RegoLoad:
    modules = _Modules()
    operator = _operator_modules(rules_dir, modules, errors)
    decision_module = Path(operator_modules_dir(rules_dir)) / "sandgate.rego"
    if not decision_module.is_file():
        # Without the module that defines data.sandgate.decision every request would be
        # denied as "undefined": say so at load instead.
        for doc, _ in wanted:
            problem = f"{decision_module} (the decision module, shipped in sandgate's rules/rego/) is missing"
            errors.append(PolicyLoadError(doc.locate(("rego",)), "rego", problem))
        return RegoLoad({}, (), ())
    library = os.path.abspath(operator_modules_dir(rules_dir)) + os.sep
    programs: list[RegoProgram] = []
    used: dict[str, RegoModule] = {m.path: m for m in operator}
    for doc, tenant in wanted:
        own = _tenant_modules(doc, tenant, library, modules, errors)
        data = _checked_data(doc, tenant.data or {}, errors)
        if own is None or data is None:
            continue
        listed = [m for m in own if m.path not in {o.path for o in operator}]
        used.update((m.path, m) for m in listed)
        programs.append(RegoProgram(tenant.tenant, (*operator, *listed), data))
    if errors:
        return RegoLoad({}, (), ())
    compiled, problems = compile_programs(programs)
    by_tenant = {t.tenant: doc for doc, t in wanted}
    for tenant_name, found in problems.items():
        for p in found:
            if p.file is None:
                doc = by_tenant[tenant_name]
                errors.append(PolicyLoadError(doc.locate(("rego",)), "rego", p.message))
            else:
                errors.append(PolicyLoadError(SourceLocation(p.file, p.line, p.column), "", p.message))
    if errors:
        return RegoLoad({}, (), ())
    digests = tuple(f"{_relative(path, rules_dir)}\0{m.digest}" for path, m in sorted(used.items()))
    return RegoLoad(compiled, tuple(sorted(used)), digests)


def _operator_modules(rules_dir: Path, modules: _Modules, errors: list[PolicyLoadError]) -> list[RegoModule]:
    folder = operator_modules_dir(rules_dir)
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.rego")):
        if path.name.endswith("_test.rego"):
            continue
        found = modules.get(path, operator=True)
        if isinstance(found, PolicyLoadError):
            errors.append(found)
            continue
        pkg = found.facts.package
        if pkg is not None and pkg[:2] == ("sandgate", "tenants"):
            errors.append(
                _at(
                    found,
                    found.facts.package_offset,
                    "package",
                    "an operator module cannot be in a tenant's package",
                )
            )
            continue
        if _checked_module(found, errors):
            out.append(found)
    return out


def _tenant_modules(
    doc: YamlDocument, tenant: TenantFile, library: str, modules: _Modules, errors: list[PolicyLoadError]
) -> list[RegoModule] | None:
    base = doc.folder
    ok = True
    out: list[RegoModule] = []
    for i, entry in enumerate(tenant.rego):
        path = base / entry
        found = modules.get(path, operator=False)
        if isinstance(found, PolicyLoadError):
            errors.append(PolicyLoadError(doc.locate(("rego", i)), f"rego.{i}", found.problem))
            ok = False
            continue
        problem = _package_problem(found, tenant.tenant, library)
        if problem:
            errors.append(_at(found, found.facts.package_offset, "package", problem))
            ok = False
            continue
        if not _checked_module(found, errors):
            ok = False
            continue
        if found.path not in {m.path for m in out}:
            out.append(found)
    return out if ok else None


def _package_problem(module: RegoModule, tenant: str, library: str) -> str:
    pkg = module.facts.package
    own = tenant_package(tenant)
    if pkg is None:
        return "no `package` declaration"
    if pkg[: len(own)] == own:
        return ""
    if pkg[:2] == ("sandgate", "tenants") and len(pkg) > 2:
        return f"package {_dotted(pkg)} belongs to tenant {pkg[2]!r}; this tenant's is {_dotted(own)}"
    if os.path.abspath(module.path).startswith(library):
        return ""  # the operator's library (rules/rego/...), e.g. the examples
    return f"a tenant's module must be in package {_dotted(own)} (or below it), not {_dotted(pkg)}"


def _checked_module(module: RegoModule, errors: list[PolicyLoadError]) -> bool:
    for name, offset in module.facts.forbidden:
        errors.append(_at(module, offset, "", f"{name} is not allowed in a sandgate policy"))
    return not module.facts.forbidden


def _checked_data(
    doc: YamlDocument, data: dict[str, Any], errors: list[PolicyLoadError]
) -> dict[str, Any] | None:
    """The tenant's data when every value is JSON (YAML dates and non-string keys are not)."""
    problems: list[PolicyLoadError] = []

    def walk(value: Any, loc: tuple[str | int, ...]) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    problems.append(
                        PolicyLoadError(
                            doc.locate((*loc, k)), _dotted_loc((*loc, k)), "keys in data must be strings"
                        )
                    )
                walk(v, (*loc, k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, (*loc, i))
        elif isinstance(value, date | datetime):
            problems.append(
                PolicyLoadError(doc.locate(loc), _dotted_loc(loc), "a date is not a JSON value; quote it")
            )
        elif not (value is None or isinstance(value, str | int | float | bool)):
            problems.append(
                PolicyLoadError(
                    doc.locate(loc), _dotted_loc(loc), f"a {type(value).__name__} is not a JSON value"
                )
            )

    walk(data, ("data",))
    errors.extend(problems)
    return None if problems else data


def _at(module: RegoModule, offset: int, field: str, problem: str) -> PolicyLoadError:
    line, column = line_column(module.text, offset)
    return PolicyLoadError(SourceLocation(module.path, line, column), field, problem)


def _dotted_loc(loc: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _relative(path: str, rules_dir: Path) -> str:
    try:
        return Path(os.path.abspath(path)).relative_to(os.path.abspath(rules_dir)).as_posix()
    except ValueError:
        return path
