"""The `sandgate` command line: exit codes and output users script against."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, SANDGATE

from sandgate.proxy.cli.main import main


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    target = tmp_path / "rules"
    shutil.copytree(REPO / "rules", target, ignore=shutil.ignore_patterns("*.token"))
    return target


def test_policy_check_notes_the_missing_starter_token_and_counts_the_sandbox_once_it_exists(
    rules: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "check", str(rules)]) == 0
    out = capsys.readouterr().out
    assert "demo.yaml:16:5: note: sandboxes.0.token: token file" in out
    assert "does not exist yet; sandbox 'demo-1' is off until it does" in out
    assert main(["token", "--output", str(rules / "tenants" / "demo-1.token")]) == 0
    assert stat.S_IMODE((rules / "tenants" / "demo-1.token").stat().st_mode) == 0o600
    assert main(["policy", "check", str(rules), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["tenants"] == ["demo"]
    assert [n for n in out["notes"] if n["rule_id"].startswith("sandboxes.")] == []


def test_policy_check_json_lists_every_error(rules: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (rules / "tenants" / "bad.yaml").write_text("tenant: Bad\nallow:\n  - hots: [x.test]\n")
    (rules / "tenants" / "demo-1.token").write_text("short")
    (rules / "tenants" / "demo-1.token").chmod(0o600)
    assert main(["policy", "check", str(rules), "--format", "json"]) == 2
    errors = json.loads(capsys.readouterr().out)["errors"]
    fields = {(Path(e["file"]).name, e["line"], e["field"]) for e in errors}
    assert ("bad.yaml", 1, "tenant") in fields
    assert ("bad.yaml", 3, "allow.0.hots") in fields
    assert ("demo.yaml", 16, "sandboxes.0.token") in fields


def test_policy_schema_is_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "TenantFile"
    assert "allow" in schema["properties"]


def test_token_prints_a_token_and_its_reference(capsys: pytest.CaptureFixture[str]) -> None:
    import hashlib

    assert main(["token"]) == 0
    captured = capsys.readouterr()
    token = captured.out.strip()
    assert len(token) >= 24
    assert captured.err.strip() == "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def test_ca_init_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "sandgate.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    assert main(["ca", "init", "--config", str(config)]) == 0
    assert main(["ca", "export", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "BEGIN CERTIFICATE" in out and "PRIVATE KEY" not in out
    assert main(["ca", "init", "--config", str(config)]) == 2, (
        "an existing CA is not replaced without --force"
    )


def test_a_bad_config_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "sandgate.yaml"
    config.write_text("listeners:\n  - port: 8080\n    hots: x\n")
    assert main(["run", "--config", str(config)]) == 2
    assert f"{config}:3:5: listeners.0.hots: unknown key (did you mean 'host'?)" in capsys.readouterr().err


def test_the_state_directory_defaults_to_sandgate_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandgate.proxy.config import load_config

    monkeypatch.setenv("SANDGATE_HOME", str(tmp_path / "home"))
    assert load_config(None).state_path == tmp_path / "home"
    monkeypatch.delenv("SANDGATE_HOME")
    assert load_config(None).state_path == Path("~/.sandgate").expanduser()


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """`sandgate policy schema | head -c 1`: the pipe closes before the command has written;
    the reader had what it wanted: the command ends quietly, exit 0 (as `audit` commands do)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe now fails with EPIPE
    try:
        done = subprocess.run(
            [SANDGATE, "policy", "schema"], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 0


def test_token_never_writes_over_a_token_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "sb.token"
    existing.write_text("in-use-token\n")
    assert main(["token", "--output", str(existing)]) == 2
    assert capsys.readouterr().err == f"sandgate: {existing}: exists; remove it first to replace it\n"
    assert existing.read_text() == "in-use-token\n"
    assert main(["token", "--output", str(tmp_path / "missing" / "sb.token")]) == 2
    assert "No such file or directory" in capsys.readouterr().err
