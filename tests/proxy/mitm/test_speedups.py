"""mitmproxy's per-event costs cut (proxy/mitm/dispatch.py, message_check.py): same behaviour,
on a real mitmproxy master and real HTTP messages."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from typing import Any

import pytest
from mitmproxy import addonmanager, exceptions, hooks, http, master, options, tls
from mitmproxy.proxy import events
from mitmproxy.proxy.layers.http._hooks import HttpRequestHeadersHook, HttpRequestHook, HttpResponseHook
from mitmproxy.proxy.layers.tls import TlsClienthelloHook
from mitmproxy.proxy.server_hooks import ClientConnectedHook
from mitmproxy.test import tflow

from sandgate.proxy.addons import heads as head_caps
from sandgate.proxy.mitm import backpressure, dispatch, message_check, option_reads, speedups

speedups.install()


class _Recorder:
    """An addon that notes each request hook it sees, under its name."""

    def __init__(self, name: str, seen: list[str], *, action: str = "") -> None:
        self.name = name
        self.seen = seen
        self.action = action

    def request(self, flow: http.HTTPFlow) -> None:
        self.seen.append(self.name)
        if self.action == "halt":
            raise exceptions.AddonHalt
        if self.action == "raise":
            raise ValueError("boom")


class _AsyncRecorder(_Recorder):
    async def request(self, flow: http.HTTPFlow) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self.seen.append(self.name)


class _Parent:
    """An addon with sub-addons (mitmproxy's own walk dispatches such a chain)."""

    def __init__(self, seen: list[str]) -> None:
        self.name = "parent"
        self.addons = [_Recorder("child", seen)]


def _master() -> master.Master:
    return master.Master(options.Options())


async def _fire(m: master.Master) -> None:
    await m.addons.trigger_event(HttpRequestHook(tflow.tflow()))


async def test_handlers_run_in_chain_order_sync_and_async() -> None:
    seen: list[str] = []
    m = _master()
    m.addons.add(_Recorder("a", seen), _AsyncRecorder("b", seen), _Recorder("c", seen))
    await _fire(m)
    assert seen == ["a", "b", "c"]
    assert [a.name for a, _ in dispatch.handlers(m.addons, "request") or ()] == ["a", "b", "c"]
    assert dispatch.handlers(m.addons, "responseheaders") == ()


async def test_addon_halt_stops_the_event() -> None:
    seen: list[str] = []
    m = _master()
    m.addons.add(_Recorder("a", seen, action="halt"), _Recorder("b", seen))
    await _fire(m)
    assert seen == ["a"]


async def test_a_raising_handler_is_logged_and_the_next_runs(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []
    m = _master()
    m.addons.add(_Recorder("a", seen, action="raise"), _Recorder("b", seen))
    with caplog.at_level(logging.ERROR, logger="mitmproxy.addonmanager"):
        await _fire(m)
    assert seen == ["a", "b"]
    assert any("Addon error: boom" in r.getMessage() for r in caplog.records)


async def test_options_errors_are_raised() -> None:
    class _Bad:
        def request(self, flow: Any) -> None:
            raise exceptions.OptionsError("bad option")

    m = _master()
    m.addons.add(_Bad())
    with pytest.raises(exceptions.OptionsError):
        await _fire(m)


async def test_the_table_follows_the_chain_as_it_changes() -> None:
    seen: list[str] = []
    m = _master()
    a = _Recorder("a", seen)
    m.addons.add(a)
    await _fire(m)
    m.addons.add(_Recorder("b", seen))
    await _fire(m)
    m.addons.remove(a)
    await _fire(m)
    m.addons.clear()
    await _fire(m)
    assert seen == ["a", "a", "b", "b"]


async def test_a_chain_with_sub_addons_is_walked_by_mitmproxy() -> None:
    seen: list[str] = []
    m = _master()
    m.addons.add(_Recorder("a", seen), _Parent(seen))
    assert dispatch.handlers(m.addons, "request") is None
    await _fire(m)
    assert seen == ["a", "child"]


def test_the_patch_is_in_place() -> None:
    assert addonmanager.AddonManager.trigger_event is dispatch._trigger_event


@pytest.mark.parametrize(
    ("field", "value"),
    [("host", b"bytes-not-str"), ("port", "80"), ("content", "text"), ("timestamp_end", "x")],
)
def test_message_fields_of_the_wrong_type_are_refused(field: str, value: Any) -> None:
    kwargs: dict[str, Any] = {
        "host": "example.com",
        "port": 80,
        "method": b"GET",
        "scheme": b"http",
        "authority": b"",
        "path": b"/",
        "http_version": b"HTTP/1.1",
        "headers": http.Headers(),
        "content": b"",
        "trailers": None,
        "timestamp_start": 1.0,
        "timestamp_end": None,
    }
    http.RequestData(**kwargs)  # the right types pass
    kwargs[field] = value
    with pytest.raises(TypeError, match=f"for {field}, but got"):
        http.RequestData(**kwargs)


def test_message_checks_accept_what_mitmproxy_accepts() -> None:
    # An int stands for a float, None for an optional field.
    r = http.Response.make(200, b"ok")
    r.data.timestamp_start = 1
    http.ResponseData(
        http_version=b"HTTP/1.1",
        headers=http.Headers(),
        content=None,
        trailers=None,
        timestamp_start=1,
        timestamp_end=None,
        status_code=200,
        reason=b"OK",
    )
    assert message_check._installed


def test_option_reads_give_values_not_shared_mutables() -> None:
    opts = options.Options()
    assert option_reads._installed
    assert opts.listen_host == ""
    opts.update(listen_host="127.0.0.1", listen_port=8080)
    assert (opts.listen_host, opts.listen_port) == ("127.0.0.1", 8080)
    # A sequence option still comes back as a copy: changing it changes no option.
    opts.update(mode=["regular@8080"])
    read = opts.mode
    read.append("socks5")
    assert opts.mode == ["regular@8080"]
    default = opts.ignore_hosts
    default.append("x")
    assert opts.ignore_hosts == []


def _every_hook_class() -> list[type[hooks.Hook]]:
    return [type(h) for h in _sample_hooks()]


def _sample_hooks() -> list[hooks.Hook]:
    flow = tflow.tflow(resp=True)
    return [
        HttpRequestHook(flow),
        HttpRequestHeadersHook(flow),
        HttpResponseHook(flow),
        TlsClienthelloHook(tls.ClientHelloData(context=flow.client_conn, client_hello=None)),  # type: ignore[arg-type]
        ClientConnectedHook(flow.client_conn),
    ]


def test_hook_arguments_from_the_table_are_mitmproxys() -> None:
    for hook in _sample_hooks():
        assert dispatch.hook_args(hook) == hook.args()
        # The same object, not a copy: handlers change the flow in place.
        assert all(a is b for a, b in zip(dispatch.hook_args(hook), hook.args(), strict=True))
    assert set(dispatch._ARG_NAMES) >= set(_every_hook_class())


def test_head_limits_follow_an_option_change_at_once() -> None:
    opts = options.Options()
    assert head_caps._limits(opts) is None  # no HeadGuard: mitmproxy is left alone
    opts.add_option(head_caps.OPT_MAX_BYTES, int, 32768, "")
    opts.add_option(head_caps.OPT_MAX_LINES, int, 100, "")
    opts.add_option(head_caps.OPT_TIMEOUT, float, 10.0, "")
    assert head_caps._limits(opts) == head_caps.HeadLimits(32768, 100, 10.0)
    opts.update(**{head_caps.OPT_MAX_BYTES: 1000, head_caps.OPT_TIMEOUT: 2.5})
    assert head_caps._limits(opts) == head_caps.HeadLimits(1000, 100, 2.5)
    opts.update(**{head_caps.OPT_MAX_BYTES: 32768})  # back to the default value, set explicitly
    assert head_caps._limits(opts) == head_caps.HeadLimits(32768, 100, 2.5)


def test_queued_bytes_skips_layers_already_collected() -> None:
    class _Layer:
        def __init__(self, queued: list[object]) -> None:
            self._paused_event_queue = queued

    client = tflow.tflow().client_conn
    data = events.DataReceived(client, b"x" * 10)
    kept = _Layer([data, data])
    gone = _Layer([data])
    refs: set[weakref.ref[Any]] = set()
    refs.update(weakref.ref(lay, refs.discard) for lay in (kept, gone))
    backpressure._LAYERS[client] = refs
    assert backpressure.queued_bytes(client, client) == 30
    del gone
    gc.collect()
    assert len(refs) == 1  # the collected layer's reference removed itself
    assert backpressure.queued_bytes(client, client) == 20
    assert backpressure.queued_bytes(tflow.tflow().client_conn, client) == 0  # unknown client


def test_held_bytes_counts_every_connection_and_parsed_body_of_the_client() -> None:
    class _Layer:
        def __init__(self, queued: list[object]) -> None:
            self._paused_event_queue = queued

    f = tflow.tflow()
    client, server = f.client_conn, f.server_conn
    from_client = events.DataReceived(client, b"x" * 10)
    from_server = events.DataReceived(server, b"y" * 7)
    layers = [_Layer([from_client, from_server]), _Layer([]), _Layer([from_server])]
    refs: set[weakref.ref[Any]] = {weakref.ref(lay) for lay in layers}
    backpressure._LAYERS[client] = refs
    # queued_bytes is one connection's share; held_bytes the bound's restart: all of them
    assert backpressure.queued_bytes(client, server) == 14
    assert backpressure.held_bytes(client) == 24
    assert backpressure.held_bytes(tflow.tflow().client_conn) == 0
