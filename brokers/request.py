"""The plain values the broker works on: a request as the gateway saw it, and the changes to make."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sandgate.brokers.secret import Secret
from sandgate.policy.protocols.mcp import McpBody

__all__ = [
    "AppliedRequest",
    "BrokerRequest",
    "Mutation",
    "RemoveHeader",
    "SetBody",
    "SetHeader",
    "SetQuery",
    "apply_mutations",
    "header_values",
]


@dataclass(frozen=True, slots=True)
class BrokerRequest:
    """One HTTP request on its way upstream, after policy allowed it.

    `host` is the normalised destination host; `path` the raw path without the query;
    `query` the raw query string without '?' ('' for none); `headers` every header as
    (name, value) pairs in order, including `host` as it will be sent. `body` None means
    the body is not buffered (streamed); `body_too_large` says the gateway stopped buffering
    it because it exceeded the gateway's limit. `mcp`: the body's MCP messages as the gateway's
    strict reader read and allowed them (an `mcp:` rule's request), else None; a credential
    with `tools:` is replaced only inside the arguments of such a body's tool calls.
    """

    method: str
    scheme: str
    host: str
    port: int
    path: str
    query: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = b""
    body_too_large: bool = False
    mcp: McpBody | None = None


@dataclass(frozen=True, slots=True)
class SetHeader:
    """Remove every header called `name` (any case), then add one with `value`."""

    name: str
    value: Secret


@dataclass(frozen=True, slots=True)
class RemoveHeader:
    """Remove every header called `name` (any case)."""

    name: str


@dataclass(frozen=True, slots=True)
class SetQuery:
    """Replace the raw query string (without '?'; '' removes it)."""

    query: Secret


@dataclass(frozen=True, slots=True)
class SetBody:
    """Replace the request body (the gateway recomputes Content-Length)."""

    body: Secret


Mutation = SetHeader | RemoveHeader | SetQuery | SetBody


@dataclass(frozen=True, slots=True)
class AppliedRequest:
    """A request after mutations: what the gateway sends upstream. Holds revealed secrets: never log it."""

    headers: tuple[tuple[str, str], ...]
    query: str
    body: bytes | None

    def __repr__(self) -> str:
        return "AppliedRequest(<redacted>)"


def header_values(headers: Iterable[tuple[str, str]], name: str) -> list[str]:
    """Every value of header `name` (case-insensitive), in order."""
    wanted = name.lower()
    return [v for k, v in headers if k.lower() == wanted]


def apply_mutations(request: BrokerRequest, mutations: Sequence[Mutation]) -> AppliedRequest:
    """Apply mutations in order; a set header replaces every client copy (never merged)."""
    headers = list(request.headers)
    query = request.query
    body = request.body
    for m in mutations:
        if isinstance(m, SetHeader | RemoveHeader):
            wanted = m.name.lower()
            headers = [(k, v) for k, v in headers if k.lower() != wanted]
            if isinstance(m, SetHeader):
                headers.append((m.name, m.value.reveal()))
        elif isinstance(m, SetQuery):
            query = m.query.reveal()
        else:
            body = m.body.reveal_bytes()
    return AppliedRequest(tuple(headers), query, body)
