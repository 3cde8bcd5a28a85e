"""The gateway's services: one ordered list, started in order, stopped in reverse.

A service's place in the list says what it may use: everything above it. Its stage says when
it starts: before the listeners open (what the first request needs), or once they serve.
Whatever the stage, the list stops bottom-up, each started service once; a stop that fails is
logged and the rest still run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import structlog

__all__ = ["Calls", "Service", "Services", "Stage", "StartStop"]

log = structlog.get_logger("sandgate.runtime")


class Stage(StrEnum):
    """When a service starts."""

    BEFORE_LISTENERS = "before_listeners"
    SERVING = "serving"


class Service(Protocol):
    """Something the gateway starts at its stage and stops at exit."""

    @property
    def name(self) -> str: ...

    @property
    def stage(self) -> Stage: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class StartStop(Protocol):
    """An object with its own `start` and `stop` (each sync or async)."""

    def start(self) -> object: ...

    def stop(self) -> object: ...


@dataclass(frozen=True)
class Calls:
    """A service made of an object's own start and stop calls (each sync or async, or none)."""

    name: str
    stage: Stage
    on_start: Callable[[], object] | None = None
    on_stop: Callable[[], object] | None = None

    @classmethod
    def of(cls, name: str, stage: Stage, subsystem: StartStop | None) -> Calls | None:
        """`subsystem`'s start and stop; None when the subsystem is absent (not in the list)."""
        if subsystem is None:
            return None
        return cls(name, stage, subsystem.start, subsystem.stop)

    async def start(self) -> None:
        await _call(self.on_start)

    async def stop(self) -> None:
        await _call(self.on_stop)


class Services:
    """The ordered list; `start(stage)` starts that stage's services top-down, `stop()` stops
    every started one bottom-up (again: nothing left to stop)."""

    def __init__(self, services: Iterable[Service]) -> None:
        self.services = tuple(services)
        if len(set(self.names)) != len(self.services):
            raise ValueError(f"services named twice: {self.names}")
        self._started: set[str] = set()

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.services]

    async def start(self, stage: Stage) -> None:
        """Start the services of `stage` in order; an exception stops the pass (and propagates)."""
        for service in self.services:
            if service.stage is stage:
                self._started.add(service.name)
                await service.start()

    async def stop(self) -> None:
        for service in reversed(self.services):
            if service.name not in self._started:
                continue
            self._started.discard(service.name)
            try:
                await service.stop()
            except Exception:
                log.exception("gateway.stop_step_failed", step=service.name)


async def _call(call: Callable[[], object] | None) -> None:
    if call is None:
        return
    result = call()
    if inspect.isawaitable(result):
        await result
