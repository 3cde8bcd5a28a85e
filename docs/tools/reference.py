"""Write the manual's reference pages from the code: `.venv/bin/python docs/tools/reference.py`.

- docs/reference/policy-file.md: the policy files' pydantic models (tenant, preset, base,
  grants, ceiling and test case files, and the Rego input document);
- docs/reference/gateway-config.md: `GatewayConfig` and its sections (sandgate.proxy.config);
- docs/reference/cli.md: the `sandgate` argparse tree and the exit-code contract;
- docs/reference/reason-codes.md: the reason codes and their meanings (sandgate.policy.reasons).

`--out DIR` writes them elsewhere; `--check` writes nothing and exits 1 with a diff when the
committed pages differ from what the code gives (tests/docs/test_reference_drift.py runs it).
The output depends on nothing but the code: no time, no environment, no terminal width.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from cli_reference import cli_page
from model_reference import Root, models_page

from sandgate.policy import reasons
from sandgate.policy.ceiling.model import CeilingFile
from sandgate.policy.model.grants import GrantsFile
from sandgate.policy.model.tenant import BaseFile, PresetFile, TenantFile
from sandgate.policy.policytests import CaseFile
from sandgate.policy.rego.input_document import InputDocument
from sandgate.proxy import config
from sandgate.proxy.cli import main as cli_main
from sandgate.proxy.cli.parser import build_parser

__all__ = ["PAGES", "main"]

DOCS = Path(__file__).resolve().parents[1]
OUT = DOCS / "reference"
COMMAND = ".venv/bin/python docs/tools/reference.py"

_GENERATED = (
    "Generated from {source} by `{command}`; `tests/docs/test_reference_drift.py` fails when it no "
    "longer matches the code, so change the code (its descriptions and docstrings), not this page."
)


def policy_file_page() -> str:
    """The policy files, each kind with the models under it."""
    roots = [
        Root(
            TenantFile,
            "Tenant file",
            "tenant-file",
            "`rules/tenants/<tenant>.yaml`, one tenant per file. "
            "`sandgate policy schema` prints its JSON Schema, for editors.",
        ),
        Root(
            PresetFile,
            "Preset file",
            "preset-file",
            "`rules/presets/<preset>.yaml`, named by a tenant's `include`.",
        ),
        Root(
            BaseFile, "Base file", "base-file", "`rules/base.yaml`, the operator's; one per rules directory."
        ),
        Root(
            GrantsFile,
            "Grants file",
            "grants-file",
            "`rules/tenants/<tenant>.grants.yaml`, written by the gateway when an approval grants "
            "with scope `tenant`; review it like code.",
        ),
        Root(
            CeilingFile,
            "Ceiling file",
            "ceiling-file",
            "`rules/ceiling.yaml` (or `approvals.ceiling`), read by `sandgate policy prove` and "
            "by automatic approval.",
        ),
        Root(
            CaseFile,
            "Test case file",
            "test-case-file",
            "`rules/tests/*.yaml`, run by `sandgate policy test`.",
        ),
        Root(
            InputDocument,
            "Rego input document",
            "rego-input-document",
            "What a tenant's Rego reads as `input` in `data.sandgate.decision`; not a file. "
            "`sandgate policy schema --input` prints its JSON Schema.",
        ),
    ]
    intro = _GENERATED.format(source="the pydantic models in `policy/`", command=COMMAND)
    intro += (
        "\n\nEvery key not listed is refused (`file:line:column: field: problem`); every key "
        "not marked required may be left out. Types are those of the JSON Schema."
    )
    return models_page(
        "Policy file reference",
        intro,
        roots,
        section_title=lambda name, path: name,
        section_anchor=lambda name, path: _kebab(name),
        sub_level=3,
        show_where=True,
    )


def gateway_config_page() -> str:
    """`sandgate run --config FILE`: every section of GatewayConfig."""
    intro = _GENERATED.format(source="`GatewayConfig` in `proxy/config.py`", command=COMMAND)
    intro += "\n\n" + _first_paragraphs(config.__doc__ or "")
    intro += (
        "\n\nEvery key is optional; a key not listed is refused. Defaults are as on a machine "
        "without `$SANDGATE_HOME`."
    )
    root = Root(config.GatewayConfig, "Top level", "top-level")
    return models_page(
        "Gateway config reference",
        intro,
        [root],
        section_title=lambda name, path: f"`{path}`",
        section_anchor=lambda name, path: path.replace("[]", "").replace(".*", "").replace(".", "-"),
        sub_level=2,
        show_where=False,
    )


def cli_reference_page() -> str:
    """Every `sandgate` command, and the exit codes scripts rely on."""
    intro = _GENERATED.format(source="the argparse tree in `proxy/cli/parser.py`", command=COMMAND)
    intro += "\n\nEvery command also takes `-h`/`--help`."
    reason_codes = frozenset(r.value for r in reasons.Reason)
    return cli_page(
        build_parser(),
        intro,
        _exit_codes(cli_main.__doc__ or ""),
        {reason_codes: "[reason codes](reason-codes.md)"},
    )


def reason_codes_page() -> str:
    """The one enum of reason codes, each with its meaning and HTTP statuses."""
    intro = _GENERATED.format(source="`MEANINGS` in `policy/reasons.py`", command=COMMAND)
    lead = inspect.cleandoc(reasons.Reason.__doc__ or "")
    first = inspect.cleandoc(reasons.__doc__ or "").split("\n\n")[0]
    return "\n".join(
        ["# Reason codes", "", intro, "", " ".join(first.split()), lead, "", reasons.markdown_table(), ""]
    )


PAGES: Mapping[str, Callable[[], str]] = {
    "policy-file.md": policy_file_page,
    "gateway-config.md": gateway_config_page,
    "cli.md": cli_reference_page,
    "reason-codes.md": reason_codes_page,
}


def _exit_codes(doc: str) -> str:
    """The paragraph of sandgate.proxy.cli.main's docstring that states the exit codes."""
    for paragraph in inspect.cleandoc(doc).split("\n\n"):
        if paragraph.startswith("Exit codes:"):
            return "Every command exits with " + " ".join(paragraph.removeprefix("Exit codes:").split())
    raise SystemExit("sandgate.proxy.cli.main's docstring no longer states the exit codes")


def _first_paragraphs(doc: str) -> str:
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs[1:])


def _kebab(name: str) -> str:
    """`SandboxEntry` → `sandbox-entry`, `OAuth2Inject` → `oauth2-inject`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name).lower()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write (or check) the generated reference pages.")
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder to write to (default {OUT})")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 with a diff when a page in --out differs"
    )
    args = parser.parse_args(argv)
    stale = []
    for name, render in PAGES.items():
        text = render()
        path: Path = args.out / name
        old = path.read_text() if path.exists() else ""
        if args.check:
            if old != text:
                stale.append(name)
                sys.stdout.writelines(
                    difflib.unified_diff(
                        old.splitlines(keepends=True),
                        text.splitlines(keepends=True),
                        f"{path} (committed)",
                        f"{path} (from the code)",
                    )
                )
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if old != text:
            path.write_text(text)
    if stale:
        print(f"\n{', '.join(stale)} no longer match the code: run `{COMMAND}` and commit the result")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
