"""deploy/install.sh: a pip failure stops the install and shows pip's own words; a held package
manager lock (a fresh cloud machine updating itself) is waited for, with a line saying so."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "deploy" / "install.sh"

# Holds a write lock on a file as apt and dpkg do (a POSIX record lock: fcntl F_SETLK, which
# lockf takes), says so, keeps it for the seconds given, then lets go by exiting.
HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_failing_pip_install_fails_the_script_with_pip_output(tmp_path: Path) -> None:
    # A project whose pyproject.toml pip cannot read, over a virtualenv where an earlier
    # install still imports (this test run's editable install): the import check alone passes.
    (tmp_path / "deploy").mkdir()
    for name in ("install.sh", "constraints.txt"):
        shutil.copy(REPO / "deploy" / name, tmp_path / "deploy" / name)
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


def wait_for_locks(locks: list[Path], **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run install.sh's wait for the package manager's locks (the script sourced: its functions
    only) on these lock files; its result and how long it took."""
    assert "wait_for_apt_locks()" in SCRIPT.read_text(), "install.sh does not wait for a held dpkg lock"
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", "-c", 'source "$1" && wait_for_apt_locks', "install.sh", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SANDGATE_APT_LOCKS": " ".join(map(str, locks)), **env},
    )
    return proc, time.monotonic() - start


@contextlib.contextmanager
def holding(lock: Path, seconds: float) -> Iterator[subprocess.Popen[str]]:
    """A process holding `lock` for `seconds` (killed on the way out), once it holds it."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
            yield holder
        finally:
            holder.kill()


def test_the_script_waits_on_the_real_dpkg_lock_before_apt_get() -> None:
    text = SCRIPT.read_text()
    default = text.split("SANDGATE_APT_LOCKS:-", 1)[1].split("}", 1)[0]
    assert default.split() == ["/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock"]
    assert 0 < text.index("    wait_for_apt_locks\n") < text.index(" update -qq")


def test_a_held_dpkg_lock_is_waited_for_with_a_line_saying_so(tmp_path: Path) -> None:
    frontend, lists = tmp_path / "lock-frontend", tmp_path / "lists-lock"
    lists.touch()
    with holding(frontend, 3) as holder:
        comm = Path(f"/proc/{holder.pid}/comm").read_text().strip()
        proc, seconds = wait_for_locks([frontend, lists])
    assert proc.returncode == 0, proc.stderr
    assert seconds >= 2, f"returned after {seconds:.1f} s, while the lock was held for 3 s"
    lines = proc.stderr.splitlines()
    assert lines[0] == (
        f"install.sh: waiting for {frontend}, held by process {holder.pid} ({comm}): "
        "a fresh machine installs its updates for a while after boot (up to 900 s)"
    )
    assert len(lines) == 2 and lines[1].startswith("install.sh: the package manager is free after ")


def test_free_locks_are_not_waited_for(tmp_path: Path) -> None:
    (tmp_path / "lock-frontend").touch()
    proc, seconds = wait_for_locks([tmp_path / "lock-frontend", tmp_path / "no-such-lock"])
    assert (proc.returncode, proc.stderr) == (0, "")
    assert seconds < 2


def test_a_lock_held_past_the_wait_stops_the_install(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    with holding(lock, 30) as holder:
        comm = Path(f"/proc/{holder.pid}/comm").read_text().strip()
        proc, _ = wait_for_locks([lock], SANDGATE_APT_LOCK_WAIT="1")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        f"install.sh: {lock} is still held after 1 s: run deploy/install.sh again once process "
        f"{holder.pid} ({comm}) is done"
    )
