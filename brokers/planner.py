"""The broker's pure decision: which placeholders a request carries, and which credentials to inject.

Evaluation order (the first step that denies wins):

1. Scan the host, path, query, every header and the buffered body for placeholders
   (raw, any case, percent-encoded, JSON-escaped, base64; see `scan`).
2. Anything placeholder-shaped that is not a placeholder of this sandbox → `unknown_placeholder`:
   another sandbox's or tenant's (cause `foreign_placeholder`), or one no sandbox known here
   owns: minted under another key (a `credentials placeholders` run without this gateway's
   `--config`), forged, truncated or extended (cause `unknown_placeholder`). The guest gets
   the same reason for all of them, so it cannot tell a genuine placeholder from a forgery.
3. A placeholder of this sandbox whose credential is not bound to this destination
   (host, port, scheme, method, path prefix) → `credential_host_mismatch`.
4. A placeholder of a bound credential in a place its injector does not replace (a header
   credential's placeholder in the body, a query credential's in a header, an encoded one
   in a body credential's body) → `credential_host_mismatch`, cause `misplaced`. Replacing
   it there instead would put the secret where the operator did not bind it (and where an
   echoing or storing API could hand it back in a form the scrubber cannot recognise);
   forwarding it would forward a placeholder. So the request is denied.
5. A body credential's placeholder in a body larger than its `max_bytes` → `body_too_large`.
   A `tools:` credential's raw placeholder outside `params.arguments` of every `tools/call` of
   the body as the strict MCP reader read it (or in a body not read as MCP, or one whose raw
   bytes do not walk as that reading: see `tool_arguments`) → `credential_host_mismatch`,
   cause `misplaced`; inside the arguments of a call of a tool it does not name → cause
   `unbound_tool`.
6. The credentials to inject: those whose placeholder was seen, plus `apply: always` ones
   bound to the destination. Two that set the same header or parameter, or two signers
   → `invalid_request`, cause `conflict`.

A streamed body (not buffered) is checked chunk by chunk by a `RequestBodyGuard`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandgate.brokers.outcome import BrokerDenial, DenialCause
from sandgate.brokers.placeholders import PlaceholderIndex, PlaceholderOwner
from sandgate.brokers.request import BrokerRequest, header_values
from sandgate.brokers.scan import BodyScan, Hit, Where, scan_request
from sandgate.brokers.tenant_credentials import CompiledCredential, CompiledTenant, request_path
from sandgate.brokers.tool_arguments import ToolArguments, tool_arguments
from sandgate.policy.model.credentials import AwsSigV4Inject, BodyInject, QueryInject

__all__ = ["Plan", "classify", "plan_request"]


@dataclass(frozen=True, slots=True)
class Plan:
    """Credentials to inject, in order, the raw body spans a body credential replaces, and
    (credential, tool) for each tool call a `tools:` credential is replaced in."""

    credentials: tuple[CompiledCredential, ...]
    body_spans: tuple[tuple[int, int, str], ...] = ()
    stream: bool = False
    tools: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class _Classified:
    foreign: tuple[str, ...]
    own: dict[str, list[Where]]


def _owner_text(owner: PlaceholderOwner | None, genuine: bool) -> str:
    if owner is not None:
        return f"{owner.tenant}/{owner.sandbox}"
    return "unknown" if genuine else "not minted here"


def classify(
    hits: list[Hit], index: PlaceholderIndex, table: CompiledTenant, sandbox: str
) -> tuple[BrokerDenial | None, dict[str, list[Where]]]:
    """Split hits into this sandbox's (by credential) and the rest; deny on any of the rest."""
    foreign_owners: list[str] = []
    foreign_names: list[str] = []
    where: list[str] = []
    own: dict[str, list[Where]] = {}
    minted_elsewhere = False
    for hit in hits:
        owner = index.owner(hit.placeholder)
        if owner is None:
            genuine = index.minter.is_genuine(hit.placeholder)
            minted_elsewhere |= not genuine
            foreign_owners.append(_owner_text(None, genuine))
            where.append(str(hit.where))
            continue
        if owner.tenant != table.tenant or owner.sandbox != sandbox or owner.credential not in table.by_name:
            foreign_owners.append(_owner_text(owner, True))
            if owner.tenant == table.tenant:
                foreign_names.append(owner.credential)
            where.append(str(hit.where))
            continue
        own.setdefault(owner.credential, []).append(hit.where)
    if foreign_owners:
        return (
            BrokerDenial(
                DenialCause.UNKNOWN_PLACEHOLDER if minted_elsewhere else DenialCause.FOREIGN_PLACEHOLDER,
                credentials=tuple(dict.fromkeys(foreign_names)),
                where=tuple(dict.fromkeys(where)),
                foreign=True,
                foreign_owners=tuple(dict.fromkeys(foreign_owners)),
            ),
            own,
        )
    return None, own


def _unbound(
    own: dict[str, list[Where]], table: CompiledTenant, request: BrokerRequest, path: str | None
) -> BrokerDenial | None:
    causes: dict[str, DenialCause] = {}
    for name in own:
        cause = table.by_name[name].binding_failure(request, path)
        if cause is not None:
            causes[name] = cause
    if not causes:
        return None
    names = tuple(causes)
    return BrokerDenial(
        causes[names[0]],
        credentials=names,
        where=tuple(dict.fromkeys(str(w) for n in names for w in own[n])),
    )


def _misplaced(own: dict[str, list[Where]], table: CompiledTenant) -> BrokerDenial | None:
    names: list[str] = []
    where: list[str] = []
    for name, places in own.items():
        cred = table.by_name[name]
        stray = [w for w in places if not cred.consumes(w)]
        if stray:
            names.append(name)
            where.extend(str(w) for w in stray)
    if not names:
        return None
    return BrokerDenial(DenialCause.MISPLACED, credentials=tuple(names), where=tuple(dict.fromkeys(where)))


def _conflict(creds: list[CompiledCredential]) -> BrokerDenial | None:
    seen_headers: dict[str, str] = {}
    seen_params: dict[str, str] = {}
    signers: list[str] = []
    for cred in creds:
        inject = cred.credential.inject
        for header in cred.managed_headers:
            if header in seen_headers:
                return BrokerDenial(
                    DenialCause.CONFLICT, (seen_headers[header], cred.name), (f"header:{header}",)
                )
            seen_headers[header] = cred.name
        if isinstance(inject, QueryInject):
            if inject.query in seen_params:
                return BrokerDenial(
                    DenialCause.CONFLICT, (seen_params[inject.query], cred.name), (f"query:{inject.query}",)
                )
            seen_params[inject.query] = cred.name
        if isinstance(inject, AwsSigV4Inject):
            signers.append(cred.name)
    if len(signers) > 1:
        return BrokerDenial(DenialCause.CONFLICT, tuple(signers), ("header:authorization",))
    return None


def plan_request(
    table: CompiledTenant, index: PlaceholderIndex, sandbox: str, request: BrokerRequest
) -> Plan | BrokerDenial:
    """Decide, without secrets, what to do with one request of `sandbox` (see the module docstring)."""
    hits, body = scan_request(request)
    denial, own = classify(hits, index, table, sandbox)
    if denial is not None:
        return denial
    path = request_path(request)
    denial = _unbound(own, table, request, path) or _misplaced(own, table)
    if denial is not None:
        return denial
    spans = _body_spans(body, index, table, request)
    if isinstance(spans, BrokerDenial):
        return spans
    creds = [table.by_name[name] for name in own]
    for cred in table.always:
        if cred.name not in own and cred.binding_failure(request, path) is None:
            creds.append(cred)
    denial = _conflict(creds)
    if denial is not None:
        return denial
    tools = tuple(dict.fromkeys((name, tool) for _, _, name, tool in spans if tool is not None))
    return Plan(tuple(creds), tuple(s[:3] for s in spans), stream=request.body is None, tools=tools)


def _body_spans(
    body: BodyScan | None, index: PlaceholderIndex, table: CompiledTenant, request: BrokerRequest
) -> list[tuple[int, int, str, str | None]] | BrokerDenial:
    """The raw body spans to replace: (start, end, credential, the tool call it is in, for a
    `tools:` credential), or the denial of a span too large or not in a bound tool's arguments."""
    spans: list[tuple[int, int, str, str | None]] = []
    calls: tuple[ToolArguments, ...] | None = None
    for start, end, placeholder in body.raw if body is not None else ():
        owner = index.owner(placeholder)
        assert owner is not None  # classify() accepted it as this sandbox's own.
        cred = table.by_name[owner.credential]
        inject = cred.credential.inject
        assert isinstance(inject, BodyInject)  # _misplaced() refused raw body hits of other kinds.
        if request.body is not None and len(request.body) > inject.max_bytes:
            return BrokerDenial(DenialCause.BODY_TOO_LARGE, (cred.name,), ("body",))
        tool: str | None = None
        if cred.tool_globs is not None:
            calls = _calls(request) if calls is None else calls
            placed = _tool_of(cred, start, end, calls)
            if isinstance(placed, BrokerDenial):
                return placed
            tool = placed
        spans.append((start, end, cred.name, tool))
    return spans


def _calls(request: BrokerRequest) -> tuple[ToolArguments, ...]:
    """The body's tool calls with their arguments' raw spans; none unless the body was read as
    MCP and its raw bytes (not compressed) walk as that reading."""
    encoding = [v.strip().lower() for v in header_values(request.headers, "content-encoding")]
    if request.mcp is None or request.body is None or any(e not in ("", "identity") for e in encoding):
        return ()
    return tool_arguments(request.body, request.mcp) or ()


def _tool_of(
    cred: CompiledCredential, start: int, end: int, calls: tuple[ToolArguments, ...]
) -> str | BrokerDenial:
    """The tool whose call's arguments hold [start, end) and that `cred` is bound to, else the denial."""
    holders = [call for call in calls if call.holds(start, end)]
    if not holders:
        return BrokerDenial(DenialCause.MISPLACED, (cred.name,), ("body",))
    call = holders[0]  # arguments never overlap: one call holds it
    if not cred.tool_bound(call.tool):
        return BrokerDenial(
            DenialCause.UNBOUND_TOOL, (cred.name,), ("body:arguments",), tools=((cred.name, call.tool),)
        )
    return call.tool
