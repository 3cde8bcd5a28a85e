"""OTLP/HTTP logs: a protobuf ExportLogsServiceRequest POSTed to `<url>/v1/logs`.

Each event is a LogRecord whose body is the event's JSON (a string) and whose attributes are
its id (`event.id`), class (`event.class`), tenant and sandbox. The receiver's answer:
200 with `partial_success.rejected_log_records` > 0 (those are refused for good: counted as
dropped, the rest delivered); 429, 5xx and a few 4xx (see transport.RETRY_STATUSES): the whole
batch again, after `Retry-After` when given; another 4xx (400: malformed) refuses the batch.
"""

from __future__ import annotations

import socket
import ssl

import httpx
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs, SeverityNumber
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from sandgate.brokers import Secret
from sandgate.proxy.audit.sinks.events import Event
from sandgate.proxy.audit.sinks.transport import Retry, Sent, retry_after, retryable_status

__all__ = ["OtlpTransport", "export_request"]


class OtlpTransport:
    """Exports batches to one OTLP/HTTP logs receiver."""

    def __init__(
        self,
        url: str,
        *,
        context: ssl.SSLContext,
        timeout: float,
        headers: dict[str, str],
        secret_headers: dict[str, Secret],
    ) -> None:
        self._url = url + "/v1/logs"
        self._headers = headers
        self._secret_headers = secret_headers
        self._client = httpx.Client(verify=context, timeout=timeout, trust_env=False)
        self._host = socket.gethostname()

    @property
    def receiver(self) -> str:
        return self._url

    def send(self, events: list[Event]) -> Sent:
        body = export_request(events, host=self._host).SerializeToString()
        headers = {
            **self._headers,
            **{k: v.reveal() for k, v in self._secret_headers.items()},
            "Content-Type": "application/x-protobuf",
        }
        try:
            answer = self._client.post(self._url, content=body, headers=headers)
        except httpx.HTTPError as e:
            raise Retry(f"{self._url}: {type(e).__name__}") from None
        if retryable_status(answer.status_code):
            raise Retry(f"{self._url}: HTTP {answer.status_code}", after=retry_after(answer))
        if answer.status_code >= 300:
            return Sent(rejected=len(events), why=f"HTTP {answer.status_code}")
        return _partial(answer, len(events))

    def close(self) -> None:
        self._client.close()


def _partial(answer: httpx.Response, count: int) -> Sent:
    """What a 2xx answer refused (partial_success); an answer that does not parse refuses none."""
    if "protobuf" not in answer.headers.get("content-type", "") or not answer.content:
        return Sent()
    reply = ExportLogsServiceResponse()
    try:
        reply.ParseFromString(answer.content)
    except Exception:  # a protobuf DecodeError: the export itself was accepted
        return Sent()
    rejected = min(count, int(reply.partial_success.rejected_log_records))
    return Sent(rejected=rejected, why=reply.partial_success.error_message[:200]) if rejected else Sent()


def export_request(events: list[Event], *, host: str) -> ExportLogsServiceRequest:
    """One ExportLogsServiceRequest holding `events` as log records."""
    records = [
        LogRecord(
            time_unix_nano=int(e.time * 1e9),
            observed_time_unix_nano=int(e.time * 1e9),
            severity_number=SeverityNumber.SEVERITY_NUMBER_INFO,
            severity_text="INFO",
            body=AnyValue(string_value=e.json()),
            attributes=_attributes(
                {
                    "event.id": e.uid,
                    "event.class": e.kind,
                    "sandgate.tenant": e.tenant,
                    "sandgate.sandbox": e.sandbox,
                }
            ),
        )
        for e in events
    ]
    resource = Resource(attributes=_attributes({"service.name": "sandgate", "host.name": host}))
    scope = ScopeLogs(scope=InstrumentationScope(name="sandgate.audit"), log_records=records)
    return ExportLogsServiceRequest(resource_logs=[ResourceLogs(resource=resource, scope_logs=[scope])])


def _attributes(values: dict[str, str]) -> list[KeyValue]:
    return [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in values.items() if v]
