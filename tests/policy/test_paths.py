"""Tests for sandgate.policy.paths: the one reading of a request path that rules match and
the upstream receives, checked against how real servers read the same bytes."""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import unquote_to_bytes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy import paths
from sandgate.policy.errors import HostError
from sandgate.policy.matcher import UNPARSEABLE_PATH, compile_path_globs
from sandgate.policy.paths import glob_problem, normalise_path, read_target

PROPERTY = settings(max_examples=400, deadline=None)

# --- normalise_path: one reading -------------------------------------------------------

PATHS_OK = [
    ("/", "/", "the root is unchanged"),
    ("/a/b", "/a/b", "a plain path is unchanged"),
    ("/a/b/", "/a/b/", "a trailing slash is kept"),
    ("/a/b?x=1#f", "/a/b", "the query and fragment are dropped"),
    ("/a#f?x", "/a", "a fragment before a question mark ends the path"),
    ("*", "*", "an options asterisk is kept"),
    ("*?x", "*", "an options asterisk loses a query"),
    ("/a/./b/../c", "/a/c", "dot segments are resolved"),
    ("/a/b/..", "/a/", "a final dot-dot keeps the trailing slash"),
    ("/a/.", "/a/", "a final dot keeps the trailing slash"),
    ("/../../etc", "/etc", "dot-dot cannot climb above the root"),
    ("/a/%2e%2E/b", "/b", "encoded dots are dots"),
    ("/a/.%2e/b", "/b", "a half-encoded dot-dot is a dot-dot"),
    ("/%41%7e%2d%5F", "/A~-_", "unreserved escapes are decoded"),
    ("/a%3fb", "/a%3Fb", "other escapes are kept with upper case hex"),
    ("/A/B", "/A/B", "case is not folded"),
    ("/\u00e4", "/%C3%A4", "a raw non-ascii character is percent-encoded"),
    ("/a|b", "/a%7Cb", "a raw character illegal in a uri is percent-encoded"),
    ("/$&'()*+,=:@", "/$&'()*+,=:@", "sub-delimiters, colon and at sign stay raw"),
    ("/a%3Ab", "/a%3Ab", "an encoded colon keeps its spelling"),
    ("/...", "/...", "three dots are an ordinary segment"),
]


@pytest.mark.parametrize(("path", "expected"), [c[:2] for c in PATHS_OK], ids=[c[2] for c in PATHS_OK])
def test_normalise_path(path: str, expected: str) -> None:
    assert normalise_path(path) == expected


PATHS_AMBIGUOUS = [
    ("", "start with '/'", "an empty path is refused"),
    ("a/b", "start with '/'", "a relative path is refused"),
    ("http://example.com/", "start with '/'", "an absolute url is refused"),
    ("/a%2fb", "encoded '/'", "an encoded slash is ambiguous"),
    ("/a%2Fb", "encoded '/'", "an upper case encoded slash is ambiguous"),
    ("/a%5cb", "encoded backslash", "an encoded backslash is ambiguous"),
    ("/a\\b", "backslash", "a raw backslash is ambiguous"),
    ("/a%00b", "encoded NUL", "an encoded nul is ambiguous"),
    ("/a\x00b", "NUL", "a raw nul is ambiguous"),
    ("/a b", "whitespace", "a raw space is refused"),
    ("/a\tb", "whitespace", "a raw tab is refused"),
    ("/a%zz", "invalid percent-escape", "an invalid escape is refused"),
    ("/a%4", "invalid percent-escape", "a truncated escape is refused"),
    ("/a%252e%252e/b", "double-encoded", "a double-encoded dot is ambiguous"),
    ("/a%252F", "double-encoded", "a double-encoded slash is ambiguous"),
    ("/a%25%32%65", "double-encoded", "a double-encoded dot with encoded hex is ambiguous"),
    ("/%2561dmin", "double-encoded", "a double-encoded letter is ambiguous"),
    ("/a%2520", "double-encoded", "a double-encoded space is ambiguous"),
    ("/v1//../admin", "empty segment", "an empty segment before a dot-dot is ambiguous"),
    ("//admin/x", "empty segment", "a leading double slash is ambiguous"),
    ("/v1/a//b", "empty segment", "an empty segment inside a path is ambiguous"),
    ("/v1/.//x", "empty segment", "an empty segment after a dot is ambiguous"),
    ("/admin;x/y", "';'", "path parameters on a segment are ambiguous"),
    ("/v1/items;v=2", "';'", "path parameters on the last segment are ambiguous"),
    ("/a/..;/b", "';'", "a dot-dot with parameters is ambiguous"),
    ("/a/%2e%2e;x/b", "';'", "an encoded dot-dot with parameters is ambiguous"),
    ("/admin%3Bx/y", "encoded ';'", "an encoded semicolon is ambiguous"),
    ("/admin%253Bx/y", "double-encoded", "a double-encoded semicolon is ambiguous"),
]


@pytest.mark.parametrize(
    ("path", "problem"), [c[:2] for c in PATHS_AMBIGUOUS], ids=[c[2] for c in PATHS_AMBIGUOUS]
)
def test_normalise_path_refuses_what_servers_read_differently(path: str, problem: str) -> None:
    with pytest.raises(HostError, match=re.escape(problem)):
        normalise_path(path)


# --- read_target: what is matched is what is forwarded ---------------------------------

TARGETS = [
    ("/v1/items", "/v1/items", "/v1/items", "a plain target is matched and forwarded unchanged"),
    ("/v1/a/./b/../c?x=1", "/v1/a/c", "/v1/a/c?x=1", "the upstream gets the path with dot segments resolved"),
    ("/v1/#/../../admin", "/v1/", "/v1/", "a fragment is never forwarded, even one holding dot segments"),
    ("/v1?q=a#frag", "/v1", "/v1?q=a", "a fragment after the query is dropped"),
    ("/a#f?x", "/a", "/a", "a question mark inside the fragment starts no query"),
    ("/%7euser", "/~user", "/~user", "the upstream gets unreserved escapes decoded"),
    ("/a%3fb?c", "/a%3Fb", "/a%3Fb?c", "an encoded question mark stays encoded"),
    ("/\u00e4", "/%C3%A4", "/%C3%A4", "the upstream gets non-ascii bytes percent-encoded"),
    ("/a?", "/a", "/a?", "an empty query is kept"),
    ("/a?b=../../c", "/a", "/a?b=../../c", "the query is forwarded as sent"),
    ("*", "*", "*", "an options asterisk is forwarded as is"),
]


@pytest.mark.parametrize(("target", "path", "forward"), [c[:3] for c in TARGETS], ids=[c[3] for c in TARGETS])
def test_read_target(target: str, path: str, forward: str) -> None:
    reading = read_target(target)
    assert (reading.path, reading.forward, reading.problem) == (path, forward, None)


AMBIGUOUS_TARGETS = [
    ("/v1//../admin", "/v1//../admin", "empty segment", "an empty segment is forwarded as sent"),
    ("//admin/x?q#f", "//admin/x?q", "empty segment", "an ambiguous path still loses its fragment"),
    ("/v1/a%2F..%2F..%2Fadmin", "/v1/a%2F..%2F..%2Fadmin", "encoded '/'", "an encoded slash is kept"),
]


@pytest.mark.parametrize(
    ("target", "forward", "problem"),
    [c[:3] for c in AMBIGUOUS_TARGETS],
    ids=[c[3] for c in AMBIGUOUS_TARGETS],
)
def test_an_ambiguous_target_matches_as_unparseable(target: str, forward: str, problem: str) -> None:
    reading = read_target(target)
    assert reading.path == UNPARSEABLE_PATH
    assert reading.forward == forward
    assert reading.problem is not None and problem in reading.problem


# --- glob_problem: globs are written in the form paths are matched in ------------------

GLOBS_OK = ["/v1/**", "/admin/**", "/v1/*/read", "/files/*.txt", "/a?c", "/v1/projects/*:run", "/%C3%A4/**"]


@pytest.mark.parametrize("glob", GLOBS_OK, ids=[f"{g} is a normal glob" for g in GLOBS_OK])
def test_a_normal_glob_has_no_problem(glob: str) -> None:
    assert glob_problem(glob) is None


GLOBS_BAD = [
    ("/%7Euser/**", "use '/~user/**' instead", "an encoded unreserved character is refused"),
    ("/a%3ab", "use '/a%3Ab' instead", "lower case hex is refused"),
    ("/\u00e4/**", "use '/%C3%A4/**' instead", "a raw non-ascii character is refused"),
    ("/a#b", "use '/a%23b' instead", "a raw hash is refused"),
    ("/v1//x", "never matches", "an empty segment never matches"),
    ("/v1/x;y", "never matches", "a semicolon never matches"),
    ("/a%2Fb", "encoded '/'", "an encoded slash never matches"),
    ("/a%2541", "never matches", "a double encoding never matches"),
    ("/v1/../admin", "dot segments", "a dot-dot segment never matches"),
    ("/v1/./x", "dot segments", "a dot segment never matches"),
]


@pytest.mark.parametrize(("glob", "problem"), [c[:2] for c in GLOBS_BAD], ids=[c[2] for c in GLOBS_BAD])
def test_a_glob_that_cannot_match_is_refused(glob: str, problem: str) -> None:
    found = glob_problem(glob)
    assert found is not None and problem in found


# --- properties -------------------------------------------------------------------------

_segments = st.sampled_from(
    [
        "v1", "V1", "admin", "ADMIN", "Admin", "files", "x.txt", "read", "a", ".", "..", "",
        "%2e", "%2E%2e", ".%2e", "%41", "%61dmin", "%7e", "%3f", "%c3%a4", "x;y", "..;", "~",
        "%2F", "%2f..", "%5c", "\\..", "%252e", "%2561", "%3B", "x.txt%00", "%20", ":", "@",
    ]
)  # fmt: skip
_paths = st.one_of(
    st.lists(_segments, max_size=8).map(lambda s: "/" + "/".join(s)),
    st.text(alphabet="/.%2eEaA5fF;?#~ \\\u00e4dmin", max_size=24).map(lambda s: "/" + s),
)


@PROPERTY
@given(_paths)
def test_the_forwarded_target_reads_back_as_the_matched_path(path: str) -> None:
    reading = read_target(path)
    if reading.path == UNPARSEABLE_PATH:
        return
    again = read_target(reading.forward)
    assert again.path == reading.path
    assert again.forward == reading.forward
    assert "#" not in reading.forward
    segments = reading.path.split("/")
    assert "." not in segments and ".." not in segments
    assert "" not in segments[1:-1]


@PROPERTY
@given(_paths)
def test_the_fast_path_for_plain_paths_agrees_with_the_full_reading(path: str) -> None:
    target = path.partition("?")[0].partition("#")[0]
    if target and paths._PLAIN_RE.fullmatch(target):
        assert paths._remove_dot_segments(paths._encode_path(target)) == target


# How servers read the path they receive: None when they refuse it.
def _decode(path: str) -> str:
    return unquote_to_bytes(path).decode("latin-1")


def _resolve(path: str, *, merge: bool) -> str | None:
    """Dot segments resolved (and with `merge`, slashes merged); None above the root (nginx 400)."""
    if merge:
        path = re.sub("/+", "/", path)
    out: list[str] = []
    segments = path.split("/")[1:]
    for segment in segments:
        if segment == "..":
            if not out:
                return None
            out.pop()
        elif segment != ".":
            out.append(segment)
    if segments and segments[-1] in (".", ".."):
        out.append("")
    return "/" + "/".join(out)


def _nginx(path: str) -> str | None:
    """nginx, merge_slashes on: decode every escape, merge slashes, resolve dots."""
    decoded = _decode(path)
    return None if "\x00" in decoded else _resolve(decoded, merge=True)


def _tomcat(path: str) -> str | None:
    """Tomcat/Spring: strip ';params' from each segment, then decode, merge and resolve."""
    stripped = "/".join(segment.partition(";")[0] for segment in path.split("/"))
    return _resolve(_decode(stripped), merge=True)


def _no_merge(path: str) -> str | None:
    """A server that keeps empty segments (S3, many frameworks): decode, resolve dots."""
    return _resolve(_decode(path), merge=False)


def _windows(path: str) -> str | None:
    """IIS: backslash is a slash, case folded."""
    read = _nginx(path.replace("\\", "/").replace("%5C", "/").replace("%5c", "/"))
    return read.lower() if read is not None else None


def _double_decode(path: str) -> str | None:
    """A front proxy decodes, the app decodes again."""
    return _nginx(_decode(path))


SERVERS: dict[str, Callable[[str], str | None]] = {
    "nginx": _nginx,
    "tomcat": _tomcat,
    "no-merge": _no_merge,
    "windows": _windows,
    "double-decode": _double_decode,
}
ALLOW = compile_path_globs(["/v1/**", "/files/*.txt", "/x/*/read"])
DENY = compile_path_globs(["/admin/**", "/v1/admin/**"], fold_case=True)


@PROPERTY
@given(_paths)
def test_every_server_reads_an_allowed_path_inside_the_allow_globs(path: str) -> None:
    """For any path the gateway allows, each server's reading of the forwarded target is one
    the allow globs match and no deny glob hits (or the server refuses it)."""
    reading = read_target(path)
    if reading.path == UNPARSEABLE_PATH:
        return  # matches no allow glob
    if ALLOW.fullmatch(reading.path) is None or DENY.fullmatch(reading.path) is not None:
        return  # refused
    forwarded = reading.forward.partition("?")[0]
    for name, server in SERVERS.items():
        seen = server(forwarded)
        if seen is None:
            continue
        assert ALLOW.fullmatch(seen) is not None, (name, path, forwarded, seen)
        assert DENY.fullmatch(seen) is None, (name, path, forwarded, seen)
