"""Load a rules directory into a PolicySet, reporting every problem as file:line: field: problem.

Layout: `base.yaml` (the operator's deny rules for every tenant), `presets/*.yaml` (allow
rules tenants include), `tenants/*.yaml` (one tenant per file). Nothing is partially
applied: either the whole directory loads, or PolicySetError lists what is wrong and the
caller keeps what it had.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .decision import Mode
from .errors import PolicyLoadError, PolicySetError, SourceLocation, TokenReferenceError
from .matcher import ANY_HOST, ANY_PORT, CompiledRule, RuleIndex, compile_path_globs
from .models import BaseFile, PresetFile, Rule, TenantFile
from .policyset import PolicySet, SandboxRecord, TenantPolicy
from .rego_loader import load_rego, rego_watch_files
from .tokens import resolve_token_reference
from .yamlsource import YamlDocument, load_yaml, validate

__all__ = ["load_policy_dir", "policy_files"]

DEFAULT_ALLOW_PORTS = frozenset({443})


@dataclass(frozen=True, slots=True)
class _Loaded[M]:
    doc: YamlDocument
    model: M


def policy_files(rules_dir: Path) -> list[Path]:
    """Every policy file, in load order (token files are listed by the PolicySet)."""
    files = [rules_dir / "base.yaml"] if (rules_dir / "base.yaml").is_file() else []
    for sub in ("presets", "tenants"):
        folder = rules_dir / sub
        if folder.is_dir():
            files += sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    return files + rego_watch_files(rules_dir)


def load_policy_dir(rules_dir: Path) -> PolicySet:
    """Load and compile the whole rules directory, or raise PolicySetError with every problem."""
    if not rules_dir.is_dir():
        raise PolicySetError(
            [PolicyLoadError(SourceLocation(str(rules_dir)), "", "rules directory not found")]
        )
    errors: list[PolicyLoadError] = []
    files = policy_files(rules_dir)
    base: _Loaded[BaseFile] | None = None
    presets: dict[str, _Loaded[PresetFile]] = {}
    tenant_files: list[_Loaded[TenantFile]] = []
    for p in files:
        if p.suffix == ".rego":
            continue
        if p.parent == rules_dir:
            base = _load_one(p, BaseFile, errors)
        elif p.parent.name == "presets" and (preset := _load_one(p, PresetFile, errors)) is not None:
            if preset.model.preset in presets:
                where = presets[preset.model.preset].doc.file
                errors.append(
                    _err(
                        preset.doc, ("preset",), f"preset {preset.model.preset!r} is also defined in {where}"
                    )
                )
                continue
            presets[preset.model.preset] = preset
        elif p.parent.name == "tenants" and (tenant_file := _load_one(p, TenantFile, errors)) is not None:
            tenant_files.append(tenant_file)

    base_deny = RuleIndex(_compile_rules(base, "deny", "base", errors) if base else [])
    preset_rules = {name: _compile_rules(p, "allow", f"preset:{name}", errors) for name, p in presets.items()}
    tenants: dict[str, TenantPolicy] = {}
    sandboxes: dict[str, SandboxRecord] = {}
    by_address: dict[str, SandboxRecord] = {}
    token_files: list[Path] = []
    token_digests: list[bytes] = []
    for loaded in tenant_files:
        tenant = _compile_tenant(loaded, preset_rules, base_deny, errors)
        if tenant.name in tenants:
            problem = f"tenant {tenant.name!r} is defined twice (also in {tenants[tenant.name].source})"
            errors.append(_err(loaded.doc, ("tenant",), problem))
            continue
        tenants[tenant.name] = tenant
        _register_sandboxes(loaded, sandboxes, by_address, token_files, token_digests, errors)
    rego = load_rego(rules_dir, [(x.doc, x.model) for x in tenant_files], errors)
    if errors:
        raise PolicySetError(errors)
    for name, program in rego.programs.items():
        tenants[name] = replace(tenants[name], rego=program)
    docs = [x.doc for x in (base, *presets.values(), *tenant_files) if x is not None]
    return PolicySet(
        version=_version(docs, rules_dir, [*token_digests, *(d.encode() for d in rego.digests)]),
        tenants=tenants,
        sandboxes=sandboxes,
        by_address=by_address,
        files=(*(str(p) for p in files if p.suffix != ".rego"), *rego.files),
        token_files=tuple(str(p) for p in token_files),
        rego_files=rego.files,
    )


def _load_one[M: (BaseFile, PresetFile, TenantFile)](
    path: Path, model: type[M], errors: list[PolicyLoadError]
) -> _Loaded[M] | None:
    try:
        doc = load_yaml(path)
        return _Loaded(doc, validate(model, doc))
    except PolicySetError as e:
        errors.extend(e.errors)
        return None
    except PolicyLoadError as e:
        errors.append(e)
        return None


def _compile_tenant(
    loaded: _Loaded[TenantFile],
    preset_rules: dict[str, list[CompiledRule]],
    base_deny: RuleIndex,
    errors: list[PolicyLoadError],
) -> TenantPolicy:
    t = loaded.model
    allow = _compile_rules(loaded, "allow", t.tenant, errors)
    for i, name in enumerate(t.include):
        rules = preset_rules.get(name)
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
        for j, host in enumerate(rule.hosts):
            if kind == "allow" and host.startswith("*.") and "." not in host[2:]:
                problem = f"{host!r} would allow a whole top-level domain; name the domains instead"
                errors.append(_err(loaded.doc, (kind, i, "hosts", j), problem))
            if kind != "allow" and host == ANY_HOST:
                # It would not cover IP literals; deny by network for that.
                problem = "'*' is for allow rules; to deny everywhere use cidrs: [0.0.0.0/0, ::/0]"
                errors.append(_err(loaded.doc, (kind, i, "hosts", j), problem))
        ports = (
            frozenset(rule.ports) if rule.ports else (DEFAULT_ALLOW_PORTS if kind == "allow" else ANY_PORT)
        )
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
            )
        )
    return out


def _register_sandboxes(
    loaded: _Loaded[TenantFile],
    sandboxes: dict[str, SandboxRecord],
    by_address: dict[str, SandboxRecord],
    token_files: list[Path],
    token_digests: list[bytes],
    errors: list[PolicyLoadError],
) -> None:
    t = loaded.model
    base_dir = Path(loaded.doc.file).parent
    for i, sb in enumerate(t.sandboxes):
        if sb.id in sandboxes:
            problem = f"sandbox {sb.id!r} is already registered to tenant {sandboxes[sb.id].tenant!r}"
            errors.append(_err(loaded.doc, ("sandboxes", i, "id"), problem))
            continue
        digest = None
        if sb.token is not None:
            if sb.token.startswith("file:"):
                token_files.append(_token_path(sb.token, base_dir))
            try:
                digest = resolve_token_reference(sb.token, base_dir)
            except TokenReferenceError as e:
                errors.append(_err(loaded.doc, ("sandboxes", i, "token"), str(e)))
                continue
            token_digests.append(digest)
        addresses = _addresses(loaded.doc, i, sb.addresses, errors)
        record = SandboxRecord(sb.id, t.tenant, digest, tuple(a for _, a in addresses))
        sandboxes[sb.id] = record
        for j, addr in addresses:
            if addr in by_address:
                problem = f"address {addr} already belongs to sandbox {by_address[addr].sandbox!r}"
                errors.append(_err(loaded.doc, ("sandboxes", i, "addresses", j), problem))
            by_address[addr] = record


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
    return PolicyLoadError(doc.locate(loc), ".".join(str(p) for p in loc), problem)


def _version(docs: Iterable[YamlDocument], rules_dir: Path, token_digests: Iterable[bytes]) -> str:
    """A short hash of what was loaded (files and tokens), independent of where the rules live."""
    h = hashlib.sha256()
    for doc in sorted(docs, key=lambda d: d.file):
        name = Path(doc.file).relative_to(rules_dir).as_posix()
        h.update(f"{name}\0{doc.digest}\0".encode())
    for digest in token_digests:
        h.update(digest)
    return h.hexdigest()[:12]
