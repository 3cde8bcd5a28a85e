"""Each `sandgate` command loads only what it uses: the light ones (`--version`, `status`,
`audit`, `sandbox list`, `credentials`, `policy status|reload`) never import mitmproxy, regopy
or opa_client, which cost seconds of CPU at start-up and only `run`, `ca`, `jail` and the
other `policy` commands need.

Each command runs in a fresh interpreter (in this one, other tests have loaded everything),
through the real `main`, which then reports the top-level packages it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import tenant_yaml, write_gateway_files

HEAVY = ("mitmproxy", "regopy", "opa_client")
MARK = "startup-probe: "

# Runs `sandgate ARGS...` in process, then prints its exit code and the packages it loaded
# (top-level ones, and sandgate's layers: sandgate.brokers, sandgate.policy, sandgate.proxy).
PROBE = f"""
import json, sys
from sandgate.proxy.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
loaded = sorted({{".".join(name.split(".")[:2 if name.startswith("sandgate.") else 1]) for name in sys.modules}})
print({MARK!r} + json.dumps({{"code": code, "loaded": loaded}}), file=sys.stderr)
"""


def probe(*argv: str, cwd: Path) -> dict[str, Any]:
    """The exit code of `sandgate ARGV` and the top-level packages it loaded."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith(MARK)]
    assert proc.returncode == 0 and lines, proc.stderr
    result: dict[str, Any] = json.loads(lines[-1].removeprefix(MARK))
    return result


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A gateway config with one tenant, an empty state directory and no gateway running."""
    path, _ = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [{"hosts": ["example.com"]}])})
    (tmp_path / "audit.jsonl").touch()
    return path


LIGHT = [
    (["--version"], 0),
    (["status", "--config", "{config}"], 1),
    (["audit", "tail", "-n", "1", "--file", "{dir}/audit.jsonl"], 0),
    (["audit", "query", "--file", "{dir}/audit.jsonl"], 0),
    (["audit", "stats", "--file", "{dir}/audit.jsonl"], 0),
    (["sandbox", "list", "--config", "{config}"], 0),
    (["credentials", "list", "--config", "{config}"], 0),
    (["credentials", "placeholders", "--sandbox", "sb1", "--config", "{config}"], 0),
    (["policy", "status", "--config", "{config}"], 2),
    (["policy", "reload", "--config", "{config}"], 1),
]


@pytest.mark.parametrize(
    ("argv", "code"),
    LIGHT,
    ids=[
        "--version loads none of them",
        "status without a gateway loads none of them",
        "audit tail loads none of them",
        "audit query loads none of them",
        "audit stats loads none of them",
        "sandbox list loads none of them",
        "credentials list loads none of them",
        "credentials placeholders loads none of them",
        "policy status without a gateway loads none of them",
        "policy reload without a gateway loads none of them",
    ],
)
def test_a_light_command_loads_no_heavy_package(config: Path, argv: list[str], code: int) -> None:
    args = [a.format(config=config, dir=config.parent) for a in argv]
    result = probe(*args, cwd=config.parent)
    assert result["code"] == code
    assert [p for p in HEAVY if p in result["loaded"]] == []


def test_version_loads_no_command_code(tmp_path: Path) -> None:
    # Not even the config model or the clients: parsing alone needs none of them.
    result = probe("--version", cwd=tmp_path)
    assert [p for p in ("pydantic", "httpx", "redis", "yaml") if p in result["loaded"]] == []


def test_audit_tail_of_a_file_loads_neither_redis_nor_the_config_model(config: Path) -> None:
    # Reading one file needs no fleet stream (redis) and no config (pydantic, the policy schema).
    result = probe("audit", "tail", "--file", str(config.parent / "audit.jsonl"), cwd=config.parent)
    assert result["code"] == 0
    assert [p for p in ("pydantic", "redis", "yaml") if p in result["loaded"]] == []


def test_status_loads_no_brokers(config: Path) -> None:
    # Its admin client names the brokers' Secret in annotations only.
    result = probe("status", "--config", str(config), cwd=config.parent)
    assert result["code"] == 1
    assert "sandgate.brokers" not in result["loaded"]


def test_policy_check_does_load_regopy(config: Path) -> None:
    # The control: the probe sees a heavy package when a command does load one.
    result = probe("policy", "check", str(config.parent / "rules"), cwd=config.parent)
    assert result["code"] == 0
    assert "regopy" in result["loaded"]
