"""Tests for the Rego part of loading a rules directory (sandgate.policy.model.rego_loader, rego_compile)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from sandgate.policy.errors import PolicyError, PolicyLoadError, PolicySetError
from sandgate.policy.model.loader import load_policy_dir, policy_files
from sandgate.policy.rego import compiler as rego_compile
from sandgate.policy.rego.compiler import sample_inputs
from sandgate.policy.rego.engine import make_engine
from sandgate.policy.rego.protocol import RegoQuery

DATA = Path(__file__).parents[2] / "data" / "rego"
GOOD = DATA / "good"
BROKEN = DATA / "broken"
REPO_REGO = Path(__file__).parents[3] / "rules" / "rego"


def rules_with(tmp_path: Path, tenants: dict[str, str]) -> Path:
    """A rules directory with the shipped Rego and the given tenants/ files."""
    shutil.copytree(REPO_REGO, tmp_path / "rego")
    (tmp_path / "tenants").mkdir(parents=True)
    for name, text in tenants.items():
        (tmp_path / "tenants" / name).write_text(text)
    return tmp_path


def load_errors(rules_dir: Path) -> list[PolicyLoadError]:
    with pytest.raises(PolicySetError) as info:
        load_policy_dir(rules_dir)
    return list(info.value.errors)


TENANT = "tenant: t\nallow:\n  - hosts: [api.example.com]\nrego: [t.rego]\n"
MODULE = 'package sandgate.tenants.t\n\nimport rego.v1\n\ndeny contains "no deletes" if input.request.method == "DELETE"\n'


def test_the_good_fixture_loads_with_a_program_for_tenants_with_rego_only() -> None:
    policy = load_policy_dir(GOOD)
    acme, plain, trial = (policy.tenants[n] for n in ("acme", "plain", "trial"))
    assert plain.rego is None
    assert acme.rego is not None and trial.rego is not None
    assert [Path(m.path).name for m in acme.rego.modules] == [
        "sandgate.rego",
        "acme.rego",
        "methods.rego",
        "body_size.rego",
    ]
    assert acme.rego.modules[0].operator and not acme.rego.modules[1].operator
    assert acme.rego.data["methods"] == {"pypi.org": ["GET", "HEAD"]}
    assert acme.rego.bundle_file is not None and Path(acme.rego.bundle_file).is_file()
    assert acme.rego.deterministic
    assert acme.rego.reads_request
    assert str(GOOD / "tenants" / "acme.rego") in policy.rego_files
    assert set(policy.rego_files) <= set(policy.files)


def test_the_input_fields_a_program_reads_come_from_all_its_modules() -> None:
    acme = load_policy_dir(GOOD).tenants["acme"].rego
    assert acme is not None and acme.input_paths is not None
    assert acme.input_paths == {
        ("tenant",),
        ("version",),
        ("phase",),
        ("dest", "host"),
        ("request", "method"),
        ("request", "path"),
        ("request", "body_size"),
        ("request", "headers", "x-debug-token"),
    }


BROKEN_CASES = [
    ("syntax", "tenants/t.rego", 6, 23, "", "Invalid boolean operator"),
    (
        "wrong-package",
        "tenants/t.rego",
        2,
        1,
        "package",
        "a tenant's module must be in package sandgate.tenants.t (or below it), not sandgate",
    ),
    (
        "other-tenant-package",
        "tenants/t.rego",
        1,
        1,
        "package",
        "package sandgate.tenants[\"someone-else\"] belongs to tenant 'someone-else'; this tenant's is sandgate.tenants.t",
    ),
    ("missing-module", "tenants/t.yaml", 6, 5, "rego.1", "cannot read: "),
    ("forbidden-builtin", "tenants/t.rego", 7, 2, "", "http.send is not allowed in a sandgate policy"),
    ("bad-data", "tenants/t.yaml", 5, 3, "data.since", "a date is not a JSON value; quote it"),
    ("compiler-crash", "tenants/t.yaml", 4, 1, "rego", "the Rego compiler crashed on this policy"),
    (
        "runtime-error",
        "tenants/t.yaml",
        4,
        1,
        "rego",
        "the decision fails on a sample connect request: Function not found: no_such_function",
    ),
]


@pytest.mark.parametrize(
    ("case", "file", "line", "column", "field", "problem"),
    BROKEN_CASES,
    ids=[
        "a syntax error is reported at its line and column",
        "a tenant module outside the tenant's package is refused",
        "a module in another tenant's package is refused",
        "a module file that cannot be read is reported at its rego: entry",
        "a builtin that reaches the network is refused where it is called",
        "data that is not JSON is refused at its key",
        "a module that crashes the compiler is reported, and the gateway lives on",
        "an unknown function is found by running sample requests",
    ],
)
def test_broken_rego_is_reported_with_its_position(
    case: str, file: str, line: int, column: int, field: str, problem: str
) -> None:
    rules_dir = BROKEN / case
    first = load_errors(rules_dir)[0]
    assert Path(first.location.file) == rules_dir / file
    assert (first.location.line, first.location.column) == (line, column)
    assert first.field == field
    assert first.problem.startswith(problem)


def test_rego_errors_are_reported_with_yaml_errors(tmp_path: Path) -> None:
    rules_with(
        tmp_path,
        {
            "t.yaml": TENANT,
            "t.rego": "package sandgate.tenants.t\n\ndeny contains x if {\n",
            "u.yaml": "tenant: u\nalow: []\n",
        },
    )
    problems = {(Path(e.location.file).name, e.field) for e in load_errors(tmp_path)}
    assert ("u.yaml", "alow") in problems
    assert any(name == "t.rego" for name, _ in problems)


def test_a_test_module_is_refused_in_rego(tmp_path: Path) -> None:
    rules_with(tmp_path, {"t.yaml": TENANT.replace("t.rego", "t_test.rego")})
    (error,) = load_errors(tmp_path)
    assert error.field == "rego.0"
    assert "is a test module" in error.problem


def test_a_tenant_with_data_only_gets_the_operator_modules(tmp_path: Path) -> None:
    rules_with(tmp_path, {"t.yaml": "tenant: t\nallow:\n  - hosts: [a.example.com]\ndata: {k: 1}\n"})
    program = load_policy_dir(tmp_path).tenants["t"].rego
    assert program is not None
    assert all(m.operator for m in program.modules)
    assert program.data == {"k": 1}


def test_without_rego_files_no_compiler_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_worker(*args: object, **kwargs: object) -> None:
        raise AssertionError("the compiler must not run for tenants without Rego")

    monkeypatch.setattr(rego_compile, "_worker", no_worker)
    (tmp_path / "tenants").mkdir()
    (tmp_path / "tenants" / "t.yaml").write_text("tenant: t\nallow:\n  - hosts: [a.example.com]\n")
    assert load_policy_dir(tmp_path).tenants["t"].rego is None


def test_an_unchanged_program_is_not_compiled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rules_with(tmp_path, {"t.yaml": TENANT, "t.rego": MODULE})
    first = load_policy_dir(tmp_path)
    calls: list[object] = []
    real = rego_compile._worker

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rego_compile, "_worker", counting)
    again = load_policy_dir(tmp_path)
    assert calls == []
    assert again.version == first.version
    (tmp_path / "tenants" / "t.rego").write_text(MODULE.replace("DELETE", "PUT"))
    changed = load_policy_dir(tmp_path)
    assert len(calls) == 1
    assert changed.version != first.version


def test_the_version_changes_with_tenant_data(tmp_path: Path) -> None:
    rules_with(tmp_path, {"t.yaml": TENANT + "data: {k: 1}\n", "t.rego": MODULE})
    first = load_policy_dir(tmp_path).version
    (tmp_path / "tenants" / "t.yaml").write_text(TENANT + "data: {k: 2}\n")
    assert load_policy_dir(tmp_path).version != first


def test_rego_files_in_the_rules_directory_are_watched(tmp_path: Path) -> None:
    rules_with(tmp_path, {"t.yaml": TENANT, "t.rego": MODULE})
    watched = {p.relative_to(tmp_path).as_posix() for p in policy_files(tmp_path)}
    assert {"tenants/t.yaml", "tenants/t.rego", "rego/sandgate.rego", "rego/examples/methods.rego"} <= watched


def test_a_broken_reload_raises_and_the_old_policy_still_evaluates(tmp_path: Path) -> None:
    rules_with(tmp_path, {"t.yaml": TENANT, "t.rego": MODULE})
    old = load_policy_dir(tmp_path)
    (tmp_path / "tenants" / "t.rego").write_text("package sandgate.tenants.t\n\ndeny contains x if {\n")
    with pytest.raises(PolicySetError):
        load_policy_dir(tmp_path)
    # A good reload prunes the compile cache; the old policy keeps its own bundle alive.
    (tmp_path / "tenants" / "t.rego").write_text(MODULE.replace("DELETE", "PATCH"))
    new = load_policy_dir(tmp_path)
    assert new.version != old.version
    program = old.tenants["t"].rego
    assert program is not None
    engine = make_engine("embedded", cache_size=0)
    doc = sample_inputs("t")[1] | {"request": {**sample_inputs("t")[1]["request"], "method": "DELETE"}}
    verdict = asyncio.run(engine.evaluate(RegoQuery(program, doc)))
    assert (verdict.allowed, verdict.message) == (False, "no deletes")


def test_shipped_rules_still_load() -> None:
    policy = load_policy_dir(Path(__file__).parents[3] / "rules")
    assert all(t.rego is None for t in policy.tenants.values())


def test_a_private_store_keeps_two_generations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rego_compile, "_store", None)
    rules_with(tmp_path, {"t.yaml": TENANT, "t.rego": MODULE})
    files = []
    for method in ("DELETE", "PUT", "PATCH"):
        (tmp_path / "tenants" / "t.rego").write_text(MODULE.replace("DELETE", method))
        program = load_policy_dir(tmp_path).tenants["t"].rego
        assert program is not None and program.bundle_file is not None
        files.append(Path(program.bundle_file))
    assert [f.is_file() for f in files] == [False, True, True]


def test_a_shared_store_outlives_the_process_and_must_be_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rego_compile, "_store", None)
    store = tmp_path / "store"
    rego_compile.use_store(store)
    assert store.stat().st_mode & 0o777 == 0o700
    rules = rules_with(tmp_path / "rules", {"t.yaml": TENANT, "t.rego": MODULE})
    program = load_policy_dir(rules).tenants["t"].rego
    assert program is not None and Path(program.bundle_file or "").parent == store
    store.chmod(0o777)
    with pytest.raises(PolicyError, match="not writable by others"):
        rego_compile.use_store(store)
