"""AWS Signature Version 4 for headers (pure): canonical request, string to sign, signature.

Follows the published algorithm the way botocore applies it: non-S3 services sign the path
with dot segments and empty segments removed and each character URI-encoded once more;
S3 signs the path as sent. Query parameters are decoded and re-encoded (RFC 3986
unreserved characters stay), sorted by name then value. Header values are trimmed and
inner runs of spaces collapsed; repeated headers are joined with ','.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, unquote

__all__ = [
    "ALGORITHM",
    "EMPTY_SHA256",
    "GuestSignature",
    "SigV4Signature",
    "amz_date",
    "canonical_query",
    "canonical_uri",
    "parse_authorization",
    "sign",
]

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# Services that sign the path exactly as sent (no normalisation, no second encoding).
_RAW_PATH_SERVICES = frozenset({"s3", "s3-outposts", "s3-object-lambda", "s3express"})

_AUTH_RE = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+)\s*,\s*SignedHeaders=(?P<sh>[^,\s]+)\s*,"
    r"\s*Signature=(?P<sig>[0-9a-fA-F]+)\s*$"
)


@dataclass(frozen=True, slots=True)
class GuestSignature:
    """What a guest's own `Authorization: AWS4-HMAC-SHA256 ...` header claims."""

    access_key_id: str
    date: str
    region: str
    service: str
    signed_headers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SigV4Signature:
    """A computed signature and the texts it was computed from (for tests and debugging)."""

    canonical_request: str
    string_to_sign: str
    signature: str
    authorization: str
    signed_headers: tuple[str, ...]


def parse_authorization(value: str) -> GuestSignature | None:
    """Parse a SigV4 Authorization header value, or None if it is not one."""
    m = _AUTH_RE.match(value.strip())
    if m is None:
        return None
    parts = m.group("cred").split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        return None
    names = tuple(m.group("sh").lower().split(";"))
    return GuestSignature(parts[0], parts[1], parts[2], parts[3], names)


def amz_date(now: datetime) -> str:
    """`YYYYMMDDTHHMMSSZ` in UTC."""
    return now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def _remove_dot_segments(path: str) -> str:
    """botocore's reading of RFC 3986 §5.2.4, which also drops empty segments."""
    if not path:
        return "/"
    out: list[str] = []
    for segment in path.split("/"):
        if not segment or segment == ".":
            continue
        if segment == "..":
            if out:
                out.pop()
            continue
        out.append(segment)
    first = "/" if path.startswith("/") else ""
    last = "/" if path.endswith("/") and out else ""
    return first + "/".join(out) + last


def canonical_uri(path: str, service: str) -> str:
    """The canonical URI of a raw request path for `service`."""
    if service in _RAW_PATH_SERVICES:
        return path or "/"
    return quote(_remove_dot_segments(path), safe="/~")


def canonical_query(query: str) -> str:
    """The canonical query string of a raw query string."""
    if not query:
        return ""
    pairs = []
    for item in query.split("&"):
        key, _, value = item.partition("=")
        pairs.append((quote(unquote(key), safe="-_.~"), quote(unquote(value), safe="-_.~")))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _trimall(value: str) -> str:
    return " ".join(value.split())


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret_access_key: str, date: str, region: str, service: str) -> bytes:
    """The derived key for one day, region and service."""
    k_date = _hmac(("AWS4" + secret_access_key).encode("utf-8"), date)
    return _hmac(_hmac(_hmac(k_date, region), service), "aws4_request")


def sign(
    *,
    method: str,
    path: str,
    query: str,
    headers: Sequence[tuple[str, str]],
    signed_headers: Iterable[str],
    payload_hash: str,
    region: str,
    service: str,
    access_key_id: str,
    secret_access_key: str,
    timestamp: str,
) -> SigV4Signature:
    """Sign a request whose headers already hold `host` and `x-amz-date: timestamp`.

    `signed_headers` are lower-case names, each present in `headers`.
    """
    names = sorted(set(signed_headers))
    values: dict[str, list[str]] = {n: [] for n in names}
    for name, value in headers:
        lower = name.lower()
        if lower in values:
            values[lower].append(_trimall(value))
    missing = [n for n in names if not values[n]]
    if missing:
        raise ValueError(f"signed headers missing from the request: {', '.join(missing)}")
    header_block = "".join(f"{n}:{','.join(values[n])}\n" for n in names)
    signed = ";".join(names)
    canonical = "\n".join(
        [
            method.upper(),
            canonical_uri(path, service),
            canonical_query(query),
            header_block,
            signed,
            payload_hash,
        ]
    )
    date = timestamp[:8]
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, timestamp, scope, hashlib.sha256(canonical.encode("utf-8")).hexdigest()])
    signature = hmac.new(
        signing_key(secret_access_key, date, region, service), to_sign.encode("utf-8"), hashlib.sha256
    ).hexdigest()
    authorization = (
        f"{ALGORITHM} Credential={access_key_id}/{scope}, SignedHeaders={signed}, Signature={signature}"
    )
    return SigV4Signature(canonical, to_sign, signature, authorization, tuple(names))
