"""The gateway writing a tenant's grants file (real files in a temporary folder): what it
writes is sealed and states every grant's methods and paths (`["*"]` for all, as a held
CONNECT's grant), it replaces the file atomically, and it never writes over a file that does
not load: a hand edit cut before a grant's methods, or a sealed file cut short."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandgate.policy.model.grants import Grant
from sandgate.policy.model.grants_seal import SEAL_END, SEAL_HEADER
from sandgate.proxy.approvals.grants_file import GrantsFileError, add_grant, read_grants, remove_grants

ID1, ID2 = "0123456789ab0001", "0123456789ab0002"


def grant(gid: str, methods: list[str] | None = None, paths: list[str] | None = None) -> Grant:
    return Grant(
        id=gid,
        tenant="t1",
        sandbox=None,
        host="api.test",
        port=443,
        methods=frozenset(methods) if methods is not None else None,
        paths=tuple(paths) if paths is not None else None,
        by="alice",
        at=1_790_000_000.0,
        reason="needs it",
    )


def shapes(grants: list[Grant]) -> list[tuple[object, ...]]:
    return [(g.id, g.methods, g.paths) for g in grants]


def test_the_gateway_writes_a_sealed_file_with_explicit_methods_and_paths(tmp_path: Path) -> None:
    path = tmp_path / "t1.grants.yaml"
    add_grant(path, grant(ID1))  # a held CONNECT's grant: host and port, its whole tunnel
    add_grant(path, grant(ID2, ["GET"], ["/v1/items"]))
    text = path.read_text()
    assert text.startswith(SEAL_HEADER) and text.splitlines()[-1].startswith(SEAL_END)
    assert text.count('    methods: ["*"]\n    paths: ["*"]\n') == 1
    assert '    methods: [GET]\n    paths: ["/v1/items"]\n' in text
    assert shapes(read_grants(path, "t1")) == [(ID1, None, None), (ID2, frozenset({"GET"}), ("/v1/items",))]
    assert [p.name for p in tmp_path.iterdir()] == ["t1.grants.yaml"], "no temporary file left behind"
    assert remove_grants(path, "t1", [ID1])[0].id == ID1
    assert shapes(read_grants(path, "t1")) == [(ID2, frozenset({"GET"}), ("/v1/items",))]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "tenant: t1\ngrants:\n  - id: 0123456789ab0001\n    host: api.test\n    port: 443\n",
            ":3:5: grants.0.methods",
        ),
        (
            "tenant: t1\ngrants:\n  - id: 0123456789ab0001\n    host: api.test\n    port: 443\n    methods: [GET]\n",
            ":3:5: grants.0.paths",
        ),
    ],
    ids=["a hand edit cut before a grant's methods", "a hand edit cut before a grant's paths"],
)
def test_a_hand_edit_cut_before_methods_or_paths_is_refused_and_never_written_over(
    tmp_path: Path, text: str, where: str
) -> None:
    path = tmp_path / "t1.grants.yaml"
    path.write_text(text)
    with pytest.raises(GrantsFileError) as e:
        read_grants(path, "t1")
    assert f"t1.grants.yaml{where}: missing" in str(e.value)
    with pytest.raises(GrantsFileError):
        add_grant(path, grant(ID2, ["GET"], ["/v1/items"]))
    assert path.read_text() == text


def test_a_sealed_file_cut_short_is_refused_and_never_written_over(tmp_path: Path) -> None:
    path = tmp_path / "t1.grants.yaml"
    add_grant(path, grant(ID1, ["GET"], ["/v1/items"]))
    whole = path.read_text()
    cut = whole[: whole.index("    paths:")]
    path.write_text(cut)
    with pytest.raises(GrantsFileError) as e:
        read_grants(path, "t1")
    assert "t1.grants.yaml:" in str(e.value) and "end line is missing" in str(e.value)
    with pytest.raises(GrantsFileError):
        add_grant(path, grant(ID2))
    assert path.read_text() == cut


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "t1.grants.yaml"
    add_grant(path, grant(ID1, ["GET"], ["/a"]))
    assert path.stat().st_mode & 0o777 == 0o644
    os.chmod(path, 0o640)
    add_grant(path, grant(ID2, ["GET"], ["/b"]))
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_stored_grant_without_methods_or_paths_is_malformed() -> None:
    """The gateway's own store (state folder, redis) writes both keys, `null` for all; a record
    without them is malformed (skipped and logged), never a grant of every method and path."""
    stored = grant(ID1).as_json()
    assert (stored["methods"], stored["paths"]) == (None, None)
    assert Grant.from_json(stored, "state").methods is None
    for key in ("methods", "paths"):
        with pytest.raises(KeyError):
            Grant.from_json({k: v for k, v in stored.items() if k != key}, "state")
