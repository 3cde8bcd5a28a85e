"""One rule for relative paths: a config value against the config file's folder, a tenant-file
value against the tenant file, a command-line argument against the working directory.

Every test runs the real CLI or a real gateway from a working directory that is neither the
config's folder nor the tenant file's, so a path resolved against the wrong one shows.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import httpx
from conftest import SANDGATE, TOKEN, curl, tenant_yaml, write_gateway_files
from support import RecordingUpstream, free_port, wait_for_port

ALLOW_API = [{"id": "api", "hosts": ["api.test"], "ports": [80]}]


def _private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


def _sandgate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SANDGATE, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_config_file_references_resolve_against_the_config_folder(tmp_path: Path) -> None:
    """`credentials.placeholder_key: file:REL` and `admin.token: file:REL` name files beside the
    config, whoever runs the gateway or the CLI and from wherever."""
    conf = tmp_path / "conf"
    admin_port = free_port()
    config, _ = write_gateway_files(
        conf,
        {"t1.yaml": tenant_yaml("t1", ALLOW_API)},
        config={
            "credentials": {"placeholder_key": "file:keys/placeholder.key"},
            "admin": {"listen": f"127.0.0.1:{admin_port}", "token": "file:keys/admin.token"},
        },
    )
    _private(conf / "keys" / "admin.token", "admin-token-0123456789abcdef")
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    first = _sandgate("credentials", "placeholders", "--sandbox", "sb1", "--config", str(config), cwd=here)
    assert first.returncode == 0, first.stderr
    assert (conf / "keys" / "placeholder.key").exists()
    assert not (here / "keys").exists(), "the key went to the working directory"
    # The same key from another working directory: the same placeholders.
    again = _sandgate("credentials", "placeholders", "--sandbox", "sb1", "--config", str(config), cwd=there)
    assert again.returncode == 0 and again.stdout == first.stdout
    with (tmp_path / "gateway.log").open("wb") as log:
        gateway = subprocess.Popen(
            [SANDGATE, "run", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT, cwd=there
        )
    try:
        wait_for_port("127.0.0.1", admin_port, timeout=30)
        answer = httpx.get(
            f"http://127.0.0.1:{admin_port}/v1/status",
            headers={"Authorization": "Bearer admin-token-0123456789abcdef"},
            timeout=10,
        )
        assert answer.status_code == 200
        assert not (there / "keys").exists()
    finally:
        gateway.terminate()
        gateway.wait(20)
    assert "admin.token" not in (tmp_path / "gateway.log").read_text()


def test_a_tenant_file_reference_resolves_against_the_tenant_file(
    tmp_path: Path, http_upstream: RecordingUpstream
) -> None:
    """A sandbox's `token: file:REL` in a tenant file names a file beside that tenant file."""
    root = tmp_path / "gw"
    config, port = write_gateway_files(
        root,
        {
            "t1.yaml": tenant_yaml(
                "t1",
                [{"id": "api", "hosts": ["api.test"], "ports": [http_upstream.port]}],
                token_ref="file:sb1.token",
            )
        },
    )
    _private(root / "rules" / "tenants" / "sb1.token", TOKEN)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with (tmp_path / "gateway.log").open("wb") as log:
        gateway = subprocess.Popen(
            [SANDGATE, "run", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT, cwd=elsewhere
        )
    try:
        wait_for_port("127.0.0.1", port, timeout=30)
        result = curl(
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-x",
            f"http://sb1:{TOKEN}@127.0.0.1:{port}",
            http_upstream.url_for("api.test") + "/",
        )
        assert result.stdout == "200", result.stderr
    finally:
        gateway.terminate()
        gateway.wait(20)


def test_a_command_line_reference_resolves_against_the_working_directory(tmp_path: Path) -> None:
    """`sandbox add --token file:REL` reads REL in the directory the command runs in."""
    root = tmp_path / "gw"
    config, _ = write_gateway_files(root, {"t1.yaml": tenant_yaml("t1", ALLOW_API)})
    (root / "my.token").write_text("not this one-0123456789abcdef\n")
    cwd = tmp_path / "work"
    _private(cwd / "my.token", "the-cli-token-0123456789abcdef")
    added = _sandgate(
        "sandbox",
        "add",
        "--id",
        "cli-sb",
        "--tenant",
        "t1",
        "--token",
        "file:my.token",
        "--config",
        str(config),
        cwd=cwd,
    )
    assert added.returncode == 0, added.stderr
    registry = json.loads((root / "state" / "sandboxes.json").read_text())
    digest = hashlib.sha256(b"the-cli-token-0123456789abcdef").hexdigest()
    assert [s["token"] for s in registry if s["id"] == "cli-sb"] == [f"sha256:{digest}"]
