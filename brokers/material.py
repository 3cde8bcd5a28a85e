"""`Material`: the resolved values one injector needs for one request."""

from __future__ import annotations

from dataclasses import dataclass

from sandgate.brokers.secret import Secret

__all__ = ["Material"]


@dataclass(frozen=True, slots=True)
class Material:
    """Secrets resolved for one credential: `secret` is the static secret, or the minted token.

    `scrub` lists every value that must never reach the guest (the secret, a token, a
    client secret or refresh token, an AWS key id and session token): the response
    scrubber replaces each of them by the credential's placeholder.
    """

    secret: Secret
    username: str | None = None
    access_key_id: Secret | None = None
    session_token: Secret | None = None
    scrub: tuple[Secret, ...] = ()
