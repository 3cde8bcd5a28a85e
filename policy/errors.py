"""Faults of the policy layer. A denial is not an exception; these are.

SandgateError
 └── PolicyError
      ├── PolicyLoadError      a file on disk is invalid (file, line, field, problem)
      │    └── PolicySetError  several PolicyLoadErrors at once (a whole rules directory)
      ├── HostError            a host, address or path that cannot be normalised
      ├── TokenReferenceError  a sandbox token reference that cannot be resolved
      │    └── TokenFileMissingError  its token file does not exist (yet)
      ├── SecretReferenceError a credential's secret reference that cannot be parsed (`env:`, `cmd:` ...)
      └── ResolveError         the gateway's resolver failed (DNS failure, timeout)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "HostError",
    "PolicyError",
    "PolicyLoadError",
    "PolicySetError",
    "ResolveError",
    "SandgateError",
    "SecretReferenceError",
    "SourceLocation",
    "TokenFileMissingError",
    "TokenReferenceError",
]


class SandgateError(Exception):
    """Base of every sandgate fault."""


class PolicyError(SandgateError):
    """A fault in policy loading, normalisation or evaluation."""


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """Where in a file a value came from (1-based line and column)."""

    file: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        if self.line is None:
            return self.file
        if self.column is None:
            return f"{self.file}:{self.line}"
        return f"{self.file}:{self.line}:{self.column}"


class PolicyLoadError(PolicyError):
    """One problem in one file, rendered as `file:line:column: field: problem`."""

    def __init__(self, location: SourceLocation, field: str, problem: str) -> None:
        self.location = location
        self.field = field
        self.problem = problem
        prefix = f"{location}: {field}: " if field else f"{location}: "
        super().__init__(prefix + problem)


class PolicySetError(PolicyLoadError):
    """Every problem found while loading a set of files; the first one is the headline."""

    def __init__(self, errors: Sequence[PolicyLoadError]) -> None:
        if not errors:
            raise ValueError("PolicySetError needs at least one error")
        self.errors = tuple(errors)
        first = self.errors[0]
        super().__init__(first.location, first.field, first.problem)

    def __str__(self) -> str:
        return "\n".join(str(PolicyLoadError(e.location, e.field, e.problem)) for e in self.errors)


class HostError(PolicyError, ValueError):
    """A host, address or path that cannot be normalised into one unambiguous value."""


class TokenReferenceError(PolicyError):
    """A sandbox token reference (`env:`, `file:`, `sha256:`) that cannot be resolved."""


class TokenFileMissingError(TokenReferenceError):
    """A `file:` token reference whose file does not exist yet: the sandbox cannot log in."""


class SecretReferenceError(PolicyError, ValueError):
    """A secret reference whose syntax is wrong, or whose scheme no secret source handles."""


class ResolveError(PolicyError):
    """The gateway's resolver could not resolve a name."""
