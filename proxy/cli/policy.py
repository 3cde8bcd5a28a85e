"""`sandgate policy check|test|explain|schema|push|prove|reload|status`: the policy author's tools.

Exit codes: 0 ok, 1 a test failed / the request is denied / the OPA server refused a push,
2 usage or invalid input (a policy that does not load). Every command takes `--format json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decision import Identity
from sandgate.policy.errors import HostError, PolicyLoadError, PolicySetError, SourceLocation
from sandgate.policy.explain import Explanation, Outcome, StepName, explain, explain_name
from sandgate.policy.hosts import normalise_host
from sandgate.policy.model.loader import Candidate, grants_file_tenant, load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.model.rego_loader import operator_modules_dir
from sandgate.policy.model.tenant import tenant_schema
from sandgate.policy.model.yamlsource import YamlDocument, load_yaml, validate
from sandgate.policy.policytests import (
    CaseFile,
    TestReport,
    parse_request,
    rego_test_modules,
    run_case_file,
    run_rego_dir,
)
from sandgate.policy.reach import reach_notes
from sandgate.policy.rego.compiler import check_modules
from sandgate.policy.rego.engine import make_engine
from sandgate.policy.rego.input_document import input_schema
from sandgate.policy.rego.opa import OpaEngine
from sandgate.policy.rego.program import RegoModule
from sandgate.policy.rego.protocol import EngineError
from sandgate.policy.resolver import ChainResolver, Resolver, StaticResolver, SystemResolver
from sandgate.proxy.cli import admin as admin_cli
from sandgate.proxy.cli.policy_prove import run_prove
from sandgate.proxy.config import GatewayConfig, ResolverConfig, load_config
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.net.host_addresses import own_addresses
from sandgate.proxy.startup.broker_setup import PolicyCredentials
from sandgate.proxy.startup.resolver_setup import build_resolver

__all__ = ["run"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _gateway_config(config_path: Path | None) -> GatewayConfig | None:
    """The gateway config `--config` names, or None. Raises ConfigError."""
    return load_config(config_path) if config_path is not None else None


def _operator_guard(config: GatewayConfig | None) -> AddressGuard:
    """The address guard of a gateway config (own addresses: this host's when 'auto'), or the
    default guard: public addresses only."""
    if config is None:
        return AddressGuard()
    cfg = config.address_guard
    own = own_addresses() if cfg.own_addresses == "auto" else cfg.own_addresses
    return AddressGuard(cfg.reachable_by_name, own, cfg.tenant_reachable)


def run(args: argparse.Namespace) -> int:
    """Run a `policy` subcommand."""
    command = args.policy_command
    if command == "schema":
        schema = input_schema() if args.input else tenant_schema()
        print(json.dumps(schema, indent=2))
        return EXIT_OK
    if command in ("check", "test"):
        try:
            config = _gateway_config(args.config)
        except ConfigError as e:
            print(f"sandgate: {e}", file=sys.stderr)
            return EXIT_USAGE
        if command == "check":
            return _check_command(args, config)
        hosts = config.resolver.hosts if config is not None else {}
        return _test(args.paths or [Path("rules")], args.format, args.verbose, _operator_guard(config), hosts)
    if command == "explain":
        return _explain(args)
    if command == "push":
        return _push(args)
    if command == "prove":
        return run_prove(args)
    if command in admin_cli.POLICY_COMMANDS:
        return admin_cli.run_policy_command(args)
    return EXIT_USAGE


def _emit(fmt: str, value: dict[str, Any], text: str) -> None:
    print(json.dumps(value, indent=2) if fmt == "json" else text)


def _error_dicts(errors: Sequence[PolicyLoadError]) -> list[dict[str, Any]]:
    return [
        {
            "file": x.location.file,
            "line": x.location.line,
            "column": x.location.column,
            "field": x.field,
            "problem": x.problem,
        }
        for x in errors
    ]


# --- check ---------------------------------------------------------------------------------


def _check_command(args: argparse.Namespace, config: GatewayConfig | None) -> int:
    """`policy check`: with --config, its guard's ranges in the notes; with --config and no
    path, the rules that gateway serves (not ./rules). A tenant, preset or base file is checked
    against `--rules`, else --config's rules, else the rules directory it is in, else ./rules."""
    guard = _operator_guard(config) if config is not None else None
    rules = args.rules or (config.rules_path if config is not None else None)
    return _check(args.paths or [rules or Path("rules")], args.format, guard, rules)


def _check(
    paths: Sequence[Path], fmt: str, guard: AddressGuard | None = None, rules: Path | None = None
) -> int:
    results = [_check_one(p, guard, rules) for p in paths]
    ok = all(r["ok"] for r in results)
    if fmt == "json":
        print(json.dumps(results[0] if len(results) == 1 else {"ok": ok, "results": results}, indent=2))
    else:
        for r in results:
            if r["ok"]:
                print(r["summary"])
                # Warnings do not fail the check: the guard holds whatever a rule says.
                for note in r.get("notes", ()):
                    print(f"{note['origin']}: {note['level']}: {note['rule_id']}: {note['text']}")
            else:
                print("\n".join(r["lines"]), file=sys.stderr)
    return EXIT_OK if ok else EXIT_USAGE


def _check_one(path: Path, guard: AddressGuard | None = None, rules: Path | None = None) -> dict[str, Any]:
    """One path's result: a rules directory, a .rego module, a tenant, preset or base file (in
    the rules directory it will join), or a test case file."""
    errors: list[PolicyLoadError]
    try:
        if path.is_dir():
            return _check_dir(path, guard)
        if path.suffix == ".rego":
            errors = _check_rego(path)
        elif path.suffix in (".yaml", ".yml"):
            doc = load_yaml(path)
            folder = _policy_folder(path, doc)
            if folder is not None:
                return _check_file(Candidate(path, folder), guard, rules)
            validate(CaseFile, doc)
            errors = []
        else:
            problem = "not a rules directory, a .rego module, a policy file or a test case file"
            raise PolicyLoadError(_where(path), "", problem)
    except PolicySetError as e:
        errors = list(e.errors)
    except PolicyLoadError as e:
        errors = [e]
    if errors:
        return {"ok": False, "errors": _error_dicts(errors), "lines": [str(e) for e in errors]}
    return {"ok": True, "files": [str(path)], "summary": f"ok: {path}"}


def _check_dir(path: Path, guard: AddressGuard | None) -> dict[str, Any]:
    """A rules directory, loaded as the gateway would; one that serves no tenant checked nothing."""
    policy = load_policy_dir(path)
    if not policy.tenants:
        raise PolicyLoadError(_where(path), "", _nothing_checked(path, policy))
    summary = f"ok: {len(policy.files)} files, {len(policy.tenants)} tenants, version {policy.version}"
    return _loaded(policy, guard, summary)


def _nothing_checked(path: Path, policy: PolicySet) -> str:
    """Why a directory that loads but defines no tenant is no rules directory to check."""
    if policy.files:
        return f"no tenant file in {path / 'tenants'}: these rules serve no sandbox"
    problem = "not a rules directory: no base.yaml, presets/ or tenants/ in it"
    if path.name in ("tenants", "presets"):
        problem += f" (a {path.name}/ folder: check the rules directory above it, or one of its files)"
    return problem


def _policy_folder(path: Path, doc: YamlDocument) -> Literal["", "presets", "tenants"] | None:
    """The folder of a rules directory this YAML file belongs in (None: a test case file)."""
    keys = doc.data if isinstance(doc.data, dict) else {}
    if grants_file_tenant(path) is not None or "tenant" in keys:
        return "tenants"
    if "preset" in keys:
        return "presets"
    if path.name == "base.yaml" and not keys.keys() & CaseFile.model_fields.keys():
        return ""
    return None


def _check_file(candidate: Candidate, guard: AddressGuard | None, rules: Path | None) -> dict[str, Any]:
    """A policy file checked in the rules directory it will join, as if it were there already."""
    rules_dir = rules or _rules_dir_of(candidate) or Path("rules")
    if not rules_dir.is_dir():
        problem = (
            f"checked in the rules directory it will join, but {rules_dir} is not a directory: "
            "name that with --rules DIR (or --config)"
        )
        raise PolicyLoadError(_where(candidate.path), "", problem)
    policy = load_policy_dir(rules_dir, candidate=candidate)
    target = candidate.target(rules_dir)
    placed = f"in {rules_dir}" if candidate.in_place(rules_dir) else f"as {target}"
    summary = (
        f"ok: {candidate.path} {placed}: {len(policy.files)} files, "
        f"{len(policy.tenants)} tenants, version {policy.version}"
    )
    return {"file": str(candidate.path), "as": str(target), **_loaded(policy, guard, summary)}


def _rules_dir_of(candidate: Candidate) -> Path | None:
    """The rules directory a policy file is in, if it is in one."""
    folder = candidate.path.absolute().parent
    if candidate.folder and folder.name == candidate.folder:
        return Path(os.path.relpath(folder.parent))
    if not candidate.folder and (folder / "tenants").is_dir():
        return Path(os.path.relpath(folder))
    return None


def _loaded(policy: PolicySet, guard: AddressGuard | None, summary: str) -> dict[str, Any]:
    """The result of a rules directory that loaded: its version, tenants, files and notes."""
    notes = reach_notes(policy, guard.tenant_reachable if guard is not None else None)
    return {
        "ok": True,
        "version": policy.version,
        "tenants": sorted(policy.tenants),
        "files": list(policy.files),
        "notes": [{"level": n.level, "origin": n.origin, "rule_id": n.rule_id, "text": n.text} for n in notes]
        + [{"level": "note", "origin": n.origin, "rule_id": n.field, "text": n.text} for n in policy.notices],
        "summary": summary,
    }


def _check_rego(path: Path) -> list[PolicyLoadError]:
    (module,) = rego_test_modules([path])
    found = [PolicyLoadError(_where(path, p.line, p.column), "", p.message) for p in check_modules([module])]
    for name, _ in module.facts.forbidden:
        found.append(PolicyLoadError(_where(path), "", f"{name} is not allowed in a sandgate policy"))
    return found


def _where(path: Path, line: int | None = None, column: int | None = None) -> SourceLocation:
    return SourceLocation(str(path), line, column)


# --- test ----------------------------------------------------------------------------------


def _test(
    paths: Sequence[Path],
    fmt: str,
    verbose: bool,
    guard: AddressGuard | None = None,
    hosts: Mapping[str, Sequence[str]] | None = None,
) -> int:
    start = time.perf_counter()
    try:
        reports = _collect_tests(paths, guard, hosts or {})
    except PolicySetError as e:
        return _load_failed(fmt, list(e.errors))
    except PolicyLoadError as e:
        return _load_failed(fmt, [e])
    seconds = time.perf_counter() - start
    counts = {k: sum(o.result == k for r in reports for o in r.outcomes) for k in ("pass", "fail", "error")}
    ok = counts["fail"] == 0 and counts["error"] == 0
    if fmt == "json":
        value = {
            "ok": ok,
            "passed": counts["pass"],
            "failed": counts["fail"],
            "errors": counts["error"],
            "seconds": round(seconds, 3),
            "sources": [
                {
                    "source": r.source,
                    "tests": [{"name": o.name, "result": o.result, "detail": o.detail} for o in r.outcomes],
                }
                for r in reports
            ],
        }
        print(json.dumps(value, indent=2))
    else:
        print(_test_text(reports, verbose))
        print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['error']} errors in {seconds:.2f}s")
    return EXIT_OK if ok else EXIT_FAILED


def _collect_tests(
    paths: Sequence[Path], guard: AddressGuard | None, hosts: Mapping[str, Sequence[str]]
) -> list[TestReport]:
    """Rules directories (their Rego tests and tests/*.yaml), case files, and loose Rego
    (files and folders given together run together, like `opa test`). `hosts`: the gateway
    config's resolver.hosts, for names a case file does not list."""
    reports: list[TestReport] = []
    policies: dict[Path, PolicySet] = {}
    loose = [p for p in paths if (p.is_dir() and not _is_rules_dir(p)) or p.suffix == ".rego"]
    if loose:
        reports += _rego_reports(loose, None)
    for path in paths:
        if path in loose:
            continue
        if path.is_dir():
            policy = load_policy_dir(path)
            policies[path.resolve()] = policy
            reports += _rego_reports([path / "rego", path / "tenants", *map(Path, policy.rego_files)], policy)
            for case_file in sorted((path / "tests").glob("*.y*ml")) if (path / "tests").is_dir() else []:
                reports.append(run_case_file(case_file, policies=policies, guard=guard, hosts=hosts))
        else:
            reports.append(run_case_file(path, policies=policies, guard=guard, hosts=hosts))
    return reports


def _rego_reports(paths: Sequence[Path], policy: PolicySet | None) -> list[TestReport]:
    modules: list[RegoModule] = rego_test_modules([p for p in paths if p.exists()])
    data = {"tenants": {}} if policy is None else _tenants_data(policy)
    return run_rego_dir(modules, data)


def _tenants_data(policy: PolicySet) -> dict[str, Any]:
    return {"tenants": {name: dict(t.rego.data) for name, t in policy.tenants.items() if t.rego}}


def _is_rules_dir(path: Path) -> bool:
    markers = (path / "tenants", path / "base.yaml", operator_modules_dir(path))
    return any(m.exists() for m in markers)


def _test_text(reports: Sequence[TestReport], verbose: bool) -> str:
    lines = []
    for r in reports:
        failed = [o for o in r.outcomes if o.result != "pass"]
        status = "FAIL" if failed else "ok"
        lines.append(f"{r.source}: {status} ({len(r.outcomes) - len(failed)}/{len(r.outcomes)} passed)")
        for o in r.outcomes if verbose else failed:
            lines.append(f"  {o.result.upper():5} {o.name}")
            if o.detail:
                lines.append(f"        {o.detail}")
    return "\n".join(lines)


def _load_failed(fmt: str, errors: list[PolicyLoadError]) -> int:
    if fmt == "json":
        print(json.dumps({"ok": False, "errors": _error_dicts(errors)}, indent=2))
    else:
        print("\n".join(str(e) for e in errors), file=sys.stderr)
    return EXIT_USAGE


# --- explain -------------------------------------------------------------------------------


def _explain(args: argparse.Namespace) -> int:
    try:
        policy = load_policy_dir(args.rules)
        # Where the tenants' credentials are bound: the credentials step, and Rego's input.
        bindings = PolicyCredentials(policy)
    except PolicySetError as e:
        return _load_failed(args.format, list(e.errors))
    identity = _explain_identity(policy, args.tenant, args.sandbox)
    if isinstance(identity, str):
        print(f"sandgate: {identity}", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = _gateway_config(args.config)
    except ConfigError as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.method.upper() == "DNS":
        return _explain_dns(args, policy, identity)
    try:
        headers = [_header(h) for h in args.header]
        target = args.url if args.method.upper() != "CONNECT" else args.url.removeprefix("https://")
        request = parse_request(f"{args.method} {target}", headers=headers, body_size=args.body_size)
        resolver = _resolver(args.resolve, config.resolver if config is not None else None)
    except ValueError as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.client:
        request = replace(request, client=args.client)
    guard = _operator_guard(config)
    engine = make_engine("embedded", cache_size=0)
    # The gateway's own name, as a gateway with this config (or with none) answers it.
    reserved = (config or GatewayConfig()).approvals.endpoint_name
    result = asyncio.run(
        explain(policy, identity, request, resolver, guard, engine, reserved=reserved, bindings=bindings)
    )
    _print_explanation(result, args, identity)
    return EXIT_OK if result.decision.allowed else EXIT_FAILED


def _explain_dns(args: argparse.Namespace, policy: PolicySet, identity: Identity) -> int:
    """`policy explain DNS NAME`: the DNS listener's decision for a guest's query of NAME."""
    try:
        name = normalise_host(args.url.rstrip("."))
    except HostError as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_USAGE
    result = asyncio.run(explain_name(policy, identity, name))
    _print_explanation(result, args, identity)
    return EXIT_OK if result.decision.allowed else EXIT_FAILED


def _print_explanation(result: Explanation, args: argparse.Namespace, identity: Identity) -> None:
    if args.format == "json":
        print(json.dumps(_explain_json(result, args), indent=2))
    else:
        print(_explain_text(result, args, identity))


def _explain_identity(policy: PolicySet, tenant: str | None, sandbox: str | None) -> Identity | str:
    if sandbox:
        record = policy.sandboxes.get(sandbox)
        if record is None:
            return f"sandbox {sandbox!r} is not registered in the rules"
        if tenant and tenant != record.tenant:
            return f"sandbox {sandbox!r} belongs to tenant {record.tenant!r}, not {tenant!r}"
        return Identity(record.tenant, record.sandbox)
    if not tenant:
        return "name a --tenant or a --sandbox"
    return Identity(tenant, "explain")


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise ValueError(f"-H {text!r}: a header is 'Name: value'")
    return name.strip(), value.strip()


def _resolver(entries: Sequence[str], gateway: ResolverConfig | None) -> Resolver:
    """`--resolve HOST=IP` first, then the gateway config's resolver (its static hosts, then its
    nameservers or the system's), or without --config the system's."""
    hosts: dict[str, list[str]] = {}
    for entry in entries:
        host, sep, ip = entry.partition("=")
        if not sep or not host or not ip:
            raise ValueError(f"--resolve {entry!r}: expected HOST=IP")
        hosts.setdefault(host.lower().rstrip("."), []).append(ip)
    base = build_resolver(gateway) if gateway is not None else SystemResolver()
    return ChainResolver(StaticResolver(hosts), base) if hosts else base


def _explain_json(result: Explanation, args: argparse.Namespace) -> dict[str, Any]:
    d = result.decision
    value: dict[str, Any] = {
        "decision": d.verdict,
        "reason": d.reason.value,
        "rule_id": d.rule_id,
        "policy_version": d.policy_version,
        "mode": d.mode.value,
        "address": d.address,
        "inspect": d.inspect,
        "detail": d.detail,
        "refused": [r.as_dict() for r in d.refused],
        "request": f"{args.method.upper()} {args.url}",
        "steps": [s.as_dict() for s in result.steps],
    }
    if result.rego is not None:
        v = result.rego.verdict
        value["rego"] = {
            "modules": list(result.rego.modules),
            "input": dict(result.rego.input),
            "verdict": {"allow": v.allowed, "reason": v.reason.value, "message": v.message, "fault": v.fault},
        }
    return value


def _explain_text(result: Explanation, args: argparse.Namespace, identity: Identity) -> str:
    d = result.decision
    lines = [f"{d.verdict}: {d.reason.value}"]
    lines.append(f"  request  {args.method.upper()} {args.url}")
    lines.append(f"  who      tenant {identity.tenant}, sandbox {identity.sandbox}")
    lines.append(f"  policy   version {d.policy_version}, mode {d.mode.value}")
    if d.rule_id:
        lines.append(f"  rule     {d.rule_id}")
    if d.detail:
        lines.append(f"  detail   {d.detail}")
    lines.append("steps")
    for s in result.steps:
        where = ""
        if s.rule_id:
            where = f" [{s.rule_id}" + (f" at {s.origin}" if s.origin else "") + "]"
        lines.append(f"  {s.number} {s.name:<13} {s.outcome:<11} {s.detail}{where}".rstrip())
        # One address is said in the step's line; several, or a refusal of them all, get a line each.
        resolve_denied = s.name is StepName.RESOLVE and s.outcome is Outcome.DENY
        listed = s.addresses if len(s.addresses) > 1 or resolve_denied else ()
        for a in listed:
            lines.append(f"{'':28}{a.address:<15} {a.result}" + (f": {a.why}" if a.why else ""))
    if result.rego is not None:
        lines.append("rego modules")
        lines += [f"  {m}" for m in result.rego.modules]
        lines.append("rego input")
        shown = json.dumps(result.rego.input, indent=2, sort_keys=True)
        lines += ["  " + line for line in shown.splitlines()]
    return "\n".join(lines)


# --- push ----------------------------------------------------------------------------------


def _push(args: argparse.Namespace) -> int:
    try:
        policy = load_policy_dir(args.rules_dir)
    except PolicySetError as e:
        return _load_failed(args.format, list(e.errors))
    token = os.environ.get(args.token_env) if args.token_env else None
    if args.token_env and not token:
        print(f"sandgate: environment variable {args.token_env} is not set", file=sys.stderr)
        return EXIT_USAGE
    modules = _push_order(policy, args.rules_dir)
    data = _tenants_data(policy)["tenants"]
    try:
        ids, removed = asyncio.run(
            _push_async(
                args.url, token, args.timeout, modules, data, prune=not args.keep, root=args.rules_dir
            )
        )
    except EngineError as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:
        # The client's errors carry OPA's message (a compile error in a module); never a token.
        print(f"sandgate: the OPA server refused the push: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    value = {"ok": True, "url": args.url, "modules": ids, "removed": removed, "tenants": sorted(data)}
    text = f"pushed {len(ids)} modules and data for {len(data)} tenants to {args.url}"
    if removed:
        text += f"; removed {len(removed)} stale modules"
    _emit(args.format, value, text)
    return EXIT_OK


def _push_order(policy: PolicySet, rules_dir: Path) -> list[RegoModule]:
    """The operator's modules, then the library under rules/rego/, then tenants' modules."""
    seen: dict[str, RegoModule] = {}
    for t in sorted(policy.tenants.values(), key=lambda t: t.name):
        for m in t.rego.modules if t.rego else ():
            seen.setdefault(m.path, m)
    library = Path(os.path.abspath(operator_modules_dir(rules_dir)))

    def rank(m: RegoModule) -> tuple[int, str]:
        if m.operator:
            return (0, m.path)
        return (1 if Path(os.path.abspath(m.path)).is_relative_to(library) else 2, m.path)

    return sorted(seen.values(), key=rank)


async def _push_async(
    url: str,
    token: str | None,
    seconds: float,
    modules: list[RegoModule],
    data: dict[str, Any],
    *,
    prune: bool,
    root: Path,
) -> tuple[list[str], list[str]]:
    engine = OpaEngine(url, timeout=seconds, token=token)
    try:
        return await engine.push(modules, data, prune=prune, root=str(root))
    finally:
        await engine.close()
