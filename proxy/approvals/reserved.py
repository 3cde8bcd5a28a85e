"""The gateway's own name (`approvals.endpoint_name`, default `sandgate.internal`): answered by
the gateway itself, never resolved upstream and never forwarded.

- Explicit proxy: a plain-HTTP request `http://<name>/...` is answered by the guests' endpoint
  (sandgate.proxy.approvals.endpoint); a CONNECT to it is refused (`reserved_host`).
- Transparent mode: the gateway's DNS listener answers the name (type A) with
  `approvals.endpoint_address`, a reserved link-local address (default 169.254.77.77). The
  guest sends it through its default route, the host rules redirect every TCP connection from
  a sandbox interface to the transparent listener whatever its destination, and that listener
  answers port-80 requests whose Host is the name. TLS naming it is refused.
- Any decision about the name (GatewayContext.decide) is `reserved_host`: no rule, not even
  `hosts: ["*"]`, makes the gateway resolve or dial it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandgate.policy.paths import glob_problem

__all__ = [
    "ENDPOINT_PATH",
    "ENDPOINT_PORT",
    "KNOWN_METHODS",
    "MAX_PATH_CHARS",
    "ReservedName",
    "path_problem",
]

# Where guests propose access requests, and the only port the name is answered on.
ENDPOINT_PATH = "/v1/access-requests"
ENDPOINT_PORT = 80
# The methods a proposal may name.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
MAX_PATH_CHARS = 1024
_PATH_GLOB = re.compile(r"^/[\x21-\x7e]*$")


def path_problem(path: str) -> str | None:
    """Why `path` is no path glob a proposal may name (a rule's syntax, at most
    MAX_PATH_CHARS), or None."""
    if len(path) > MAX_PATH_CHARS or not _PATH_GLOB.match(path):
        return f"a path glob starts with '/', has no spaces or control characters, at most {MAX_PATH_CHARS}"
    problem = glob_problem(path)
    return f"{path!r}: {problem}" if problem is not None else None


@dataclass(frozen=True, slots=True)
class ReservedName:
    """The name the gateway answers itself, and the address its DNS listener gives for it."""

    name: str
    address: str

    @property
    def endpoint(self) -> str:
        """The URL guests propose access requests at."""
        return f"http://{self.name}{ENDPOINT_PATH}"

    def poll(self, request_id: str) -> str:
        """The URL a guest polls one of its access requests at."""
        return f"{self.endpoint}/{request_id}"

    def ask(
        self, host: str | None, port: int | None, method: str | None = None, path: str | None = None
    ) -> dict[str, object] | None:
        """The `ask` member of a denial's body (sandgate.proxy.respond shows it where an approval
        could change the denial): the endpoint, and a proposal that, submitted as is, asks for
        this request. No query (rules never match one, and it may carry a secret); None when
        no proposal could name the request (a method not proposable, an ambiguous path)."""
        if not host or not port:
            return None
        proposal: dict[str, object] = {"host": host, "port": port}
        if method is not None:
            if method.upper() not in KNOWN_METHODS:
                return None
            proposal["methods"] = [method.upper()]
        if path is not None:
            path = path.partition("?")[0]
            if path_problem(path) is not None:
                return None  # no rule can match it: no proposal would allow it
            proposal["paths"] = [path]
        return {"endpoint": self.endpoint, "proposal": proposal}
