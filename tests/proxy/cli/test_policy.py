"""Golden outputs of `sandgate policy check|test|explain|schema|push`, and their exit codes.

Goldens live in tests/data/policytests/golden/; policy versions and timings are masked.
Regenerate with SANDGATE_UPDATE_GOLDEN=1 after a deliberate change, and read the diff.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from support.opa_server import FakeOpaServer

from sandgate.proxy.cli.main import main

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "tests" / "data" / "policytests" / "golden"
GOOD = "tests/data/rego/good"
BROKEN = "tests/data/rego/broken"
RESOLVE = [
    "--resolve",
    "pypi.org=151.101.0.223",
    "--resolve",
    "api.github.com=140.82.112.6",
    "--resolve",
    "upload.pypi.org=151.101.0.224",
]


def masked(text: str) -> str:
    text = re.sub(r"\b[0-9a-f]{12}\b", "<version>", text)
    text = re.sub(r" in \d+\.\d\ds$", " in <time>s", text, flags=re.MULTILINE)
    return re.sub(r'"seconds": [0-9.]+', '"seconds": "<time>"', text)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["policy", *args])
    out, err = capsys.readouterr()
    return code, masked(out), masked(err)


def golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("SANDGATE_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"output differs from {path.relative_to(REPO)}"


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


# --- check ---------------------------------------------------------------------------------


def test_check_a_good_directory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "check", GOOD)
    assert (code, err) == (0, "")
    golden("check_good", out)


def test_check_a_good_directory_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", GOOD, "--format", "json")
    assert code == 0
    assert json.loads(out)["tenants"] == ["acme", "plain", "trial"]
    golden("check_good_json", out)


BROKEN_CASES = sorted(p.name for p in (REPO / BROKEN).iterdir())


@pytest.mark.parametrize("case", BROKEN_CASES)
def test_check_broken_rego(capsys: pytest.CaptureFixture[str], case: str) -> None:
    code, out, err = run(capsys, "check", f"{BROKEN}/{case}")
    assert (code, out) == (2, "")
    golden(f"check_broken_{case}", err)


@pytest.mark.parametrize("case", ["unknown-key", "many-errors", "yaml-unclosed"])
def test_check_broken_yaml(capsys: pytest.CaptureFixture[str], case: str) -> None:
    code, out, err = run(capsys, "check", f"tests/data/rules/broken/{case}")
    assert (code, out) == (2, "")
    golden(f"check_broken_yaml_{case}", err)


def test_check_broken_rego_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", f"{BROKEN}/syntax", "--format", "json")
    assert code == 2
    assert json.loads(out)["errors"][0] == {
        "file": f"{BROKEN}/syntax/tenants/t.rego",
        "line": 6,
        "column": 23,
        "field": "",
        "problem": "Invalid boolean operator",
    }


def test_check_a_rego_file_and_several_paths(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys,
        "check",
        f"{BROKEN}/syntax/tenants/t.rego",
        "rules/rego/sandgate.rego",
        "tests/data/policytests/failing.yaml",
    )
    assert code == 2
    golden("check_paths", out + "--- stderr\n" + err)


def test_check_refuses_what_is_not_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "check", "README.md")
    assert code == 2
    assert err == "README.md: not a rules directory, a .rego module, a policy file or a test case file\n"


# --- test ----------------------------------------------------------------------------------


def test_test_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "test", GOOD, "tests/data/policytests/passing.yaml", "-v")
    assert (code, err) == (0, "")
    golden("test_pass", out)


def test_test_fails(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "test", "tests/data/policytests/failing.yaml", "tests/data/policytests/rego")
    assert (code, err) == (1, "")
    golden("test_fail", out)


def test_test_fails_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "test", "tests/data/policytests/failing.yaml", "--format", "json")
    assert code == 1
    value = json.loads(out)
    assert (value["ok"], value["passed"], value["failed"], value["errors"]) == (False, 1, 2, 1)
    golden("test_fail_json", out)


def test_test_the_shipped_rules(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "test")
    assert code == 0
    assert out.splitlines()[-1].endswith("0 failed, 0 errors in <time>s")


def test_test_a_broken_directory_is_invalid_input(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "test", f"{BROKEN}/syntax")
    assert (code, out) == (2, "")
    assert err.startswith(f"{BROKEN}/syntax/tenants/t.rego:6:23: Invalid boolean operator")


# --- explain -------------------------------------------------------------------------------

EXPLAIN_CASES = [
    ("allow", ["--tenant", "acme", "GET", "https://pypi.org/simple/"], 0),
    (
        "deny_rego",
        [
            "--sandbox",
            "acme-1",
            "POST",
            "https://api.github.com/repos/evil/x",
            "-H",
            "Authorization: Bearer t0ken",
        ],
        1,
    ),
    ("deny_not_allowed", ["--tenant", "acme", "GET", "https://example.com/"], 1),
    ("deny_base", ["--tenant", "acme", "GET", "http://metadata.google.internal/computeMetadata/v1/"], 1),
    ("deny_port", ["--tenant", "acme", "CONNECT", "pypi.org:8443"], 1),
    ("deny_private", ["--tenant", "plain", "GET", "https://pypi.org/", "--resolve", "pypi.org=10.0.0.1"], 1),
    ("deny_identity", ["--tenant", "nobody", "GET", "https://pypi.org/"], 1),
    ("would_deny", ["--tenant", "trial", "POST", "https://pypi.org/simple/"], 0),
    (
        "body_too_large",
        ["--tenant", "acme", "POST", "https://upload.pypi.org/legacy/", "--body-size", "5000000"],
        1,
    ),
]


@pytest.mark.parametrize(("name", "args", "code"), EXPLAIN_CASES, ids=[c[0] for c in EXPLAIN_CASES])
def test_explain(capsys: pytest.CaptureFixture[str], name: str, args: list[str], code: int) -> None:
    resolve = [] if "--resolve" in args else RESOLVE
    got, out, err = run(capsys, "explain", "--rules", GOOD, *resolve, *args)
    assert (got, err) == (code, "")
    assert "t0ken" not in out
    golden(f"explain_{name}", out)


def test_explain_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "explain",
        "--rules",
        GOOD,
        *RESOLVE,
        "--tenant",
        "acme",
        "--format",
        "json",
        "PUT",
        "https://pypi.org/simple/",
    )
    assert code == 1
    value = json.loads(out)
    assert (value["decision"], value["reason"], value["rule_id"]) == (
        "deny",
        "method_not_allowed",
        "acme/rego",
    )
    assert [s["outcome"] for s in value["steps"]] == ["ok", "skip", "ok", "ok", "ok", "deny"]
    assert value["steps"][3]["origin"] == f"{GOOD}/tenants/acme.yaml:10"
    assert value["rego"]["input"]["request"]["method"] == "PUT"
    golden("explain_json", out)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["GET", "https://pypi.org/"], "sandgate: name a --tenant or a --sandbox\n"),
        (
            ["--sandbox", "nobody-1", "GET", "https://pypi.org/"],
            "sandgate: sandbox 'nobody-1' is not registered in the rules\n",
        ),
        (
            ["--tenant", "acme", "GET", "pypi.org/x"],
            "sandgate: 'pypi.org/x': the URL needs http:// or https:// and a host\n",
        ),
        (
            ["--tenant", "acme", "-H", "nocolon", "GET", "https://pypi.org/"],
            "sandgate: -H 'nocolon': a header is 'Name: value'\n",
        ),
    ],
    ids=["no identity given", "an unknown sandbox", "a URL without a scheme", "a header without a colon"],
)
def test_explain_usage_errors(capsys: pytest.CaptureFixture[str], args: list[str], problem: str) -> None:
    code, _, err = run(capsys, "explain", "--rules", GOOD, *args)
    assert (code, err) == (2, problem)


# --- schema and push -----------------------------------------------------------------------


def test_schema_of_tenant_files_has_rego_and_data(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schema")
    assert code == 0
    props = json.loads(out)["properties"]
    assert {"rego", "data"} <= set(props)


def test_schema_of_the_rego_input(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schema", "--input")
    assert code == 0
    schema = json.loads(out)
    assert schema["title"] == "sandgate Rego input, version 2"
    golden("schema_input", out)


def test_push_uploads_modules_and_data_and_prunes(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeOpaServer() as server:
        server.policies["sandgate/old.rego"] = "package old\n"
        server.policies["theirs"] = "package theirs\n"
        code, out, err = run(capsys, "push", GOOD, "--url", server.url, "--format", "json")
        assert (code, err) == (0, "")
        value = json.loads(out)
        assert value["removed"] == ["sandgate/old.rego"]
        assert value["tenants"] == ["acme", "trial"]
        assert value["modules"][0] == "sandgate/rego/sandgate.rego"
        assert "sandgate/tenants/acme.rego" in value["modules"]
        assert set(server.policies) == {*value["modules"], "theirs"}
        assert server.data["tenants"]["acme"]["github_orgs"] == ["acme"]
        answer = server.query(
            ["sandgate", "decision"],
            {
                "version": 1,
                "tenant": "acme",
                "phase": "request",
                "dest": {"host": "pypi.org"},
                "request": {"method": "PUT", "headers": {}},
            },
        )
        assert answer["result"]["reason"] == "method_not_allowed"


def test_push_to_an_unreachable_server_fails(capsys: pytest.CaptureFixture[str]) -> None:
    from support import free_port

    code, out, err = run(capsys, "push", GOOD, "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "1")
    assert (code, out) == (1, "")
    assert err.startswith("sandgate: the OPA server refused the push: ")


def test_push_needs_its_token_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SANDGATE_TEST_OPA_TOKEN", raising=False)
    code, _, err = run(
        capsys, "push", GOOD, "--url", "http://127.0.0.1:1", "--token-env", "SANDGATE_TEST_OPA_TOKEN"
    )
    assert (code, err) == (2, "sandgate: environment variable SANDGATE_TEST_OPA_TOKEN is not set\n")


def test_check_a_file_nested_a_thousand_levels_is_invalid_input_with_a_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "tenants").mkdir()
    (tmp_path / "tenants" / "t.yaml").write_text("tenant: t\nallow:\n  - hosts: " + "[" * 1200 + "]" * 1200)
    code, out, err = run(capsys, "check", str(tmp_path))
    assert (code, out) == (2, "")
    assert re.match(rf"^{re.escape(str(tmp_path))}/tenants/t\.yaml:3:\d+: invalid YAML: ", err)
    assert "RecursionError" not in err


def test_check_the_shipped_rules_on_a_fresh_clone_notes_the_missing_demo_token(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A fresh clone has no rules/tenants/demo-1.token yet (quickstart makes it): not an error."""
    import shutil

    rules = tmp_path / "rules"
    shutil.copytree(REPO / "rules", rules, ignore=shutil.ignore_patterns("*.token"))
    code, out, err = run(capsys, "check", str(rules))
    assert (code, err) == (0, "")
    assert "note: " in out and "demo-1.token does not exist yet; sandbox 'demo-1' is off until it does" in out


def test_check_with_a_config_and_no_path_checks_the_config_rules_dir(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Not ./rules (here the repository's shipped rules): the rules that gateway serves,
    # its rules_dir resolved against the config's folder.
    shutil.copytree(REPO / GOOD, tmp_path / "served")
    config = tmp_path / "sandgate.yaml"
    config.write_text("rules_dir: served\n")
    code, out, _ = run(capsys, "check", "--config", str(config), "--format", "json")
    assert code == 0
    assert json.loads(out)["tenants"] == ["acme", "plain", "trial"]
    assert all(f.startswith(str(tmp_path / "served")) for f in json.loads(out)["files"])
