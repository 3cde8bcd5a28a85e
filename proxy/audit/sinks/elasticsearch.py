"""Elasticsearch bulk API compatible: NDJSON POSTed to `<url>/_bulk`.

Each event is `{"create": {"_index": .., "_id": <event id>}}` and the event (with an
`@timestamp` added when it has none): a resend of an event the index holds is a 409 for that
item, which counts as delivered. Per item: 2xx and 409 delivered; 429 and 5xx sent again (only
those); another status (400: a mapping error) refused for good, counted as dropped and logged.
The whole request answered 429/5xx (or a 4xx in transport.RETRY_STATUSES): again later.
"""

from __future__ import annotations

import json
import ssl
from datetime import UTC, datetime
from typing import Any

import httpx

from sandgate.brokers import Secret
from sandgate.proxy.audit.sinks.events import Event
from sandgate.proxy.audit.sinks.transport import Retry, Sent, retry_after, retryable_status

__all__ = ["BulkTransport", "bulk_body"]


class BulkTransport:
    """Sends batches to one bulk-compatible receiver."""

    def __init__(
        self,
        url: str,
        *,
        index: str,
        api_key: Secret | None,
        context: ssl.SSLContext,
        timeout: float,
    ) -> None:
        self._url = url + "/_bulk"
        self._index = index
        self._api_key = api_key
        self._client = httpx.Client(verify=context, timeout=timeout, trust_env=False)

    @property
    def receiver(self) -> str:
        return self._url

    def send(self, events: list[Event]) -> Sent:
        headers = {"Content-Type": "application/x-ndjson"}
        if self._api_key is not None:
            headers["Authorization"] = f"ApiKey {self._api_key.reveal()}"
        try:
            answer = self._client.post(self._url, content=bulk_body(events, self._index), headers=headers)
        except httpx.HTTPError as e:
            raise Retry(f"{self._url}: {type(e).__name__}") from None
        if retryable_status(answer.status_code):
            raise Retry(f"{self._url}: HTTP {answer.status_code}", after=retry_after(answer))
        if answer.status_code >= 300:
            return Sent(rejected=len(events), why=f"HTTP {answer.status_code}: {answer.text[:200]}")
        try:
            reply = answer.json()
        except ValueError:
            raise Retry(f"{self._url}: an answer that is not JSON") from None
        return _items(reply, events)

    def close(self) -> None:
        self._client.close()


def _items(reply: Any, events: list[Event]) -> Sent:
    """Sort the per-item results: delivered, to send again, refused."""
    if not isinstance(reply, dict) or not reply.get("errors"):
        return Sent()
    items = reply.get("items")
    if not isinstance(items, list) or len(items) != len(events):
        raise Retry("bulk answer without one item per event")
    again: list[Event] = []
    rejected, why = 0, ""
    for event, item in zip(events, items, strict=True):
        result: object = next(iter(item.values()), {}) if isinstance(item, dict) and item else {}
        status = int(result.get("status", 500)) if isinstance(result, dict) else 500
        if status < 300 or status == 409:
            continue
        error = result.get("error") if isinstance(result, dict) else None
        why = str(error.get("type") if isinstance(error, dict) else error or f"status {status}")[:200]
        if status == 429 or status >= 500:
            again.append(event)
        else:
            rejected += 1
    return Sent(again=again, rejected=rejected, why=why)


def bulk_body(events: list[Event], index: str) -> bytes:
    """One `create` action and document per event, NDJSON (ends with a newline)."""
    out = []
    for e in events:
        doc = dict(e.body)
        doc.setdefault("@timestamp", datetime.fromtimestamp(e.time, UTC).isoformat(timespec="milliseconds"))
        out.append(json.dumps({"create": {"_index": index, "_id": e.uid}}, separators=(",", ":")))
        out.append(json.dumps(doc, separators=(",", ":"), default=str))
    return ("\n".join(out) + "\n").encode()
