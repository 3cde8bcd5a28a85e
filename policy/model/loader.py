"""Load a rules directory into a PolicySet, reporting every problem as file:line: field: problem.

Layout: `base.yaml` (the operator's deny rules for every tenant), `presets/*.yaml` (allow
rules tenants include), `tenants/*.yaml` (one tenant per file). Strict: either the whole
directory loads, or PolicySetError lists what is wrong and the caller keeps what it had.
Isolated (the gateway): a broken tenant file takes only its own tenant (see load_policy_dir).
A tenant's grants file (`tenants/<tenant>.grants.yaml`, sandgate.policy.model.grants) is part
of that tenant: a broken one is that tenant's problem, as its own file's would be.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from sandgate.policy.decision import Mode
from sandgate.policy.errors import (
    PolicyLoadError,
    PolicySetError,
    SourceLocation,
    TokenFileMissingError,
    TokenReferenceError,
)
from sandgate.policy.matcher import ANY_HOST, ANY_PORT, CompiledRule, RuleIndex, compile_path_globs
from sandgate.policy.model.claims import Claim, conflicts
from sandgate.policy.model.grants import EMPTY_GRANTS, Grants, grant_from_entry, load_grants_file
from sandgate.policy.model.policyset import LoadNotice, PolicySet, SandboxRecord, TenantPolicy, TenantProblem
from sandgate.policy.model.rego_loader import RegoLoad, load_rego, rego_watch_files
from sandgate.policy.model.salvage import salvage
from sandgate.policy.model.sandbox_tokens import resolve_token_reference
from sandgate.policy.model.section_conflicts import WrittenRule, section_conflicts
from sandgate.policy.model.tenant import BaseFile, PresetFile, Rule, TenantFile
from sandgate.policy.model.yamlsource import YamlDocument, load_yaml, validate
from sandgate.policy.rego.compiler import keep_only
from sandgate.policy.rego.program import RegoProgram

__all__ = ["Candidate", "grants_file_tenant", "load_policy_dir", "policy_files"]

DEFAULT_ALLOW_PORTS = frozenset({443})


@dataclass(frozen=True, slots=True)
class _Loaded[M]:
    doc: YamlDocument
    model: M
    # What was left of a file that did not validate (sandgate.policy.model.salvage): checked, so
    # every problem is reported, never served.
    salvaged: bool = False


def policy_files(rules_dir: Path) -> list[Path]:
    """Every policy file, in load order (token files are listed by the PolicySet)."""
    files = [rules_dir / "base.yaml"] if (rules_dir / "base.yaml").is_file() else []
    for sub in ("presets", "tenants"):
        folder = rules_dir / sub
        if folder.is_dir():
            files += sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    return files + rego_watch_files(rules_dir)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A policy file checked where it is to go, without copying it there (`policy check FILE`).

    It stands in for the file of its name in `folder` (`tenants`, `presets`; "" for
    base.yaml), and the paths written in it (Rego modules, token files) are read from that
    folder, as they will be once it is there. Its sandbox ids count as the newest claims.
    """

    path: Path
    folder: Literal["", "presets", "tenants"]

    def target(self, rules_dir: Path) -> Path:
        """The file it stands in for."""
        return rules_dir / "base.yaml" if self.folder == "" else rules_dir / self.folder / self.path.name

    def in_place(self, rules_dir: Path) -> bool:
        """Whether it is the file it stands in for (then it is loaded as any other)."""
        return os.path.abspath(self.path) == os.path.abspath(self.target(rules_dir))


def load_policy_dir(
    rules_dir: Path,
    *,
    previous: PolicySet | None = None,
    isolate: bool = False,
    candidate: Candidate | None = None,
) -> PolicySet:
    """Load and compile the whole rules directory.

    Strict (the default; `policy check`, `sandgate run --strict`): any problem raises
    PolicySetError listing every one, and the caller keeps what it had.
    Isolated (`isolate=True`, the running gateway): a problem in the operator's files (the
    rules directory, base.yaml, the operator's Rego modules) still raises, since no tenant may
    be decided without the operator's deny rules; a broken tenant file (or a preset it
    includes) takes only its own tenant, which keeps its version from `previous` when it had
    one and otherwise has no policy (its sandboxes get no_identity). Each is in `problems`.
    `candidate`: a file loaded in place of the one it stands in for (see Candidate).
    """
    if not rules_dir.is_dir():
        raise PolicySetError(
            [PolicyLoadError(SourceLocation(str(rules_dir)), "", "rules directory not found")]
        )
    placed, placements = _placed(rules_dir, candidate)
    read = _read_files(placed, placements)

    base_deny = RuleIndex(
        _compile_rules(read.base, "deny", "base", read.operator_errors) if read.base else []
    )
    preset_rules, broken_presets = _compile_presets(read, isolate=isolate)
    compiled, defined, grants_docs = _compile_tenants(read, preset_rules, broken_presets, base_deny)
    rego = _load_rego(rules_dir, compiled, read.tenant_errors, read.operator_errors, isolate=isolate)

    newest = str(candidate.path) if candidate is not None else None
    _blame_shared_sandboxes(read.tenant_files, read.tenant_errors, previous, newest)
    registry = _SandboxRegistry()
    tenants = _register_tenants(rules_dir, read, compiled, rego, registry, grants_docs)
    all_errors = [*read.operator_errors, *_flatten(read.preset_errors), *_flatten(read.tenant_errors)]
    if read.operator_errors or (all_errors and not isolate):
        raise PolicySetError(all_errors)

    problems = _isolate(
        read.tenant_files, read.preset_errors, read.tenant_errors, tenants, previous, base_deny, registry
    )
    registry.notices += _name_notices(read.tenant_files)
    registry.notices += _orphan_grants(read.grants_files, defined)
    keep_only(t.rego for t in tenants.values() if t.rego is not None)
    docs = [x.doc for x in (read.base, *read.presets.values()) if x is not None]
    return PolicySet(
        version=_version(docs, rules_dir, [t.digest for t in tenants.values()]),
        tenants=tenants,
        sandboxes=registry.by_id,
        by_address=registry.by_address,
        files=(*(str(p) for p, _ in placed), *rego.files),
        token_files=tuple(str(p) for p in registry.token_files),
        rego_files=rego.files,
        problems=problems,
        notices=tuple(registry.notices),
    )


def _compile_presets(read: _Read, *, isolate: bool) -> tuple[dict[str, list[CompiledRule]], frozenset[str]]:
    """The presets' allow rules by name, and the presets a tenant may not include (broken)."""
    preset_rules: dict[str, list[CompiledRule]] = {}
    for name, preset in read.presets.items():
        errors = read.preset_errors[preset.doc.file]
        rules = _compile_rules(preset, "allow", f"preset:{name}", errors)
        if not errors or not isolate:  # strict: reported once, at the preset
            preset_rules[name] = rules
    broken_presets = (frozenset(read.presets) | read.unloadable_presets) - frozenset(preset_rules)
    return preset_rules, broken_presets


def _compile_tenants(
    read: _Read,
    preset_rules: dict[str, list[CompiledRule]],
    broken_presets: frozenset[str],
    base_deny: RuleIndex,
) -> tuple[list[tuple[_Loaded[TenantFile], TenantPolicy]], dict[str, str], dict[str, YamlDocument]]:
    """Each tenant file compiled with its grants: the tenants without errors, where each tenant
    is defined, and the grants documents read (their digests join the tenant's)."""
    compiled: list[tuple[_Loaded[TenantFile], TenantPolicy]] = []
    defined: dict[str, str] = {}
    grants_docs: dict[str, YamlDocument] = {}
    for loaded in read.tenant_files:
        errors = read.tenant_errors[loaded.doc.file]
        tenant = _compile_tenant(loaded, preset_rules, broken_presets, base_deny, errors)
        errors += section_conflicts(_written_allow(loaded, read.presets, preset_rules), loaded.model.tenant)
        if tenant.name in defined:
            problem = f"tenant {tenant.name!r} is defined twice (also in {defined[tenant.name]})"
            errors.append(_err(loaded.doc, ("tenant",), problem))
            continue
        if loaded.salvaged:
            # Its sandbox entries are checked, never registered.
            _SandboxRegistry().declare(loaded, errors)
            continue
        defined[tenant.name] = tenant.source
        grants_path = read.grants_files.get(tenant.name)
        if grants_path is not None:
            placed_at = read.placements.get(grants_path)
            grants = _load_grants(grants_path, tenant.name, errors, grants_docs, placed_at)
            tenant = replace(tenant, grants=grants)
        if not errors:
            compiled.append((loaded, tenant))
    return compiled, defined, grants_docs


def _register_tenants(
    rules_dir: Path,
    read: _Read,
    compiled: list[tuple[_Loaded[TenantFile], TenantPolicy]],
    rego: RegoLoad,
    registry: _SandboxRegistry,
    grants_docs: dict[str, YamlDocument],
) -> dict[str, TenantPolicy]:
    """The compiled tenants whose Rego and sandboxes hold, with their programs, sandboxes and
    digests; each one's sandboxes declared in `registry`."""
    tenants: dict[str, TenantPolicy] = {}
    for loaded, tenant in compiled:
        errors = read.tenant_errors[loaded.doc.file]
        if errors:
            continue  # its Rego failed
        records = registry.declare(loaded, errors)
        if errors:
            continue
        program = rego.programs.get(tenant.name)
        tenants[tenant.name] = replace(
            tenant,
            rego=program,
            sandboxes=records,
            digest=_tenant_digest(loaded.doc, rules_dir, records, program, grants_docs.get(tenant.name)),
        )
    return tenants


_FOLDER_ORDER = {"": 0, "presets": 1, "tenants": 2}


def _placed(rules_dir: Path, candidate: Candidate | None) -> tuple[list[tuple[Path, str]], dict[Path, Path]]:
    """The policy files to load, each with its folder ("" for base.yaml), in load order, and
    the path a candidate is loaded as (the file it stands in for)."""
    placed = [
        (p, "" if p.parent == rules_dir else p.parent.name)
        for p in policy_files(rules_dir)
        if p.suffix != ".rego"
    ]
    if candidate is None:
        return placed, {}
    if candidate.in_place(rules_dir):
        return placed, {}
    target = candidate.target(rules_dir)
    placed = [x for x in placed if x[0] != target]
    placed.append((candidate.path, candidate.folder))
    placed.sort(key=lambda x: (_FOLDER_ORDER[x[1]], target.name if x[0] == candidate.path else x[0].name))
    return placed, {candidate.path: target}


@dataclass(slots=True)
class _Read:
    """The files of a rules directory, read and validated (not compiled), with their problems."""

    operator_errors: list[PolicyLoadError] = field(default_factory=list)
    preset_errors: dict[str, list[PolicyLoadError]] = field(default_factory=dict)
    tenant_errors: dict[str, list[PolicyLoadError]] = field(default_factory=dict)
    base: _Loaded[BaseFile] | None = None
    presets: dict[str, _Loaded[PresetFile]] = field(default_factory=dict)
    tenant_files: list[_Loaded[TenantFile]] = field(default_factory=list)
    grants_files: dict[str, Path] = field(default_factory=dict)
    unloadable_presets: set[str] = field(default_factory=set)
    # A candidate's path → the path it is loaded as (see _placed).
    placements: dict[Path, Path] = field(default_factory=dict)


def _read_files(placed: list[tuple[Path, str]], placements: dict[Path, Path]) -> _Read:
    """Read and validate each policy file as what its folder makes it."""
    read = _Read(placements=placements)
    for p, folder in placed:
        placed_at = placements.get(p)
        if folder == "":
            read.base = _load_one(p, BaseFile, read.operator_errors, placed_at)
        elif folder == "presets":
            _read_preset(p, read, placed_at)
        elif folder == "tenants" and (tenant_name := grants_file_tenant(p)) is not None:
            read.grants_files[tenant_name] = p
        elif folder == "tenants":
            tenant_file = _load_one(p, TenantFile, read.tenant_errors.setdefault(str(p), []), placed_at)
            if tenant_file is not None:
                read.tenant_files.append(tenant_file)
    return read


def _read_preset(p: Path, read: _Read, placed_at: Path | None) -> None:
    """Read one preset file; one that does not validate (or repeats a name) defines none."""
    errors = read.preset_errors.setdefault(str(p), [])
    preset = _load_one(p, PresetFile, errors, placed_at)
    if preset is None or preset.salvaged:
        if preset is not None:  # checked for its other problems; it claims no name
            _compile_rules(preset, "allow", f"preset:{preset.model.preset}", errors)
        if (name := _declared_name(p, "preset")) is not None:
            read.unloadable_presets.add(name)
        return
    if preset.model.preset in read.presets:
        where = read.presets[preset.model.preset].doc.file
        problem = f"preset {preset.model.preset!r} is also defined in {where}"
        errors.append(_err(preset.doc, ("preset",), problem))
        return
    read.presets[preset.model.preset] = preset


def _flatten(by_file: dict[str, list[PolicyLoadError]]) -> list[PolicyLoadError]:
    """Every file's errors, each file's in line order."""
    return [e for errors in by_file.values() for e in sorted(errors, key=_line_order)]


def _line_order(e: PolicyLoadError) -> tuple[bool, int, int]:
    where = e.location
    return (where.line is None, where.line or 0, where.column or 0)


def _load_rego(
    rules_dir: Path,
    compiled: list[tuple[_Loaded[TenantFile], TenantPolicy]],
    tenant_errors: dict[str, list[PolicyLoadError]],
    operator_errors: list[PolicyLoadError],
    *,
    isolate: bool,
) -> RegoLoad:
    """The tenants' Rego; an error in a tenant's own file or module goes to that tenant (and,
    isolated, the rest are loaded again without it), any other to the operator's errors."""
    pending = compiled
    while True:
        errors: list[PolicyLoadError] = []
        rego = load_rego(rules_dir, [(x.doc, x.model) for x, _ in pending], errors)
        if not errors:
            return rego
        owners = _rego_owners(pending)
        blamed: set[str] = set()
        for e in errors:
            files = owners.get(os.path.normpath(e.location.file))
            if files is None:
                operator_errors.append(e)
                continue
            for file in files:
                tenant_errors[file].append(e)
                blamed.add(file)
        if operator_errors or not isolate or not blamed:
            return rego
        pending = [x for x in pending if x[0].doc.file not in blamed]


def _rego_owners(compiled: list[tuple[_Loaded[TenantFile], TenantPolicy]]) -> dict[str, list[str]]:
    """Tenant files by the files their Rego problems can be reported in (theirs, their modules)."""
    owners: dict[str, list[str]] = {}
    for loaded, _ in compiled:
        file = loaded.doc.file
        owners.setdefault(os.path.normpath(file), []).append(file)
        base_dir = loaded.doc.folder
        for entry in loaded.model.rego:
            owners.setdefault(os.path.normpath(base_dir / entry), []).append(file)
    return owners


def _isolate(
    tenant_files: list[_Loaded[TenantFile]],
    preset_errors: dict[str, list[PolicyLoadError]],
    tenant_errors: dict[str, list[PolicyLoadError]],
    tenants: dict[str, TenantPolicy],
    previous: PolicySet | None,
    base_deny: RuleIndex,
    registry: _SandboxRegistry,
) -> tuple[TenantProblem, ...]:
    """A problem for each file that did not load; a broken tenant file's last good version
    (from `previous`, with today's base deny rules) is served again when it had one."""
    problems = [
        TenantProblem(file, None, tuple(str(e) for e in errors), kept_last_good=False)
        for file, errors in preset_errors.items()
        if errors
    ]
    names: dict[str, str | None] = {x.doc.file: x.model.tenant for x in tenant_files}
    for file, errors in tenant_errors.items():
        if not errors:
            continue
        if file not in names:
            names[file] = _declared_name(Path(file), "tenant")
        old = _last_good(previous, file, names.get(file))
        kept = False
        if old is not None and old.name not in tenants and registry.restore(old.sandboxes):
            tenants[old.name] = replace(old, base_deny=base_deny)
            kept = True
        name = names.get(file) or (old.name if old else None)
        problems.append(TenantProblem(file, name, tuple(str(e) for e in errors), kept_last_good=kept))
    return tuple(problems)


def _declared_name(path: Path, key: str) -> str | None:
    """The `tenant:` or `preset:` a file that did not validate still names, if it parses."""
    try:
        data = load_yaml(path).data
    except PolicyLoadError:
        return None
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def _last_good(previous: PolicySet | None, file: str, name: str | None) -> TenantPolicy | None:
    """The tenant `file` defined in the previous policy (by file, else by the name it declares)."""
    if previous is None:
        return None
    for tenant in previous.tenants.values():
        if tenant.source == file:
            return tenant
    return previous.tenants.get(name) if name else None


def _load_one[M: (BaseFile, PresetFile, TenantFile)](
    path: Path, model: type[M], errors: list[PolicyLoadError], placed_at: Path | None = None
) -> _Loaded[M] | None:
    """The file's model; with a schema error, what is left of it (salvaged), or None.
    `placed_at`: the path it is loaded as, when not its own (a Candidate)."""
    try:
        doc = load_yaml(path)
    except PolicyLoadError as e:
        errors.append(e)  # YAML syntax: nothing of this file can be read
        return None
    if placed_at is not None:
        doc = replace(doc, placed_at=str(placed_at))
    try:
        return _Loaded(doc, validate(model, doc))
    except PolicySetError as e:
        found = list(e.errors)
    except PolicyLoadError as e:
        found = [e]
    errors.extend(found)
    rest = salvage(model, doc, found)
    if rest is None:
        return None
    errors.extend(rest[2])
    return _Loaded(rest[0], rest[1], salvaged=True)


def _blame_shared_sandboxes(
    tenant_files: list[_Loaded[TenantFile]],
    tenant_errors: dict[str, list[PolicyLoadError]],
    previous: PolicySet | None,
    newest: str | None = None,
) -> None:
    """A sandbox id two tenant files define: an error in the newcomer's (sandgate.policy.model.claims).
    `newest`: a file that counts as changed after every other (a Candidate, not yet in place)."""
    claims: list[Claim] = []
    for loaded in tenant_files:
        file = loaded.doc.file
        loads = not tenant_errors[file]
        mtime = _NEWEST if file == newest else _mtime_ns(file)
        for i, sb in enumerate(loaded.model.sandboxes):
            where = loaded.doc.locate(("sandboxes", i, "id"))
            claims.append(Claim(sb.id, loaded.model.tenant, file, where, i, loads, mtime))
    owners = {k: r.tenant for k, r in previous.sandboxes.items()} if previous is not None else {}
    docs = {x.doc.file: x.doc for x in tenant_files}
    for conflict in conflicts(claims, owners):
        claim = conflict.claim
        error = _err(docs[claim.file], ("sandboxes", claim.index, "id"), conflict.problem)
        tenant_errors[claim.file].append(error)


_NEWEST = 1 << 62  # nanoseconds: after any file's modification time


def _mtime_ns(file: str) -> int:
    try:
        return os.stat(file).st_mtime_ns
    except OSError:
        return 0


def _name_notices(tenant_files: list[_Loaded[TenantFile]]) -> list[LoadNotice]:
    """A note for each tenant whose name is not its file's: `acme.yaml` defining `acmee` is
    most likely a typo. A note, not an error: existing files named otherwise keep loading."""
    notices = []
    for loaded in tenant_files:
        stem = Path(loaded.doc.file).stem
        name = loaded.model.tenant
        if loaded.salvaged or stem == name:
            continue
        where = str(loaded.doc.locate(("tenant",)))
        text = f"tenant {name!r} is defined in a file named {stem!r}: rename one of them so they agree"
        notices.append(LoadNotice(where, "tenant", text))
    return notices


GRANTS_SUFFIXES = (".grants.yaml", ".grants.yml")


def grants_file_tenant(path: Path) -> str | None:
    """The tenant a grants file (`<tenant>.grants.yaml`) is for, or None for any other file."""
    for suffix in GRANTS_SUFFIXES:
        if path.name.endswith(suffix):
            return path.name[: -len(suffix)]
    return None


def _load_grants(
    path: Path,
    tenant: str,
    errors: list[PolicyLoadError],
    docs: dict[str, YamlDocument],
    placed_at: Path | None = None,
) -> Grants:
    """A tenant's grants file; its problems are the tenant's (file:line: field: problem)."""
    try:
        doc, model = load_grants_file(path)
    except PolicySetError as e:
        errors.extend(e.errors)
        return EMPTY_GRANTS
    except PolicyLoadError as e:
        errors.append(e)
        return EMPTY_GRANTS
    docs[tenant] = doc if placed_at is None else replace(doc, placed_at=str(placed_at))
    if model.tenant != tenant:
        problem = f"this grants file is for tenant {tenant!r} (its name), not {model.tenant!r}"
        errors.append(_err(doc, ("tenant",), problem))
        return EMPTY_GRANTS
    grants = []
    seen: set[str] = set()
    for i, entry in enumerate(model.grants):
        where = doc.locate(("grants", i))
        if entry.id in seen:
            errors.append(_err(doc, ("grants", i, "id"), f"grant {entry.id!r} is listed twice"))
            continue
        seen.add(entry.id)
        grants.append(grant_from_entry(tenant, entry, f"{where.file}:{where.line}"))
    return Grants(grants)


def _orphan_grants(grants_files: dict[str, Path], defined: dict[str, str]) -> list[LoadNotice]:
    """A note for each grants file whose tenant is not defined: it grants nothing."""
    return [
        LoadNotice(str(path), "tenant", f"no tenant {name!r} is defined: its grants allow nothing")
        for name, path in sorted(grants_files.items())
        if name not in defined
    ]


def _written_allow(
    loaded: _Loaded[TenantFile],
    presets: dict[str, _Loaded[PresetFile]],
    preset_rules: dict[str, list[CompiledRule]],
) -> list[WrittenRule]:
    """A tenant's allow rules as written, in the order it compiles them (its own, then each
    included preset's that loaded), with the file each is written in."""
    written = [WrittenRule(rule, loaded.doc, i) for i, rule in enumerate(loaded.model.allow)]
    for name in loaded.model.include:
        preset = presets.get(name)
        if preset is not None and name in preset_rules:
            written += [WrittenRule(rule, preset.doc, i) for i, rule in enumerate(preset.model.allow)]
    return written


def _compile_tenant(
    loaded: _Loaded[TenantFile],
    preset_rules: dict[str, list[CompiledRule]],
    broken_presets: frozenset[str],
    base_deny: RuleIndex,
    errors: list[PolicyLoadError],
) -> TenantPolicy:
    t = loaded.model
    allow = _compile_rules(loaded, "allow", t.tenant, errors)
    for i, name in enumerate(t.include):
        rules = preset_rules.get(name)
        if name in broken_presets:
            errors.append(_err(loaded.doc, ("include", i), f"preset {name!r} did not load (see its file)"))
            continue
        if rules is None:
            known = ", ".join(sorted(preset_rules)) or "none"
            errors.append(_err(loaded.doc, ("include", i), f"unknown preset {name!r} (known: {known})"))
            continue
        allow += rules
    return TenantPolicy(
        name=t.tenant,
        mode=Mode(t.mode),
        allow=RuleIndex(allow),
        deny=RuleIndex(_compile_rules(loaded, "deny", t.tenant, errors)),
        base_deny=base_deny,
        ask=RuleIndex(_compile_rules(loaded, "ask", t.tenant, errors)),
        unmatched_ask=t.unmatched == "ask",
        source=loaded.doc.file,
        credentials=tuple(t.credentials),
        limits=t.limits,
    )


def _compile_rules(
    loaded: _Loaded[TenantFile] | _Loaded[PresetFile] | _Loaded[BaseFile],
    kind: str,
    owner: str,
    errors: list[PolicyLoadError],
) -> list[CompiledRule]:
    rules: Sequence[Rule] = getattr(loaded.model, kind)
    out = []
    for i, rule in enumerate(rules):
        where = loaded.doc.locate((kind, i))
        if kind == "ask" and rule.protocol == "tcp":
            # A held raw tunnel has no request to show the operator: ask for HTTP and TLS only.
            problem = "'protocol: tcp' cannot be asked for; allow it or leave it out"
            errors.append(_err(loaded.doc, (kind, i, "protocol"), problem))
        if kind != "allow" and rule.reads_messages:
            # A deny rule refuses whole requests; an asked request is held before any body is read.
            field = "mcp" if rule.mcp is not None else "jsonrpc" if rule.jsonrpc is not None else "graphql"
            errors.append(_err(loaded.doc, (kind, i, field), f"'{field}' is an allow-rule field"))
        for j, host in enumerate(rule.hosts):
            if kind != "deny" and host.startswith("*.") and "." not in host[2:]:
                problem = f"{host!r} would allow a whole top-level domain; name the domains instead"
                errors.append(_err(loaded.doc, (kind, i, "hosts", j), problem))
            if kind == "deny" and host == ANY_HOST:
                # It would not cover IP literals; deny by network for that.
                problem = "'*' is for allow rules; to deny everywhere use cidrs: [0.0.0.0/0, ::/0]"
                errors.append(_err(loaded.doc, (kind, i, "hosts", j), problem))
        ports = frozenset(rule.ports) if rule.ports else (ANY_PORT if kind == "deny" else DEFAULT_ALLOW_PORTS)
        out.append(
            CompiledRule(
                rule_id=f"{owner}/{kind}/{rule.id or i}",
                ports=ports,
                methods=frozenset(rule.methods) if rule.methods is not None else None,
                # Deny globs fold case: "/ADMIN" must not slip past "/admin/**" to a server that folds it.
                paths=(
                    compile_path_globs(rule.paths, fold_case=kind == "deny")
                    if rule.paths is not None
                    else None
                ),
                inspect=rule.needs_inspection,
                hosts=tuple(rule.hosts),
                cidrs=tuple(rule.cidrs),
                origin=f"{where.file}:{where.line}",
                raw_tcp=rule.protocol == "tcp",
                websocket=rule.websocket,
                messages=rule.messages,
            )
        )
    return out


class _SandboxRegistry:
    """The sandboxes of the tenants loaded so far, by id and by address, and their token files."""

    def __init__(self) -> None:
        self.by_id: dict[str, SandboxRecord] = {}
        self.by_address: dict[str, SandboxRecord] = {}
        self.by_interface: dict[str, SandboxRecord] = {}
        self.token_files: list[Path] = []
        self.notices: list[LoadNotice] = []

    def declare(
        self, loaded: _Loaded[TenantFile], errors: list[PolicyLoadError]
    ) -> tuple[SandboxRecord, ...]:
        """A tenant file's sandboxes, registered only when all of them are valid and free.

        A `file:` token that does not exist yet is no error: that sandbox is left out (nobody
        can log in as it) with a notice, and the file is watched, so creating it loads it.
        """
        t = loaded.model
        records: list[SandboxRecord] = []
        ids: dict[str, SandboxRecord] = {}
        addresses: dict[str, SandboxRecord] = {}
        interfaces: dict[str, SandboxRecord] = {}
        for i, sb in enumerate(t.sandboxes):
            owner = self.by_id.get(sb.id) or ids.get(sb.id)
            if owner is not None:
                problem = f"sandbox {sb.id!r} is already registered to tenant {owner.tenant!r}"
                errors.append(_err(loaded.doc, ("sandboxes", i, "id"), problem))
                continue
            token = self._token(loaded, i, errors)
            if token is None:
                continue
            digest, token_ref = token
            found = _addresses(loaded.doc, i, sb.addresses, errors)
            at = loaded.doc.locate(("sandboxes", i))
            record = SandboxRecord(
                sb.id,
                t.tenant,
                digest,
                tuple(a for _, a in found),
                sb.interface,
                token_ref=token_ref,
                origin=f"{at.file}:{at.line}" if at.line is not None else at.file,
            )
            ids[sb.id] = record
            records.append(record)
            if sb.interface is not None:
                owner = self.by_interface.get(sb.interface) or interfaces.get(sb.interface)
                if owner is not None:
                    taken = f"sandbox {owner.sandbox!r} of tenant {owner.tenant!r}"
                    problem = f"interface {sb.interface} already carries {taken}"
                    errors.append(_err(loaded.doc, ("sandboxes", i, "interface"), problem))
                interfaces[sb.interface] = record
            for j, addr in found:
                owner = self.by_address.get(addr) or addresses.get(addr)
                if owner is not None:
                    problem = f"address {addr} already belongs to sandbox {owner.sandbox!r}"
                    errors.append(_err(loaded.doc, ("sandboxes", i, "addresses", j), problem))
                addresses[addr] = record
        if errors:
            return ()
        self.by_id.update(ids)
        self.by_address.update(addresses)
        self.by_interface.update(interfaces)
        return tuple(records)

    def _token(
        self, loaded: _Loaded[TenantFile], i: int, errors: list[PolicyLoadError]
    ) -> tuple[bytes | None, str | None] | None:
        """Sandbox `i`'s (token digest, token reference as registered), both None without a
        token; None when it is left out (its token file is missing: a notice; a bad reference:
        an error). A `file:` token's path is watched either way."""
        sb = loaded.model.sandboxes[i]
        if sb.token is None:
            return None, None
        base_dir = loaded.doc.folder
        token_ref = sb.token
        if sb.token.startswith("file:"):
            self.token_files.append(_token_path(sb.token, base_dir))
            token_ref = f"file:{_token_path(sb.token, base_dir)}"
        try:
            return resolve_token_reference(sb.token, base_dir), token_ref
        except TokenFileMissingError as e:
            where = str(loaded.doc.locate(("sandboxes", i, "token")))
            text = f"{e}; sandbox {sb.id!r} is off until it does"
            self.notices.append(LoadNotice(where, f"sandboxes.{i}.token", text))
        except TokenReferenceError as e:
            errors.append(_err(loaded.doc, ("sandboxes", i, "token"), str(e)))
        return None

    def restore(self, records: Sequence[SandboxRecord]) -> bool:
        """Register a kept tenant's sandboxes again; False (nothing registered) when one is taken."""
        if any(
            r.sandbox in self.by_id
            or any(a in self.by_address for a in r.addresses)
            or (r.interface is not None and r.interface in self.by_interface)
            for r in records
        ):
            return False
        for r in records:
            self.by_id[r.sandbox] = r
            self.by_address.update((a, r) for a in r.addresses)
            if r.interface is not None:
                self.by_interface[r.interface] = r
        return True


def _token_path(reference: str, base_dir: Path) -> Path:
    path = Path(reference.removeprefix("file:")).expanduser()
    return path if path.is_absolute() else base_dir / path


def _addresses(
    doc: YamlDocument, i: int, raw: Iterable[str], errors: list[PolicyLoadError]
) -> list[tuple[int, str]]:
    """(index in the file, canonical address) for each valid entry."""
    out = []
    for j, text in enumerate(raw):
        try:
            out.append((j, str(ipaddress.ip_address(text))))
        except ValueError:
            errors.append(_err(doc, ("sandboxes", i, "addresses", j), f"{text!r} is not an IP address"))
    return out


def _err(doc: YamlDocument, loc: tuple[str | int, ...], problem: str) -> PolicyLoadError:
    return PolicyLoadError(doc.locate(loc), doc.field_name(loc), problem)


def _tenant_digest(
    doc: YamlDocument,
    rules_dir: Path,
    records: Iterable[SandboxRecord],
    program: RegoProgram | None,
    grants: YamlDocument | None = None,
) -> str:
    """What one tenant was loaded from: its file, its grants file, its sandboxes' token
    digests, its Rego."""
    h = hashlib.sha256()
    h.update(f"{_relative(doc.placed, rules_dir)}\0{doc.digest}\0".encode())
    if grants is not None:
        h.update(f"{_relative(grants.placed, rules_dir)}\0{grants.digest}\0".encode())
    for record in records:
        h.update(record.token_digest or b"-")
    if program is not None:
        for m in program.modules:
            h.update(f"{_relative(m.path, rules_dir)}\0{m.digest}\0".encode())
        h.update(json.dumps(program.data, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


def _version(docs: Iterable[YamlDocument], rules_dir: Path, tenant_digests: Iterable[str]) -> str:
    """A short hash of what was loaded (the operator's files and every tenant served),
    independent of where the rules live."""
    h = hashlib.sha256()
    for doc in sorted(docs, key=lambda d: d.placed):
        h.update(f"{_relative(doc.placed, rules_dir)}\0{doc.digest}\0".encode())
    for digest in sorted(tenant_digests):
        h.update(digest.encode())
    return h.hexdigest()[:12]


def _relative(file: str, rules_dir: Path) -> str:
    """`file` relative to the rules directory (a module outside it: as given)."""
    try:
        return Path(os.path.abspath(file)).relative_to(os.path.abspath(rules_dir)).as_posix()
    except ValueError:
        return file
