"""A lean phase runs its hooks on the real addon manager in-line when none waits, waits through
one hook when one does, and fails closed when it cannot finish."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mitmproxy import hooks as hooks_module
from mitmproxy import http
from mitmproxy.proxy.layers.http._hooks import HttpRequestHeadersHook, HttpRequestHook
from mitmproxy.test import taddons, tflow

from sandgate.proxy.lean.phases import END_EMPTY_BODY, LeanWait, run_phase


class Recorder:
    """Records the hooks it sees; `wait` makes `requestheaders` wait on a future."""

    def __init__(self, wait: asyncio.Future[None] | None = None, kill: bool = False) -> None:
        self.seen: list[tuple[str, bytes | None]] = []
        self.wait = wait
        self.kill = kill

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        self.seen.append(("requestheaders", flow.request.data.content))
        if self.wait is not None:
            await self.wait
        if self.kill:
            flow.kill()

    def request(self, flow: http.HTTPFlow) -> None:
        self.seen.append(("request", flow.request.data.content))


def _flow() -> http.HTTPFlow:
    flow = tflow.tflow()
    flow.request.data.content = None  # as read from a head
    return flow


def _drive(phase: Any) -> list[Any]:
    """The commands a phase yields until it is done (none: it ran in-line)."""
    return list(phase)


async def test_a_phase_no_addon_waits_in_runs_in_line_in_mitmproxys_order() -> None:
    recorder = Recorder()
    with taddons.context(recorder):
        flow = _flow()
        commands = _drive(
            run_phase(flow, HttpRequestHeadersHook(flow), END_EMPTY_BODY, HttpRequestHook(flow))
        )
    assert commands == []
    # The body ends between the two hooks, as mitmproxy ends a request without one.
    assert recorder.seen == [("requestheaders", None), ("request", b"")]
    assert flow.error is None


async def test_a_phase_an_addon_waits_in_is_waited_for_through_one_hook() -> None:
    waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    recorder = Recorder(wait=waiting)
    with taddons.context(recorder):
        flow = _flow()
        phase = run_phase(flow, HttpRequestHeadersHook(flow), HttpRequestHook(flow))
        wait = next(phase)
        assert isinstance(wait, LeanWait) and wait.blocking
        assert recorder.seen == [("requestheaders", None)], "the request hook waits for the first"
        waiting.set_result(None)
        await wait.phase
        with pytest.raises(StopIteration):
            phase.send(None)
    assert [name for name, _ in recorder.seen] == ["requestheaders", "request"]
    assert flow.error is None


async def test_a_killed_flow_gets_no_later_hook_of_its_phase() -> None:
    recorder = Recorder(kill=True)
    with taddons.context(recorder):
        flow = _flow()
        assert _drive(run_phase(flow, HttpRequestHeadersHook(flow), HttpRequestHook(flow))) == []
    assert [name for name, _ in recorder.seen] == ["requestheaders"]
    assert flow.error is not None


async def test_a_phase_that_cannot_finish_leaves_the_flow_killed() -> None:
    """The gateway stopping cancels a waiting phase: its undecided request must not go on."""
    waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    recorder = Recorder(wait=waiting)
    with taddons.context(recorder):
        flow = _flow()
        phase = run_phase(flow, HttpRequestHeadersHook(flow), HttpRequestHook(flow))
        wait = next(phase)
        assert isinstance(wait, LeanWait)
        wait.phase.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wait.phase
        with pytest.raises(StopIteration):
            phase.send(None)
    assert [name for name, _ in recorder.seen] == ["requestheaders"], "the request hook never ran"
    assert flow.error is not None and flow.error.msg == "killed"


async def test_a_phase_that_raises_outside_an_addon_leaves_the_flow_killed() -> None:
    def broken(flow: http.HTTPFlow) -> None:
        raise RuntimeError("a step that breaks")

    recorder = Recorder()
    with taddons.context(recorder):
        flow = _flow()
        assert _drive(run_phase(flow, HttpRequestHeadersHook(flow), broken, HttpRequestHook(flow))) == []
    assert [name for name, _ in recorder.seen] == ["requestheaders"]
    assert flow.error is not None and flow.error.msg == "killed"


class Updates:
    """An addon with mitmproxy's `update` hook: it is told after each hook, as mitmproxy tells it."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.updates: list[tuple[int, list[str]]] = []

    def update(self, flows: list[http.HTTPFlow]) -> None:
        self.updates.append((len(flows), [name for name, _ in self.recorder.seen]))


async def test_an_update_handler_is_called_after_each_hook_and_none_is_made_without_one() -> None:
    recorder = Recorder()
    updates = Updates(recorder)
    with taddons.context(recorder, updates):
        flow = _flow()
        _drive(run_phase(flow, HttpRequestHeadersHook(flow), HttpRequestHook(flow)))
    assert updates.updates == [(1, ["requestheaders"]), (1, ["requestheaders", "request"])]

    made: list[object] = []
    original = hooks_module.UpdateHook.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        original(self, *args, **kwargs)

    with taddons.context(Recorder()), pytest.MonkeyPatch.context() as patch:
        patch.setattr(hooks_module.UpdateHook, "__init__", counted)
        flow = _flow()
        _drive(run_phase(flow, HttpRequestHeadersHook(flow), HttpRequestHook(flow)))
    assert made == [], "no addon has `update`: none is made"
