"""The one place in proxy/ that starts asyncio tasks: named, held until done, crashes logged.

The event loop keeps only weak references to tasks, so a task nobody holds can be collected
mid-run; and a task that dies with an exception nobody awaits is reported, if at all, by the
loop's default handler at garbage collection. Two helpers cover every use in the gateway:

- `BackgroundTask`: one long-running loop owned by an object, started and stopped with it
  (idempotent both ways; stop cancels and waits, so nothing runs after it returns).
- `TaskSet.spawn` / `spawn`: a short fire-and-forget task (an audit record from a synchronous
  hook, one DNS answer), held in a set until it finishes.

A lint rule (ruff TID251 and tests/proxy/test_tasks.py) keeps bare `create_task` and
`ensure_future` out of proxy/ everywhere else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

__all__ = ["BackgroundTask", "TaskSet", "spawn"]

log = structlog.get_logger("sandgate.tasks")


class BackgroundTask:
    """One named task running `run()`; `start()` and `stop()` are idempotent."""

    def __init__(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self._run = run
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """True while the task is started and has not finished (stopped, returned or crashed)."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the task unless it is running (a task that ended is started afresh)."""
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._guarded(), name=self.name)

    async def stop(self) -> None:
        """Cancel the task and wait until it has ended."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await _wait_ended([task])

    async def _guarded(self) -> None:
        try:
            await self._run()
        except Exception:  # CancelledError is not an Exception: a stop still ends the task
            log.exception("task.crashed", task=self.name)


class TaskSet:
    """Short tasks held until done; an exception one ends with is logged, never lost."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn[T](self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Run `coro` as a task named `name`, held by this set until it finishes."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    async def cancel(self) -> None:
        """Cancel every task still running and wait until each has ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await _wait_ended(tasks)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.error("task.crashed", task=task.get_name(), exc_info=error)


_detached = TaskSet()


def spawn[T](coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    """Run `coro` as a task held (by this module) until it finishes; see `TaskSet.spawn`."""
    return _detached.spawn(coro, name=name)


async def _wait_ended(tasks: list[asyncio.Task[Any]]) -> None:
    """Wait until every task has ended, raising neither their exceptions nor their cancellation.

    `asyncio.wait` rather than `await task` under `suppress(CancelledError)`: that would also
    swallow the caller's own cancellation arriving while it waits, which must propagate.
    """
    if tasks:
        await asyncio.wait(tasks)
