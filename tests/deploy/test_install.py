"""deploy/install.sh: a pip failure stops the install and shows pip's own words."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from conftest import REPO


def test_a_failing_pip_install_fails_the_script_with_pip_output(tmp_path: Path) -> None:
    # A project whose pyproject.toml pip cannot read, over a virtualenv where an earlier
    # install still imports (this test run's editable install): the import check alone passes.
    (tmp_path / "deploy").mkdir()
    shutil.copy(REPO / "deploy" / "install.sh", tmp_path / "deploy" / "install.sh")
    (tmp_path / "pyproject.toml").write_text('[project\nname = "sandgate"\n')
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / ".venv")], check=True, timeout=300)
    python = tmp_path / ".venv" / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    for earlier in Path(sysconfig.get_path("purelib")).glob("__editable__*sandgate*"):
        shutil.copy(earlier, purelib)
    assert subprocess.run([str(python), "-c", "import sandgate.proxy.cli.main"], timeout=60).returncode == 0

    proc = subprocess.run(
        ["bash", "deploy/install.sh", "--only", "venv"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert "Expected ']' at the end of a table declaration" in proc.stderr
    assert "install.sh: pip install failed (the whole output: .venv/pip-install.log)" in proc.stderr
    assert not list((tmp_path / ".venv").glob(".sandgate-installed*")), "a failed install left its stamp"
