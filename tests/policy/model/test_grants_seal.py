"""The seal of a gateway-written grants file: whole, it loads back as exactly the grants it was
written from; cut at any byte (so at every line boundary) or changed under its seal, it is
refused as a whole and the tenant keeps its last good grants. A hand-written file has no seal
and loads as any policy file; cut at a line boundary, it is refused or allows no more methods
and paths than the whole file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy.errors import PolicyLoadError, PolicySetError
from sandgate.policy.model.grants import Grant, grant_from_entry, parse_grants_text, render_grants_file
from sandgate.policy.model.grants_seal import SEAL_END, SEAL_HEADER, check_seal, seal
from sandgate.policy.model.loader import load_policy_dir

PROPERTY = settings(max_examples=200, deadline=None)
FILE = "acme.grants.yaml"


def grant(
    gid: str,
    methods: list[str] | None,
    paths: list[str] | None,
    *,
    host: str = "api.example.com",
    port: int = 443,
    expires: float | None = None,
    reason: str | None = "the build needs it",
) -> Grant:
    return Grant(
        id=gid,
        tenant="acme",
        sandbox=None,
        host=host,
        port=port,
        methods=frozenset(methods) if methods is not None else None,
        paths=tuple(paths) if paths is not None else None,
        expires=expires,
        by="alice",
        at=1_790_000_000.0,
        reason=reason,
    )


GRANTS = [
    grant("0123456789ab0001", ["GET"], ["/v1/items"]),
    grant("0123456789ab0002", None, None, port=8443, expires=1_890_000_000.0),
    grant("0123456789ab0003", ["POST", "PUT"], ["/v2/**", "/v3/*/x"], reason=None),
]


def shape(g: Grant) -> tuple[object, ...]:
    """What a grant allows and until when."""
    methods = sorted(g.methods) if g.methods is not None else None
    return (g.id, g.host, g.port, methods, g.paths, g.expires)


def parsed(text: str) -> list[Grant]:
    _, model = parse_grants_text(text, FILE)
    return [grant_from_entry("acme", e, FILE) for e in model.grants]


def write_rules(root: Path, grants: str) -> Path:
    (root / "tenants").mkdir(parents=True, exist_ok=True)
    (root / "tenants" / "acme.yaml").write_text("tenant: acme\nallow:\n  - hosts: [open.example.com]\n")
    (root / "tenants" / "acme.grants.yaml").write_text(grants)
    return root


def test_a_sealed_file_cut_at_any_byte_is_refused() -> None:
    text = render_grants_file("acme", GRANTS)
    assert text.startswith(SEAL_HEADER) and text.rstrip("\n").rpartition("\n")[2].startswith(SEAL_END)
    assert [shape(g) for g in parsed(text)] == [shape(g) for g in GRANTS]
    for cut in range(len(text)):
        with pytest.raises(PolicyLoadError):
            parsed(text[:cut])


def test_a_sealed_file_cut_at_a_line_boundary_is_refused_and_the_last_good_grants_stay(
    tmp_path: Path,
) -> None:
    whole = render_grants_file("acme", GRANTS)
    root = write_rules(tmp_path, whole)
    good = load_policy_dir(root, isolate=True)
    assert [shape(g) for g in good.tenants["acme"].grants] == [shape(g) for g in GRANTS]
    lines = whole.splitlines(keepends=True)
    for n in range(len(lines)):
        (root / "tenants" / "acme.grants.yaml").write_text("".join(lines[:n]))
        with pytest.raises(PolicySetError) as e:
            load_policy_dir(root)
        assert "acme.grants.yaml:" in str(e.value), n
        kept = load_policy_dir(root, previous=good, isolate=True)
        assert [shape(g) for g in kept.tenants["acme"].grants] == [shape(g) for g in GRANTS], n
        assert kept.problems[0].kept_last_good, n


def test_the_seal_errors_name_the_line_and_say_how_to_edit_by_hand() -> None:
    text = render_grants_file("acme", GRANTS[:1])
    last = len(text.splitlines())
    with pytest.raises(PolicyLoadError) as e:
        check_seal(text.replace("/v1/items", "/v1/**"), FILE)
    assert str(e.value).startswith(f"{FILE}:{last}: the file does not match the digest on its end line")
    assert "delete its first and last lines" in str(e.value)
    # Unsealed, as the message says: a hand-written file, loaded for what it says.
    body = "".join(text.replace("/v1/items", "/v1/**").splitlines(keepends=True)[3:-1])
    assert [g.paths for g in parsed(body)] == [("/v1/**",)]
    with pytest.raises(PolicyLoadError) as e:
        check_seal(text[:-1], FILE)
    assert str(e.value).startswith(f"{FILE}:{last}: the file does not match")


def test_a_hand_written_file_needs_no_seal() -> None:
    text = 'tenant: acme\ngrants:\n  - {id: 0123456789ab0001, host: a.example.com, port: 443, methods: ["*"], paths: ["*"]}\n'
    check_seal(text, FILE)
    assert [(g.methods, g.paths) for g in parsed(text)] == [(None, None)]


HAND_WRITTEN = """\
tenant: acme
grants:
  # approved by alice, for the nightly build
  - id: 0123456789ab0001
    host: api.example.com
    port: 443
    methods:
      - GET
      - HEAD
    paths:
      - /v1/items
      - /v1/items/*
  - id: 0123456789ab0002
    host: uploads.example.com
    port: 443
    methods: [PUT]
    paths: ["/incoming/**"]
    expires: "2030-01-01T00:00:00Z"
"""


def test_a_hand_written_file_cut_at_a_line_boundary_never_allows_more_methods_or_paths() -> None:
    whole = {g.id: g for g in parsed(HAND_WRITTEN)}
    lines = HAND_WRITTEN.splitlines(keepends=True)
    loaded_some = 0
    for n in range(len(lines)):
        try:
            cut = parsed("".join(lines[:n]))
        except PolicyLoadError:
            continue
        loaded_some += 1
        for g in cut:
            full = whole[g.id]
            assert full.methods is not None and full.paths is not None
            assert g.methods is not None and g.methods <= full.methods, (n, g)
            assert g.paths is not None and set(g.paths) <= set(full.paths), (n, g)
    assert loaded_some >= 3, "the cuts between whole grants and list items still load"


_IDS = st.lists(st.text("0123456789abcdef", min_size=12, max_size=16), min_size=0, max_size=4, unique=True)
_METHODS = st.none() | st.sets(st.sampled_from(["GET", "POST", "PUT", "DELETE"]), min_size=1).map(sorted)
_PATHS = st.none() | st.lists(st.sampled_from(["/", "/v1/items", "/v1/**", "/a/*/b", "/x"]), min_size=1)
_SHAPES = st.tuples(
    _METHODS, _PATHS, st.none() | st.integers(1_800_000_000, 1_900_000_000), st.none() | st.text()
)


@st.composite
def _grants(draw: st.DrawFn) -> list[Grant]:
    out = []
    for gid in draw(_IDS):
        methods, paths, expires, reason = draw(_SHAPES)
        out.append(grant(gid, methods, paths, expires=float(expires) if expires else None, reason=reason))
    return out


@PROPERTY
@given(_grants(), st.data())
def test_any_sealed_file_loads_back_whole_and_is_refused_cut_or_changed(
    grants: list[Grant], data: st.DataObject
) -> None:
    text = render_grants_file("acme", grants)
    back = parsed(text)
    assert sorted(map(shape, back)) == sorted(map(shape, grants))
    assert [g.reason for g in sorted(back, key=lambda g: g.id)] == [
        g.reason for g in sorted(grants, key=lambda g: g.id)
    ]
    cut = data.draw(st.integers(0, len(text) - 1), label="cut")
    with pytest.raises(PolicyLoadError):
        parsed(text[:cut])
    at = data.draw(st.integers(len(SEAL_HEADER), len(text) - 1), label="changed at")
    other = data.draw(st.sampled_from("x\n #:*-0a"), label="to")
    if other != text[at]:
        with pytest.raises(PolicyLoadError):
            parsed(text[:at] + other + text[at + 1 :])


def test_a_body_without_a_final_newline_is_sealed_whole() -> None:
    """The end line starts a line of its own whatever the body ends with."""
    text = seal("tenant: acme\ngrants: []")
    check_seal(text, FILE)
    assert parsed(text) == []


def test_a_seal_of_another_version_is_refused_never_taken_for_none() -> None:
    text = render_grants_file("acme", GRANTS[:1]).replace("grants-file v1", "grants-file v2", 1)
    with pytest.raises(PolicyLoadError) as e:
        check_seal(text, FILE)
    assert str(e.value).startswith(f"{FILE}:1: a seal this gateway does not know")
