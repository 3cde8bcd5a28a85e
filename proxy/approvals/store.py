"""The access requests one worker holds: created on an `ask` decision (kind `held`) or proposed
by a guest through the gateway's own endpoint (kind `proposal`, nobody held on it), ended by an
operator's approve or deny, by `approvals.ask_timeout_seconds`, or (for the hold, not the entry)
by the client hanging up. In memory: a worker that restarts drops its held connections with them.

Single-threaded (the gateway's event loop): a state changes once, from `held`, `pending` or
`client_gone` to `approved`, `denied` or `expired`, so an approval racing the timeout
releases the request either exactly once or not at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import structlog

from sandgate.proxy.approvals.tool_calls import ToolCall
from sandgate.proxy.audit.records import format_time, new_decision_id, redact_query
from sandgate.proxy.metrics import METRICS

__all__ = [
    "NOTE_MAX",
    "AccessRequest",
    "Approvals",
    "QueueFull",
    "SettleError",
    "State",
    "asked_for",
    "clean_note",
]

log = structlog.get_logger("sandgate.approvals")

# How often a held request looks whether its client hung up (the reader of a connection whose
# request is held does not tell: its layer is paused until the hook returns).
GONE_POLL = 0.25
# Decided and expired requests kept for `show` (and 409 on a second decision), newest last.
KEEP_DECIDED = 1000
# The longest guest note kept (characters): it is shown to operators, never trusted.
NOTE_MAX = 500


class State(StrEnum):
    """Where an access request stands."""

    HELD = "held"
    PENDING = "pending"  # a proposal: open, nobody held on it
    CLIENT_GONE = "client_gone"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    CUT = "cut"  # held when the gateway began to shut down: answered at once, never released


OPEN = frozenset({State.HELD, State.PENDING, State.CLIENT_GONE})
# Open requests nobody waits on: the store expires them at their deadline itself.
UNHELD = frozenset({State.PENDING, State.CLIENT_GONE})


class QueueFull(Exception):
    """The sandbox already has as many requests held as `approvals.max_held_per_sandbox`."""


class SettleError(Exception):
    """An operator's approval or denial that cannot be taken: 404 (unknown id), 409 (already
    settled), or (proxy/approvals/operator_decisions.py) 400, 501, 503."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True, eq=False)
class AccessRequest:
    """One held request or guest proposal: what it asks for, and where it stands."""

    id: str
    tenant: str
    sandbox: str
    phase: str
    host: str
    port: int
    method: str | None
    path: str | None
    rule_id: str | None
    created: float
    deadline: float  # monotonic
    state: State = State.HELD
    by: str | None = None
    reason: str | None = None
    decided: float | None = None
    kind: str = "held"  # "held" (an `ask` decision) or "proposal" (the guest's endpoint)
    methods: tuple[str, ...] | None = None  # a proposal's methods (None: any)
    paths: tuple[str, ...] | None = None  # a proposal's path globs (None: any)
    note: str | None = None  # the guest's reason text: untrusted, cleaned by clean_note
    # A held MCP body: the tool calls that wait for a person (sandgate.proxy.approvals.tool_calls).
    calls: tuple[ToolCall, ...] = ()
    # Seconds from its creation to the end of its hold or wait (a decision, its deadline, its
    # client hanging up): set once, when that happens.
    waited: float | None = None
    started: float = field(default_factory=time.monotonic, repr=False)
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def proposed(self) -> dict[str, list[str] | None]:
        """A proposal's `proposal` field in the audit trail: its methods and path globs."""
        return {
            "methods": list(self.methods) if self.methods is not None else None,
            "paths": list(self.paths) if self.paths is not None else None,
        }

    def view(self) -> dict[str, Any]:
        """The request as the admin API and `sandgate requests` show it."""
        return {
            "id": self.id,
            "tenant": self.tenant,
            "sandbox": self.sandbox,
            "phase": self.phase,
            "host": self.host,
            "port": self.port,
            "method": self.method,
            "path": self.path,
            "rule_id": self.rule_id,
            "created": format_time(self.created),
            "state": self.state.value,
            "by": self.by,
            "reason": self.reason,
            "decided": format_time(self.decided) if self.decided is not None else None,
            "kind": self.kind,
            **self.proposed(),
            "note": self.note,
            # A held tool call: its tool (the first, for a batch), and every asked call with its
            # arguments' digest and preview (shown to operators only, never recorded).
            "tool": self.calls[0].tool if self.calls else None,
            "tool_calls": [c.view() for c in self.calls] if self.calls else None,
        }


class Approvals:
    """The pending store of one worker process."""

    def __init__(self, *, timeout: float, max_held: int) -> None:
        self.timeout = timeout
        self.max_held = max_held
        self._open: dict[str, AccessRequest] = {}
        # Called with every new open request (sandgate.proxy.approvals.webhook announces it).
        self.on_opened: list[Callable[[AccessRequest], None]] = []
        # Called with every request that ends: decided, expired, dropped (a proposal's end is
        # recorded there: nobody is held on it to record it).
        self.on_closed: list[Callable[[AccessRequest], None]] = []
        self._closed: OrderedDict[str, AccessRequest] = OrderedDict()

    def held(self, sandbox: str | None = None) -> int:
        """Requests held open now (their client still waiting), of one sandbox or all."""
        return sum(
            1
            for r in self._open.values()
            if r.state is State.HELD and (sandbox is None or r.sandbox == sandbox)
        )

    def open_for(self, sandbox: str) -> int:
        """Requests of `sandbox` still open: held, proposed, or their client gone and undecided."""
        return sum(1 for r in self._open.values() if r.sandbox == sandbox)

    def hold(
        self,
        *,
        tenant: str,
        sandbox: str,
        phase: str,
        host: str,
        port: int,
        method: str | None,
        path: str | None,
        rule_id: str | None,
        calls: tuple[ToolCall, ...] = (),
    ) -> AccessRequest:
        """A new held request (`calls`: the tool calls of a held MCP body); QueueFull when the
        sandbox is at its cap."""
        self._admit(sandbox)
        request = AccessRequest(
            id=new_decision_id(),
            tenant=tenant,
            sandbox=sandbox,
            phase=phase,
            host=host,
            port=port,
            method=method,
            path=redact_query(path) if path is not None else None,
            rule_id=rule_id,
            created=time.time(),
            deadline=time.monotonic() + self.timeout,
            calls=calls,
        )
        self._store(request)
        return request

    def propose(
        self,
        *,
        tenant: str,
        sandbox: str,
        host: str,
        port: int,
        methods: tuple[str, ...] | None,
        paths: tuple[str, ...] | None,
        note: str | None,
        rule_id: str | None = None,
    ) -> AccessRequest:
        """A guest's proposal: open (`pending`) until a decision or its deadline, nobody held on
        it; QueueFull when the sandbox is at its cap (proposals count with held requests)."""
        self._admit(sandbox)
        request = AccessRequest(
            id=new_decision_id(),
            tenant=tenant,
            sandbox=sandbox,
            phase="proposal",
            host=host,
            port=port,
            method=None,
            path=None,
            rule_id=rule_id,
            created=time.time(),
            deadline=time.monotonic() + self.timeout,
            state=State.PENDING,
            kind="proposal",
            methods=methods,
            paths=tuple(redact_query(p) for p in paths) if paths is not None else None,
            note=clean_note(note),
        )
        self._store(request)
        return request

    def _admit(self, sandbox: str) -> None:
        self.expire()
        # Every open request counts, a hung-up client's too: a guest that asks and hangs up at
        # once would otherwise fill the listing (and the trail) without bound.
        if self.open_for(sandbox) >= self.max_held:
            METRICS.approval_outcome("queue_full")
            raise QueueFull(sandbox)

    def _store(self, request: AccessRequest) -> None:
        self._open[request.id] = request
        self._gauge()
        self._opened(request)

    def _opened(self, request: AccessRequest) -> None:
        """A new open request was stored: tell whoever announces it."""
        _tell(self.on_opened, request, "approval.announce_failed")

    def _ended(self, request: AccessRequest) -> None:
        """An open request ended: tell whoever records it."""
        _tell(self.on_closed, request, "approval.end_failed")

    async def wait(self, request: AccessRequest, gone: Callable[[], bool] = lambda: False) -> State:
        """Hold until a decision, the deadline, or the client hanging up (`client_gone`, or
        `gone()` turning true: looked at every GONE_POLL s); the state it ended in."""
        while request.state is State.HELD:
            remaining = request.deadline - time.monotonic()
            if remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(request.done.wait(), min(remaining, GONE_POLL))
            if request.state is State.HELD and gone():
                self.client_gone(request)
        if request.state is State.HELD:
            self._close(request, State.EXPIRED)
        return request.state

    def client_gone(self, request: AccessRequest) -> None:
        """The held request's client hung up: it is no longer held, and stays listed for a decision."""
        if request.state is State.HELD:
            request.state = State.CLIENT_GONE
            METRICS.approval_outcome("client_gone")
            self._waited(request, "client_gone")
            request.done.set()
            self._gauge()

    def cut_held(self) -> int:
        """The gateway is shutting down: every held request ends now (its hook answers it and
        records the cut); how many. Proposals and hung-up requests hold nobody: they stay."""
        held = [r for r in self._open.values() if r.state is State.HELD]
        for request in held:
            self._close(request, State.CUT)
        return len(held)

    def drop(self, request: AccessRequest) -> None:
        """A hold that ended without a decision (a fault, a shutdown): no longer open (one whose
        client hung up stays listed for a decision)."""
        if request.state is State.HELD:
            self._close(request, State.EXPIRED)

    def settle(self, request_id: str, *, approve: bool, by: str | None, reason: str | None) -> AccessRequest:
        """Approve or deny an open request; SettleError 404 or 409."""
        self.expire()
        request = self._open.get(request_id)
        if request is None:
            closed = self._closed.get(request_id)
            if closed is None:
                raise SettleError(404, f"no access request {request_id!r}")
            raise SettleError(409, f"access request {request_id!r} is already {closed.state.value}")
        request.by, request.reason = by, reason
        self._close(request, State.APPROVED if approve else State.DENIED)
        return request

    def get(self, request_id: str) -> AccessRequest | None:
        self.expire()
        return self._open.get(request_id) or self._closed.get(request_id)

    def listing(self) -> list[AccessRequest]:
        """The open requests (held, or their client gone), oldest first."""
        self.expire()
        return sorted(self._open.values(), key=lambda r: r.id)

    def _close(self, request: AccessRequest, state: State) -> None:
        request.state = state
        request.decided = time.time()
        self._open.pop(request.id, None)
        self._closed[request.id] = request
        while len(self._closed) > KEEP_DECIDED:
            self._closed.popitem(last=False)
        METRICS.approval_outcome(state.value)
        self._waited(request, state.value)
        request.done.set()
        self._gauge()
        self._ended(request)

    def expire(self) -> None:
        """End the proposals and hung-up requests past their deadline: nobody waits on theirs.
        Every use of the store calls this, and a sweep (ProposalTrail), so that their end is
        recorded when it happens."""
        now = time.monotonic()
        for request in [r for r in self._open.values() if r.state in UNHELD and r.deadline <= now]:
            self._close(request, State.EXPIRED)

    def _waited(self, request: AccessRequest, outcome: str) -> None:
        # The time it waited ends once: a request whose client hung up waited until then.
        if request.waited is None:
            waited = time.monotonic() - request.started
            # Expired: it waited its timeout, however late a sweep noticed.
            request.waited = min(waited, self.timeout) if outcome == "expired" else waited
            METRICS.approval_wait(request.tenant, outcome, request.waited)

    def _gauge(self) -> None:
        METRICS.approvals_held(self.held())


def _tell(listeners: list[Callable[[AccessRequest], None]], request: AccessRequest, failed: str) -> None:
    """Call each listener with the request; one that raises is logged and stops no other."""
    for listener in listeners:
        try:
            listener(request)
        except Exception:
            log.exception(failed, id=request.id)


def clean_note(note: str | None) -> str | None:
    """A guest's reason text fit to show an operator: control and format characters (escapes,
    bidi overrides) dropped, whitespace runs made one space, at most NOTE_MAX characters."""
    if note is None:
        return None
    kept = "".join(
        " " if ch.isspace() else ch for ch in note if ch.isspace() or unicodedata.category(ch)[0] != "C"
    )
    cleaned = " ".join(kept.split())[:NOTE_MAX]
    return cleaned or None


def asked_for(view: Mapping[str, Any]) -> tuple[list[str] | None, list[str] | None]:
    """What an access request (its view) asks for: a proposal's methods and path globs, or a
    held request's own method and path (without its query); None: every method, every path
    (a held CONNECT)."""
    methods = view.get("methods")
    if methods is None and view.get("method"):
        methods = [str(view["method"])]
    paths = view.get("paths")
    if paths is None and view.get("path"):
        paths = [str(view["path"]).partition("?")[0]]
    return methods, paths
