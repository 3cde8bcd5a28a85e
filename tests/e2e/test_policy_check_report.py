"""`sandgate policy check` reports every problem of every file, blames a shared sandbox id on
the newcomer naming both files, and notes a tenant named unlike its file (the real CLI)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import SANDGATE

from sandgate.policy.decision import Identity
from sandgate.policy.model.loader import load_policy_dir


def sha(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


DEMO = f"""tenant: demo
sandboxes:
  - id: demo-1
    token: {sha("demo-token-0123456789")}
allow:
  - hosts: [pypi.org]
"""
ACME = f"""tenant: acme
sandboxes:
  - id: acme-1
    token: {sha("acme-token-0123456789")}
allow:
  - hosts: [example.com]
"""
# acme.yaml after an edit that went wrong in many places at once.
ACME_MANY = f"""tenant: acme
sandboxes:
  - id: acme-1
    token: {sha("acme-token-0123456789")}
    tokn: typo
  - id: acme-2
    token: sha256:abc
allw:
  - hosts: [example.com]
include: [no-such-preset]
allow:
  - hosts: [Example.COM]
  - hosts: ["*.com"]
limits:
  requests_per_minute: 0
"""


def check(rules: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, "policy", "check", str(rules), *args], capture_output=True, text=True, timeout=60
    )


def write(rules: Path, name: str, text: str, age: float = 0.0) -> Path:
    """Write a tenant file and date it `age` seconds back (modification times decide blame)."""
    path = rules / "tenants" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    when = path.stat().st_mtime - age
    os.utime(path, (when, when))
    return path


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    root = tmp_path / "rules"
    write(root, "demo.yaml", DEMO, age=3600)
    write(root, "acme.yaml", ACME, age=3600)
    return root


def test_every_problem_of_a_file_with_an_unknown_key_is_reported(rules: Path) -> None:
    write(rules, "acme.yaml", ACME_MANY)
    result = check(rules)
    assert (result.returncode, result.stdout) == (2, "")
    acme = str(rules / "tenants" / "acme.yaml")
    assert result.stderr.splitlines() == [
        f"{acme}:5:5: sandboxes.0.tokn: unknown key (did you mean 'token'?)",
        f"{acme}:7:5: sandboxes.1.token: sha256: needs 64 hex digits",
        f"{acme}:8:1: allw: unknown key (did you mean 'allow'?)",
        f"{acme}:10:11: include.0: unknown preset 'no-such-preset' (known: none)",
        f"{acme}:12:13: allow.0.hosts.0: 'Example.COM' is not in normal form: use 'example.com' instead",
        f"{acme}:13:13: allow.1.hosts.0: '*.com' would allow a whole top-level domain; name the domains instead",
        f"{acme}:15:3: limits.requests_per_minute: Input should be greater than or equal to 1",
    ]


def test_every_file_is_reported_and_json_lists_each_error_with_file_line_and_field(rules: Path) -> None:
    write(rules, "acme.yaml", ACME_MANY)
    write(rules, "demo.yaml", DEMO.replace("allow:", "alow:"))
    result = check(rules, "--format", "json")
    assert result.returncode == 2
    errors = json.loads(result.stdout)["errors"]
    assert [(Path(e["file"]).name, e["line"], e["field"]) for e in errors] == [
        ("acme.yaml", 5, "sandboxes.0.tokn"),
        ("acme.yaml", 7, "sandboxes.1.token"),
        ("acme.yaml", 8, "allw"),
        ("acme.yaml", 10, "include.0"),
        ("acme.yaml", 12, "allow.0.hosts.0"),
        ("acme.yaml", 13, "allow.1.hosts.0"),
        ("acme.yaml", 15, "limits.requests_per_minute"),
        ("demo.yaml", 5, "alow"),
    ]


def test_a_yaml_syntax_error_stops_only_its_own_file(rules: Path) -> None:
    write(rules, "acme.yaml", "tenant: acme\nallow: [\n")
    write(rules, "demo.yaml", DEMO.replace("pypi.org", "PyPI.org"))
    result = check(rules)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 2, lines
    assert "acme.yaml:3:1: invalid YAML" in lines[0]
    assert "demo.yaml:6:13: allow.0.hosts.0: 'PyPI.org' is not in normal form" in lines[1]


def test_a_sandbox_added_to_a_second_file_is_blamed_there_naming_both(rules: Path) -> None:
    # The case: demo-1 added to acme.yaml, demo.yaml untouched.
    edited = ACME.replace("allow:", f"  - id: demo-1\n    token: {sha('other-token-0123456')}\nallow:")
    write(rules, "acme.yaml", edited)
    result = check(rules)
    acme, demo = (str(rules / "tenants" / f) for f in ("acme.yaml", "demo.yaml"))
    assert (result.returncode, result.stderr.splitlines()) == (
        2,
        [
            f"{acme}:5:5: sandboxes.1.id: sandbox 'demo-1' is also defined in {demo}:3:5 (tenant 'demo'); "
            "this file changed after that one: remove it from one of them"
        ],
    )


def test_the_blame_follows_the_file_changed_last_whichever_name_sorts_first(rules: Path) -> None:
    # zeta.yaml sorts after demo.yaml but is the older file: demo.yaml is the newcomer here.
    zeta = DEMO.replace("tenant: demo", "tenant: zeta").replace("pypi.org", "zeta.example")
    write(rules, "zeta.yaml", zeta, age=7200)
    write(rules, "demo.yaml", DEMO)
    result = check(rules)
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"{rules / 'tenants' / 'demo.yaml'}:3:5: sandboxes.0.id: sandbox 'demo-1'")
    assert f"also defined in {rules / 'tenants' / 'zeta.yaml'}:3:5 (tenant 'zeta')" in line


def test_equal_times_blame_the_later_name(rules: Path) -> None:
    zeta = DEMO.replace("tenant: demo", "tenant: zeta").replace("pypi.org", "zeta.example")
    path = write(rules, "zeta.yaml", zeta)
    stamp = path.stat().st_mtime_ns
    os.utime(rules / "tenants" / "demo.yaml", ns=(stamp, stamp))
    (line,) = check(rules).stderr.splitlines()
    assert "zeta.yaml:3:5: sandboxes.0.id: sandbox 'demo-1' is also defined in " in line
    assert "this file comes later by name" in line


def test_a_reload_keeps_a_running_sandbox_with_its_tenant_whatever_the_times(rules: Path) -> None:
    before = load_policy_dir(rules, isolate=True)
    # acme.yaml claims demo-1, and demo.yaml is touched later: demo still owned it before.
    edited = ACME.replace("allow:", f"  - id: demo-1\n    token: {sha('other-token-0123456')}\nallow:")
    write(rules, "acme.yaml", edited, age=60)
    write(rules, "demo.yaml", DEMO + "# touched\n")
    after = load_policy_dir(rules, previous=before, isolate=True)
    assert after.authenticate("demo-1", "demo-token-0123456789") == Identity("demo", "demo-1")
    assert sorted(after.tenants) == ["acme", "demo"]
    (problem,) = after.problems
    assert problem.tenant == "acme" and problem.kept_last_good is True
    assert "is registered to tenant 'demo' now and stays there" in problem.errors[0]
    assert after.authenticate("acme-1", "acme-token-0123456789") == Identity("acme", "acme-1")


def test_a_tenant_named_unlike_its_file_is_noted_and_still_loads(rules: Path) -> None:
    write(rules, "acme.yaml", ACME.replace("tenant: acme", "tenant: acmee"))
    result = check(rules)
    assert result.returncode == 0, result.stderr
    acme = rules / "tenants" / "acme.yaml"
    assert (
        f"{acme}:1:1: note: tenant: tenant 'acmee' is defined in a file named 'acme': "
        "rename one of them so they agree"
    ) in result.stdout.splitlines()
    strict = load_policy_dir(rules)
    assert sorted(strict.tenants) == ["acmee", "demo"]


def test_a_preset_with_a_schema_error_still_reports_its_other_problems_and_takes_no_name(
    rules: Path,
) -> None:
    presets = rules / "presets"
    presets.mkdir()
    (presets / "a-broken.yaml").write_text('preset: web\ndescrption: typo\nallow:\n  - hosts: ["*.org"]\n')
    (presets / "b-good.yaml").write_text("preset: web\nallow:\n  - hosts: [example.org]\n")
    write(rules, "acme.yaml", ACME.replace("allow:", "include: [web]\nallow:"))
    result = check(rules)
    broken = presets / "a-broken.yaml"
    assert result.stderr.splitlines() == [
        f"{broken}:2:1: descrption: unknown key (did you mean 'description'?)",
        f"{broken}:4:13: allow.0.hosts.0: '*.org' would allow a whole top-level domain; "
        "name the domains instead",
    ]
    # The gateway: the good preset keeps its name, and the tenant including it loads.
    policy = load_policy_dir(rules, isolate=True)
    assert sorted(policy.tenants) == ["acme", "demo"]
    assert [p.file for p in policy.problems] == [str(broken)]
