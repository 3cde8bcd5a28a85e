"""The seal of a grants file the gateway wrote: a first line that says so and a last line that
carries the SHA-256 of every byte above it, so a cut or altered file is told from a whole one.

    # sandgate-grants-file v1: written by the gateway, sealed by its last line ...
    tenant: t1
    grants: ...
    # sandgate-grants-file end sha256:<64 hex digits of everything above this line>

A file that starts with `# sandgate-grants-file` loads only whole: no end line (cut short), a digest
that does not match (cut or edited), or text after the end line is refused as a whole. A file
without the first line is a hand-written one and loads as any policy file does. Why a header
and not only an end line: without it, a file cut before its end line would read as a
hand-written file and load the grants written before the cut.
"""

from __future__ import annotations

import hashlib
import re

from sandgate.policy.errors import PolicyLoadError, SourceLocation

__all__ = ["SEAL_END", "SEAL_HEADER", "check_seal", "seal"]

_FAMILY = "# sandgate-grants-file"
SEAL_HEADER = f"{_FAMILY} v1"
SEAL_END = f"{_FAMILY} end sha256:"
_HEADER = (
    f"{SEAL_HEADER}: written by the gateway, sealed by its last line (a digest of the lines\n"
    "# above it). A sealed file that was cut or changed does not load: to edit it by hand,\n"
    "# delete its first line and its last line first.\n"
)
_END_LINE = re.compile(re.escape(SEAL_END) + r"([0-9a-f]{64})\n")
_UNSEAL = "to edit a gateway-written grants file by hand, delete its first and last lines"


def seal(body: str) -> str:
    """`body` (YAML, ending in a newline) with the header above it and the end line below."""
    if not body.endswith("\n"):
        body += "\n"
    text = _HEADER + body
    return f"{text}{SEAL_END}{_digest(text)}\n"


def check_seal(text: str, file: str) -> None:
    """Refuse (PolicyLoadError naming file and line) a sealed file that is not whole; a file
    without the header is not sealed and passes."""
    if not text.startswith(_FAMILY):
        return
    if not text.startswith(SEAL_HEADER + ":"):
        # A seal this gateway does not know (a newer one wrote it) is never taken for no seal.
        problem = f"a seal this gateway does not know (it knows {SEAL_HEADER!r}); {_UNSEAL}"
        raise PolicyLoadError(SourceLocation(file, 1), "", problem)
    # Lines end at "\n" only, as the gateway writes them (not at \r, \x85, \u2028 ...).
    at = text.rfind("\n" + SEAL_END) + 1
    if at == 0:
        problem = f"the gateway wrote this file (line 1) and its end line is missing: it is cut; {_UNSEAL}"
        raise PolicyLoadError(SourceLocation(file, _line_of(text, len(text))), "", problem)
    where = SourceLocation(file, _line_of(text, at))
    end = text[at:]
    if "\n" in end[:-1]:
        raise PolicyLoadError(where, "", f"text after the end line: a sealed file ends with it; {_UNSEAL}")
    found = _END_LINE.fullmatch(end)
    if found is None or found.group(1) != _digest(text[:at]):
        problem = "the file does not match the digest on its end line: it was cut or changed"
        raise PolicyLoadError(where, "", f"{problem}; {_UNSEAL}")


def _line_of(text: str, offset: int) -> int:
    """The 1-based line of `offset` (of the last line, at the end of a text ending in a newline)."""
    if offset == len(text) and text.endswith("\n"):
        offset -= 1
    return text.count("\n", 0, offset) + 1


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
