"""Announce each new access request with an HMAC-signed POST (`approvals.webhook`).

Each worker announces the requests it holds: a request lives in exactly one worker's store, so
it gets exactly one call (with its retries), and no worker depends on another being up to be
announced. The callback paths in the body name the gateway's public admin API, where the lead
takes an operator's decision (proxy/approvals/operator_decisions.py) to whichever worker holds
the request (proxy/admin/access_requests.py).

Off the hot path: the store's hook only queues the call (bounded; when full the call is dropped,
logged and counted); a background task sends it (a few at once), retrying a failed attempt
with backoff while the request is still open. Nothing here holds, delays or fails a request.

Signature: `X-Sandgate-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>`,
with `X-Sandgate-Timestamp` (unix seconds, new on each attempt): a receiver recomputes it and
refuses a timestamp outside its window (a replay). `X-Sandgate-Delivery` (the request id) is
the same on every attempt, so a receiver can drop a retry of a call it already took.
The secret is read once, held as a Secret, and appears in no log line, error or repr; logs name
the receiver by scheme, host, port and path only (a URL's user:password or query may be secret).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import random
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import structlog

from sandgate.brokers import Secret
from sandgate.proxy.approvals.store import OPEN, AccessRequest, Approvals
from sandgate.proxy.config import WebhookConfig
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.metrics import METRICS
from sandgate.proxy.stores.placeholder_key import load_placeholder_key
from sandgate.proxy.tasks import BackgroundTask, TaskSet

__all__ = [
    "DELIVERY_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "Webhook",
    "load_webhook_secret",
    "sign",
    "verify",
    "webhook_for",
]

log = structlog.get_logger("sandgate.approvals.webhook")

SIGNATURE_HEADER = "X-Sandgate-Signature"
TIMESTAMP_HEADER = "X-Sandgate-Timestamp"
DELIVERY_HEADER = "X-Sandgate-Delivery"
MIN_SECRET_BYTES = 16
# Calls in flight at once per worker: a slow receiver does not hold up every other call.
CONCURRENCY = 4
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 30.0
# Attempts answered with these are tried again; any other 4xx is the receiver refusing the call.
RETRY_STATUSES = frozenset({408, 425, 429})


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The signature header's value: `sha256=` and the hex HMAC-SHA256 of `timestamp.body`."""
    digest = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify(
    secret: bytes,
    timestamp: str,
    body: bytes,
    signature: str,
    *,
    tolerance: float = 300.0,
    now: float | None = None,
) -> bool:
    """Whether a call is genuine and fresh (what a receiver checks): the signature matches
    (compared in constant time) and the timestamp lies within `tolerance` s of `now`."""
    try:
        sent = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - sent) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


def load_webhook_secret(reference: str) -> Secret:
    """The webhook key from its reference (env:VAR or file:PATH), at least 16 bytes."""
    try:
        return load_placeholder_key(reference, create=False, min_bytes=MIN_SECRET_BYTES)
    except ConfigError as e:
        raise ConfigError(
            f"approvals.webhook.secret: {str(e).replace('placeholder key', 'secret')}"
        ) from None


def receiver_name(url: str) -> str:
    """The receiver as logs name it: scheme, host, port and path (no credentials, no query)."""
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


@dataclass(frozen=True, slots=True)
class _Call:
    """One announcement: the request (to stop retrying once it is decided) and the body to send."""

    request: AccessRequest
    body: bytes


class Webhook:
    """Queues and sends one worker's announcements; `start` and `stop` on the gateway's loop."""

    def __init__(self, config: WebhookConfig, secret: Secret, *, gateway_id: str, worker: int) -> None:
        self.url = config.url
        self.receiver = receiver_name(config.url)
        self.gateway_id = gateway_id
        self.worker = worker
        self.timeout = config.timeout_seconds
        self.max_attempts = config.max_attempts
        self._secret = secret
        self._queue: asyncio.Queue[_Call] = asyncio.Queue(maxsize=config.queue)
        self._slots = asyncio.Semaphore(CONCURRENCY)
        self._sending = TaskSet()
        self._task = BackgroundTask("sandgate-approval-webhook", self._run)
        self._client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"Webhook({self.receiver!r}, worker={self.worker})"

    def announce(self, request: AccessRequest) -> None:
        """Queue the call announcing a new request (never blocks; a full queue drops it)."""
        body = json.dumps(self.body(request), separators=(",", ":"), sort_keys=True).encode()
        try:
            self._queue.put_nowait(_Call(request, body))
        except asyncio.QueueFull:
            METRICS.webhook_call("dropped")
            log.warning("approval.webhook_dropped", id=request.id, receiver=self.receiver, why="queue full")

    def body(self, request: AccessRequest) -> dict[str, object]:
        """What a call says: the request as the admin API shows it, where it is, how to decide it."""
        path = f"/v1/access-requests/{request.id}"
        return {
            "event": "access_request.opened",
            "gateway": self.gateway_id,
            "worker": self.worker,
            "request": request.view(),
            "admin": {"show": path, "approve": f"{path}/approve", "deny": f"{path}/deny"},
        }

    @property
    def queued(self) -> int:
        """Calls waiting to be sent."""
        return self._queue.qsize()

    def start(self) -> None:
        """Start sending (idempotent)."""
        if self._client is None:
            # trust_env off: the gateway's own HTTP(S)_PROXY settings must not reroute the call.
            self._client = httpx.AsyncClient(timeout=self.timeout, follow_redirects=False, trust_env=False)
        self._task.start()

    async def stop(self) -> None:
        """Stop sending: calls queued or being retried are given up (the requests die with the worker)."""
        await self._task.stop()
        await self._sending.cancel()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _run(self) -> None:
        while True:
            call = await self._queue.get()
            await self._slots.acquire()
            try:
                self._sending.spawn(self._deliver(call), name=f"sandgate-approval-webhook-{call.request.id}")
            except BaseException:
                self._slots.release()
                raise

    async def _deliver(self, call: _Call) -> None:
        try:
            attempt, error = 0, ""
            while True:
                attempt += 1
                error, retry = await self._attempt(call)
                if not error:
                    METRICS.webhook_call("delivered")
                    log.info(
                        "approval.webhook_sent", id=call.request.id, receiver=self.receiver, attempts=attempt
                    )
                    return
                # A request decided or expired meanwhile needs no more announcing.
                if not retry or attempt >= self.max_attempts or call.request.state not in OPEN:
                    break
                METRICS.webhook_call("retried")
                await asyncio.sleep(_backoff(attempt))
            METRICS.webhook_call("failed")
            log.warning(
                "approval.webhook_failed",
                id=call.request.id,
                receiver=self.receiver,
                attempts=attempt,
                error=error,
            )
        finally:
            self._slots.release()

    async def _attempt(self, call: _Call) -> tuple[str, bool]:
        """One POST: ("", _) when the receiver took it (2xx), else (what went wrong, retry it?)."""
        client = self._client
        if client is None:
            return "not started", False
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "sandgate-approvals",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(self._secret.reveal_bytes(), timestamp, call.body),
            DELIVERY_HEADER: call.request.id,
        }
        try:
            response = await client.post(self.url, content=call.body, headers=headers)
        except httpx.HTTPError as e:
            # The class only: an exception's text can carry the URL, and with it a credential.
            return type(e).__name__, True
        if 200 <= response.status_code < 300:
            return "", False
        status = response.status_code
        return f"HTTP {status}", status >= 500 or status in RETRY_STATUSES


def _backoff(attempt: int) -> float:
    """Seconds before attempt `attempt + 1`: doubling from FIRST_BACKOFF, a little jitter, capped."""
    base: float = min(FIRST_BACKOFF * 2.0 ** (attempt - 1), MAX_BACKOFF)
    return base * random.uniform(0.8, 1.2)  # noqa: S311 (spreading retries, not a secret)


def webhook_for(
    config: WebhookConfig | None, approvals: Approvals, *, gateway_id: str, worker: int
) -> Webhook | None:
    """The webhook announcing `approvals`' new requests, or None when none is configured;
    ConfigError when its secret cannot be read."""
    if config is None:
        return None
    webhook = Webhook(config, load_webhook_secret(config.secret), gateway_id=gateway_id, worker=worker)
    approvals.on_opened.append(webhook.announce)
    return webhook
