"""The session-end check finds and stops what a test run left running, and only that."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from .leftovers import MARKER, leftovers, new_run_id, reap


def _daemon(run_id: str) -> int:
    """A process that left pytest's tree (double fork: its parent exits at once), marked `run_id`."""
    code = "import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(60)\n"
    subprocess.run([sys.executable, "-c", code], env={**os.environ, MARKER: run_id}, check=True, timeout=10)
    deadline = time.monotonic() + 5
    while not (found := leftovers(run_id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(found) == 1, found
    return found[0].pid


def test_a_marked_process_is_found_and_stopped_and_another_runs_is_not() -> None:
    mine, theirs = new_run_id(), new_run_id()
    pid = _daemon(mine)
    other = _daemon(theirs)
    try:
        left = reap(mine, exclude=frozenset({os.getpid()}), grace=0.2)
        assert [p.pid for p in left] == [pid]
        assert "time.sleep(60)" in left[0].command
        assert leftovers(mine) == [], "stopped"
        assert [p.pid for p in leftovers(theirs)] == [other], "another run's process is left alone"
    finally:
        reap(theirs, exclude=frozenset(), grace=0)
    assert leftovers(theirs) == []


def test_a_run_that_cleaned_up_reports_nothing() -> None:
    run_id = new_run_id()
    subprocess.run(["true"], env={**os.environ, MARKER: run_id}, check=True)
    assert reap(run_id, exclude=frozenset(), grace=0.2) == []
