"""What a Rego engine is: the `PolicyEngine` protocol, its query and verdict, and the one
reading of a decision document. An engine never raises and never allows on a fault:

    the decision document          → the verdict
    {"allow": true[, "reason": "allowed"]}           allowed
    {"allow": false, "reason": R, "message": M}      denied with R when R is a code a policy
                                                     may give (REGO_REASONS), else policy_denied
    {"allow": false} (no reason)                     policy_denied
    undefined (no decision at all)                   policy_denied (a denial, not a fault)
    anything else: not an object, `allow` not a
    boolean, `allow: true` with another reason       policy_error (a fault)
    engine error, timeout, unreachable server        policy_error (a fault)

Report mode relaxes a Rego denial (the tenant's own policy), never a fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandgate.policy.decision import EgressRequest, Identity
from sandgate.policy.errors import PolicyError
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.input_document import (
    MessageField,
    PathTree,
    input_document,
    project,
    projected_input,
)
from sandgate.policy.rego.program import RegoProgram

__all__ = [
    "REGO_REASONS",
    "UNDEFINED",
    "EngineError",
    "PolicyEngine",
    "RegoQuery",
    "RegoVerdict",
    "fault",
    "interpret",
]

# The reason codes a policy may deny with; any other string becomes policy_denied.
REGO_REASONS = frozenset(
    {
        Reason.POLICY_DENIED,
        Reason.HOST_NOT_ALLOWED,
        Reason.HOST_DENIED,
        Reason.PORT_NOT_ALLOWED,
        Reason.METHOD_NOT_ALLOWED,
        Reason.PATH_NOT_ALLOWED,
        Reason.BODY_TOO_LARGE,
        Reason.RATE_LIMITED,
    }
)

# Stands for "the query had no result".
UNDEFINED: Any = object()

MAX_MESSAGE = 500


class EngineError(PolicyError):
    """An engine cannot be built or configured (bad URL, unknown kind)."""


@dataclass(frozen=True, slots=True)
class RegoVerdict:
    """What the tenant's Rego decided. The zero value denies."""

    allowed: bool = False
    reason: Reason = Reason.POLICY_ERROR
    # The policy's own words (`message`); shown in explain, recorded as the decision's detail.
    message: str = ""
    # True for an engine fault (policy_error): never relaxed, never cached.
    fault: bool = False
    cached: bool = field(default=False, compare=False)


def fault(problem: str) -> RegoVerdict:
    """A policy_error verdict; `problem` must not contain request data or secrets."""
    return RegoVerdict(allowed=False, reason=Reason.POLICY_ERROR, message=problem[:MAX_MESSAGE], fault=True)


def interpret(result: object) -> RegoVerdict:
    """The verdict for a decision document (or UNDEFINED), per the table in this module."""
    if result is UNDEFINED:
        return RegoVerdict(reason=Reason.POLICY_DENIED, message="the policy's decision is undefined")
    if not isinstance(result, dict):
        return fault(f"the decision is a {type(result).__name__}, not an object")
    allow = result.get("allow")
    reason = result.get("reason")
    message = result.get("message")
    text = message[:MAX_MESSAGE] if isinstance(message, str) else ""
    if allow is True:
        if reason is None or reason == Reason.ALLOWED.value:
            return RegoVerdict(allowed=True, reason=Reason.ALLOWED, message=text)
        return fault("the decision allows with a reason other than 'allowed'")
    if allow is not False:
        return fault("the decision's 'allow' is not a boolean")
    if isinstance(reason, str) and reason in REGO_REASONS:
        return RegoVerdict(reason=Reason(reason), message=text)
    return RegoVerdict(reason=Reason.POLICY_DENIED, message=text)


class RegoQuery:
    """One evaluation: the tenant's program and the input document, both built on demand.

    `for_request` builds nothing up front: the embedded engine asks for `projected` (only the
    fields the program reads, built directly), the opa engine for the whole `document`.
    `for_message` is the same for one message of a body (phase "message").
    """

    __slots__ = ("_document", "_message", "_projected", "_request", "program")

    def __init__(
        self,
        program: RegoProgram,
        document: Mapping[str, Any] | None = None,
        *,
        request: tuple[Identity, EgressRequest, str | None] | None = None,
        message: MessageField | None = None,
    ) -> None:
        if (document is None) == (request is None):
            raise ValueError("a query needs either the input document or the request to build it from")
        if message is not None and request is None:
            raise ValueError("a message's query is built from its request")
        self.program = program
        self._document = document
        self._projected: Mapping[str, Any] | None = None
        self._request = request
        self._message = message

    @classmethod
    def for_request(
        cls, program: RegoProgram, identity: Identity, request: EgressRequest, ip: str | None
    ) -> RegoQuery:
        return cls(program, request=(identity, request, ip))

    @classmethod
    def for_message(
        cls,
        program: RegoProgram,
        identity: Identity,
        request: EgressRequest,
        ip: str | None,
        message: MessageField,
    ) -> RegoQuery:
        """The query about one message of `request`'s body (phase "message")."""
        return cls(program, request=(identity, request, ip), message=message)

    @property
    def document(self) -> Mapping[str, Any]:
        """The whole input document (version 2, secrets redacted)."""
        if self._document is None:
            assert self._request is not None
            self._document = input_document(*self._request, self._message)
        return self._document

    @property
    def projected(self) -> Mapping[str, Any]:
        """Only the input fields the program's modules can read."""
        if self._projected is None:
            tree: PathTree | None = self.program.tree
            if self._document is None and self._request is not None:
                self._projected = projected_input(*self._request, tree, self._message)
            else:
                self._projected = project(self.document, tree)
        return self._projected


class PolicyEngine(Protocol):
    """Evaluates data.sandgate.decision for a tenant's program; never raises, never fails open."""

    name: str

    async def evaluate(self, query: RegoQuery) -> RegoVerdict: ...

    async def health(self) -> bool: ...

    async def close(self) -> None: ...
