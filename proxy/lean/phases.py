"""Hooks of one exchange phase run on the gateway's addons, in-line when none suspends.

mitmproxy runs each hook as a task and resumes the layer with a `HookCompleted` event through
the whole layer stack. A phase here is one eagerly started task that runs its hooks in order
(as mitmproxy's `handle_lifecycle`: each hook, then `update` if an addon has one): when no
addon awaits anything that is not ready, it is done before the layer goes on. When one does
(an OPA server, redis, an approval), the layer waits for it through `LeanWait`, a blocking
hook whose handler (the `LeanPath` addon) awaits the task: the connection handler disarms the
idle timeout meanwhile and the layer's events queue, as for any hook.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import structlog
from mitmproxy import ctx, http
from mitmproxy import hooks as hooks_module
from mitmproxy.flow import Error
from mitmproxy.proxy import commands

from sandgate.proxy.mitm.dispatch import handlers
from sandgate.proxy.mitm.wire_errors import KILLED

__all__ = ["END_EMPTY_BODY", "LeanWait", "Step", "run_phase"]

log = structlog.get_logger("sandgate.lean")

# Something the layer does to the flow between two hooks of one phase.
Step = Callable[[http.HTTPFlow], None]


@dataclass
class LeanWait(commands.StartHook):
    """A lean phase suspended: the layer waits until its task is done."""

    phase: asyncio.Task[None]
    name = "sandgate_lean_wait"


def _end_empty_body(flow: http.HTTPFlow) -> None:
    flow.request.data.content = b""
    flow.request.timestamp_end = time.time()


# A request without a body ends between its two hooks, as mitmproxy ends it.
END_EMPTY_BODY: Step = _end_empty_body


async def _hooks(flow: http.HTTPFlow, hooks: tuple[Any, ...]) -> None:
    manager = ctx.master.addons
    try:
        for hook in hooks:
            if not isinstance(hook, hooks_module.Hook):
                hook(flow)  # a Step
                continue
            await _lifecycle(manager, hook, flow)
            if flow.intercepted:
                await flow.wait_for_resume()  # as mitmproxy's connection handler waits
            if flow.error is not None:
                return  # killed or failed: the later hooks of the phase are not for it
    except Exception:
        # handle_lifecycle logs an addon's error and goes on; this is anything else. Fail closed
        # first: the log call itself may fail the same way (a RecursionError).
        _fail_closed(flow)
        log.exception("hook_failed", hook="lean.phase")


async def _lifecycle(manager: Any, hook: hooks_module.Hook, flow: http.HTTPFlow) -> None:
    """mitmproxy's `handle_lifecycle` without its per-hook costs: the flow is known (no
    `args()` walk), and no `UpdateHook` is made when no addon has an `update` handler."""
    await manager.trigger_event(hook)
    if handlers(manager, "update") != ():
        await manager.trigger_event(hooks_module.UpdateHook([flow]))


def _fail_closed(flow: http.HTTPFlow) -> None:
    if flow.error is None:
        flow.error = Error(KILLED.text)


def run_phase(flow: http.HTTPFlow, *hooks: Any) -> Generator[commands.Command, Any, None]:
    """Run `hooks` on the addons (a `Step` between two is called on the flow); yields `LeanWait`
    only if an addon suspended. A phase that did not run to its end (cancelled: the gateway
    stops; anything raised outside an addon) leaves the flow killed: nothing undecided goes on."""
    task = asyncio.Task(_hooks(flow, hooks), loop=asyncio.get_running_loop(), eager_start=True)
    if not task.done():
        yield LeanWait(task)
    if not task.done() or task.cancelled() or task.exception() is not None:
        _fail_closed(flow)
