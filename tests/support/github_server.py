"""A GitHub-API-like endpoint on loopback: `POST /app/installations/{id}/access_tokens`.

Verifies the app JWT the way GitHub does (RS256 with the app's public key, `iss` the app
id, `iat` in the past, `exp` at most ten minutes ahead) and mints `ghs_` installation tokens
with an `expires_at`. Records every request and the JWT claims it accepted.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from .oauth_server import JsonServer, RecordedTokenRequest

__all__ = ["GitHubAppServer", "verify_app_jwt"]


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify_app_jwt(jwt: str, public_key: rsa.RSAPublicKey, app_id: str, now: float) -> dict[str, Any]:
    """The claims of a valid GitHub App JWT, or ValueError saying what is wrong."""
    try:
        head_b64, payload_b64, sig_b64 = jwt.split(".")
    except ValueError:
        raise ValueError("not three parts") from None
    header = json.loads(_unb64url(head_b64))
    if header.get("alg") != "RS256":
        raise ValueError("alg is not RS256")
    try:
        public_key.verify(
            _unb64url(sig_b64), f"{head_b64}.{payload_b64}".encode(), padding.PKCS1v15(), hashes.SHA256()
        )
    except InvalidSignature:
        raise ValueError("bad signature") from None
    claims: dict[str, Any] = json.loads(_unb64url(payload_b64))
    if str(claims.get("iss")) != app_id:
        raise ValueError("wrong iss")
    if not claims["iat"] <= now + 1 or not now < claims["exp"] <= now + 600:
        raise ValueError("iat/exp out of range")
    return claims


class GitHubAppServer(JsonServer):
    """Mints installation tokens for one app and installation."""

    def __init__(
        self,
        *,
        app_id: str,
        public_key: rsa.RSAPublicKey,
        installation_id: int,
        token_ttl: float = 3600,
        clock: Any = time.time,
    ) -> None:
        super().__init__()
        self.app_id = app_id
        self.public_key = public_key
        self.installation_id = installation_id
        self.token_ttl = token_ttl
        self.clock = clock
        self.claims: list[dict[str, Any]] = []
        self.issued: list[str] = []

    def handle(self, request: RecordedTokenRequest) -> tuple[int, dict[str, Any]]:
        if request.path != f"/app/installations/{self.installation_id}/access_tokens":
            return 404, {"message": "Not Found"}
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return 401, {"message": "A JSON web token could not be decoded"}
        try:
            claims = verify_app_jwt(auth[7:], self.public_key, self.app_id, self.clock())
        except (ValueError, KeyError, TypeError) as e:
            return 401, {"message": f"invalid JWT: {e}"}
        self.claims.append(claims)
        token = f"ghs_{secrets.token_urlsafe(27)}"
        self.issued.append(token)
        expires = datetime.fromtimestamp(self.clock() + self.token_ttl, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return 201, {"token": token, "expires_at": expires, "permissions": {"contents": "read"}}
