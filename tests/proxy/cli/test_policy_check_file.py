"""`sandgate policy check FILE`: a tenant (preset, grants, base) file checked in the rules
directory it will join, nothing copied; and a check that checked nothing is an error (exit 2).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from sandgate.proxy.cli.main import main

REPO = Path(__file__).resolve().parents[3]

ACME = {
    "tenant": "acme",
    "include": ["python-packages"],
    "allow": [{"id": "github", "hosts": ["api.github.com"]}],
    "sandboxes": [{"id": "acme-1", "token": "file:acme-1.token"}],
}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["policy", "check", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    """The shipped rules (base.yaml, presets, the demo tenant) in a folder of their own."""
    root = tmp_path / "rules"
    shutil.copytree(REPO / "rules", root, ignore=shutil.ignore_patterns("*.token", "tests"))
    (root / "tenants" / "demo-1.token").write_text("demo-1-token-0123456789abcdef\n")
    (root / "tenants" / "demo-1.token").chmod(0o600)
    return root


@pytest.fixture
def staged(tmp_path: Path) -> Path:
    """acme.yaml, written outside the rules directory (in review, before it goes live)."""
    path = tmp_path / "review" / "acme.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(ACME, sort_keys=False))
    return path


def test_a_tenant_file_is_checked_in_the_rules_it_will_join(
    capsys: pytest.CaptureFixture[str], rules: Path, staged: Path
) -> None:
    code, out, err = run(capsys, str(staged), "--rules", str(rules), "--format", "json")
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert result["as"] == str(rules / "tenants" / "acme.yaml")
    assert result["tenants"] == ["acme", "demo"], "with the folder's own tenants"
    assert (
        str(staged) in result["files"] and str(rules / "presets" / "python-packages.yaml") in result["files"]
    )
    assert not (rules / "tenants" / "acme.yaml").exists(), "nothing was copied"
    # Its token file is looked for where it will be: in the rules' tenants/ folder.
    assert [n["text"] for n in result["notes"]] == [
        f"token file {rules}/tenants/acme-1.token does not exist yet; sandbox 'acme-1' is off until it does"
    ]
    # The version is the one the gateway serves once the file is there.
    shutil.copy(staged, rules / "tenants" / "acme.yaml")
    code, out, _ = run(capsys, str(rules), "--format", "json")
    assert (code, json.loads(out)["version"]) == (0, result["version"])


def test_a_tenant_file_is_not_read_as_a_test_case_file(
    capsys: pytest.CaptureFixture[str], rules: Path, staged: Path
) -> None:
    staged.write_text("tenant: acme\nalow:\n  - hosts: [api.github.com]\ninclude: [ruby-gems]\n")
    code, out, err = run(capsys, str(staged), "--rules", str(rules))
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"{staged}:2:1: alow: unknown key (did you mean 'allow'?)",
        f"{staged}:4:11: include.0: unknown preset 'ruby-gems' (known: node-packages, python-packages)",
    ]


def test_a_sandbox_id_another_tenant_has_is_the_new_file_s_error(
    capsys: pytest.CaptureFixture[str], rules: Path, staged: Path
) -> None:
    staged.write_text("tenant: acme\nsandboxes:\n  - id: demo-1\n    token: file:acme-1.token\n")
    code, _, err = run(capsys, str(staged), "--rules", str(rules))
    assert code == 2
    assert err == (
        f"{staged}:3:5: sandboxes.0.id: sandbox 'demo-1' is also defined in {rules}/tenants/demo.yaml:15:5 "
        "(tenant 'demo'); this file changed after that one: remove it from one of them\n"
    )


def test_the_file_replaces_the_one_of_its_name(
    capsys: pytest.CaptureFixture[str], rules: Path, staged: Path
) -> None:
    # The live acme.yaml is broken; the new one, which is to replace it, is not.
    (rules / "tenants" / "acme.yaml").write_text("tenant: acme\nallow: [{hots: [x.test]}]\n")
    code, out, err = run(capsys, str(staged), "--rules", str(rules))
    assert (code, err) == (0, "")
    assert out.startswith(f"ok: {staged} as {rules}/tenants/acme.yaml: 5 files, 2 tenants, version ")


def test_its_rego_modules_are_read_from_the_folder_it_will_join(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "tests/data/rego/good", rules, symlinks=False)
    staged = tmp_path / "trial.yaml"
    shutil.copy(rules / "tenants" / "trial.yaml", staged)  # rego: [../rego/examples/methods.rego, trial.rego]
    code, _, err = run(capsys, str(staged), "--rules", str(rules))
    assert (code, err) == (0, ""), err
    staged.write_text(staged.read_text().replace("trial.rego", "trial2.rego"))
    code, _, err = run(capsys, str(staged), "--rules", str(rules))
    assert code == 2
    assert f"rego.1: cannot read: [Errno 2] No such file or directory: '{rules}/tenants/trial2.rego'" in err


@pytest.mark.parametrize(
    "where",
    ["--rules", "--config", "in its rules", "./rules"],
    ids=[
        "--rules names the rules directory",
        "else --config's rules_dir",
        "else the rules directory the file is in",
        "else ./rules",
    ],
)
def test_which_rules_directory_it_joins(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    rules: Path,
    staged: Path,
    where: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    args = [str(staged)]
    if where == "--rules":
        args += ["--rules", str(rules)]
    elif where == "--config":
        (tmp_path / "sandgate.yaml").write_text(f"rules_dir: {rules}\n")
        args += ["--config", str(tmp_path / "sandgate.yaml")]
    elif where == "in its rules":
        staged = rules / "tenants" / "acme.yaml"
        shutil.move(args[0], staged)
        args = [str(staged)]
    else:
        args = ["review/acme.yaml"]
    code, out, err = run(capsys, *args, "--format", "json")
    assert (code, err) == (0, "")
    assert Path(json.loads(out)["as"]).resolve() == rules / "tenants" / "acme.yaml"


def test_a_missing_rules_directory_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, staged: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, str(staged))
    assert (code, out) == (2, "")
    assert err == (
        f"{staged}: checked in the rules directory it will join, but rules is not a directory: "
        "name that with --rules DIR (or --config)\n"
    )


@pytest.mark.parametrize(
    ("kind", "name", "text"),
    [
        ("presets", "python-packages.yaml", "preset: python-packages\nallow:\n  - hosts: [pypi.org]\n"),
        ("tenants", "demo.grants.yaml", "tenant: demo\ngrants: []\n"),
        ("", "base.yaml", "deny:\n  - hosts: [evil.example]\n"),
    ],
    ids=["a preset file", "a grants file", "a base.yaml"],
)
def test_other_policy_files_are_checked_in_place_too(
    capsys: pytest.CaptureFixture[str], rules: Path, tmp_path: Path, kind: str, name: str, text: str
) -> None:
    staged = tmp_path / name
    staged.write_text(text)
    code, out, err = run(capsys, str(staged), "--rules", str(rules), "--format", "json")
    assert (code, err) == (0, ""), err
    assert json.loads(out)["as"] == str(rules / kind / name)


# --- checking nothing ----------------------------------------------------------------------


def test_a_folder_without_policy_files_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, str(tmp_path))
    assert (code, out) == (2, "")
    assert err == f"{tmp_path}: not a rules directory: no base.yaml, presets/ or tenants/ in it\n"


def test_a_tenants_folder_is_pointed_to_its_rules_directory(
    capsys: pytest.CaptureFixture[str], rules: Path
) -> None:
    code, out, err = run(capsys, str(rules / "tenants"))
    assert (code, out) == (2, "")
    assert err.endswith("(a tenants/ folder: check the rules directory above it, or one of its files)\n")


def test_rules_without_a_tenant_serve_nothing_and_are_an_error(
    capsys: pytest.CaptureFixture[str], rules: Path
) -> None:
    shutil.rmtree(rules / "tenants")
    code, out, _ = run(capsys, str(rules), "--format", "json")
    assert code == 2
    assert json.loads(out)["errors"] == [
        {
            "file": str(rules),
            "line": None,
            "column": None,
            "field": "",
            "problem": f"no tenant file in {rules}/tenants: these rules serve no sandbox",
        }
    ]
