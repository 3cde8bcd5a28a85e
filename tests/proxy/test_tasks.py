"""sandgate.proxy.tasks on a real event loop, and the rule that tasks start nowhere else."""

from __future__ import annotations

import ast
import asyncio
import gc
import weakref
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sandgate.proxy.tasks import BackgroundTask, TaskSet, spawn

REPO = Path(__file__).resolve().parents[2]


class Loop:
    """A background loop that counts its starts and records how each run ended."""

    def __init__(self) -> None:
        self.starts = 0
        self.ended: list[str] = []
        self.ticked = asyncio.Event()

    async def run(self) -> None:
        self.starts += 1
        try:
            while True:
                self.ticked.set()
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise


async def ended(task: BackgroundTask) -> None:
    """Wait (up to 2 s) until the task has finished on its own."""
    async with asyncio.timeout(2):
        while task.running:
            await asyncio.sleep(0.01)


async def test_start_runs_the_loop_once_however_often_it_is_called() -> None:
    loop = Loop()
    task = BackgroundTask("test-loop", loop.run)
    task.start()
    task.start()
    async with asyncio.timeout(2):
        await loop.ticked.wait()
    task.start()
    assert task.running
    assert loop.starts == 1
    assert [t.get_name() for t in asyncio.all_tasks()].count("test-loop") == 1
    await task.stop()


async def test_stop_cancels_and_waits_until_the_loop_has_ended() -> None:
    loop = Loop()
    task = BackgroundTask("test-loop", loop.run)
    task.start()
    async with asyncio.timeout(2):
        await loop.ticked.wait()
    await task.stop()
    assert loop.ended == ["cancelled"]
    assert not task.running
    assert "test-loop" not in [t.get_name() for t in asyncio.all_tasks()]
    await task.stop()  # a second stop is a no-op
    assert loop.ended == ["cancelled"]


async def test_stop_before_start_is_a_no_op() -> None:
    loop = Loop()
    task = BackgroundTask("test-loop", loop.run)
    await task.stop()
    assert loop.starts == 0
    assert not task.running


async def test_a_stopped_task_starts_again() -> None:
    loop = Loop()
    task = BackgroundTask("test-loop", loop.run)
    task.start()
    async with asyncio.timeout(2):
        await loop.ticked.wait()
    await task.stop()
    loop.ticked.clear()
    task.start()
    async with asyncio.timeout(2):
        await loop.ticked.wait()
    assert loop.starts == 2
    assert task.running
    await task.stop()
    assert loop.ended == ["cancelled", "cancelled"]


async def test_a_crash_is_logged_with_the_task_name_and_a_restart_runs_again() -> None:
    runs = 0

    async def crash() -> None:
        nonlocal runs
        runs += 1
        await asyncio.sleep(0)
        raise ValueError("boom")

    task = BackgroundTask("test-crasher", crash)
    with capture_logs() as events:
        task.start()
        await ended(task)
    crashes = [e for e in events if e["event"] == "task.crashed"]
    assert len(crashes) == 1
    assert crashes[0]["task"] == "test-crasher"
    assert crashes[0]["log_level"] == "error"
    assert crashes[0]["exc_info"] is True

    task.start()  # a crashed task is not running: start runs it afresh
    await ended(task)
    assert runs == 2
    await task.stop()  # stopping a crashed task raises nothing


async def test_stop_lets_the_callers_own_cancellation_through() -> None:
    release = asyncio.Event()
    cancelled = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            await release.wait()  # cleanup that takes a while
            raise

    task = BackgroundTask("test-slow", slow_to_stop)
    task.start()
    await asyncio.sleep(0)
    stopper = asyncio.create_task(task.stop())
    async with asyncio.timeout(2):
        await cancelled.wait()
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert stopper.cancelled()
    release.set()
    await asyncio.sleep(0.01)


async def test_spawn_holds_the_task_until_it_is_done() -> None:
    tasks = TaskSet()
    gate = asyncio.Event()
    finished = asyncio.Event()

    async def job() -> int:
        await gate.wait()
        finished.set()
        return 7

    ref = weakref.ref(tasks.spawn(job(), name="test-job"))
    gc.collect()
    assert ref() is not None, "the running task was collected: nothing held it"
    assert len(tasks) == 1
    gate.set()
    async with asyncio.timeout(2):
        await finished.wait()
        while len(tasks):
            await asyncio.sleep(0)
    gc.collect()
    assert ref() is None, "the finished task is still held"


async def test_a_spawned_task_that_raises_is_logged() -> None:
    tasks = TaskSet()

    async def fails() -> None:
        raise RuntimeError("lost record")

    with capture_logs() as events:
        task = tasks.spawn(fails(), name="test-fails")
        async with asyncio.timeout(2):
            while len(tasks):
                await asyncio.sleep(0)
    crashes = [e for e in events if e["event"] == "task.crashed"]
    assert [c["task"] for c in crashes] == ["test-fails"]
    assert isinstance(crashes[0]["exc_info"], RuntimeError)
    assert task.done()


async def test_cancel_stops_every_spawned_task() -> None:
    tasks = TaskSet()
    spawned = [tasks.spawn(asyncio.sleep(3600), name=f"test-sleep-{i}") for i in range(3)]
    await asyncio.sleep(0)
    with capture_logs() as events:
        await tasks.cancel()
    assert all(t.cancelled() for t in spawned)
    assert len(tasks) == 0
    assert not [e for e in events if e["event"] == "task.crashed"]


async def test_module_spawn_names_and_holds_its_task() -> None:
    task = spawn(asyncio.sleep(0, result="done"), name="test-detached")
    assert task.get_name() == "test-detached"
    assert await task == "done"


# -- the rule: tasks start only in proxy/tasks.py ----------------------------------------------

_STARTERS = frozenset({"create_task", "ensure_future"})

# Calls allowed outside proxy/tasks.py: policy/ and brokers/ may not import it, so each holds its
# own task until it ends (see the comment at the call).
_ALLOWED = {"policy/resolver.py": 1, "brokers/broker.py": 1}


def task_starts(source: str) -> list[int]:
    """Lines that start a task: `<anything>.create_task(...)` or `ensure_future(...)`, any spelling."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in _STARTERS:
            lines.append(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio\nasyncio.create_task(f())",
        "import asyncio\nasyncio.get_running_loop().create_task(f())",
        "loop.create_task(f(), name='x')",
        "from asyncio import ensure_future\nensure_future(f())",
        "from asyncio import create_task as go\nimport asyncio as a\na.ensure_future(f())",
    ],
    ids=[
        "asyncio.create_task is caught",
        "a running loop's create_task is caught",
        "a stored loop's create_task is caught",
        "an imported ensure_future is caught",
        "an aliased module's ensure_future is caught",
    ],
)
def test_the_rule_catches_every_spelling(source: str) -> None:
    assert task_starts(source) == [source.count("\n") + 1]


def test_the_rule_leaves_other_calls_alone() -> None:
    assert (
        task_starts("import asyncio\nasyncio.gather(f())\nspawn(f(), name='x')\ntasks.spawn(g(), name='y')")
        == []
    )


def test_tasks_start_only_in_proxy_tasks() -> None:
    found: dict[str, int] = {}
    for package in ("proxy", "policy", "brokers"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            count = len(task_starts(path.read_text()))
            if count and rel != "proxy/tasks.py":
                found[rel] = count
    assert found == _ALLOWED
