"""Turn a plan and resolved material into request mutations (pure; the clock is passed in)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from urllib.parse import quote, quote_plus, unquote_to_bytes

from sandgate.brokers.material import Material
from sandgate.brokers.outcome import BrokerDenial, DenialCause
from sandgate.brokers.planner import Plan
from sandgate.brokers.providers.sigv4 import amz_date, parse_authorization, sign
from sandgate.brokers.request import (
    BrokerRequest,
    Mutation,
    RemoveHeader,
    SetBody,
    SetHeader,
    SetQuery,
    apply_mutations,
    header_values,
)
from sandgate.brokers.secret import Secret
from sandgate.brokers.tenant_credentials import CompiledCredential
from sandgate.policy.model.credentials import (
    AwsSigV4Inject,
    BasicInject,
    BodyInject,
    GitHubAppInject,
    HeaderInject,
    OAuth2Inject,
    QueryInject,
)

__all__ = ["build_mutations"]

_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
# Signed when the guest did not sign (apply: always): what AWS SDKs sign besides host and date.
_DEFAULT_SIGNED = (
    "host",
    "x-amz-date",
    "x-amz-content-sha256",
    "x-amz-security-token",
    "content-type",
    "content-md5",
)
_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"


def _header_value(cred: CompiledCredential, material: Material) -> SetHeader:
    inject = cred.credential.inject
    secret = material.secret.reveal()
    if isinstance(inject, HeaderInject):
        return SetHeader(inject.header, Secret(inject.format.replace("{secret}", secret)))
    if isinstance(inject, BasicInject):
        assert material.username is not None
        pair = f"{material.username}:{secret}".encode()
        return SetHeader("Authorization", Secret("Basic " + base64.b64encode(pair).decode("ascii")))
    if isinstance(inject, OAuth2Inject):
        return SetHeader(inject.oauth2.header, Secret(inject.oauth2.format.replace("{token}", secret)))
    assert isinstance(inject, GitHubAppInject)
    return SetHeader(inject.github_app.header, Secret(inject.github_app.format.replace("{token}", secret)))


def _query_name(raw: str) -> str:
    return unquote_to_bytes(raw.replace("+", " ")).decode("utf-8", "replace")


def _set_query(query: str, param: str, secret: Secret) -> str:
    """`query` with every `param` value replaced by one `param=<secret>` at the first one's place."""
    value = f"{quote(param, safe='')}={quote(secret.reveal(), safe='')}"
    out: list[str] = []
    placed = False
    for pair in query.split("&") if query else []:
        if _query_name(pair.partition("=")[0]) == param:
            if not placed:
                out.append(value)
                placed = True
            continue
        out.append(pair)
    if not placed:
        out.append(value)
    return "&".join(out)


def _body_encoding(content_type: str) -> str:
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return "json"
    if media == "application/x-www-form-urlencoded":
        return "form"
    return "text"


def _encode_for_body(secret: Secret, encoding: str) -> bytes:
    text = secret.reveal()
    if encoding == "json":
        return json.dumps(text)[1:-1].encode("ascii")
    if encoding == "form":
        return quote_plus(text, safe="").encode("ascii")
    return secret.reveal_bytes()


def _replace_body(body: bytes, spans: Sequence[tuple[int, int, str]], values: Mapping[str, bytes]) -> bytes:
    pieces: list[bytes] = []
    pos = 0
    for start, end, name in sorted(spans):
        pieces.append(body[pos:start])
        pieces.append(values[name])
        pos = end
    pieces.append(body[pos:])
    return b"".join(pieces)


def _sigv4(
    cred: CompiledCredential,
    material: Material,
    request: BrokerRequest,
    prior: Sequence[Mutation],
    now: datetime,
) -> list[Mutation] | BrokerDenial:
    inject = cred.credential.inject
    assert isinstance(inject, AwsSigV4Inject)
    spec = inject.aws_sigv4
    assert material.access_key_id is not None
    applied = apply_mutations(request, prior)
    timestamp = amz_date(now)
    out: list[Mutation] = [SetHeader("X-Amz-Date", Secret(timestamp))]
    if material.session_token is not None:
        out.append(SetHeader("X-Amz-Security-Token", material.session_token))
    else:
        out.append(RemoveHeader("X-Amz-Security-Token"))
    declared = header_values(applied.headers, "x-amz-content-sha256")
    body_changed = any(isinstance(m, SetBody) for m in prior)
    if declared:
        payload_hash = declared[0].strip()
        if payload_hash.startswith("STREAMING-") and payload_hash != _UNSIGNED_TRAILER:
            return BrokerDenial(DenialCause.UNSIGNABLE, (cred.name,), ("header:x-amz-content-sha256",))
        if body_changed and _HEX64.match(payload_hash) and applied.body is not None:
            payload_hash = hashlib.sha256(applied.body).hexdigest()
            out.append(SetHeader("X-Amz-Content-Sha256", Secret(payload_hash)))
    elif applied.body is None:
        return BrokerDenial(DenialCause.BODY_TOO_LARGE, (cred.name,), ("body",))
    else:
        payload_hash = hashlib.sha256(applied.body).hexdigest()
    final = apply_mutations(request, [*prior, *out])
    present = {k.lower() for k, _ in final.headers}
    guest = None
    authorization = header_values(applied.headers, "authorization")
    if authorization:
        guest = parse_authorization(authorization[0])
    names = set(guest.signed_headers) if guest is not None else set(_DEFAULT_SIGNED)
    names |= {"host", "x-amz-date"}
    names.discard("authorization")
    if material.session_token is not None:
        names.add("x-amz-security-token")
    else:
        names.discard("x-amz-security-token")
    if "x-amz-content-sha256" in present:
        names.add("x-amz-content-sha256")
    signature = sign(
        method=request.method,
        path=request.path,
        query=final.query,
        headers=final.headers,
        # host and x-amz-date always: a request without a host header is the caller's fault (raises).
        signed_headers=(names & present) | {"host", "x-amz-date"},
        payload_hash=payload_hash,
        region=spec.region,
        service=spec.service,
        access_key_id=material.access_key_id.reveal(),
        secret_access_key=material.secret.reveal(),
        timestamp=timestamp,
    )
    out.append(SetHeader("Authorization", Secret(signature.authorization)))
    return out


def build_mutations(
    plan: Plan, materials: Mapping[str, Material], request: BrokerRequest, now: datetime
) -> tuple[Mutation, ...] | BrokerDenial:
    """The mutations that inject every planned credential; SigV4 signs last, over the final request."""
    mutations: list[Mutation] = []
    signer: CompiledCredential | None = None
    body_values: dict[str, bytes] = {}
    encoding = _body_encoding(next(iter(header_values(request.headers, "content-type")), ""))
    if request.mcp is not None:
        # Read as JSON whatever its Content-Type says: the secret goes in JSON-escaped, so a
        # quote or backslash in it cannot end the string it is placed in.
        encoding = "json"
    query = request.query
    for cred in plan.credentials:
        inject = cred.credential.inject
        material = materials[cred.name]
        if isinstance(inject, AwsSigV4Inject):
            signer = cred
        elif isinstance(inject, QueryInject):
            query = _set_query(query, inject.query, material.secret)
        elif isinstance(inject, BodyInject):
            body_values[cred.name] = _encode_for_body(material.secret, encoding)
        else:
            mutations.append(_header_value(cred, material))
    if query != request.query:
        mutations.append(SetQuery(Secret(query)))
    if plan.body_spans:
        assert request.body is not None
        mutations.append(SetBody(Secret(_replace_body(request.body, plan.body_spans, body_values))))
    if plan.credentials:
        # The scrubber reads plain bodies only; ask the upstream not to compress this response.
        mutations.append(SetHeader("Accept-Encoding", Secret("identity")))
    if signer is not None:
        signed = _sigv4(signer, materials[signer.name], request, mutations, now)
        if isinstance(signed, BrokerDenial):
            return signed
        mutations.extend(signed)
    return tuple(mutations)
