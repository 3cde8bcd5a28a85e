"""A sink as the audit writer sees it: `write` never waits on the receiver, the full policy
(drop_newest counted and logged once; block holds the writer until there is room), and a
queue left by a stopped gateway delivered by the next one."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import structlog
from support.siem_http import SiemReceiver
from support.siem_lines import trail_lines, wait_for

from sandgate.brokers import Secret
from sandgate.proxy.audit.sinks.hec import HecTransport
from sandgate.proxy.audit.sinks.otlp import OtlpTransport
from sandgate.proxy.audit.sinks.sink import SiemSink
from sandgate.proxy.audit.sinks.syslog import SyslogTransport

SinkFactory = Callable[..., SiemSink]


@pytest.fixture
def receiver() -> Iterator[SiemReceiver]:
    server = SiemReceiver(hec_token="test-token").start()
    yield server
    server.stop()


def otlp(receiver: SiemReceiver) -> OtlpTransport:
    return OtlpTransport(
        receiver.url, context=ssl.create_default_context(), timeout=5, headers={}, secret_headers={}
    )


def test_write_does_not_wait_for_a_receiver_that_never_answers(make_sink: SinkFactory) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(100)  # accepts (the kernel does) and never reads or answers
    try:
        transport = SyslogTransport("127.0.0.1", silent.getsockname()[1], context=None, timeout=30)
        sink = make_sink(transport)
        started = time.monotonic()
        for _ in range(50):
            sink.write(trail_lines(20))
        assert time.monotonic() - started < 1.0
        assert sink.figures().spooled == 1000 and sink.figures().delivered == 0
    finally:
        silent.close()


def test_drop_newest_counts_what_did_not_fit_and_logs_once(
    receiver: SiemReceiver, make_sink: SinkFactory
) -> None:
    receiver.stop()
    lines = trail_lines(2000)
    with structlog.testing.capture_logs() as logs:
        sink = make_sink(otlp(receiver), max_bytes=65_536)
        for start in range(0, 2000, 100):
            sink.write(lines[start : start + 100])
    figures = sink.figures()
    assert figures.dropped_full > 0 and figures.spooled + figures.dropped_full == 2000
    assert figures.queue_bytes <= 65_536
    assert [e["event"] for e in logs].count("audit.sink_full") == 1
    receiver.start()
    wait_for(lambda: sink.figures().delivered == figures.spooled, "the queued records")
    assert receiver.uids() == [f"d{i}" for i in range(figures.spooled)]  # the oldest kept, in order


def test_block_holds_the_writer_until_the_receiver_takes_records(
    receiver: SiemReceiver, make_sink: SinkFactory
) -> None:
    receiver.stop()
    lines = trail_lines(400)
    sink = make_sink(otlp(receiver), max_bytes=65_536, when_full="block")
    done = threading.Event()

    def writer() -> None:
        for start in range(0, 400, 50):
            sink.write(lines[start : start + 50])
        done.set()

    threading.Thread(target=writer, daemon=True).start()
    assert not done.wait(1.0)  # held: the queue is full and nothing drains it
    assert sink.figures().dropped_full == 0
    receiver.start()
    assert done.wait(15)
    wait_for(lambda: sink.figures().delivered == 400, "every record")
    assert sink.figures().dropped_full == 0


def test_a_queue_left_unsent_is_delivered_by_the_next_sink(
    receiver: SiemReceiver, make_sink: SinkFactory
) -> None:
    receiver.stop()
    first = make_sink(hec(receiver))
    first.write(trail_lines(30))
    wait_for(lambda: first.figures().retried > 0, "an attempt")
    first.close()
    receiver.start()
    second = make_sink(hec(receiver))  # the same queue folder: a gateway started again
    wait_for(lambda: second.figures().delivered == 30, "the earlier queue")
    assert receiver.uids() == [f"d{i}" for i in range(30)]


def test_a_clean_close_sends_what_is_queued(receiver: SiemReceiver, make_sink: SinkFactory) -> None:
    sink = make_sink(hec(receiver), linger=30.0)  # left alone, the batch would wait 30 s to fill
    sink.write(trail_lines(7))
    time.sleep(0.2)
    assert receiver.uids() == []
    started = time.monotonic()
    sink.close()
    assert time.monotonic() - started < 2.0
    assert receiver.uids() == [f"d{i}" for i in range(7)] and sink.figures().queue_bytes == 0


def hec(receiver: SiemReceiver) -> HecTransport:
    return HecTransport(
        receiver.url,
        token=Secret("test-token"),
        context=ssl.create_default_context(),
        timeout=2,
        sourcetype="s",
        index=None,
    )
