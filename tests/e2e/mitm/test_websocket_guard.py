"""The WebSocket guard (proxy/mitm/websocket_guard.py): its start-up self-test, and the cap on one
message end to end through a real gateway, a real WebSocket upstream and a wsproto guest."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import (
    OTHER_TOKEN,
    OTHER_TOKEN_REF,
    TOKEN,
    UPSTREAM_IP,
    GatewayFactory,
    RunningGateway,
    tenant_yaml,
)
from mitmproxy import options
from mitmproxy.proxy.layers import websocket as layers
from support import RecordingUpstream, TestPKI
from support.ws_peers import WebSocketGuest, WebSocketUpstream
from wsproto.events import BytesMessage, TextMessage
from wsproto.extensions import PerMessageDeflate
from wsproto.frame_protocol import CloseReason

from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.upgrades import Upgrades
from sandgate.proxy.audit.records import new_decision_id
from sandgate.proxy.mitm import websocket_guard as guard
from sandgate.proxy.mitm.closer import ConnectionCloser

CAP = 1024 * 1024
FRAGMENT = 64 * 1024
ATTEMPT = 40 * 1024 * 1024  # what the guest tries to send: the 40 MiB message


class _Loader:
    def __init__(self, opts: options.Options) -> None:
        self.opts = opts

    def add_option(self, name: str, typespec: type, default: Any, help: str) -> None:
        self.opts.add_option(name, typespec, default, help)


def test_the_start_up_self_test_fails_loudly_when_the_seam_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    guard.install()
    opts = options.Options()
    Upgrades(None, ConnectionCloser(None)).load(_Loader(opts))  # type: ignore[arg-type]
    guard.self_test(opts)  # the seam is where it was
    original = guard._ORIGINAL
    assert original is not None
    # mitmproxy relays through its own method again: no cap, no control hook.
    monkeypatch.setattr(layers.WebsocketLayer, "relay_messages", original)
    with pytest.raises(RuntimeError, match="without the control hook"):
        guard.self_test(opts)
    monkeypatch.undo()
    # wsproto inflates without a bound again: a small deflated frame expands past the cap.
    monkeypatch.setattr(
        guard._CappedDeflate, "frame_inbound_payload_data", PerMessageDeflate.frame_inbound_payload_data
    )
    with pytest.raises(RuntimeError, match="inflated past the cap"):
        guard.self_test(opts)
    with pytest.raises(RuntimeError, match="not installed"):
        guard.self_test(options.Options())


@pytest.mark.parametrize(
    "hook",
    [guard.SandgateWebsocketControlHook, guard.SandgateWebsocketOversizeHook],
    ids=["the control hook", "the oversize hook"],
)
def test_each_hook_has_the_one_argument_mitmproxys_proxy_server_passes(hook: type) -> None:
    assert len(dataclasses.fields(hook)) == 1


@pytest.mark.parametrize("reason", list(Reason), ids=lambda r: f"{r.value} with its decision id fits a CLOSE")
def test_every_close_reason_the_guest_reads_fits_a_close_frame(reason: Reason) -> None:
    assert len(guard.close_reason(reason, new_decision_id()).encode()) <= guard.CLOSE_REASON_MAX


# -- end to end ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ws_upstream(pki: TestPKI) -> Iterator[WebSocketUpstream]:
    with WebSocketUpstream(UPSTREAM_IP, pki) as up:
        yield up


@pytest.fixture(scope="module")
def shared_gateway(
    start_module_gateway: GatewayFactory, ws_upstream: WebSocketUpstream, http_upstream: RecordingUpstream
) -> RunningGateway:
    """t1's sandbox may open WebSockets to the upstream; t2's reaches a plain HTTP upstream."""
    ws_rule = {"hosts": ["api.test"], "ports": [ws_upstream.port], "inspect": True, "websocket": True}
    plain = {"hosts": ["api.test"], "ports": [http_upstream.port]}
    return start_module_gateway(
        {
            "t1.yaml": tenant_yaml("t1", [ws_rule]),
            "t2.yaml": tenant_yaml("t2", [plain], sandbox="sb2", token_ref=OTHER_TOKEN_REF),
        },
        config={"websocket": {"max_message_bytes": CAP}},
    )


@pytest.fixture
def gateway(shared_gateway: RunningGateway) -> RunningGateway:
    shared_gateway.mark()
    return shared_gateway


def _guest(gw: RunningGateway, up: WebSocketUpstream, deflate: bool = False) -> WebSocketGuest:
    return WebSocketGuest(gw.port, gw.ca_file, "api.test", up.port, ("sb1", TOKEN), deflate=deflate)


def _memory(pid: int) -> tuple[int, int]:
    """(resident bytes now, their high-water mark) of process `pid` and its descendants (a
    gateway of several workers), from /proc."""
    rss = peak = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss += int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            peak += int(line.split()[1]) * 1024
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            child_rss, child_peak = _memory(int(child))
            rss, peak = rss + child_rss, peak + child_peak
    return rss, peak


def _assert_bounded(before: tuple[int, int], after: tuple[int, int], what: str) -> None:
    """Neither what the gateway kept nor its peak grew by more than a few caps."""
    kept, peak = after[0] - before[0], after[1] - before[1]
    print(
        f"{what}: RSS {before[0] / 2**20:.1f} -> {after[0] / 2**20:.1f} MiB (kept {kept / 2**20:+.1f}), "
        f"peak {before[1] / 2**20:.1f} -> {after[1] / 2**20:.1f} MiB ({peak / 2**20:+.1f})"
    )
    assert kept < 8 * CAP, f"the gateway kept {kept >> 20} MiB after {what}"
    assert peak < 8 * CAP, f"the gateway's peak grew by {peak >> 20} MiB for {what}"


def _record_of(gw: RunningGateway, close_reason: str) -> dict[str, Any]:
    """The one record the close reason names (`... (decision <id>)`), the only one of its reason."""
    found = re.fullmatch(r"sandgate: (\w+) \(decision ([0-9a-f]+)\)", close_reason)
    assert found, close_reason
    record = gw.record(found.group(2))
    assert record["reason"] == found.group(1)
    assert [r["reason"] for r in gw.settled()].count(found.group(1)) == 1, "exactly one record"
    return record


def _assert_clean_log(gw: RunningGateway) -> None:
    """A refusal is not a crash: no traceback, no mitmproxy crash report, no error line."""
    time.sleep(0.3)  # what the teardown of the closed connections logs
    log = gw.log()
    assert "Traceback" not in log and "crashed" not in log and '"level": "error"' not in log, log[-3000:]


class _OtherTenant:
    """Plain requests of another tenant through the same gateway, one after another, in a thread:
    from before the block starts until one more has been answered after it ended."""

    def __init__(self, gw: RunningGateway, up: RecordingUpstream) -> None:
        self.url = f"http://api.test:{up.port}/other"
        self.proxy = gw.proxy("sb2", OTHER_TOKEN)
        self.statuses: list[int | str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _OtherTenant:
        self._thread.start()
        self._wait_for(1)
        return self

    def __exit__(self, *exc: object) -> None:
        self._wait_for(len(self.statuses) + 1)
        self._stop.set()
        self._thread.join(20)

    def _wait_for(self, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.statuses) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    def _run(self) -> None:
        with httpx.Client(proxy=self.proxy, timeout=10) as client:
            while not self._stop.is_set():
                try:
                    self.statuses.append(client.get(self.url).status_code)
                except httpx.HTTPError as e:
                    self.statuses.append(type(e).__name__)


@pytest.mark.slow
@pytest.mark.parametrize("size", [CAP - 1, CAP], ids=["one byte under the cap", "exactly the cap"])
def test_a_message_within_the_cap_passes_whole(
    gateway: RunningGateway, ws_upstream: WebSocketUpstream, size: int
) -> None:
    conn_id = len(ws_upstream.events)
    guest = _guest(gateway, ws_upstream)
    try:
        assert guest.send_message(size, FRAGMENT) == size
        records = ws_upstream.wait_for(conn_id, "bytes")
        assert [r for r in records if r[0] == "bytes"] == [
            ("bytes", size, hashlib.sha256(b"g" * size).hexdigest())
        ]
        # The session goes on.
        guest.send(TextMessage("still here"))
        assert guest.wait(lambda evs: any(isinstance(e, TextMessage) for e in evs))
    finally:
        guest.close()


@pytest.mark.slow
def test_a_message_over_the_cap_closes_the_session_with_1009_one_record_and_no_growth(
    gateway: RunningGateway, ws_upstream: WebSocketUpstream, http_upstream: RecordingUpstream
) -> None:
    gw = gateway
    # Warm up (TLS, a whole message of the cap's size), then measure.
    warm = _guest(gw, ws_upstream)
    warm.send_message(CAP, FRAGMENT)
    warm.send(TextMessage("warm"))
    assert warm.wait(lambda evs: any(isinstance(e, TextMessage) for e in evs))
    warm.close()
    before = _memory(gw.proc.pid)
    conn_id = len(ws_upstream.events)
    guest = _guest(gw, ws_upstream)
    with _OtherTenant(gw, http_upstream) as other:
        sent = guest.send_message(ATTEMPT, FRAGMENT)
        close = guest.close_event()
    after = _memory(gw.proc.pid)
    guest.close()
    assert close is not None, f"no CLOSE after {sent} bytes"
    assert close.code == CloseReason.MESSAGE_TOO_BIG
    assert sent < ATTEMPT, "the gateway stopped the message long before its end"
    record = _record_of(gw, close.reason or "")
    assert (record["decision"], record["detail"]) == (
        "deny",
        f"a WebSocket message from the guest over {CAP} bytes",
    )
    upstream = ws_upstream.wait_for(conn_id, "eof")
    assert not [r for r in upstream if r[0] == "bytes"], "none of the message reached the upstream"
    assert ("close", CloseReason.GOING_AWAY, "") in upstream, upstream
    assert other.statuses and set(other.statuses) == {200}, other.statuses
    print(f"the other tenant's requests meanwhile: {len(other.statuses)}, all 200")
    _assert_bounded(before, after, f"a {ATTEMPT >> 20} MiB message refused after {sent / 2**20:.1f} MiB")
    _assert_clean_log(gw)


@pytest.mark.slow
def test_a_deflated_message_that_inflates_past_the_cap_is_refused_before_it_is_inflated(
    gateway: RunningGateway, ws_upstream: WebSocketUpstream
) -> None:
    gw = gateway
    before = _memory(gw.proc.pid)
    guest = _guest(gw, ws_upstream, deflate=True)
    try:
        # 40 MiB of one byte: well under 100 KiB on the wire once deflated. The refusal can
        # come before the last of it is written (seen under load): sending stops there.
        guest.send_until_refused(BytesMessage(b"\0" * ATTEMPT))
        close = guest.close_event()
        after = _memory(gw.proc.pid)
    finally:
        guest.close()
    assert close is not None and close.code == CloseReason.MESSAGE_TOO_BIG
    _record_of(gw, close.reason or "")
    _assert_bounded(before, after, f"a {ATTEMPT >> 20} MiB message deflated to {guest.sent_bytes >> 10} KiB")
    _assert_clean_log(gw)


@pytest.mark.slow
def test_a_message_over_the_cap_from_the_upstream_closes_the_session_too(
    gateway: RunningGateway, ws_upstream: WebSocketUpstream
) -> None:
    conn_id = len(ws_upstream.events)
    guest = _guest(gateway, ws_upstream)
    try:
        guest.send(TextMessage(f"send-bytes:{CAP + FRAGMENT}:{FRAGMENT}"))
        close = guest.close_event()
    finally:
        guest.close()
    assert close is not None and close.code == CloseReason.GOING_AWAY
    assert not any(isinstance(e, BytesMessage) for e in guest.events), "none of it reached the guest"
    record = _record_of(gateway, close.reason or "")
    assert record["detail"] == f"a WebSocket message from the upstream over {CAP} bytes"
    upstream = ws_upstream.wait_for(conn_id, "eof")
    assert ("close", CloseReason.MESSAGE_TOO_BIG, "") in upstream, upstream
    _assert_clean_log(gateway)
