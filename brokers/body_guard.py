"""`RequestBodyGuard`: the planner's checks for a request body that is streamed, not buffered."""

from __future__ import annotations

from sandgate.brokers.outcome import BrokerDenial, DenialCause
from sandgate.brokers.placeholders import PlaceholderIndex
from sandgate.brokers.planner import classify
from sandgate.brokers.request import BrokerRequest
from sandgate.brokers.scan import Hit, Part, StreamScanner, Where
from sandgate.brokers.tenant_credentials import CompiledTenant, request_path
from sandgate.policy.model.credentials import BodyInject

__all__ = ["RequestBodyGuard"]


class RequestBodyGuard:
    """Feed every chunk of a streamed request body before forwarding it; a denial means: kill the flow.

    Chunks before the one that completes a placeholder held only part of it. Any placeholder
    in a streamed body is denied: one that is not this sandbox's (`unknown_placeholder`), an
    unbound credential's, a bound body credential's (it cannot be replaced in a stream:
    `body_too_large`), or a bound credential of another kind (`misplaced`).
    """

    __slots__ = ("_denial", "_index", "_path", "_request", "_sandbox", "_scanner", "_table")

    def __init__(
        self, table: CompiledTenant, index: PlaceholderIndex, sandbox: str, request: BrokerRequest
    ) -> None:
        self._table = table
        self._index = index
        self._sandbox = sandbox
        self._request = request
        self._path = request_path(request)
        self._scanner = StreamScanner()
        self._denial: BrokerDenial | None = None

    def feed(self, chunk: bytes) -> BrokerDenial | None:
        """Scan one chunk; a denial (then and for every later chunk) means the body must not go on."""
        if self._denial is not None:
            return self._denial
        found = self._scanner.feed(chunk)
        if not found:
            return None
        hits = [Hit(p, Where(Part.BODY)) for p in sorted(found)]
        denial, own = classify(hits, self._index, self._table, self._sandbox)
        if denial is None:
            for name in own:
                cred = self._table.by_name[name]
                cause = cred.binding_failure(self._request, self._path)
                if cause is None:
                    is_body = isinstance(cred.credential.inject, BodyInject)
                    cause = DenialCause.BODY_TOO_LARGE if is_body else DenialCause.MISPLACED
                denial = BrokerDenial(cause, credentials=(name,), where=("body",))
                break
        self._denial = denial
        return denial
