"""The Rego input document: a versioned contract, built from a request, with secrets redacted.

Version 1, field by field (`sandgate policy schema --input` prints it as JSON Schema):

    version      1
    phase        "connect" | "tls" | "request"
    tenant       the tenant's name (from the sandbox's identity, never from the request)
    sandbox      the sandbox id
    client       the guest's address (IP), or null
    dest         {host, port, ip, sni, scheme}: the normalised host, the port, the address
                 the gateway resolved, checked and will dial, the TLS SNI, "http"/"https"
    request      {method, path, query, headers, body_size}: null fields before the HTTP
                 layer (phase "connect"); `path` normalised (sandgate.policy.paths), without
                 query or fragment, "\\u0000unparseable" when servers could read it
                 differently (check paths by allow-list); `query`
                 maps each name to its values; `headers` maps lower-case names to values
                 (repeats joined with ", "); `body_size` is the declared length, or null
    credentials  names of the credentials the broker would use for this request

Header and query values whose name looks secret (authorization, proxy-authorization,
cookie, x-api-key, or containing token, secret, key, password, credential, session,
signature, auth) are replaced by "REDACTED": the name stays, so a policy can test presence.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field

from sandgate.policy.decision import EgressRequest, Identity
from sandgate.policy.rego.source import InputPaths

__all__ = [
    "INPUT_VERSION",
    "REDACTED",
    "PathTree",
    "cache_key",
    "input_document",
    "input_schema",
    "is_secret_name",
    "path_tree",
    "project",
    "projected_input",
]

INPUT_VERSION = 1
REDACTED = "REDACTED"

_SECRET_NAMES = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"})
_SECRET_PARTS = ("token", "secret", "key", "password", "passwd", "credential", "session", "signature", "auth")

# A path tree: {"request": {"method": True}} reads input.request.method only; True is a whole subtree.
PathTree = Mapping[str, "PathTree | bool"]


def is_secret_name(name: str) -> bool:
    """Whether a header or query parameter name looks like it carries a secret."""
    lowered = name.lower()
    return lowered in _SECRET_NAMES or any(part in lowered for part in _SECRET_PARTS)


# Each field of the document, built on its own, in the document's order: input_document
# builds them all, projected_input only those a policy reads.
_DEST: dict[str, Callable[[EgressRequest, str | None], Any]] = {
    "host": lambda r, ip: r.host,
    "port": lambda r, ip: r.port,
    "ip": lambda r, ip: ip,
    "sni": lambda r, ip: r.sni,
    "scheme": lambda r, ip: r.scheme,
}
_REQUEST: dict[str, Callable[[EgressRequest], Any]] = {
    "method": lambda r: r.method,
    "path": lambda r: r.path,
    "query": lambda r: _query(r.query),
    "headers": lambda r: _headers(r.headers),
    "body_size": lambda r: r.body_size,
}
_TOP: dict[str, Callable[[Identity, EgressRequest], Any]] = {
    "version": lambda i, r: INPUT_VERSION,
    "phase": lambda i, r: r.phase.value,
    "tenant": lambda i, r: i.tenant,
    "sandbox": lambda i, r: i.sandbox,
    "client": lambda i, r: r.client,
}
_WHOLE: PathTree = {**dict.fromkeys(_TOP, True), "dest": True, "request": True, "credentials": True}


def input_document(identity: Identity, request: EgressRequest, ip: str | None) -> dict[str, Any]:
    """The input document (version 1) for one request; `ip` is the address that will be dialled."""
    return projected_input(identity, request, ip, _WHOLE)


def projected_input(
    identity: Identity, request: EgressRequest, ip: str | None, tree: PathTree | None
) -> dict[str, Any]:
    """`project(input_document(identity, request, ip), tree)`, without building the fields the
    tree leaves out (header redaction and query parsing cost more than the rest together)."""
    out: dict[str, Any] = {}
    for key, sub in (_WHOLE if tree is None else tree).items():
        if sub is True:
            if key in _TOP:
                out[key] = _TOP[key](identity, request)
            elif key == "dest":
                out[key] = {k: build(request, ip) for k, build in _DEST.items()}
            elif key == "request":
                out[key] = {k: build(request) for k, build in _REQUEST.items()}
            elif key == "credentials":
                out[key] = list(request.credentials)
        elif isinstance(sub, Mapping):
            if key == "dest":
                out[key] = project({k: _DEST[k](request, ip) for k in sub if k in _DEST}, sub)
            elif key == "request":
                out[key] = project({k: _REQUEST[k](request) for k in sub if k in _REQUEST}, sub)
    return out


def _headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        shown = REDACTED if is_secret_name(key) else value
        out[key] = f"{out[key]}, {shown}" if key in out else shown
    return out


def _query(query: str | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if not query:
        return out
    for name, value in parse_qsl(query, keep_blank_values=True):
        out.setdefault(name, []).append(REDACTED if is_secret_name(name) else value)
    return out


def path_tree(paths: InputPaths) -> PathTree | None:
    """The tree of input paths a policy reads; None when it reads the whole input."""
    if paths is None:
        return None
    root: dict[str, Any] = {}
    for path in sorted(paths, key=len):
        node = root
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if child is True:
                break
            node = child
        else:
            node[path[-1]] = True
    return root


def project(doc: Mapping[str, Any], tree: PathTree | None) -> Mapping[str, Any]:
    """Only the parts of `doc` that `tree` names (the whole document when tree is None)."""
    if tree is None:
        return doc
    out: dict[str, Any] = {}
    for key, sub in tree.items():
        if key not in doc:
            continue
        value = doc[key]
        if sub is True:
            out[key] = value
        elif isinstance(value, Mapping) and isinstance(sub, Mapping):
            out[key] = project(value, sub)
    return out


def cache_key(projected: Mapping[str, Any]) -> str:
    """A canonical text for a projected document (distinguishes 1, 1.0, true and "1")."""
    return json.dumps(projected, sort_keys=True, separators=(",", ":"))


# --- the JSON Schema of the input document -------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DestInput(_Model):
    """Where the request goes."""

    host: str = Field(description="normalised host: lowercase A-labels, or a canonical IP literal")
    port: int = Field(ge=1, le=65535, description="the destination port")
    ip: str | None = Field(description="the address the gateway resolved, checked and will dial")
    sni: str | None = Field(description="the TLS ClientHello SNI, when known")
    scheme: Literal["http", "https"] | None = Field(description="null at phase connect")


class RequestInput(_Model):
    """The HTTP request; every field is null (headers and query empty) at phase connect."""

    method: str | None = Field(description="the HTTP method, in upper case")
    path: str | None = Field(description="normalised path without the query")
    query: dict[str, list[str]] = Field(description="name → values; secret-looking values REDACTED")
    headers: dict[str, str] = Field(
        description="lower-case name → value (repeats joined with ', '); secret-looking values REDACTED"
    )
    body_size: int | None = Field(description="declared body length in bytes, or null")


class InputDocument(_Model):
    """The input of `data.sandgate.decision` (version 1)."""

    version: Literal[1] = Field(description="the version of this document's contract")
    phase: Literal["connect", "tls", "request"] = Field(
        description=(
            "connect: a CONNECT or a new transparent connection; tls: its ClientHello; request: each HTTP "
            "request"
        )
    )
    tenant: str = Field(description="the tenant's name (from the sandbox's identity, never from the request)")
    sandbox: str = Field(description="the sandbox id")
    client: str | None = Field(description="the guest's address")
    dest: DestInput
    request: RequestInput
    credentials: list[str] = Field(description="names of the credentials the broker would use")


def input_schema() -> dict[str, Any]:
    """JSON Schema of the Rego input document."""
    schema = InputDocument.model_json_schema()
    schema["title"] = f"sandgate Rego input, version {INPUT_VERSION}"
    return schema
