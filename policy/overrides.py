"""Method overrides: the other methods a request can mean to the server that receives it.

Frameworks let a header or a query parameter replace the request line's method (Express
method-override, Laravel, Symfony, Google APIs, ASP.NET): `GET /v1/items/1` with
`X-HTTP-Method-Override: DELETE` deletes. A method rule must hold for every method a
request can mean, so the gateway (and `policy explain` and `policy test`) decides each of
them with `decide_readings`; one refusal refuses the request.
(A lower-case request method needs no reading of its own: mitmproxy hands it over
upper-cased, as the servers that accept one read it.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from urllib.parse import parse_qsl

from sandgate.policy.decision import Decision, EgressRequest, Identity
from sandgate.policy.reasons import Reason

__all__ = [
    "MAX_READINGS",
    "OVERRIDE_HEADERS",
    "OVERRIDE_PARAMETER",
    "TooManyReadings",
    "decide_readings",
    "method_readings",
]

OVERRIDE_HEADERS = ("x-http-method-override", "x-http-method", "x-method-override")
# Laravel and Symfony read it from the query string too (Rails only from a form body).
OVERRIDE_PARAMETER = "_method"
# Each reading is one more decision: a request naming more methods than this is refused.
MAX_READINGS = 4
_MAX_ECHO = 32  # a guest-chosen method name in a detail is cut to this

# `decide(identity, request, address=...)`: the policy's decision for one request.
Decide = Callable[..., Awaitable[Decision]]


class TooManyReadings(ValueError):
    """A request names more distinct override methods than MAX_READINGS."""


def method_readings(
    method: str, headers: Iterable[tuple[str, str]], query: str
) -> tuple[tuple[str, str], ...]:
    """(method, where it came from) for each method the request can mean besides `method`.

    Values are stripped and upper-cased (as the frameworks that honour them do); a
    comma-separated value counts every item. TooManyReadings past MAX_READINGS.
    """
    found: dict[str, str] = {}
    for name, value in headers:
        if name.lower() in OVERRIDE_HEADERS:
            _add(found, value, name)
    if OVERRIDE_PARAMETER in query:
        for name, value in parse_qsl(query, keep_blank_values=True):
            if name == OVERRIDE_PARAMETER:
                _add(found, value, f"query parameter {OVERRIDE_PARAMETER}")
    found.pop(method, None)
    if len(found) > MAX_READINGS:
        raise TooManyReadings(f"the request names {len(found)} override methods (at most {MAX_READINGS})")
    return tuple(found.items())


def _add(found: dict[str, str], value: str, source: str) -> None:
    for item in value.split(","):
        reading = item.strip().upper()
        # An empty override means no override to every framework that reads one.
        if reading:
            found.setdefault(reading, source)


async def decide_readings(
    decide: Decide,
    identity: Identity | None,
    request: EgressRequest,
    decision: Decision,
    *,
    address: str | None = None,
) -> Decision:
    """`decision` (allowing `request`) once every other method the request can mean is
    decided too: the first refusal, else `decision`, or a reading's report-mode would-deny."""
    try:
        readings = method_readings(request.method or "", request.headers, request.query or "")
    except TooManyReadings as e:
        version, mode = decision.policy_version, decision.mode
        return Decision(reason=Reason.INVALID_REQUEST, policy_version=version, mode=mode, detail=str(e))
    for method, source in readings:
        other = await decide(identity, replace(request, method=method), address=address)
        where = f"read as {method[:_MAX_ECHO]!r} ({source})"
        if not other.allowed:
            return replace(other, detail=f"{where}: {other.detail}" if other.detail else where)
        if other.report_only and not decision.report_only:
            decision = replace(other, detail=where)
    return decision
