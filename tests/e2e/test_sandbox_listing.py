"""`sandgate sandbox list`, `policy status` and `/v1/status`: every sandbox the gateway knows.

Sandboxes from tenant files and from the run-time registry alike, with their tenant, how they
are identified (token reference, never the token; interface and addresses) and where they
are defined, through a real running gateway and from the files when none runs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import (
    OTHER_TOKEN,
    OTHER_TOKEN_REF,
    SANDGATE,
    TOKEN,
    TOKEN_REF,
    GatewayFactory,
    tenant_yaml,
    write_gateway_files,
)

pytestmark = pytest.mark.slow

OTHER_REF = OTHER_TOKEN_REF


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=config.parent,
    )


def files(root: Path) -> tuple[Path, Path]:
    """Two tenants: t1 with a token sandbox, t2 with a transparent one (an address); returns
    (config, t2's file)."""
    t2 = yaml.safe_dump(
        {"tenant": "t2", "sandboxes": [{"id": "vm2", "addresses": ["10.213.0.6"]}], "allow": []},
        sort_keys=False,
    )
    config, _ = write_gateway_files(root, {"t1.yaml": tenant_yaml("t1", []), "t2.yaml": t2})
    return config, root / "rules" / "tenants" / "t2.yaml"


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def registry_entry(root: Path) -> None:
    """A run-time registration in the registry file: a transparent sandbox on an interface."""
    entry = {"id": "tap-vm", "tenant": "t1", "interface": "sg-tap9", "addresses": ["10.213.0.10"]}
    (root / "state").mkdir(exist_ok=True, mode=0o700)
    (root / "state" / "sandboxes.json").write_text(json.dumps([entry]))


def test_a_running_gateway_lists_tenant_file_and_registry_sandboxes(start_gateway: GatewayFactory) -> None:
    t2 = yaml.safe_dump(
        {"tenant": "t2", "sandboxes": [{"id": "vm2", "addresses": ["10.213.0.6"]}], "allow": []},
        sort_keys=False,
    )
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", []), "t2.yaml": t2})
    config = gw.root / "sandgate.yaml"
    added = cli(config, "sandbox", "add", "--tenant", "t2", "--id", "dyn1", "--token", OTHER_REF)
    assert added.returncode == 0, added.stderr
    t1_file, t2_file = gw.rules_dir / "tenants" / "t1.yaml", gw.rules_dir / "tenants" / "t2.yaml"

    result = cli(config, "sandbox", "list", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        {
            "id": "sb1",
            "tenant": "t1",
            "token": TOKEN_REF,
            "interface": None,
            "addresses": [],
            "defined_in": f"{t1_file}:{line_of(t1_file, '- id: sb1')}",
        },
        {
            "id": "dyn1",
            "tenant": "t2",
            "token": OTHER_REF,
            "interface": None,
            "addresses": [],
            "defined_in": f"registry {gw.root / 'state' / 'sandboxes.json'}",
        },
        {
            "id": "vm2",
            "tenant": "t2",
            "token": None,
            "interface": None,
            "addresses": ["10.213.0.6"],
            "defined_in": f"{t2_file}:{line_of(t2_file, '- id: vm2')}",
        },
    ]
    text = cli(config, "sandbox", "list")
    assert text.returncode == 0 and text.stderr == ""
    header, *rows = text.stdout.splitlines()
    assert header.split() == ["SANDBOX", "TENANT", "IDENTIFIED", "BY", "DEFINED", "IN"]
    assert [r.split()[:2] for r in rows] == [["sb1", "t1"], ["dyn1", "t2"], ["vm2", "t2"]]
    assert f"token {TOKEN_REF[:19]}…" in rows[0] and rows[0].endswith(
        f"t1.yaml:{line_of(t1_file, '- id: sb1')}"
    )
    assert "address 10.213.0.6" in rows[2]
    assert TOKEN not in text.stdout + result.stdout and OTHER_TOKEN not in text.stdout + result.stdout

    # /v1/status lists what `policy status` prints: tenants and every sandbox.
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))) as c:
        st = c.get("http://sandgate/v1/status").json()
    assert st["tenant_names"] == ["t1", "t2"] and st["tenants"] == 2
    assert st["sandbox_list"] == json.loads(result.stdout) and st["sandboxes"] == 3
    status = cli(config, "policy", "status")
    assert status.returncode == 0, status.stderr
    assert "tenants: t1, t2" in status.stdout
    for row in rows:
        assert row in status.stdout.splitlines()


def test_without_a_gateway_the_files_and_the_registry_are_listed(tmp_path: Path) -> None:
    config, t2_file = files(tmp_path)
    registry_entry(tmp_path)
    result = cli(config, "sandbox", "list", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = {r["id"]: r for r in json.loads(result.stdout)}
    assert sorted(rows) == ["sb1", "tap-vm", "vm2"]
    assert rows["tap-vm"]["interface"] == "sg-tap9" and rows["tap-vm"]["addresses"] == ["10.213.0.10"]
    assert rows["tap-vm"]["defined_in"] == f"registry {tmp_path / 'state' / 'sandboxes.json'}"
    assert rows["vm2"]["defined_in"] == f"{t2_file}:{line_of(t2_file, '- id: vm2')}"
    assert "note: no gateway is running: listed from" in result.stderr
    text = cli(config, "sandbox", "list").stdout
    assert "interface sg-tap9, address 10.213.0.10" in text


def test_an_empty_list_says_so(tmp_path: Path) -> None:
    config, _ = write_gateway_files(tmp_path, {"t1.yaml": yaml.safe_dump({"tenant": "t1", "allow": []})})
    text = cli(config, "sandbox", "list")
    assert (text.returncode, text.stdout) == (0, "no sandboxes\n")
    assert json.loads(cli(config, "sandbox", "list", "--format", "json").stdout) == []


def test_a_broken_tenant_file_is_noted_and_a_broken_base_is_an_error(tmp_path: Path) -> None:
    config, t2_file = files(tmp_path)
    t2_file.write_text("tenant: t2\nallow:\n  - hots: [x.test]\n")
    result = cli(config, "sandbox", "list")
    assert result.returncode == 0
    assert [r.split()[0] for r in result.stdout.splitlines()[1:]] == ["sb1"]
    assert f"note: {t2_file} did not load: its sandboxes are not listed" in result.stderr
    (tmp_path / "rules" / "base.yaml").write_text("deny:\n  - hots: [x.test]\n")
    broken = cli(config, "sandbox", "list")
    assert broken.returncode == 2 and "base.yaml:2:" in broken.stderr and broken.stdout == ""
