"""Hooks of one exchange phase run on the gateway's addons, in-line when none suspends.

mitmproxy runs each hook as a task and resumes the layer with a `HookCompleted` event through
the whole layer stack. A phase here is one eagerly started task that runs its hooks in order
(`handle_lifecycle`, as mitmproxy does): when no addon awaits anything that is not ready, it
is done before the layer goes on. When one does (an OPA server, redis, an approval), the layer
waits for it through `LeanWait`, a blocking hook whose handler (the `LeanPath` addon) awaits
the task: the connection handler disarms the idle timeout meanwhile and the layer's events
queue, as for any hook.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from mitmproxy import ctx, http
from mitmproxy.proxy import commands

__all__ = ["LeanWait", "run_phase"]


@dataclass
class LeanWait(commands.StartHook):
    """A lean phase suspended: the layer waits until its task is done."""

    phase: asyncio.Task[None]
    name = "sandgate_lean_wait"


async def _hooks(flow: http.HTTPFlow, hooks: tuple[Any, ...]) -> None:
    manager = ctx.master.addons
    for hook in hooks:
        await manager.handle_lifecycle(hook)
        if flow.error is not None:
            return  # killed or failed: the later hooks of the phase are not for it


def run_phase(flow: http.HTTPFlow, *hooks: Any) -> Generator[commands.Command, Any, None]:
    """Run `hooks` on the addons; yields `LeanWait` only if one of them suspended."""
    task = asyncio.Task(_hooks(flow, hooks), loop=asyncio.get_running_loop(), eager_start=True)
    if not task.done():
        yield LeanWait(task)
    if not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]  # handle_lifecycle logs addon errors itself
