"""GitHub App installation tokens: a JWT signed with the app key (RS256) buys one, cached till near expiry."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from sandgate.brokers.errors import SecretUnavailable, TokenEndpointError
from sandgate.brokers.httpclient import AsyncHttpClient
from sandgate.brokers.material import Material
from sandgate.brokers.providers.token_cache import Token, TokenCache, parse_json_object, refresh_time
from sandgate.brokers.secret import Secret
from sandgate.brokers.sources.registry import SecretRegistry
from sandgate.policy.model.credentials import GitHubAppSpec
from sandgate.policy.model.secret_refs import SecretRef, parse_ref

__all__ = ["GitHubAppProvider", "app_jwt"]

# GitHub accepts at most 10 minutes; iat is backdated for clock drift, as GitHub recommends.
JWT_LIFETIME = 540
JWT_BACKDATE = 60
API_VERSION = "2022-11-28"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def app_jwt(app_id: str, key: rsa.RSAPrivateKey, now: float) -> str:
    """A GitHub App JWT: RS256 over {iat: now-60, exp: now+540, iss: app_id}."""
    header = {"alg": "RS256", "typ": "JWT"}
    payload = {"iat": int(now) - JWT_BACKDATE, "exp": int(now) + JWT_LIFETIME, "iss": app_id}
    signing_input = (
        _b64url(json.dumps(header, separators=(",", ":")).encode())
        + "."
        + _b64url(json.dumps(payload, separators=(",", ":")).encode())
    )
    signature = key.sign(signing_input.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + _b64url(signature)


class GitHubAppProvider:
    """Mints and caches the installation token of one GitHub App credential.

    The private key is read through its secret source on every mint (so a rotated key
    file is used at once) and parsed only when its bytes changed.
    """

    __slots__ = ("_cache", "_clock", "_http", "_key", "_resolve_ref", "_secrets", "spec")

    def __init__(
        self,
        spec: GitHubAppSpec,
        *,
        secrets: SecretRegistry,
        http: AsyncHttpClient,
        clock: Callable[[], float] = time.time,
        resolve_ref: Callable[[str], SecretRef] = parse_ref,
    ) -> None:
        self.spec = spec
        self._secrets = secrets
        self._http = http
        self._clock = clock
        self._resolve_ref = resolve_ref
        self._cache = TokenCache(self._fetch, clock)
        self._key: tuple[bytes, rsa.RSAPrivateKey] | None = None

    async def material(self) -> Material:
        """The current installation token."""
        token = await self._cache.get()
        return Material(secret=token.value, scrub=(token.value,))

    def invalidate(self) -> None:
        self._cache.invalidate()

    async def _private_key(self) -> rsa.RSAPrivateKey:
        pem = (await self._secrets.get(self._resolve_ref(self.spec.private_key))).reveal_bytes()
        digest = hashlib.sha256(pem).digest()
        if self._key is not None and self._key[0] == digest:
            return self._key[1]
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError):
            raise SecretUnavailable("GitHub App private key is not an unencrypted PEM private key") from None
        if not isinstance(key, rsa.RSAPrivateKey):
            raise SecretUnavailable("GitHub App private key is not an RSA key")
        self._key = (digest, key)
        return key

    async def _fetch(self) -> Token:
        spec = self.spec
        key = await self._private_key()
        issued = self._clock()
        jwt = app_jwt(spec.app_id, key, issued)
        url = f"{spec.api_url.rstrip('/')}/app/installations/{spec.installation_id}/access_tokens"
        request: dict[str, Any] = {}
        if spec.repositories is not None:
            request["repositories"] = list(spec.repositories)
        if spec.permissions is not None:
            request["permissions"] = dict(spec.permissions)
        headers = {
            "Accept": "application/vnd.github+json",
            "Authorization": f"Bearer {jwt}",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "sandgate",
        }
        body = b""
        if request:
            headers["Content-Type"] = "application/json"
            body = json.dumps(request).encode()
        response = await self._http.post(url, headers=headers, body=body)
        where = f"GitHub API {urlsplit(url).hostname}"
        if response.status != 201:
            raise TokenEndpointError(
                f"{where} answered HTTP {response.status} for installation {spec.installation_id}"
            )
        data = parse_json_object(response.body, where)
        token = data.get("token")
        expires = data.get("expires_at")
        if not isinstance(token, str) or not token or not isinstance(expires, str):
            raise TokenEndpointError(f"{where} answered no token or expires_at")
        try:
            moment = datetime.fromisoformat(expires)
        except ValueError:
            raise TokenEndpointError(f"{where} answered an invalid expires_at") from None
        expires_at = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
        if expires_at <= issued:
            raise TokenEndpointError(f"{where} answered a token that has already expired")
        return Token(Secret(token), expires_at, refresh_time(issued, expires_at, spec.skew_seconds))
