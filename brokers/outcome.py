"""What the broker decides for one request: a denial, or the mutations to apply."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from sandgate.brokers.request import Mutation
from sandgate.policy.reasons import Reason

if TYPE_CHECKING:
    from sandgate.brokers.body_guard import RequestBodyGuard

__all__ = ["BrokerAllow", "BrokerDecision", "BrokerDenial", "DenialCause"]


class DenialCause(StrEnum):
    """Why the broker denied, finer than the reason code (audited as `detail`)."""

    FOREIGN_PLACEHOLDER = "foreign_placeholder"  # another sandbox's or tenant's placeholder
    UNKNOWN_PLACEHOLDER = "unknown_placeholder"  # placeholder-shaped, minted for no one this gateway knows
    UNBOUND_HOST = "unbound_host"
    UNBOUND_PORT = "unbound_port"
    UNBOUND_SCHEME = "unbound_scheme"  # plain http to a credential without `plaintext: true`
    UNBOUND_METHOD = "unbound_method"
    UNBOUND_PATH = "unbound_path"
    MISPLACED = "misplaced"  # bound destination, but not where the injector puts the secret
    UNBOUND_TOOL = "unbound_tool"  # in the arguments of a tool call whose tool it is not bound to
    CONFLICT = "conflict"  # two credentials would set the same header, parameter or signature
    BODY_TOO_LARGE = "body_too_large"
    UNSIGNABLE = "unsignable"  # a SigV4 payload mode the gateway cannot re-sign (signed chunks)
    SECRET_UNAVAILABLE = "secret_unavailable"  # noqa: S105 (a cause, not a password)

    @property
    def reason(self) -> Reason:
        """The reason code this cause is reported under."""
        return _REASONS.get(self, Reason.CREDENTIAL_HOST_MISMATCH)


# Both look the same to the guest: it must not learn whether a string it holds is genuine.
_REASONS = {
    DenialCause.FOREIGN_PLACEHOLDER: Reason.UNKNOWN_PLACEHOLDER,
    DenialCause.UNKNOWN_PLACEHOLDER: Reason.UNKNOWN_PLACEHOLDER,
    DenialCause.CONFLICT: Reason.INVALID_REQUEST,
    DenialCause.UNSIGNABLE: Reason.INVALID_REQUEST,
    DenialCause.BODY_TOO_LARGE: Reason.BODY_TOO_LARGE,
    DenialCause.SECRET_UNAVAILABLE: Reason.INTERNAL_ERROR,
}


@dataclass(frozen=True, slots=True)
class BrokerDenial:
    """Deny the request. Names and places only, never a value.

    `credentials`: this tenant's credential names involved; `where`: places in the request
    (`header:authorization`, `query:key`, `body`, `body:encoded`, `path`, `host`);
    `foreign`: a placeholder that is not this sandbox's was seen, whose owners (`tenant/sandbox`;
    `unknown` for one minted with this gateway's key for a sandbox it does not know;
    `not minted here` for one of another key, a forgery, or a truncated or extended one) are
    in `foreign_owners` for the operator's log, not for the guest. `tools`: (credential, tool)
    where a `tools:` credential's placeholder was sent to a tool it is not bound to.
    """

    cause: DenialCause
    credentials: tuple[str, ...] = ()
    where: tuple[str, ...] = ()
    foreign: bool = False
    foreign_owners: tuple[str, ...] = ()
    detail: str = ""
    tools: tuple[tuple[str, str], ...] = ()
    allowed: Literal[False] = False

    @property
    def reason(self) -> Reason:
        return self.cause.reason


@dataclass(frozen=True, slots=True)
class BrokerAllow:
    """Forward the request after applying `mutations` in order.

    `credentials` and `injectors` (kinds) are for the audit record, and `tools`: (credential,
    tool) for each `tools:` credential replaced in a tool call's arguments. When the request
    body is streamed, `body_guard` must see every chunk before it is forwarded.
    """

    mutations: tuple[Mutation, ...] = ()
    credentials: tuple[str, ...] = ()
    injectors: tuple[str, ...] = ()
    tools: tuple[tuple[str, str], ...] = ()
    body_guard: RequestBodyGuard | None = None
    allowed: Literal[True] = True

    @property
    def injected(self) -> bool:
        """Whether a credential was injected (the response must then be scrubbed)."""
        return bool(self.credentials)


BrokerDecision = BrokerAllow | BrokerDenial
