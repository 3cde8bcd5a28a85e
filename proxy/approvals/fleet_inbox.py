"""The fleet's approval inbox in redis: every gateway publishes the requests it holds, lists the
others', and takes an operator's decision on another gateway's request to that gateway.

Keys (under the `redis:` prefix):
- `held:<gateway>`: the gateway's open requests (JSON, as `GET /v1/access-requests` shows
  them), rewritten on every change and every PUBLISH_EVERY s, expiring EXPIRE_AFTER s after
  the last write: a gateway that died drops out of every listing on its own.
- `held-gateways`: a sorted set of gateway → the time its listing expires (the listing's index).
- `settled:<id>`: the gateway that held a request now settled, for KEEP_SETTLED s, so a late
  decision on it from another gateway gets the holder's 409, as it would there.
- `decide:<gateway>`: decisions handed to the gateway that holds the request (a list it BLPOPs).
- `decided:<ticket>`: the holder's outcome for one handed-over decision (a list, kept briefly).

A decision message names the request, the verb, the operator's fields (`by`, `reason`, scope,
TTL, uses) and the gateway it came through: nothing secret. The holder applies it with the
function a local decision uses, and only for a request it holds (else 404); its store settles
a request once, so two decisions racing from two gateways release it once. The gateway the
operator talks to waits up to DECIDE_WAIT s; when no outcome comes, it takes its message back
(LREM): taken back, nothing was applied; gone, the holder took it, and the answer says so.
A holder drops a message whose deadline passed before it took it (the sender gave up on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from sandgate.proxy.approvals.store import SettleError
from sandgate.proxy.redis.client import Keys
from sandgate.proxy.redis.outage import RedisOutage
from sandgate.proxy.tasks import BackgroundTask

__all__ = [
    "DECIDE_WAIT",
    "EXPIRE_AFTER",
    "PUBLISH_EVERY",
    "Apply",
    "FleetInbox",
    "FleetUnreachable",
    "Lister",
]

log = structlog.get_logger("sandgate.approvals")

# A gateway rewrites its listing this often (besides on every change)...
PUBLISH_EVERY = 2.0
# ...and a listing not rewritten for this long is gone (its gateway died or lost redis).
EXPIRE_AFTER = 8.0
# How long the gateway an operator talks to waits for the holder's outcome.
DECIDE_WAIT = 5.0
# How long an outcome nobody collected stays, and how long an unserved decide list stays.
KEEP_OUTCOME = 30.0
# How long a settled request's holder stays known to the fleet.
KEEP_SETTLED = 600.0

# This gateway's open requests, as its own listing shows them.
Lister = Callable[[], Awaitable[list[dict[str, Any]]]]
# Apply a decision here: (request id, "approve" | "deny", the operator's fields, the gateway it
# came through) → the settled request; SettleError when it cannot be taken.
Apply = Callable[[str, str, dict[str, Any], str], Awaitable[dict[str, Any]]]


class FleetUnreachable(Exception):
    """Redis did not answer: the other gateways' requests can be neither listed nor decided."""


class FleetInbox:
    """One gateway's side of the fleet's approval inbox (run by the lead of its workers)."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        gateway_id: str,
        *,
        timeout: float,
        list_local: Lister,
        apply: Apply,
        outage: RedisOutage,
    ) -> None:
        self.client = client
        self.keys = keys
        self.gateway_id = gateway_id
        self.list_local = list_local
        self.apply = apply
        self.outage = outage
        # A blocking pop returns before the client's own command timeout would cut it.
        self.block = max(0.05, timeout / 2)
        self._dirty = asyncio.Event()
        self._settled: list[str] = []  # settled here, not yet marked so in redis
        self._tasks = (
            BackgroundTask("sandgate-fleet-inbox-publish", self._publish_loop),
            BackgroundTask("sandgate-fleet-inbox-serve", self._serve_loop),
        )

    def changed(self, _request: object = None) -> None:
        """A request was held or settled here: publish the listing now (Approvals' listener)."""
        self._dirty.set()

    def settled(self, request: object) -> None:
        """A request ended here (Approvals' listener): publish, and mark who settled it."""
        request_id = getattr(request, "id", None)
        if isinstance(request_id, str):
            self._settled.append(request_id)
        self._dirty.set()

    async def start(self) -> None:
        for task in self._tasks:
            task.start()

    async def stop(self) -> None:
        for task in self._tasks:
            await task.stop()
        # A clean stop takes this gateway's listing out at once (its held requests are cut).
        with contextlib.suppress(RedisError, OSError):
            await self.client.zrem(self.keys("held-gateways"), self.gateway_id)
            await self.client.delete(self.keys("held", self.gateway_id))

    async def _publish_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), PUBLISH_EVERY)
            self._dirty.clear()
            try:
                await self.publish()
            except (RedisError, OSError) as e:
                self.outage.failed("fleet_inbox", e)
                await asyncio.sleep(self.block)
            except Exception:
                # Never ends the loop: the next refresh tries again.
                log.exception("fleet_inbox.publish_failed")
                await asyncio.sleep(self.block)

    async def publish(self) -> None:
        """Write this gateway's open requests (and its place in the index) with their expiry."""
        requests = await self.list_local()
        expires = time.time() + EXPIRE_AFTER
        body = json.dumps({"gateway": self.gateway_id, "expires": expires, "requests": requests})
        settled, self._settled = self._settled, []
        async with self.client.pipeline(transaction=True) as pipe:
            for request_id in settled:
                pipe.set(self.keys("settled", request_id), self.gateway_id, px=int(KEEP_SETTLED * 1000))
            pipe.set(self.keys("held", self.gateway_id), body, px=int(EXPIRE_AFTER * 1000))
            pipe.zadd(self.keys("held-gateways"), {self.gateway_id: expires})
            pipe.zremrangebyscore(self.keys("held-gateways"), "-inf", time.time())
            try:
                await pipe.execute()
            except (RedisError, OSError):
                self._settled[:0] = settled  # marked with the next write
                raise
        self.outage.reached("fleet_inbox")

    async def others(self) -> list[dict[str, Any]]:
        """The other gateways' open requests, each with its `gateway`; FleetUnreachable."""
        now = time.time()
        try:
            names = await self.client.zrangebyscore(self.keys("held-gateways"), now, "+inf")
            listed = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
            gateways = [g for g in listed if g != self.gateway_id]
            bodies = await self.client.mget([self.keys("held", g) for g in gateways]) if gateways else []
        except (RedisError, OSError) as e:
            self.outage.failed("fleet_inbox", e)
            raise FleetUnreachable(type(e).__name__) from None
        self.outage.reached("fleet_inbox")
        out: list[dict[str, Any]] = []
        for gateway, raw in zip(gateways, bodies, strict=True):
            listing = _listing(raw)
            requests = listing.get("requests") if listing is not None else None
            if listing is None or not isinstance(requests, list) or float(listing.get("expires") or 0) <= now:
                continue
            out.extend({**r, "gateway": gateway} for r in requests if isinstance(r, dict))
        return out

    async def holder_of(self, request_id: str) -> str | None:
        """The other gateway that lists the request as held, or that settled it lately; None
        when none does (FleetUnreachable)."""
        for request in await self.others():
            if request.get("id") == request_id:
                return str(request["gateway"])
        try:
            settled_by = await self.client.get(self.keys("settled", request_id))
        except (RedisError, OSError) as e:
            self.outage.failed("fleet_inbox", e)
            raise FleetUnreachable(type(e).__name__) from None
        if settled_by is None:
            return None
        holder = settled_by.decode() if isinstance(settled_by, bytes) else str(settled_by)
        return holder if holder != self.gateway_id else None

    async def decide_remote(self, request_id: str, verb: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Hand a decision to the gateway that holds the request and wait for its outcome:
        the settled request, or SettleError (its 404 / 409 / 400 / 422, 503 when redis is
        down, 504 when the holder did not answer in time)."""
        try:
            holder = await self.holder_of(request_id)
        except FleetUnreachable:
            raise SettleError(
                503,
                f"access request {request_id!r} is not held by this gateway, and the fleet's redis is "
                "unreachable: a request held by another gateway cannot be decided now",
            ) from None
        if holder is None:
            raise SettleError(404, f"no access request {request_id!r} in the fleet")
        message = {"id": request_id, "verb": verb, "fields": fields, "from": self.gateway_id}
        outcome = await self._hand_over(holder, message)
        if outcome.get("status") != 200:
            raise SettleError(int(outcome.get("status") or 502), str(outcome.get("error")))
        body = outcome.get("body")
        return {**(body if isinstance(body, dict) else {}), "gateway": holder}

    async def _hand_over(self, holder: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Push one decision to `holder`'s list and wait for its outcome (SettleError 503 / 504
        saying whether anything can have been applied)."""
        ticket = secrets.token_hex(16)
        message = json.dumps({**fields, "ticket": ticket, "deadline": time.time() + DECIDE_WAIT})
        queue, what = self.keys("decide", holder), f"the decision on {fields['id']!r}"
        pushed = taken_back = False
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.rpush(queue, message)
                pipe.pexpire(queue, int(KEEP_OUTCOME * 1000))
                await pipe.execute()
            pushed = True
            outcome = await self._outcome(ticket)
            if outcome is None:
                taken_back = bool(await self.client.lrem(queue, 1, message))
        except (RedisError, OSError) as e:
            self.outage.failed("fleet_inbox", e)
            if not pushed:
                raise SettleError(
                    503,
                    f"the fleet's redis failed: {what} was not handed to gateway {holder!r}, "
                    "nothing was applied",
                ) from None
            raise SettleError(
                503,
                f"the fleet's redis failed after {what} was handed to gateway {holder!r}: list "
                "the requests to see its outcome",
            ) from None
        if outcome is not None:
            return outcome
        if taken_back:
            raise SettleError(
                504, f"gateway {holder!r} did not take {what} within {DECIDE_WAIT:g} s; nothing was applied"
            )
        raise SettleError(
            504,
            f"gateway {holder!r} took {what} but did not answer within {DECIDE_WAIT:g} s: list the "
            "requests to see its outcome",
        )

    async def _outcome(self, ticket: str) -> dict[str, Any] | None:
        """The holder's outcome for `ticket`, or None when none came within DECIDE_WAIT s."""
        deadline = time.monotonic() + DECIDE_WAIT
        key = self.keys("decided", ticket)
        while (left := deadline - time.monotonic()) > 0:
            popped = await self.client.blpop([key], timeout=min(self.block, max(left, 0.01)))
            if popped is not None:
                found = _listing(popped[1])
                return found if found is not None else {"status": 502, "error": "unreadable outcome"}
        return None

    async def _serve_loop(self) -> None:
        queue = self.keys("decide", self.gateway_id)
        while True:
            try:
                popped = await self.client.blpop([queue], timeout=self.block)
            except (RedisError, OSError) as e:
                self.outage.failed("fleet_inbox", e)
                await asyncio.sleep(self.block)
                continue
            if popped is not None:
                await self._serve(popped[1])

    async def _serve(self, raw: bytes | str) -> None:
        """Apply one handed-over decision here and write its outcome back."""
        message = _listing(raw)
        if message is None or not isinstance(message.get("fields"), dict):
            log.warning("fleet_inbox.unreadable_decision")
            return
        if float(message.get("deadline") or 0) <= time.time():
            # Its sender stopped waiting and answered 504: applying it now would surprise.
            log.warning("fleet_inbox.decision_too_late", id=str(message.get("id"))[:64])
            return
        request_id, verb = str(message.get("id")), str(message.get("verb"))
        via = str(message.get("from"))[:128]
        try:
            if verb not in ("approve", "deny"):
                raise SettleError(400, f"unknown decision {verb[:16]!r}")
            body = await self.apply(request_id, verb, message["fields"], via)
            outcome: dict[str, Any] = {"status": 200, "body": body}
        except SettleError as e:
            outcome = {"status": e.status, "error": e.message}
        except Exception:
            log.exception("fleet_inbox.apply_failed", id=request_id[:64])
            outcome = {"status": 500, "error": "the holding gateway failed to apply the decision"}
        key = self.keys("decided", str(message.get("ticket"))[:64])
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.rpush(key, json.dumps(outcome))
                pipe.pexpire(key, int(KEEP_OUTCOME * 1000))
                await pipe.execute()
        except (RedisError, OSError) as e:
            # Applied (or refused) here; the sender answers 504 and the listing shows the result.
            self.outage.failed("fleet_inbox", e)
        self._dirty.set()


def _listing(raw: bytes | str | None) -> dict[str, Any] | None:
    """A JSON object read from redis, or None when it is missing or not one."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
