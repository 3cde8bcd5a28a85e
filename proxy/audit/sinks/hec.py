"""Splunk HTTP Event Collector compatible: newline-joined event objects POSTed to
`<url>/services/collector/event` with `Authorization: Splunk <token>`.

Each object: `time` (epoch seconds), `event` (the event), `sourcetype`, `fields.event_id` (its
id, indexed for de-duplication), and `index` when set. 2xx: delivered; 429, 5xx and the 4xx in
transport.RETRY_STATUSES (a token being fixed): again later; another 4xx (400: a malformed
event) refuses the batch, counted as dropped and logged.
"""

from __future__ import annotations

import json
import ssl

import httpx

from sandgate.brokers import Secret
from sandgate.proxy.audit.sinks.events import Event
from sandgate.proxy.audit.sinks.transport import Retry, Sent, retry_after, retryable_status

__all__ = ["HecTransport", "hec_body"]


class HecTransport:
    """Sends batches to one HEC-compatible receiver."""

    def __init__(
        self,
        url: str,
        *,
        token: Secret,
        context: ssl.SSLContext,
        timeout: float,
        sourcetype: str,
        index: str | None,
    ) -> None:
        self._url = url + "/services/collector/event"
        self._token = token
        self._sourcetype = sourcetype
        self._index = index
        self._client = httpx.Client(verify=context, timeout=timeout, trust_env=False)

    @property
    def receiver(self) -> str:
        return self._url

    def send(self, events: list[Event]) -> Sent:
        body = hec_body(events, sourcetype=self._sourcetype, index=self._index)
        headers = {"Authorization": f"Splunk {self._token.reveal()}", "Content-Type": "application/json"}
        try:
            answer = self._client.post(self._url, content=body, headers=headers)
        except httpx.HTTPError as e:
            raise Retry(f"{self._url}: {type(e).__name__}") from None
        if retryable_status(answer.status_code):
            raise Retry(f"{self._url}: HTTP {answer.status_code}", after=retry_after(answer))
        if answer.status_code >= 300:
            return Sent(rejected=len(events), why=f"HTTP {answer.status_code}: {answer.text[:200]}")
        return Sent()

    def close(self) -> None:
        self._client.close()


def hec_body(events: list[Event], *, sourcetype: str, index: str | None) -> bytes:
    """The events as HEC event objects, one per line."""
    lines = []
    for e in events:
        obj: dict[str, object] = {
            "time": round(e.time, 3),
            "sourcetype": sourcetype,
            "fields": {"event_id": e.uid},
            "event": e.body,
        }
        if index:
            obj["index"] = index
        lines.append(json.dumps(obj, separators=(",", ":"), default=str))
    return "\n".join(lines).encode()
