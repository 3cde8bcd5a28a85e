"""What sandgate reads from Rego source text without evaluating it.

A small tokenizer (comments, strings, identifiers, punctuation, brace depth) is enough for:
the `package` of a module, the `input` fields it can read (which decides what goes into
the decision cache key and the input the embedded engine marshals), whether it calls a
builtin whose result changes between calls (such a policy is never cached), builtins
sandgate refuses, and the `test_` rules of a test module. Anything the scan cannot read
for certain widens the answer: an `input` it cannot follow means "the whole input".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = [
    "FORBIDDEN_BUILTINS",
    "NONDETERMINISTIC_BUILTINS",
    "InputPaths",
    "ModuleFacts",
    "Token",
    "byte_to_char_offset",
    "line_column",
    "merge_paths",
    "module_facts",
    "package_ref",
    "ref_text",
    "tokens",
]

# Builtins whose result differs between two evaluations of the same input: no caching.
NONDETERMINISTIC_BUILTINS = frozenset(
    {
        "time.now_ns",
        "rand.intn",
        "uuid.rfc4122",
        "http.send",
        "net.lookup_ip_addr",
        "opa.runtime",
        # These read the clock to check expiry.
        "io.jwt.decode_verify",
        "crypto.x509.parse_and_verify_certificates",
        "crypto.x509.parse_and_verify_certificates_with_options",
    }
)
# Builtins that reach the network or the host from inside a policy: refused at load.
FORBIDDEN_BUILTINS = frozenset({"http.send", "net.lookup_ip_addr", "opa.runtime"})

# A path into the input document; None in a set of paths means "the whole input".
InputPaths = frozenset[tuple[str, ...]] | None

_TOKEN = re.compile(
    r"""
    (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>[0-9][0-9.eE+-]*)
  | (?P<newline>\n)
  | (?P<space>[ \t\r]+)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class Token:
    """One token: kind, text, character offset, brace depth before it, first on its line."""

    kind: str
    text: str
    offset: int
    depth: int
    line_start: bool


def tokens(source: str) -> Iterator[Token]:
    """The significant tokens of a module (comments and whitespace dropped)."""
    depth = 0
    line_start = True
    for m in _TOKEN.finditer(source):
        kind = m.lastgroup or "punct"
        text = m.group()
        if kind == "newline":
            line_start = True
            continue
        if kind in ("space", "comment"):
            continue
        yield Token(kind, text, m.start(), depth, line_start)
        line_start = False
        if text in "{[(":
            depth += 1
        elif text in "}])" and depth > 0:
            depth -= 1


def line_column(source: str, offset: int) -> tuple[int, int]:
    """1-based line and column of a character offset."""
    line = source.count("\n", 0, offset) + 1
    return line, offset - (source.rfind("\n", 0, offset) + 1) + 1


def byte_to_char_offset(source: str, byte_offset: int) -> int:
    """The character offset of a UTF-8 byte offset (rego-cpp reports bytes)."""
    return len(source.encode()[:byte_offset].decode(errors="ignore"))


@dataclass(frozen=True, slots=True)
class ModuleFacts:
    """What a scan of one module found."""

    package: tuple[str, ...] | None
    package_offset: int
    input_paths: InputPaths
    builtins: frozenset[str]
    # (name, offset) of each use of a builtin in FORBIDDEN_BUILTINS.
    forbidden: tuple[tuple[str, int], ...]
    tests: tuple[str, ...]
    # Names of the rules the module defines (heads at the start of a top-level line).
    heads: frozenset[str] = frozenset()


def module_facts(source: str) -> ModuleFacts:
    """Scan a module once for its package, input fields, builtins and test rules."""
    toks = list(tokens(source))
    package, package_offset = _package(toks)
    paths: set[tuple[str, ...]] | None = set()
    builtins: set[str] = set()
    forbidden: list[tuple[str, int]] = []
    tests: list[str] = []
    heads: set[str] = set()
    for i, tok in enumerate(toks):
        if tok.kind == "string" and i > 0 and toks[i - 1].text == "$":
            paths = None  # a template string's {expressions} are not scanned: assume anything
        if tok.kind != "ident":
            continue
        after_dot = i > 0 and toks[i - 1].text == "."
        if tok.text == "input" and not after_dot and paths is not None:
            path = _ref_path(toks, i + 1)
            if path is None or not path:
                paths = None
            else:
                paths.add(path)
        if not after_dot:
            name = next(
                (n for n in _prefixes(_dotted_name(toks, i)) if n in NONDETERMINISTIC_BUILTINS),
                "",
            )
            if name:
                builtins.add(name)
                if name in FORBIDDEN_BUILTINS:
                    forbidden.append((name, tok.offset))
        if tok.line_start and tok.depth == 0:
            if tok.text == "default" and i + 1 < len(toks) and toks[i + 1].kind == "ident":
                heads.add(toks[i + 1].text)
            elif tok.text not in {"package", "import"}:
                heads.add(tok.text)
            if tok.text.startswith("test_"):
                tests.append(tok.text)
    return ModuleFacts(
        package=package,
        package_offset=package_offset,
        input_paths=None if paths is None else _minimal(paths),
        builtins=frozenset(builtins),
        forbidden=tuple(forbidden),
        tests=tuple(dict.fromkeys(tests)),
        heads=frozenset(heads),
    )


def package_ref(source: str) -> tuple[str, ...] | None:
    """The package path of a module (`sandgate.tenants["a-b"]` → ('sandgate', 'tenants', 'a-b'))."""
    return _package(list(tokens(source)))[0]


def ref_text(path: tuple[str, ...]) -> str:
    """A package path as Rego writes it: sandgate.tenants["a-b"]."""
    out = path[0]
    for part in path[1:]:
        out += f".{part}" if part.isidentifier() else f"[{json.dumps(part)}]"
    return out


def merge_paths(parts: Iterable[InputPaths]) -> InputPaths:
    """The union of several modules' input paths (None absorbs everything)."""
    out: set[tuple[str, ...]] = set()
    for p in parts:
        if p is None:
            return None
        out |= p
    return _minimal(out)


def _package(toks: list[Token]) -> tuple[tuple[str, ...] | None, int]:
    for i, tok in enumerate(toks):
        if tok.kind == "ident" and tok.text == "package" and tok.line_start and tok.depth == 0:
            if i + 1 >= len(toks) or toks[i + 1].kind != "ident":
                return None, tok.offset
            path = _ref_path(toks, i + 2)
            return ((toks[i + 1].text, *path) if path is not None else None), tok.offset
    return None, 0


def _ref_path(toks: list[Token], i: int) -> tuple[str, ...] | None:
    """The static path of `.a["b"].c` starting at toks[i]; a dynamic index ends it; None if unreadable."""
    out: list[str] = []
    while i < len(toks):
        tok = toks[i]
        if tok.text == "." and i + 1 < len(toks) and toks[i + 1].kind == "ident":
            out.append(toks[i + 1].text)
            i += 2
            continue
        if tok.text == "[":
            if i + 2 < len(toks) and toks[i + 1].kind in ("string", "raw") and toks[i + 2].text == "]":
                out.append(_unquote(toks[i + 1].text))
                i += 3
                continue
            # A computed index reads every member at this level.
            return tuple(out)
        break
    return tuple(out)


def _dotted_name(toks: list[Token], i: int) -> str:
    """The dotted name starting at toks[i] (`crypto.x509.parse_and_verify_certificates`)."""
    parts = [toks[i].text]
    while i + 2 < len(toks) and toks[i + 1].text == "." and toks[i + 2].kind == "ident" and len(parts) < 4:
        parts.append(toks[i + 2].text)
        i += 2
    return ".".join(parts)


def _prefixes(name: str) -> list[str]:
    """a.b.c → [a.b.c, a.b, a]: a call is `f(...)`, but a chain may continue past the builtin."""
    parts = name.split(".")
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


def _unquote(text: str) -> str:
    if text.startswith("`"):
        return text[1:-1]
    try:
        value = json.loads(text)
    except ValueError:
        return text[1:-1]
    return value if isinstance(value, str) else text[1:-1]


def _minimal(paths: set[tuple[str, ...]]) -> frozenset[tuple[str, ...]]:
    """Drop paths another path in the set already covers (a prefix reads the whole subtree)."""
    out: set[tuple[str, ...]] = set()
    for p in sorted(paths, key=len):
        if not any(p[: len(q)] == q for q in out):
            out.add(p)
    return frozenset(out)
