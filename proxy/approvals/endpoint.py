"""The guests' own endpoint at the reserved name (sandgate.proxy.approvals.reserved): a sandbox
proposes access and polls the answer, without leaving the sandbox.

- `POST /v1/access-requests` `{host, port, methods, paths, reason}`: validated (400 naming the
  field; nothing counted or recorded), rate-limited per sandbox (`approvals.proposals_per_minute`,
  429 with Retry-After),
  screened (what the address guard or a deny rule refuses is refused at once with that
  reason, 403: never asked about; what is already allowed answers so, 200), then opened as a
  proposal (Approvals.propose: 202 `{id, state, poll}`, an audit record `ask` with `approval_id`).
- `GET /v1/access-requests/<id>`: its state, for the sandbox that made it only (else 404).
The sandbox is the one the connection is identified as (proxy credential, or source address in
transparent mode): nothing in the request names it. Each worker keeps the proposals made through
it; with several workers a poll for an id this one does not hold asks the lead's admin API (which
asks every worker), since the explicit listener spreads a sandbox's connections over them.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import structlog
from mitmproxy import http

from sandgate.policy.decide import literal_ip
from sandgate.policy.decision import Decision, EgressRequest, Identity, Phase
from sandgate.policy.errors import HostError
from sandgate.policy.hosts import normalise_host
from sandgate.policy.reasons import Reason
from sandgate.proxy.approvals.proposal_trail import ProposalTrail
from sandgate.proxy.approvals.reserved import (
    ENDPOINT_PATH,
    ENDPOINT_PORT,
    KNOWN_METHODS,
    ReservedName,
    path_problem,
)
from sandgate.proxy.approvals.store import Approvals, QueueFull, clean_note
from sandgate.proxy.audit.records import DecisionContext, decision_record
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.respond import decision_response, json_body

__all__ = ["AccessEndpoint", "Invalid", "Proposal", "parse_proposal"]

log = structlog.get_logger("sandgate.endpoint")

MAX_BODY = 16 * 1024
MAX_METHODS = 8
MAX_PATHS = 16
# A reason longer than this is refused rather than cut (clean_note cuts what is kept further).
MAX_REASON_CHARS = 4000
# What refuses a proposal at once: a request it would allow is refused for safety anyway.
REFUSING = frozenset({Reason.PRIVATE_ADDRESS, Reason.HOST_DENIED, Reason.DNS_DENIED, Reason.RESERVED_HOST})
_ID = re.compile(r"^[0-9a-f]{28}$")
_FIELDS = frozenset({"host", "port", "methods", "paths", "reason"})
WINDOW = 60.0
# Polls one sandbox may make per minute for ids this worker does not hold (each asks the lead,
# which asks every worker): enough for an agent polling a few requests every second or two.
MISSES_PER_MINUTE = 120
LEAD_TIMEOUT = 2.0
# What a guest polling its request sees: no operator's name or text.
GUEST_FIELDS = ("id", "kind", "state", "host", "port", "methods", "paths", "created", "decided")


class Invalid(Exception):
    """A proposal that does not validate: 400 naming `field`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Proposal:
    """What a guest asks for: a destination, its methods and path globs (None: any)."""

    host: str
    port: int
    methods: tuple[str, ...] | None
    paths: tuple[str, ...] | None
    note: str | None


def parse_proposal(body: bytes) -> Proposal:
    """The proposal in a request body; Invalid naming the field at fault."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise Invalid("body", "the body is not JSON") from None
    if not isinstance(data, dict):
        raise Invalid("body", "the body is not a JSON object")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise Invalid(unknown[0], "unknown field (known: host, port, methods, paths, reason)")
    host = data.get("host")
    if not isinstance(host, str) or not host:
        raise Invalid("host", "a host name (or address) is required")
    try:
        normal = normalise_host(host)
    except HostError as e:
        raise Invalid("host", str(e)) from None
    if "*" in normal:
        raise Invalid("host", "one host, not a pattern")
    port = data.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise Invalid("port", "a port number from 1 to 65535 is required")
    methods = _methods(data.get("methods"))
    paths = _paths(data.get("paths"))
    reason = data.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS):
        raise Invalid("reason", f"a text of at most {MAX_REASON_CHARS} characters")
    return Proposal(normal, port, methods, paths, clean_note(reason))


def _methods(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or len(value) > MAX_METHODS:
        raise Invalid("methods", f"a list of 1 to {MAX_METHODS} methods")
    out: list[str] = []
    for m in value:
        if not isinstance(m, str) or m.upper() not in KNOWN_METHODS:
            raise Invalid("methods", f"known methods: {', '.join(sorted(KNOWN_METHODS))}")
        out.append(m.upper())
    return tuple(dict.fromkeys(out))


def _paths(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or len(value) > MAX_PATHS:
        raise Invalid("paths", f"a list of 1 to {MAX_PATHS} path globs")
    for p in value:
        if not isinstance(p, str):
            raise Invalid("paths", "each path glob is a string")
        problem = path_problem(p)
        if problem is not None:
            raise Invalid("paths", problem)
    return tuple(dict.fromkeys(value))


def _json(status: int, fields: dict[str, Any], headers: dict[str, str] | None = None) -> http.Response:
    return http.Response.make(
        status,
        json_body(fields),
        {"Content-Type": "application/json", "Cache-Control": "no-store", **(headers or {})},
    )


def _error(status: int, error: str, *, headers: dict[str, str] | None = None, **fields: Any) -> http.Response:
    return _json(status, {"error": error, **fields}, headers)


class AccessEndpoint:
    """Answers the guests' requests to the reserved name, for one worker's pending store."""

    def __init__(
        self,
        ctx: GatewayContext,
        approvals: Approvals,
        reserved: ReservedName,
        *,
        per_minute: int,
        lead_admin: Path | None = None,
        trail: ProposalTrail | None = None,
    ) -> None:
        self.ctx = ctx
        self.approvals = approvals
        self.reserved = reserved
        self.per_minute = per_minute
        # Records each proposal's end (approved, denied, expired) as its `ask` was recorded.
        self.trail = trail
        # The lead's admin socket, asked for requests other workers hold (None: one worker).
        self.lead_admin = lead_admin
        # Proposal times per sandbox in the last minute (a sliding window, per worker), and of
        # polls this worker could not answer alone.
        self._recent: dict[str, deque[float]] = {}
        self._misses: dict[str, deque[float]] = {}

    @property
    def name(self) -> str:
        return self.reserved.name

    # -- the request gate's dispatch ---------------------------------------------------------

    async def headers(self, flow: http.HTTPFlow, dctx: DecisionContext, port: int) -> bool:
        """A request's head arrived: answer it now (False), or say it is a proposal to `answer`
        once its body is in (True)."""
        if port != ENDPOINT_PORT or flow.request.scheme != "http":
            refusal = Decision(
                reason=Reason.RESERVED_HOST,
                policy_version=self.ctx.policy.version,
                detail=f"the gateway's own name answers plain HTTP on port {ENDPOINT_PORT} only",
            )
            await self._refuse(flow, dctx, refusal)
            return False
        identity = dctx.identity
        if identity is None:
            await self._refuse(
                flow, dctx, Decision(reason=Reason.NO_IDENTITY, policy_version=self.ctx.policy.version)
            )
            return False
        path = flow.request.path.partition("?")[0]
        method = flow.request.method
        if path in ("/", ""):
            flow.response = _json(200, {"access_requests": self.reserved.endpoint})
        elif path == ENDPOINT_PATH:
            if method != "POST":
                flow.response = _error(405, "use POST to propose an access request")
                flow.response.headers["Allow"] = "POST"
                return False
            length = flow.request.headers.get("content-length")
            if length is None or not length.isdigit():
                flow.response = _error(411, "a Content-Length is required")
            elif int(length) > MAX_BODY:
                flow.response = _error(413, f"a proposal is at most {MAX_BODY} bytes")
            elif flow.request.headers.get("content-encoding"):
                flow.response = _error(415, "the body must not be encoded")
            else:
                return True
        elif path.startswith(ENDPOINT_PATH + "/"):
            if method != "GET":
                flow.response = _error(405, "use GET to poll an access request")
                flow.response.headers["Allow"] = "GET"
                return False
            flow.response = await self._poll(identity, path.removeprefix(ENDPOINT_PATH + "/"))
        else:
            flow.response = _error(404, "not found", access_requests=self.reserved.endpoint)
        return False

    async def answer(self, flow: http.HTTPFlow, dctx: DecisionContext) -> None:
        """A proposal's body is in (`dctx`: its head's context): validate, screen, open it (or
        refuse), and answer."""
        assert dctx.identity is not None
        identity = dctx.identity
        body = flow.request.raw_content
        if body is None or len(body) > MAX_BODY:
            flow.response = _error(413, f"a proposal is at most {MAX_BODY} bytes")
            return
        try:
            proposal = parse_proposal(body)
        except Invalid as e:
            flow.response = _error(400, e.message, field=e.field)
            return
        target = replace(dctx, host=proposal.host, port=proposal.port, method=None, path=None)
        wait = self._admit(identity.sandbox)
        if wait is not None:
            await self._rate_limited(flow, target, wait)
            return
        verdict = await self._screen(identity, proposal)
        if verdict is not None and not verdict.allowed:
            # Refused for safety: never asked about. The record and the answer say why.
            flow.response = decision_response(verdict, proposal.host, target.decision_id)
            await self.ctx.audit.emit(decision_record(target, verdict))
            return
        if verdict is not None:
            already = {"state": "allowed", "host": proposal.host, "port": proposal.port}
            flow.response = _json(200, {**already, "detail": "already allowed"})
            return
        await self._open(flow, identity, proposal, target)

    async def _rate_limited(self, flow: http.HTTPFlow, target: DecisionContext, wait: int) -> None:
        """Answer a sandbox over its proposals per minute, then record the denial."""
        limited = Decision(
            reason=Reason.RATE_LIMITED,
            policy_version=self.ctx.policy.version,
            detail="approvals.proposals_per_minute",
        )
        response = _error(
            429,
            "too many access requests proposed",
            reason=Reason.RATE_LIMITED.value,
            limit="approvals.proposals_per_minute",
            retry_after=wait,
        )
        response.headers["Retry-After"] = str(wait)
        flow.response = response
        await self.ctx.audit.emit(decision_record(target, limited))

    async def _open(
        self, flow: http.HTTPFlow, identity: Identity, proposal: Proposal, target: DecisionContext
    ) -> None:
        """Open an access request for a screened proposal, record its `ask` and answer 202 with
        where to poll it; or answer the refusal when none can be opened or recorded."""
        tenant = self.ctx.policy.tenant(identity.tenant)
        mode = tenant.mode if tenant is not None else Decision().mode
        version = self.ctx.policy.version
        try:
            request = self.approvals.propose(
                tenant=identity.tenant,
                sandbox=identity.sandbox,
                host=proposal.host,
                port=proposal.port,
                methods=proposal.methods,
                paths=proposal.paths,
                note=proposal.note,
            )
        except QueueFull:
            detail = "too many access requests open"
            full = Decision(
                reason=Reason.APPROVAL_QUEUE_FULL, policy_version=version, mode=mode, detail=detail
            )
            flow.response = decision_response(full, proposal.host, target.decision_id)
            await self.ctx.audit.emit(decision_record(target, full))
            return
        detail = "proposed by the sandbox"
        asked = Decision(reason=Reason.APPROVAL_REQUIRED, policy_version=version, mode=mode, detail=detail)
        record = decision_record(target, asked)
        record["decision"] = "ask"
        record["approval_id"] = request.id
        record["proposal"] = request.proposed()
        if self.trail is not None:
            # Before the ask is written: an automatic approval may end it while that waits.
            self.trail.opened(request, target, asked)
        if not await self.ctx.audit.emit(record):
            # Nothing is open that the trail does not show (nor an end of an unrecorded ask).
            if self.trail is not None:
                self.trail.forget(request.id)
            self.approvals.settle(request.id, approve=False, by="sandgate", reason="audit queue full")
            failed = Decision.internal_error(version)
            flow.response = decision_response(failed, proposal.host, target.decision_id)
            return
        log.info("approval.proposed", id=request.id, sandbox=request.sandbox, host=request.host)
        poll = self.reserved.poll(request.id)
        flow.response = _json(
            202, {"id": request.id, "state": request.state.value, "poll": poll}, {"Location": poll}
        )

    # -- helpers -----------------------------------------------------------------------------

    async def _poll(self, identity: Identity, request_id: str) -> http.Response:
        missing = _error(404, "no such access request")
        if not _ID.match(request_id):
            return missing
        found = self.approvals.get(request_id)
        if found is not None:
            view = found.view()
        elif self.lead_admin is not None:
            wait = _admit(self._misses, identity.sandbox, MISSES_PER_MINUTE)
            if wait is not None:
                return _error(429, "too many polls", retry_after=wait, headers={"Retry-After": str(wait)})
            asked = await self._ask_lead(request_id)
            if asked is None:
                return _error(503, "the gateway could not look the request up", headers={"Retry-After": "1"})
            view = asked
        else:
            return missing
        if (view.get("tenant"), view.get("sandbox")) != (identity.tenant, identity.sandbox):
            # Another sandbox's request is not there for this one, not even its existence.
            return missing
        return _json(200, {k: view.get(k) for k in GUEST_FIELDS})

    async def _ask_lead(self, request_id: str) -> dict[str, Any] | None:
        """The request as the lead's admin API shows it ({} when no worker holds it), or None
        when the lead did not answer."""
        assert self.lead_admin is not None
        transport = httpx.AsyncHTTPTransport(uds=str(self.lead_admin))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://sandgate") as client:
                answer = await client.get(f"{ENDPOINT_PATH}/{request_id}", timeout=LEAD_TIMEOUT)
        except httpx.HTTPError as e:
            log.warning("endpoint.lead_unanswered", error=type(e).__name__)
            return None
        if answer.status_code == 404:
            return {}
        body = answer.json() if answer.status_code == 200 else None
        return body if isinstance(body, dict) else None

    def _admit(self, sandbox: str) -> int | None:
        """None when `sandbox` may propose now (counted), else the seconds to wait."""
        return _admit(self._recent, sandbox, self.per_minute)

    async def _screen(self, identity: Identity, p: Proposal) -> Decision | None:
        """A refusal (the guard, a deny rule, the reserved name), an allowed decision (nothing
        to ask), or None: a proposal for an operator. Names no rule names are not looked up
        (a proposal is no way to make the gateway resolve a name)."""
        tenant = self.ctx.policy.tenant(identity.tenant)
        if tenant is None:
            return Decision(reason=Reason.NO_IDENTITY, policy_version=self.ctx.policy.version)
        if literal_ip(p.host) is None:
            denied = tenant.refuses_name(p.host)
            if denied is not None:
                return Decision(
                    reason=Reason.HOST_DENIED,
                    rule_id=denied.rule_id,
                    policy_version=self.ctx.policy.version,
                    mode=tenant.mode,
                    detail="a deny rule refuses this host",
                )
        connect = await self.ctx.decide(identity, EgressRequest(Phase.CONNECT, p.host, p.port))
        if connect.reason in REFUSING:
            return connect
        if connect.allowed and not connect.inspect and not connect.raw_tcp:
            return connect  # the whole destination is allowed already
        if p.methods is None or p.paths is None or any(_is_glob(path) for path in p.paths):
            return None
        scheme = "https" if p.port == 443 else "http"
        every = True
        for method in p.methods:
            for path in p.paths:
                request = EgressRequest(
                    Phase.REQUEST, p.host, p.port, scheme=scheme, method=method, path=path
                )
                decision = await self.ctx.decide(identity, request)
                if decision.reason in REFUSING:
                    return decision
                every = every and decision.allowed
        return connect if every and connect.allowed else None

    async def _refuse(self, flow: http.HTTPFlow, dctx: DecisionContext, decision: Decision) -> None:
        flow.response = decision_response(decision, dctx.host, dctx.decision_id)
        await self.ctx.audit.emit(decision_record(dctx, decision))


def _admit(windows: dict[str, deque[float]], sandbox: str, per_minute: int) -> int | None:
    """None when `sandbox` is under `per_minute` in its sliding window (counted now), else the
    seconds until it is."""
    now = time.monotonic()
    for key in [k for k, q in windows.items() if not q or q[-1] <= now - WINDOW]:
        del windows[key]
    recent = windows.setdefault(sandbox, deque())
    while recent and recent[0] <= now - WINDOW:
        recent.popleft()
    if len(recent) >= per_minute:
        return max(1, math.ceil(recent[0] + WINDOW - now))
    recent.append(now)
    return None


def _is_glob(path: str) -> bool:
    return "*" in path or "?" in path
