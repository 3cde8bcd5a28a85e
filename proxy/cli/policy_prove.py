"""`sandgate policy prove [--ceiling FILE] [--config FILE] [PATH...]`: any request a tenant's rules allow that
the operator's ceiling does not, as counter-examples.

Exit codes: 0 every rule is inside the ceiling, 1 something is outside (or could not be
decided), 2 bad input (a ceiling or policy that does not load).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sandgate.policy.ceiling import Proof, effective_rules, load_ceiling, prove_tenants
from sandgate.policy.errors import PolicyLoadError, PolicySetError
from sandgate.policy.model.loader import load_policy_dir
from sandgate.proxy.config import load_config
from sandgate.proxy.errors import ConfigError

__all__ = ["run_prove"]

EXIT_OK, EXIT_OUTSIDE, EXIT_USAGE = 0, 1, 2
DEFAULT_CEILING = "ceiling.yaml"


def run_prove(args: argparse.Namespace) -> int:
    """Prove each rules directory against its ceiling; the worst exit code wins."""
    as_json = args.format == "json"
    try:
        # With --config and no path, the rules that gateway serves (not ./rules), as `policy check`.
        default = load_config(args.config).rules_path if args.config else Path("rules")
    except ConfigError as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_USAGE
    results = [_prove_one(path, args.ceiling, as_json) for path in args.paths or [default]]
    if as_json:
        docs = [doc for doc, _ in results]
        print(json.dumps(docs[0] if len(docs) == 1 else {"results": docs}, indent=2))
    return max(code for _, code in results)


def _prove_one(rules: Path, ceiling_path: Path | None, fmt_json: bool) -> tuple[dict[str, Any], int]:
    ceiling_file = ceiling_path or rules / DEFAULT_CEILING
    if not ceiling_file.is_file():
        problem = f"no ceiling at {ceiling_file}: see rules/ceiling.example.yaml, or give --ceiling"
        return _bad(rules, [problem], fmt_json)
    try:
        ceiling = load_ceiling(ceiling_file)
        policy = load_policy_dir(rules)
        tenants = effective_rules(policy)
    except PolicySetError as e:
        return _bad(rules, [str(x) for x in e.errors], fmt_json)
    except PolicyLoadError as e:
        return _bad(rules, [str(e)], fmt_json)
    proof = prove_tenants(tenants, ceiling)
    if not fmt_json:
        _print(proof, rules)
    doc: dict[str, Any] = {"rules_dir": str(rules), **proof.as_dict()}
    return doc, EXIT_OK if proof.inside else EXIT_OUTSIDE


def _bad(rules: Path, lines: list[str], fmt_json: bool) -> tuple[dict[str, Any], int]:
    if not fmt_json:
        for line in lines:
            print(f"sandgate: {line}", file=sys.stderr)
    return {"rules_dir": str(rules), "ok": False, "errors": lines}, EXIT_USAGE


def _print(proof: Proof, rules: Path) -> None:
    for e in proof.excesses:
        if e.example is not None:
            example = f"e.g. {e.example}" + (f" with {e.message}" if e.message is not None else "")
        elif e.message is not None:
            example = f"e.g. {e.message}"
        else:
            example = f"e.g. a DNS lookup of {e.lookup}" if e.lookup is not None else "not decided"
        print(f"{e.origin}: tenant {e.tenant}: {e.rule_id} allows requests outside the ceiling: {example}")
        if e.why:
            print(f"  {e.why}")
    for note in proof.notes:
        print(f"note: {note}")
    counted = f"{_n(proof.rules, 'rule')} of {_n(proof.tenants, 'tenant')} in {rules}"
    if proof.inside:
        print(f"inside: {counted} stay inside {proof.ceiling}")
    else:
        print(f"outside: {len(proof.excesses)} of {counted} go outside {proof.ceiling}")


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
