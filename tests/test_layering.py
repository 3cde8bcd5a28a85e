"""Layering as code: the import contracts in pyproject.toml ([tool.importlinter]: pure packages,
proxy's layers) and no import cycle between modules, checked on the tree and shown failing on
deliberate violations.

Both checks read the import graph grimp builds (import-linter's graph), with imports under
`if TYPE_CHECKING:` left out: they never run, so they cannot make a cycle at import time.
"""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "policy", "brokers")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# Prints each import cycle between modules (the strongly connected components of the graph),
# one import per line, and exits 1 when there is one. Run in a subprocess so that PYTHONPATH
# decides which tree `sandgate` is.
CYCLES = """
import sys
import grimp

graph = grimp.build_graph(
    "sandgate.proxy", "sandgate.policy", "sandgate.brokers",
    exclude_type_checking_imports=True, cache_dir=None,
)
index, low, stack, on_stack, cycles = {}, {}, [], set(), []

def visit(start):
    # Tarjan's algorithm, iterative: the graph is deeper than it is wide.
    work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
    index[start] = low[start] = len(index)
    stack.append(start); on_stack.add(start)
    while work:
        node, children = work[-1]
        child = next(children, None)
        if child is not None:
            if child not in index:
                index[child] = low[child] = len(index)
                stack.append(child); on_stack.add(child)
                work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
            continue
        work.pop()
        if work:
            low[work[-1][0]] = min(low[work[-1][0]], low[node])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop(); on_stack.discard(member); component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(component)

for module in sorted(graph.modules):
    if module not in index:
        visit(module)
for component in cycles:
    print("cycle:")
    for importer in sorted(component):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & component):
            lines = sorted(d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported))
            print(f"  {importer} -> {imported} (l.{','.join(map(str, lines))})")
sys.exit(1 if cycles else 0)
"""


def _run(argv: list[str], tree: Path | None) -> subprocess.CompletedProcess[str]:
    """Run a check on the installed tree (None) or on a copy laid out as `tree/sandgate/...`."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return subprocess.run(
        argv, cwd=tree or ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def lint_imports(tree: Path | None = None) -> subprocess.CompletedProcess[str]:
    return _run([str(LINT_IMPORTS), "--no-cache"], tree)


def module_cycles(tree: Path | None = None) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-c", CYCLES], tree)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the packages as the `sandgate` namespace, with the project's pyproject.toml."""
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / "sandgate" / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def add_line(tree: Path, module: str, line: str) -> None:
    """Append a top-level line to a module of the copy, e.g. `policy/hosts.py`."""
    path = tree / "sandgate" / module
    path.write_text(path.read_text() + "\n" + line + "\n")


def test_the_import_contracts_hold() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
    assert "proxy sub-packages import only downwards KEPT" in result.stdout


def test_no_module_is_in_an_import_cycle() -> None:
    result = module_cycles()
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_checks_read_the_copy_not_the_installed_tree(tree: Path) -> None:
    # Without this, the violation tests below could pass against the wrong tree.
    probe = _run([sys.executable, "-c", "import sandgate.policy; print(sandgate.policy.__file__)"], tree)
    assert probe.stdout.strip() == str(tree / "sandgate" / "policy" / "__init__.py")
    assert lint_imports(tree).returncode == 0
    assert module_cycles(tree).returncode == 0


@pytest.mark.parametrize(
    ("module", "line", "contract", "offence"),
    [
        (
            "policy/hosts.py",
            "from sandgate.brokers.secret import Secret",
            "policy imports neither brokers nor proxy",
            "sandgate.policy.hosts -> sandgate.brokers.secret",
        ),
        (
            "policy/model/tenant.py",
            "import sandgate.proxy.config",
            "policy imports neither brokers nor proxy",
            "sandgate.policy.model.tenant -> sandgate.proxy.config",
        ),
        (
            "brokers/scrub.py",
            "from sandgate.proxy.errors import ConfigError",
            "brokers does not import proxy",
            "sandgate.brokers.scrub -> sandgate.proxy.errors",
        ),
        (
            "proxy/addons/identify.py",
            "from sandgate.proxy.cli import main",
            "addons and mitm do not import the CLI",
            "sandgate.proxy.addons.identify -> sandgate.proxy.cli.main",
        ),
        (
            "proxy/mitm/closer.py",
            "from sandgate.proxy.cli.status import run",
            "addons and mitm do not import the CLI",
            "sandgate.proxy.mitm.closer -> sandgate.proxy.cli.status",
        ),
        (
            "proxy/addons/request_gate.py",
            "import sandgate.proxy.runtime",
            "proxy sub-packages import only downwards",
            "sandgate.proxy.addons.request_gate -> sandgate.proxy.runtime",
        ),
        (
            "proxy/net/nft.py",
            "from sandgate.proxy.addons.identify import Identify",
            "proxy sub-packages import only downwards",
            "sandgate.proxy.net.nft -> sandgate.proxy.addons.identify",
        ),
        (
            "proxy/config.py",
            "from sandgate.proxy.net.host_table import owner_comment",
            "proxy sub-packages import only downwards",
            "sandgate.proxy.config -> sandgate.proxy.net.host_table",
        ),
    ],
    ids=[
        "policy importing brokers breaks the contract",
        "a policy model importing proxy breaks the contract",
        "brokers importing proxy breaks the contract",
        "an addon importing the CLI breaks the contract",
        "a mitm fix importing the CLI breaks the contract",
        "an addon importing the runtime breaks the proxy layers",
        "host plumbing importing an addon breaks the proxy layers",
        "the config importing host plumbing breaks the proxy layers",
    ],
)
def test_a_forbidden_import_fails_naming_it(
    tree: Path, module: str, line: str, contract: str, offence: str
) -> None:
    add_line(tree, module, line)
    result = lint_imports(tree)
    assert result.returncode != 0
    assert f"{contract} BROKEN" in result.stdout
    assert offence in result.stdout


def test_a_cycle_between_policy_sub_packages_fails_naming_the_dependency(tree: Path) -> None:
    # policy/model reads policy/rego; a rego module reading the model closes a package cycle.
    add_line(tree, "policy/rego/program.py", "from sandgate.policy.model.tenant import Limits")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "no cycle between siblings in policy and brokers BROKEN" in result.stdout
    assert "No cycles are allowed in sandgate.policy." in result.stdout
    assert "- .rego -> .model (1 import)" in result.stdout


def test_an_import_cycle_fails_naming_its_imports(tree: Path) -> None:
    # reasons is imported (indirectly) by decision; make decision's module import back.
    add_line(tree, "policy/reasons.py", "from sandgate.policy.decision import Decision")
    result = module_cycles(tree)
    assert result.returncode == 1
    assert "sandgate.policy.reasons -> sandgate.policy.decision (l." in result.stdout
    assert "sandgate.policy.decision -> sandgate.policy.reasons" in result.stdout


def test_a_cycle_only_under_type_checking_is_not_one(tree: Path) -> None:
    add_line(
        tree,
        "policy/reasons.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sandgate.policy.decision import Decision",
    )
    assert module_cycles(tree).returncode == 0


# What importing a pure package (or one module under it) must not load: the other layers, and
# the heavy engines its surface leaves in their own modules (regopy, the OPA client, dnspython).
NOT_LOADED = {
    "sandgate.policy.model.tenant": ("sandgate.brokers", "sandgate.proxy", "httpx", "regopy", "opa_client"),
    "sandgate.policy": ("sandgate.brokers", "sandgate.proxy", "httpx", "regopy", "opa_client", "dns"),
    "sandgate.policy.model": ("sandgate.brokers", "sandgate.proxy", "httpx", "regopy", "opa_client", "dns"),
    "sandgate.policy.rego": ("sandgate.brokers", "sandgate.proxy", "httpx", "regopy", "opa_client", "dns"),
    "sandgate.brokers": ("sandgate.proxy", "mitmproxy", "regopy", "opa_client"),
}


@pytest.mark.parametrize(
    ("module", "forbidden"),
    list(NOT_LOADED.items()),
    ids=[f"importing {module} loads none of {', '.join(f)}" for module, f in NOT_LOADED.items()],
)
def test_importing_a_pure_package_stays_light(module: str, forbidden: tuple[str, ...]) -> None:
    # A fresh interpreter: in this one, other tests have loaded everything already.
    prefixes = tuple(f"{name}." for name in forbidden)
    check = (
        f"import sys, {module}\n"
        f"loaded = sorted(m for m in sys.modules if m in {forbidden!r} or m.startswith({prefixes!r}))\n"
        "print(loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    result = _run([sys.executable, "-c", check], None)
    assert result.returncode == 0, result.stdout + result.stderr


PROXY_PACKAGES = ["", ".addons", ".admin", ".audit", ".cli", ".fleet", ".mitm", ".net", ".stores"]


@pytest.mark.parametrize(
    "sub", PROXY_PACKAGES, ids=[f"sandgate.proxy{s} names its modules" for s in PROXY_PACKAGES]
)
def test_a_proxy_package_names_each_public_module_in_all(sub: str) -> None:
    package = importlib.import_module(f"sandgate.proxy{sub}")
    folder = Path(package.__file__ or "").parent
    public = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}
    public |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    assert sorted(package.__all__) == sorted(public), f"update __all__ in {folder / '__init__.py'}"


def function_level_imports(path: Path) -> list[tuple[int, bool]]:
    """(line, has a comment above it) for each import inside a function of one module."""
    text = path.read_text()
    lines = text.splitlines()
    found: list[tuple[int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                above = child.lineno - 2
                while above >= 0 and lines[above].strip().startswith(("import ", "from ")):
                    above -= 1
                found.append((child.lineno, above >= 0 and lines[above].strip().startswith("#")))
            nested = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, in_function or nested)

    visit(ast.parse(text), False)
    return found


# Modules outside the CLI that may defer one heavy import, and why.
DEFERRED_IMPORTS = {
    # opa_client brings aiohttp (~0.5 s of CPU per process) for an engine that is off by default.
    Path("policy/rego/opa.py"): "opa_client",
    # graphql-core (~0.14 s per process) for policies with a `graphql:` section only: loaded by
    # such a section, or by the first GraphQL body a policy without one still reads.
    Path("policy/protocols/rules.py"): "graphql_document",
    Path("policy/protocols/graphql_ops.py"): "graphql_document",
}


def test_no_import_hides_inside_a_function() -> None:
    # Factories live in their own modules and import at the top. The CLI alone may defer a
    # heavy import (start-up time of every command), with a comment saying why; so may the
    # modules in DEFERRED_IMPORTS, for the one import named there.
    hidden = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT)
            allowed = where.parts[:2] == ("proxy", "cli") or where in DEFERRED_IMPORTS
            for line, commented in function_level_imports(path):
                text = path.read_text().splitlines()[line - 1]
                named = where not in DEFERRED_IMPORTS or DEFERRED_IMPORTS[where] in text
                if not (allowed and commented and named):
                    hidden.append(f"{where}:{line}")
    assert hidden == []


def test_the_function_level_import_check_finds_one(tmp_path: Path) -> None:
    module = tmp_path / "factory.py"
    module.write_text(
        "import os\n\n"
        "def build() -> None:\n"
        "    from sandgate.policy import reasons\n\n"
        "def lazy() -> None:\n"
        "    # Lazy: the reason why.\n"
        "    import json\n"
        "    import sys\n"
    )
    assert function_level_imports(module) == [(4, False), (8, True), (9, True)]
