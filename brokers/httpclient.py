"""The HTTP client the broker uses for token endpoints: a protocol, and one httpx implementation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from sandgate.brokers.errors import TokenEndpointError

__all__ = ["AsyncHttpClient", "HttpResponse", "HttpxClient"]

MAX_RESPONSE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """A token endpoint's answer: status, lower-case headers, body."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    def __repr__(self) -> str:
        # The body holds tokens.
        return f"HttpResponse(status={self.status}, body=<{len(self.body)} bytes>)"


class AsyncHttpClient(Protocol):
    """POSTs to a token endpoint; raises TokenEndpointError for transport failures."""

    async def post(self, url: str, *, headers: Mapping[str, str], body: bytes) -> HttpResponse: ...


class HttpxClient:
    """`AsyncHttpClient` over one `httpx.AsyncClient`.

    Never uses proxy variables from the environment (they may point at this gateway), never
    follows redirects, caps the response size, and reports failures without their text
    (an error message may quote a request that carried a secret).
    """

    __slots__ = ("_client", "_max_bytes")

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        verify: bool | str = True,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self._client = httpx.AsyncClient(
            timeout=timeout, verify=verify, trust_env=False, follow_redirects=False
        )
        self._max_bytes = max_response_bytes

    async def post(self, url: str, *, headers: Mapping[str, str], body: bytes) -> HttpResponse:
        host = httpx.URL(url).host
        try:
            async with self._client.stream("POST", url, headers=dict(headers), content=body) as response:
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_raw():
                    size += len(chunk)
                    if size > self._max_bytes:
                        raise TokenEndpointError(
                            f"token endpoint {host} answered more than {self._max_bytes} bytes"
                        )
                    chunks.append(chunk)
                return HttpResponse(
                    response.status_code,
                    {k.lower(): v for k, v in response.headers.items()},
                    b"".join(chunks),
                )
        except httpx.HTTPError as e:
            raise TokenEndpointError(f"token endpoint {host} failed: {type(e).__name__}") from None

    async def aclose(self) -> None:
        await self._client.aclose()
