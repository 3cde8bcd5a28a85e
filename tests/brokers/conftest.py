"""Shared pieces for broker tests: an in-memory secret source, a settable clock, credential builders."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.oauth_server import OAuthTokenServer

from sandgate.brokers import (
    Broker,
    BrokerRequest,
    Credential,
    HttpxClient,
    Secret,
    SecretRef,
    SecretRegistry,
    SecretUnavailable,
    TenantCredentials,
    default_registry,
)

KEY = Secret(b"gateway-placeholder-key-0123456789abcdef")
OPENAI_SECRET = "sk-live-4f9a2c7e1b3d5f7a9c0e2b4d"


class MemorySource:
    """A real in-memory SecretSource (`mem:NAME`), counting reads; a missing name is unavailable."""

    def __init__(self, **values: str) -> None:
        self.values = dict(values)
        self.reads = 0

    async def get(self, ref: SecretRef) -> Secret:
        self.reads += 1
        value = self.values.get(ref.value)
        if value is None:
            raise SecretUnavailable(f"memory secret {ref.value} is not set")
        return Secret(value)


class Clock:
    """Wall-clock seconds that a test moves by hand."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def credential(**fields: Any) -> Credential:
    """A credential from keyword fields (as a tenant file would write them)."""
    return Credential.model_validate(fields)


def header_credential(name: str = "openai", **extra: Any) -> Credential:
    fields: dict[str, Any] = {
        "name": name,
        "secret": f"mem:{name}",
        "hosts": ["api.openai.com"],
        "inject": {"header": "Authorization", "format": "Bearer {secret}"},
    }
    fields.update(extra)
    return credential(**fields)


def request(
    host: str = "api.openai.com",
    path: str = "/v1/chat/completions",
    *,
    method: str = "POST",
    scheme: str = "https",
    port: int = 443,
    query: str = "",
    headers: tuple[tuple[str, str], ...] = (),
    body: bytes | None = b"",
    body_too_large: bool = False,
) -> BrokerRequest:
    return BrokerRequest(
        method=method,
        scheme=scheme,
        host=host,
        port=port,
        path=path,
        query=query,
        headers=(("host", host), *headers),
        body=body,
        body_too_large=body_too_large,
    )


@pytest.fixture
def memory() -> MemorySource:
    return MemorySource(openai=OPENAI_SECRET)


@pytest.fixture
def registry(memory: MemorySource) -> SecretRegistry:
    return default_registry().with_source("mem", memory)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def http() -> Any:
    client = HttpxClient(timeout=5.0)
    yield client
    await client.aclose()


def make_broker(
    registry: SecretRegistry,
    tenants: list[TenantCredentials],
    *,
    http: Any = None,
    clock: Any = None,
) -> Broker:
    kwargs: dict[str, Any] = {"placeholder_key": KEY, "secrets": registry}
    if http is not None:
        kwargs["http"] = http
    if clock is not None:
        kwargs["clock"] = clock
    broker = Broker(**kwargs)
    broker.configure(tenants)
    return broker


@pytest.fixture
def oauth_server() -> Iterator[OAuthTokenServer]:
    with OAuthTokenServer(client_id="sandgate-client", client_secret="client-secret-0123456789") as server:
        yield server
