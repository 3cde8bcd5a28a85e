"""The responses the gateway itself sends to the guest.

Every answer has one shape: a status, `X-Sandgate-Reason`, `X-Sandgate-Decision-Id` and a JSON
body `{"error", "reason", "host", "decision_id"}`. The status tells "not allowed" from "could
not reach": 403 for policy, 400 for a request the gateway cannot read, 413/429 for limits,
502/504 when an allowed destination could not be resolved, reached or understood. Nothing
from the wire (upstream bytes) is ever quoted in an answer; of the guest's own request, only a
denial an approval could change names its destination, method and path (no query) again, in
`ask`: the endpoint to propose at and the proposal that would allow it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from mitmproxy import http

from sandgate.policy.decision import Decision, Refusal
from sandgate.policy.reasons import Reason

__all__ = [
    "ASKABLE",
    "SHUTTING_DOWN",
    "decision_response",
    "denied_response",
    "json_body",
    "limited_response",
    "proxy_auth_required",
    "shutdown_response",
    "status_for",
    "upstream_error_response",
]

REASON_HEADER = "X-Sandgate-Reason"
DECISION_HEADER = "X-Sandgate-Decision-Id"

# Reasons that are not a policy "no": the request was unreadable, or its destination failed.
_STATUS = {
    Reason.INVALID_REQUEST: 400,
    Reason.DNS_FAILURE: 502,
    Reason.UPSTREAM_UNREACHABLE: 502,
    Reason.UPSTREAM_PROTOCOL_ERROR: 502,
}
# What a request refused by a draining gateway (or a hold the drain ended) is told.
SHUTTING_DOWN = "gateway shutting down"
_ERROR_TEXT = {400: "invalid request", 403: "egress denied", 502: "bad gateway", 504: "gateway timeout"}


# Denials an operator's approval could turn around: nothing allowed it, or it was asked about.
# Never the guard's, a deny rule's, Rego's or a limit's: no proposal changes those.
ASKABLE = frozenset(
    {
        Reason.HOST_NOT_ALLOWED,
        Reason.PORT_NOT_ALLOWED,
        Reason.METHOD_NOT_ALLOWED,
        Reason.PATH_NOT_ALLOWED,
        Reason.APPROVAL_REQUIRED,
        Reason.APPROVAL_DENIED,
        Reason.APPROVAL_TIMEOUT,
    }
)


def json_body(fields: Mapping[str, object]) -> bytes:
    """A JSON answer's body: one line, ended by a newline (so that `curl` leaves the prompt
    on a line of its own)."""
    return json.dumps(fields).encode() + b"\n"


def status_for(reason: Reason) -> int:
    """The status a refusal with `reason` is answered with (403 unless it is not about policy)."""
    return _STATUS.get(reason, 403)


def denied_response(
    reason: Reason,
    host: str | None,
    decision_id: str,
    message: str | None = None,
    *,
    status: int | None = None,
    close: bool = False,
    refused: Sequence[Refusal] = (),
    ask: Mapping[str, object] | None = None,
) -> http.Response:
    """A refusal (403 by default) with the reason in a header and a JSON body an agent can read.

    `message` is a policy author's explanation (a Rego denial's), never gateway internals.
    `status` overrides the reason's (504 for a timeout); `close` asks the client to hang up.
    `refused`: the addresses the address guard refused (`private_address`), each with why.
    `ask`: where and what to propose (sandgate.proxy.approvals.reserved), shown only for a
    denial an approval could change (ASKABLE).
    """
    code = status if status is not None else status_for(reason)
    fields: dict[str, object] = {
        "error": _ERROR_TEXT.get(code, "egress denied"),
        "reason": reason.value,
        "host": host,
        "decision_id": decision_id,
    }
    if message:
        fields["message"] = message
    if refused:
        fields["refused"] = [{"address": r.address, "kind": r.kind, "why": r.why} for r in refused]
    if ask is not None and reason in ASKABLE:
        fields["ask"] = dict(ask)
    body = json_body(fields)
    headers = {
        "Content-Type": "application/json",
        REASON_HEADER: reason.value,
        DECISION_HEADER: decision_id,
        "Cache-Control": "no-store",
    }
    if close:
        headers["Connection"] = "close"
    return http.Response.make(code, body, headers)


def decision_response(
    decision: Decision, host: str | None, decision_id: str, *, ask: Mapping[str, object] | None = None
) -> http.Response:
    """The refusal of a denied decision, with what of it the guest may read.

    Only a Rego author's message reaches the guest; other details stay in the audit trail,
    except the addresses the guard refused (no secret), so an agent can say what to open,
    and (`ask`) where to ask for a request an approval would let through.
    """
    reason = decision.reason
    message = decision.detail if reason is Reason.POLICY_DENIED else None
    refused = decision.refused if reason is Reason.PRIVATE_ADDRESS else ()
    return denied_response(reason, host, decision_id, message, refused=refused, ask=ask)


def upstream_error_response(
    reason: Reason, host: str | None, decision_id: str, status: int = 502
) -> http.Response:
    """502 (or 504) shaped like a denial: the policy allowed, the upstream failed."""
    fields = {"error": "upstream failed", "reason": reason.value, "host": host, "decision_id": decision_id}
    return http.Response.make(
        status,
        json_body(fields),
        {
            "Content-Type": "application/json",
            REASON_HEADER: reason.value,
            DECISION_HEADER: decision_id,
            "Cache-Control": "no-store",
        },
    )


def limited_response(
    reason: Reason, limit: str, retry_after: int, host: str | None, decision_id: str
) -> http.Response:
    """429 (a rate or byte limit, with Retry-After) or 413 (body_too_large), shaped like a denial."""
    fields: dict[str, object] = {
        "error": "egress denied",
        "reason": reason.value,
        "host": host,
        "decision_id": decision_id,
        "limit": limit,
    }
    headers = {
        "Content-Type": "application/json",
        REASON_HEADER: reason.value,
        DECISION_HEADER: decision_id,
        "Cache-Control": "no-store",
    }
    status = 413
    if reason is not Reason.BODY_TOO_LARGE:
        status = 429
        fields["retry_after"] = retry_after
        headers["Retry-After"] = str(retry_after)
    return http.Response.make(status, json_body(fields), headers)


def proxy_auth_required(decision_id: str) -> http.Response:
    """407 asking for the sandbox's proxy credential."""
    body = json_body(
        {
            "error": "proxy authentication required",
            "reason": Reason.NO_IDENTITY.value,
            "host": None,
            "decision_id": decision_id,
        }
    )
    return http.Response.make(
        407,
        body,
        {
            "Content-Type": "application/json",
            "Proxy-Authenticate": 'Basic realm="sandgate"',
            REASON_HEADER: Reason.NO_IDENTITY.value,
            DECISION_HEADER: decision_id,
        },
    )


def shutdown_response(decision_id: str) -> http.Response:
    """503 `internal_error` "gateway shutting down", `Connection: close`: try again shortly."""
    body = {"error": SHUTTING_DOWN, "reason": Reason.INTERNAL_ERROR.value, "decision_id": decision_id}
    return http.Response.make(
        503,
        json_body(body),
        {
            "Content-Type": "application/json",
            REASON_HEADER: Reason.INTERNAL_ERROR.value,
            DECISION_HEADER: decision_id,
            "Retry-After": "1",
            "Connection": "close",
        },
    )
