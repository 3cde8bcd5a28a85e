"""The CLI's side of the admin API: calls over the running gateway's unix socket.

Every function raises GatewayNotRunning when nothing answers on the socket (the CLI then
says so, or works on local files where that makes sense) and AdminApiError with the API's
message and field for any non-2xx answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.errors import ProxyError
from sandgate.proxy.stores.protocols import CredentialInfo, StoreError

if TYPE_CHECKING:
    # Annotations only: importing the brokers package would cost `sandgate status` ~0.5 s.
    from sandgate.brokers import Secret

__all__ = [
    "AdminApiError",
    "ApiCredentialStore",
    "GatewayNotRunning",
    "access_request",
    "access_requests",
    "add_sandbox",
    "decide_access_request",
    "gateway_running",
    "grants",
    "list_credentials",
    "list_sandboxes",
    "open_sandbox_listeners",
    "readiness",
    "reload_policy",
    "remove_credential",
    "remove_sandbox",
    "revoke_grant",
    "set_credential",
    "status",
    "update_sandbox",
]

TIMEOUT = httpx.Timeout(30.0, connect=2.0)


class GatewayNotRunning(ProxyError):
    """No gateway answers on the admin socket."""


class AdminApiError(ProxyError):
    """The admin API refused; the message is the API's (never a credential value)."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None,
        errors: list[str],
        body: dict[str, Any] | None = None,
    ) -> None:
        where = f" ({field})" if field else ""
        super().__init__(f"{message}{where}" + "".join(f"\n  {e}" for e in errors))
        self.status = status
        self.message = message
        self.field = field
        self.errors = errors
        # The whole answer (a refused reload carries the version still in force, the fleet's version).
        self.body = body or {}


def _call(
    config: GatewayConfig, method: str, path: str, *, answers: tuple[int, ...] = (), **kw: Any
) -> dict[str, Any]:
    """The JSON answer; `answers`: non-2xx statuses that are answers here, not errors."""
    sock = config.admin_socket_path
    transport = httpx.HTTPTransport(uds=str(sock))
    try:
        with httpx.Client(transport=transport, base_url="http://sandgate", timeout=TIMEOUT) as client:
            resp = client.request(method, path, **kw)
    except (httpx.ConnectError, httpx.RemoteProtocolError, FileNotFoundError):
        raise GatewayNotRunning(
            f"no gateway is running (nothing answers on {sock}); start it with `sandgate run`"
        ) from None
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if not resp.is_success and resp.status_code not in answers:
        raise AdminApiError(
            resp.status_code,
            str(body.get("error") or f"HTTP {resp.status_code}"),
            body.get("field"),
            [str(e) for e in body.get("errors", [])],
            body,
        )
    return dict(body)


def gateway_running(config: GatewayConfig) -> bool:
    """Whether a gateway answers on the admin socket."""
    if not config.admin.enabled or not config.admin_socket_path.is_socket():
        return False
    try:
        _call(config, "GET", "/healthz")
    except GatewayNotRunning:
        return False
    except AdminApiError:
        return True
    return True


def status(config: GatewayConfig, timeout: float | None = None) -> dict[str, Any]:
    return _call(config, "GET", "/v1/status", timeout=timeout or TIMEOUT)


def readiness(config: GatewayConfig, timeout: float | None = None) -> dict[str, Any]:
    """`/readyz`: `{"ready": bool, "checks": {name: bool}}` (its 503 is an answer, not an error)."""
    return _call(config, "GET", "/readyz", answers=(503,), timeout=timeout or TIMEOUT)


def access_requests(config: GatewayConfig) -> dict[str, Any]:
    """The requests held for a decision: `{"requests": [...]}`."""
    return _call(config, "GET", "/v1/access-requests")


def access_request(config: GatewayConfig, request_id: str) -> dict[str, Any]:
    return _call(config, "GET", f"/v1/access-requests/{quote(request_id, safe='')}")


def decide_access_request(
    config: GatewayConfig,
    request_id: str,
    *,
    approve: bool,
    by: str | None,
    reason: str | None,
    scope: str | None = None,
    ttl_seconds: float | None = None,
    any_arguments: bool = False,
    max_uses: int | None = None,
    expires_at: str | None = None,
) -> dict[str, Any]:
    """Approve (with a scope) or deny a request (AdminApiError 404: unknown, 409: already decided)."""
    verb = "approve" if approve else "deny"
    path = f"/v1/access-requests/{quote(request_id, safe='')}/{verb}"
    body: dict[str, Any] = {"by": by, "reason": reason}
    if scope is not None:
        body["scope"] = scope
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    if any_arguments:
        body["any_arguments"] = True
    if max_uses is not None:
        body["max_uses"] = max_uses
    if expires_at is not None:
        body["expires_at"] = expires_at
    return _call(config, "POST", path, json=body)


def grants(config: GatewayConfig) -> dict[str, Any]:
    """The grants in force: `{"grants": [...]}`."""
    return _call(config, "GET", "/v1/grants")


def revoke_grant(config: GatewayConfig, grant_id: str, *, by: str | None) -> dict[str, Any]:
    return _call(config, "POST", f"/v1/grants/{quote(grant_id, safe='')}/revoke", json={"by": by})


def reload_policy(config: GatewayConfig) -> dict[str, Any]:
    return _call(config, "POST", "/v1/policy/reload")


def open_sandbox_listeners(config: GatewayConfig) -> dict[str, Any]:
    """Make the running gateway open a transparent and a DNS listener (if it has none)."""
    return _call(config, "POST", "/v1/listeners/sandbox")


def list_sandboxes(config: GatewayConfig) -> list[dict[str, Any]]:
    return list(_call(config, "GET", "/v1/sandboxes")["sandboxes"])


def add_sandbox(config: GatewayConfig, sandbox: dict[str, Any]) -> dict[str, Any]:
    return _call(config, "POST", "/v1/sandboxes", json=sandbox)


def update_sandbox(config: GatewayConfig, sandbox: dict[str, Any]) -> dict[str, Any]:
    """Change a registered sandbox in place (404 when it is not registered)."""
    return _call(config, "PUT", f"/v1/sandboxes/{quote(str(sandbox['id']), safe='')}", json=sandbox)


def remove_sandbox(config: GatewayConfig, sandbox_id: str) -> dict[str, Any]:
    return _call(config, "DELETE", f"/v1/sandboxes/{quote(sandbox_id, safe='')}")


def list_credentials(config: GatewayConfig, tenant: str | None = None) -> list[dict[str, Any]]:
    params = {"tenant": tenant} if tenant else None
    return list(_call(config, "GET", "/v1/credentials", params=params)["credentials"])


def set_credential(config: GatewayConfig, tenant: str, name: str, value: Secret) -> dict[str, Any]:
    """Add or rotate; the value goes in the body only."""
    return dict(
        _call(config, "PUT", _credential_path(tenant, name), json={"value": value.reveal()})["credential"]
    )


def remove_credential(config: GatewayConfig, tenant: str, name: str) -> dict[str, Any]:
    return _call(config, "DELETE", _credential_path(tenant, name))


def _credential_path(tenant: str, name: str) -> str:
    return f"/v1/credentials/{quote(tenant, safe='')}/{quote(name, safe='')}"


class ApiCredentialStore:
    """The running gateway's credential store seen through the admin API, so the CLI's
    `credentials set|rotate|remove|list` run the same code against it or the store itself."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config

    async def list(self, tenant: str | None = None) -> list[CredentialInfo]:
        return [
            CredentialInfo(e["tenant"], e["name"], int(e["version"]), e["updated"])
            for e in list_credentials(self.config, tenant)
        ]

    async def put(self, tenant: str, name: str, value: Secret, *, must_exist: bool = False) -> CredentialInfo:
        if must_exist and not any(i.name == name for i in await self.list(tenant)):
            raise StoreError(f"credential {name} of tenant {tenant} is not set; use `set`", 404)
        e = set_credential(self.config, tenant, name, value)
        return CredentialInfo(e["tenant"], e["name"], int(e["version"]), e["updated"])

    async def get(self, tenant: str, name: str) -> Secret | None:
        raise StoreError("credential values are write-only", 403)

    async def remove(self, tenant: str, name: str) -> bool:
        try:
            remove_credential(self.config, tenant, name)
        except AdminApiError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def rekey(self) -> int:
        raise StoreError("`rekey` works on the store itself: run it where the store keys are")

    async def aclose(self) -> None:
        return None
