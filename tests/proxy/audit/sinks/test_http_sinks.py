"""OTLP/HTTP, Splunk HEC and Elasticsearch bulk sinks against local receivers that decode
each wire format: ids, attributes, failed answers retried, refusals counted, secrets kept."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator

import pytest
import structlog
from support.siem_http import Answer, SiemReceiver
from support.siem_lines import trail_lines, wait_for

from sandgate.brokers import Secret
from sandgate.proxy.audit.sinks.elasticsearch import BulkTransport
from sandgate.proxy.audit.sinks.events import encode_lines
from sandgate.proxy.audit.sinks.hec import HecTransport
from sandgate.proxy.audit.sinks.otlp import OtlpTransport
from sandgate.proxy.audit.sinks.sink import SiemSink

SinkFactory = Callable[..., SiemSink]
TOKEN = "hec-token-5b1e0c9a77d24e1f"


@pytest.fixture
def receiver() -> Iterator[SiemReceiver]:
    server = SiemReceiver(hec_token=TOKEN).start()
    yield server
    server.stop()


def otlp(receiver: SiemReceiver, **headers: Secret) -> OtlpTransport:
    return OtlpTransport(
        receiver.url, context=ssl.create_default_context(), timeout=5, headers={}, secret_headers=headers
    )


def hec(receiver: SiemReceiver, token: str = TOKEN) -> HecTransport:
    return HecTransport(
        receiver.url,
        token=Secret(token),
        context=ssl.create_default_context(),
        timeout=5,
        sourcetype="sandgate:audit",
        index=None,
    )


def bulk(receiver: SiemReceiver) -> BulkTransport:
    return BulkTransport(
        receiver.url, index="sandgate-audit", api_key=None, context=ssl.create_default_context(), timeout=5
    )


def test_otlp_log_records_carry_the_event_and_its_id(receiver: SiemReceiver, make_sink: SinkFactory) -> None:
    lines = trail_lines(40)
    sink = make_sink(otlp(receiver), fmt="ocsf")
    sink.write(lines)
    expected = [e.uid for e in encode_lines(lines, "ocsf")]
    wait_for(lambda: len(receiver.received) >= len(expected), "every event")
    assert receiver.uids() == expected
    first = receiver.received[0]
    assert first.body["metadata"]["uid"] == first.uid == "d0"
    assert first.meta["event.class"] == "HTTP Activity"
    assert (first.meta["sandgate.tenant"], first.meta["sandgate.sandbox"]) == ("t1", "sb1")
    assert first.meta["resource"]["service.name"] == "sandgate"
    assert first.meta["time_unix_nano"] == int(first.body["time"]) * 1_000_000


@pytest.mark.parametrize(
    "answers",
    [
        (Answer(500), Answer(503)),
        (Answer(429, retry_after=0.2),),
        (Answer(401),),
    ],
    ids=["server errors are retried", "429 waits Retry-After", "a refused token is retried, not dropped"],
)
def test_otlp_failed_exports_are_sent_again(
    receiver: SiemReceiver, make_sink: SinkFactory, answers: tuple[Answer, ...]
) -> None:
    receiver.script.extend(answers)
    sink = make_sink(otlp(receiver))
    sink.write(trail_lines(10))
    wait_for(lambda: sink.figures().delivered == 10, "delivery")
    assert receiver.uids() == [f"d{i}" for i in range(10)]
    assert sink.figures().retried == 10 * len(answers) and sink.figures().rejected == 0


def test_otlp_partial_success_counts_the_rejected_as_dropped(
    receiver: SiemReceiver, make_sink: SinkFactory
) -> None:
    receiver.script.append(Answer(rejected=3))
    with structlog.testing.capture_logs() as logs:
        sink = make_sink(otlp(receiver), batch_size=10)
        sink.write(trail_lines(10))
        wait_for(lambda: (f := sink.figures()).delivered == 7 and f.queue_bytes == 0, "delivery")
    assert sink.figures().rejected == 3
    assert any(e["event"] == "audit.sink_rejected" and e["events"] == 3 for e in logs)


def test_otlp_secret_headers_are_sent_and_never_shown(receiver: SiemReceiver, make_sink: SinkFactory) -> None:
    receiver.script.append(Answer(503))
    with structlog.testing.capture_logs() as logs:
        transport = otlp(receiver, Authorization=Secret(f"Bearer {TOKEN}"))
        sink = make_sink(transport)
        sink.write(trail_lines(2))
        wait_for(lambda: sink.figures().delivered == 2, "delivery")
    assert receiver.requests[-1][1]["Authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in json.dumps(logs, default=str) + repr(sink) + repr(transport) + repr(vars(transport))


def test_hec_events_carry_the_id_and_the_token(receiver: SiemReceiver, make_sink: SinkFactory) -> None:
    sink = make_sink(hec(receiver), fmt="native")
    sink.write(trail_lines(25))
    wait_for(lambda: sink.figures().delivered == 25, "delivery")
    assert receiver.uids() == [f"d{i}" for i in range(25)]
    first = receiver.received[0]
    assert first.body["decision_id"] == "d0" and first.meta["sourcetype"] == "sandgate:audit"
    assert isinstance(first.meta["time"], float)
    assert receiver.requests[0][1]["Authorization"] == f"Splunk {TOKEN}"


def test_hec_a_wrong_token_is_retried_and_never_logged(
    receiver: SiemReceiver, make_sink: SinkFactory
) -> None:
    wrong = "wrong-token-0f3c2d1b9e8a7f6"
    with structlog.testing.capture_logs() as logs:
        transport = hec(receiver, wrong)
        sink = make_sink(transport)
        sink.write(trail_lines(3))
        wait_for(lambda: sink.figures().retried >= 6, "two failed attempts")
    assert receiver.received == [] and sink.figures().delivered == 0 and sink.figures().rejected == 0
    assert any(e["event"] == "audit.sink_unavailable" and "HTTP 401" in e["why"] for e in logs)
    shown = json.dumps(logs, default=str) + repr(sink) + repr(transport) + repr(vars(transport))
    assert wrong not in shown and TOKEN not in shown


def test_bulk_a_resend_is_a_409_that_counts_as_delivered(
    receiver: SiemReceiver, make_sink: SinkFactory
) -> None:
    receiver.ids.update({"d0", "d1"})  # delivered before an acknowledgement was lost
    sink = make_sink(bulk(receiver))
    sink.write(trail_lines(5))
    wait_for(lambda: sink.figures().delivered == 5, "delivery")
    assert receiver.uids() == ["d2", "d3", "d4"] and sink.figures().retried == 0


def test_bulk_only_the_retryable_items_are_sent_again(receiver: SiemReceiver, make_sink: SinkFactory) -> None:
    receiver.script.append(Answer(items=(201, 429, 400, 503, 201)))
    with structlog.testing.capture_logs() as logs:
        sink = make_sink(bulk(receiver))
        sink.write(trail_lines(5))
        # Counted as delivered when the receiver answers, the cursor moved just after.
        wait_for(lambda: (f := sink.figures()).delivered == 4 and f.queue_bytes == 0, "delivery")
    again = receiver.requests[1]
    assert again[0] == "/_bulk"
    assert receiver.uids() == ["d0", "d4", "d1", "d3"]  # d1 and d3 again; d2 refused for good
    figures = sink.figures()
    assert (figures.retried, figures.rejected, figures.queue_bytes) == (2, 1, 0)
    assert any(e["event"] == "audit.sink_rejected" and e["events"] == 1 for e in logs)
