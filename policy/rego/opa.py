"""The opa engine: asks an OPA server's Data API for data.sandgate.decision.

Built on opa-python-client's AsyncOpaClient: one aiohttp session per event loop (so
connections are reused), no retries (a retry inside a per-call timeout only delays the
denial), a total timeout per call on the session and a hard `asyncio.timeout` around it.
Every failure (refused, timed out, HTTP error, a body that is not JSON) is a policy_error.
The server must hold what `sandgate policy push` uploads: the operator's modules, every
tenant's modules (package sandgate.tenants.<tenant>) and `data.tenants`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from sandgate.policy.rego.program import RegoModule
from sandgate.policy.rego.protocol import UNDEFINED, EngineError, RegoQuery, RegoVerdict, fault, interpret

__all__ = ["OpaEngine", "module_id"]


def module_id(path: str, root: str | None = None) -> str:
    """The policy id a module is uploaded under: sandgate/<path relative to root>, URL-safe."""
    if root is not None:
        relative = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
        path = relative if not relative.startswith("..") else path
    safe = "".join(c if c.isalnum() or c in "._-" else "/" for c in path)
    return "sandgate/" + "/".join(p for p in safe.split("/") if p and p not in (".", ".."))


class OpaEngine:
    """An OPA server over HTTP(S); one connection pool per event loop."""

    name = "opa"

    def __init__(self, url: str, *, timeout: float = 0.5, token: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EngineError(f"the OPA url must be http(s)://host[:port], not {url!r}")
        if parts.path not in ("", "/") or parts.query or parts.username:
            raise EngineError("the OPA url takes no path, query or credentials (use `token`)")
        if timeout <= 0:
            raise EngineError("the OPA timeout must be positive")
        self.url = f"{parts.scheme}://{parts.netloc}"
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 8181)
        self._ssl = parts.scheme == "https"
        self._token = token
        # Imported here, not at module level: it brings aiohttp (~0.5 s of CPU), which a gateway
        # on the embedded engine (the default) and most CLI calls never need.
        from opa_client import AsyncOpaClient

        self._client_type = AsyncOpaClient
        self.timeout = timeout
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None

    async def _session(self) -> Any:
        """The client of the running loop (an aiohttp session belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._client is not None and self._loop is loop:
            return self._client
        if self._opening is None or self._loop is not loop:
            self._opening, self._loop, self._client = asyncio.Lock(), loop, None
        async with self._opening:
            if self._client is not None:
                return self._client
            client = self._client_type(
                host=self._host,
                port=self._port,
                ssl=self._ssl,
                token=self._token,
                retries=0,
                timeout=self.timeout,
            )
            await client.__aenter__()
            self._client = client
            return client

    async def evaluate(self, query: RegoQuery) -> RegoVerdict:
        try:
            async with asyncio.timeout(self.timeout):
                client = await self._session()
                response = await client.query_rule(
                    input_data=query.document, package_path="sandgate", rule_name="decision"
                )
        except TimeoutError:
            return fault(f"the OPA server did not answer within {self.timeout:g}s")
        except Exception as e:
            return fault(f"the OPA server failed ({_describe(e)})")
        if not isinstance(response, dict):
            return fault("the OPA server's answer is not an object")
        if "result" not in response:
            return interpret(UNDEFINED)
        return interpret(response["result"])

    async def health(self) -> bool:
        """Whether the server answers its /health endpoint within the timeout."""
        try:
            async with asyncio.timeout(self.timeout):
                client = await self._session()
                return bool(await client.check_health())
        except Exception:
            return False

    async def push(
        self,
        modules: Iterable[RegoModule],
        tenants_data: Mapping[str, Any],
        *,
        prune: bool = True,
        root: str | None = None,
    ) -> tuple[list[str], list[str]]:
        """Upload modules in order (one policy id each) and data.tenants; drop other sandgate/ ids.

        Returns (ids uploaded, ids removed). Raises what the client raises (the caller reports it).
        """
        client = await self._session()
        ids = []
        for module in modules:
            mid = module_id(module.path, root)
            await client.update_policy_from_string(module.text, mid, rego_compat=False)
            ids.append(mid)
        await client.update_or_create_data(dict(tenants_data), "tenants")
        removed = []
        if prune:
            for old in await client.get_policies_list():
                if isinstance(old, str) and old.startswith("sandgate/") and old not in ids:
                    await client.delete_policy(old)
                    removed.append(old)
        return ids, removed

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.close_connection()


def _describe(e: BaseException) -> str:
    """A short, secret-free description: the type, and the HTTP status when there is one."""
    status = getattr(e, "status", None)
    return f"{type(e).__name__} {status}" if isinstance(status, int) else type(e).__name__
