"""Syslog sinks against Debian's rsyslogd, run with the config the SIEM page shows: RFC 5424
over TCP (octet counting) and TLS, each event's id in the structured data, outages retried."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog
from support.pki import TestPKI
from support.rsyslog import Rsyslog
from support.siem_lines import trail_lines, wait_for

from sandgate.proxy.audit.sinks.events import Event, encode_lines
from sandgate.proxy.audit.sinks.sink import SiemSink
from sandgate.proxy.audit.sinks.syslog import SyslogTransport, frame, message

SinkFactory = Callable[..., SiemSink]


@pytest.fixture
def rsyslog(tmp_path: Path) -> Iterator[Rsyslog]:
    server = Rsyslog(tmp_path / "rsyslog").start()
    yield server
    server.stop()


@pytest.mark.parametrize("tls", [False, True], ids=["over plain TCP", "over TLS"])
def test_every_event_arrives_once_with_its_id(rsyslog: Rsyslog, make_sink: SinkFactory, tls: bool) -> None:
    ctx = ssl.create_default_context(cafile=rsyslog.pki.ca_file) if tls else None
    port = rsyslog.tls_port if tls else rsyslog.port
    sink = make_sink(SyslogTransport("127.0.0.1", port, context=ctx, timeout=5), fmt="ocsf")
    lines = trail_lines(120)
    sink.write(lines)
    expected = [e.uid for e in encode_lines(lines, "ocsf")]
    assert sorted(rsyslog.wait_for(len(expected))) == sorted(expected)
    params, body = rsyslog.events()[0]
    assert params == {"id": "d0", "class": "HTTP Activity", "tenant": "t1", "sandbox": "sb1"}
    assert body["metadata"]["uid"] == "d0" and body["class_uid"] == 4002  # type: ignore[index]
    # Counted when rsyslog closed its side; the cursor moves just after.
    wait_for(
        lambda: (f := sink.figures()).delivered == len(expected) and f.queue_bytes == 0, "the delivered count"
    )


def test_a_receiver_away_for_a_moment_gets_everything_after(rsyslog: Rsyslog, make_sink: SinkFactory) -> None:
    rsyslog.stop()
    sink = make_sink(SyslogTransport("127.0.0.1", rsyslog.port, context=None, timeout=2), fmt="native")
    sink.write(trail_lines(30))
    wait_for(lambda: sink.figures().retried >= 60, "two failed attempts")
    assert sink.figures().delivered == 0 and sink.figures().oldest_seconds > 0
    rsyslog.start()
    assert sorted(rsyslog.wait_for(30)) == sorted(f"d{i}" for i in range(30))
    wait_for(lambda: sink.figures().delivered == 30, "the delivered count")


def test_an_untrusted_certificate_is_not_sent_to_and_is_retried(
    rsyslog: Rsyslog, make_sink: SinkFactory, tmp_path: Path
) -> None:
    (tmp_path / "other").mkdir()
    other = TestPKI(directory=tmp_path / "other", common_name="another CA")
    ctx = ssl.create_default_context(cafile=other.ca_file)
    with structlog.testing.capture_logs() as logs:
        sink = make_sink(SyslogTransport("127.0.0.1", rsyslog.tls_port, context=ctx, timeout=2))
        sink.write(trail_lines(5))
        wait_for(lambda: sink.figures().retried >= 10, "two failed attempts")
    assert rsyslog.uids() == [] and sink.figures().delivered == 0
    failed = [e for e in logs if e["event"] == "audit.sink_unavailable"]
    assert failed and "certificate not trusted" in failed[0]["why"]
    assert "PRIVATE KEY" not in json.dumps(logs, default=str)


def test_a_message_is_rfc5424_with_escaped_structured_data() -> None:
    event = Event(
        uid="id-1", body={"k": "v"}, time=1796032800.25, kind="HTTP Activity", tenant='t"1]', sandbox="s\\b"
    )
    msg = message(event, pri=134, hostname="gw1", app="sandgate", procid="42")
    assert msg == (
        b'<134>1 2026-11-30T10:00:00.250Z gw1 sandgate 42 HTTP_Activity [sandgate@32473 id="id-1" '
        b'class="HTTP Activity" tenant="t\\"1\\]" sandbox="s\\\\b"] {"k":"v"}'
    )
    assert frame(msg) == str(len(msg)).encode() + b" " + msg
