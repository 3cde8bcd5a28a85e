"""OAuth2 access tokens (client credentials, refresh token), fetched from a token endpoint and cached."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable
from urllib.parse import quote_plus, urlencode, urlsplit

from sandgate.brokers.errors import TokenEndpointError
from sandgate.brokers.httpclient import AsyncHttpClient
from sandgate.brokers.material import Material
from sandgate.brokers.providers.token_cache import Token, TokenCache, parse_json_object, refresh_time
from sandgate.brokers.secret import Secret
from sandgate.brokers.sources.registry import SecretRegistry
from sandgate.policy.model.credentials import OAuth2Spec
from sandgate.policy.model.secret_refs import SecretRef, parse_ref

__all__ = ["OAuth2Provider"]

# RFC 6749 error codes are short ASCII words; anything else from the server is not repeated.
_ERROR_CODE = re.compile(r"^[a-z_]{1,64}$")
_FORM = "application/x-www-form-urlencoded"


class OAuth2Provider:
    """Mints and caches the access token of one OAuth2 credential.

    The token is reused until `skew_seconds` before it expires. With the refresh-token
    grant, a rotated refresh token returned by the server is kept in memory and used next;
    when the configured source changes (an operator rotated it), the source wins again.
    """

    __slots__ = (
        "_cache",
        "_client_secret",
        "_clock",
        "_http",
        "_refresh_from_source",
        "_refresh_rotated",
        "_resolve_ref",
        "_secrets",
        "spec",
    )

    def __init__(
        self,
        spec: OAuth2Spec,
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
        self._client_secret: Secret | None = None
        self._refresh_from_source: Secret | None = None
        self._refresh_rotated: Secret | None = None

    async def material(self) -> Material:
        """The current access token, and every value the guest must never see."""
        token = await self._cache.get()
        scrub = [token.value]
        scrub.extend(s for s in (self._client_secret, self._refresh_rotated, self._refresh_from_source) if s)
        return Material(secret=token.value, scrub=tuple(scrub))

    def invalidate(self) -> None:
        """Drop the cached access token (the next request fetches a new one)."""
        self._cache.invalidate()

    async def _refresh_token(self) -> Secret:
        assert self.spec.refresh_token is not None
        configured = await self._secrets.get(self._resolve_ref(self.spec.refresh_token))
        if self._refresh_from_source is None or configured != self._refresh_from_source:
            self._refresh_from_source = configured
            self._refresh_rotated = None
        return self._refresh_rotated or configured

    async def _fetch(self) -> Token:
        spec = self.spec
        form: list[tuple[str, str]] = [("grant_type", spec.grant)]
        if spec.grant == "refresh_token":
            form.append(("refresh_token", (await self._refresh_token()).reveal()))
        if spec.scope:
            form.append(("scope", spec.scope))
        headers = {"Content-Type": _FORM, "Accept": "application/json"}
        client_secret: Secret | None = None
        if spec.client_secret is not None:
            client_secret = await self._secrets.get(self._resolve_ref(spec.client_secret))
            self._client_secret = client_secret
        if client_secret is not None and spec.client_auth == "basic":
            pair = f"{quote_plus(spec.client_id)}:{quote_plus(client_secret.reveal())}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        else:
            form.append(("client_id", spec.client_id))
            if client_secret is not None:
                form.append(("client_secret", client_secret.reveal()))
        issued = self._clock()
        response = await self._http.post(
            spec.token_url, headers=headers, body=urlencode(form).encode("ascii")
        )
        where = f"token endpoint {urlsplit(spec.token_url).hostname}"
        data = parse_json_object(response.body, where) if response.body else {}
        if response.status != 200:
            code = data.get("error")
            detail = f" ({code})" if isinstance(code, str) and _ERROR_CODE.match(code) else ""
            raise TokenEndpointError(f"{where} answered HTTP {response.status}{detail}")
        access = data.get("access_token")
        if not isinstance(access, str) or not access:
            raise TokenEndpointError(f"{where} answered no access_token")
        token_type = data.get("token_type", "bearer")
        if not isinstance(token_type, str) or token_type.lower() != "bearer":
            raise TokenEndpointError(f"{where} answered a token type other than bearer")
        expires_in = data.get("expires_in", spec.default_expires_in)
        if isinstance(expires_in, str) and expires_in.isdigit():
            expires_in = int(expires_in)
        if not isinstance(expires_in, int | float) or isinstance(expires_in, bool) or expires_in <= 0:
            raise TokenEndpointError(f"{where} answered an invalid expires_in")
        rotated = data.get("refresh_token")
        if spec.grant == "refresh_token" and isinstance(rotated, str) and rotated:
            self._refresh_rotated = Secret(rotated)
        expires_at = issued + float(expires_in)
        return Token(Secret(access), expires_at, refresh_time(issued, expires_at, spec.skew_seconds))
