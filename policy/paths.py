"""Request paths: the one reading that path rules match and the upstream receives. No I/O.

Servers read the same path bytes differently: nginx merges `//` and decodes every escape
(`%2F` too) before resolving `..`; Tomcat and Spring strip `;params` from each segment
(`/..;/` climbs); IIS reads `\\` as `/`; S3 keeps `a//b` apart from `a/b`. So the gateway
reads a request target once:

- the fragment is dropped (RFC 3986 3.5: it is the client's, never sent to a server);
- the path is brought to the form RFC 3986 6.2.2 calls equivalent (unreserved escapes
  decoded, other escapes in upper case, raw non-pchars encoded, dot segments resolved),
  path rules match that form, and that form is what the upstream receives;
- a path that servers could read as different paths has no such form: an empty segment
  (`//`), a `;` (raw or `%3B`), an encoded or raw `\\`, an encoded `/`, NUL, whitespace,
  or a double encoding (`%25` and two hex digits). Its match form is UNPARSEABLE_PATH,
  which matches no allow glob and every deny glob; it is forwarded as sent (only a host
  without path rules can allow it, and there no reading of it can bypass one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandgate.policy.errors import HostError
from sandgate.policy.matcher import UNPARSEABLE_PATH
from sandgate.policy.percent import read_escapes

__all__ = ["Target", "glob_problem", "normalise_path", "read_target"]

_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# RFC 3986 pchar minus unreserved and pct-encoded: sub-delims, ':' and '@'; plus '/'.
# ';' is among them but never gets this far: see _AMBIGUOUS_ESCAPES and read_path.
_PATH_KEEP = frozenset(b"!$&'()*+,;=:@/")
# Escapes a server decodes into structure: %2F and %5C split segments (nginx, IIS), NUL
# ends a C string, %3B starts Tomcat's path parameters once a front proxy decoded it.
_AMBIGUOUS_ESCAPES = {
    0x2F: "an encoded '/'",
    0x5C: "an encoded backslash",
    0x00: "an encoded NUL",
    0x3B: "an encoded ';'",
}
# %25 and two hex digits: a second decode (a proxy, then the app) yields another character,
# so "/%2561dmin" is /admin to an app that decodes twice. Checked on the output, so
# "%25%32%45" (which becomes "%252E") is caught too.
_DOUBLE_ENCODED_RE = re.compile(r"%25[0-9A-Fa-f]{2}")
# Already in normal form: segments of unreserved and kept characters, none empty (but a
# final one), none starting with '.' (so no dot segment), no '%' and no ';'. Most paths.
_PLAIN_RE = re.compile(r"(?:/[A-Za-z0-9_~!$&'()*+,=:@-][A-Za-z0-9._~!$&'()*+,=:@-]*)*/?", re.ASCII)


@dataclass(frozen=True, slots=True)
class Target:
    """A request target as the gateway reads it.

    `path` is what path rules (and Rego's `input.request.path`) see: the normalised path,
    or UNPARSEABLE_PATH. `query` is the raw query, "" when there is none. `forward` is the
    origin-form target the upstream receives: the normalised path and the query, never a
    fragment; for an ambiguous path, the path as sent. `problem` says why a path is ambiguous.
    """

    path: str
    query: str
    forward: str
    problem: str | None = None


def read_target(target: str) -> Target:
    """Read an origin-form request target (`/path?query#fragment`, or `*`) once."""
    before_fragment = target.partition("#")[0]
    raw_path, question, query = before_fragment.partition("?")
    try:
        path = normalise_path(raw_path)
    except HostError as e:
        return Target(UNPARSEABLE_PATH, query, before_fragment, str(e))
    return Target(path, query, path + question + query)


def normalise_path(path: str) -> str:
    """The one reading of a request path (query and fragment dropped), or HostError when
    servers could read it as different paths."""
    end = len(path)
    for delimiter in "?#":
        found = path.find(delimiter)
        if 0 <= found < end:
            end = found
    target = path[:end]
    if target == "*":
        return "*"
    if target and _PLAIN_RE.fullmatch(target):
        return target
    if not target.startswith("/"):
        raise HostError("path must start with '/'")
    encoded = _encode_path(target)
    if _DOUBLE_ENCODED_RE.search(encoded):
        raise HostError("path contains a double-encoded character ('%25' and two hex digits)")
    if ";" in encoded:
        # Tomcat, Jetty and Spring strip ";params" from each segment, nginx does not: "/admin;x/y"
        # is /admin/y to one and a name "admin;x" to the other, and "/..;/" climbs in Tomcat.
        raise HostError("path contains ';' (path parameters; servers disagree on them)")
    if "//" in encoded:
        # nginx and Apache merge the slashes (then "/v1//../admin" is /admin), S3 and most
        # frameworks keep the empty segment (then it is /v1/admin): no reading is safe.
        raise HostError("path has an empty segment ('//')")
    return _remove_dot_segments(encoded)


def glob_problem(glob: str) -> str | None:
    """Why a path glob can never match a path as the gateway reads it, or None.

    Globs are written in the normalised form paths are matched in, so a glob that differs
    from its own normal form is refused with the form to use instead.
    """
    pieces = re.split(r"(\*\*|\*|\?)", glob)
    try:
        normal = "".join(p if p in ("**", "*", "?") else _encode_path(p) for p in pieces)
    except HostError as e:
        return f"{e}: it never matches"
    if normal != glob:
        return f"use {normal!r} instead (paths are matched in their normal form)"
    if _DOUBLE_ENCODED_RE.search(glob) or ";" in glob or "//" in glob:
        return "an ambiguous path (';', '//', double encoding) never matches: the glob never does"
    if any(segment in (".", "..") for segment in glob.split("/")):
        return "paths are matched with dot segments resolved: a '.' or '..' segment never matches"
    return None


def _encode_path(target: str) -> str:
    """Percent-decode unreserved bytes, uppercase other escapes, encode raw non-pchars."""
    try:
        data = target.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise HostError("path is not valid Unicode") from None
    out: list[str] = []
    for byte, escaped in read_escapes(data, HostError("path has an invalid percent-escape")):
        if escaped:
            if byte in _AMBIGUOUS_ESCAPES:
                raise HostError(f"path contains {_AMBIGUOUS_ESCAPES[byte]}")
            out.append(chr(byte) if byte in _UNRESERVED else f"%{byte:02X}")
            continue
        if byte == 0x00:
            raise HostError("path contains NUL")
        if byte == 0x5C:
            raise HostError("path contains a backslash")
        if byte <= 0x20 or byte == 0x7F:
            raise HostError("path contains whitespace or a control character")
        if byte in _UNRESERVED or byte in _PATH_KEEP:
            out.append(chr(byte))
        else:
            # Not legal raw in a path (non-ASCII, '"', '<', '|', ...): one spelling only.
            out.append(f"%{byte:02X}")
    return "".join(out)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4 remove_dot_segments for an absolute path."""
    stack: list[str] = []
    segments = path[1:].split("/")
    for segment in segments:
        if segment == ".":
            continue
        if segment == "..":
            if stack:
                stack.pop()
            continue
        stack.append(segment)
    if segments[-1] in (".", ".."):
        stack.append("")  # "/a/." and "/a/b/.." keep their trailing slash.
    return "/" + "/".join(stack)
