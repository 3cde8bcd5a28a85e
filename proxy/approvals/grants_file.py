"""A tenant's grants file (`<tenants dir>/<tenant>.grants.yaml`), written by the gateway: read
whole, changed, rendered with its who/when/why comments (sandgate.policy.model.grants), and
replaced atomically (a temporary file beside it, fsync, rename, fsync of the folder), so a
reader sees the old file or the new one, never half of one. It is sealed too (its first and
last lines, sandgate.policy.model.grants_seal): a copy of it cut short (a backup, a sync, an
editor's save) is refused, never loaded as the grants before the cut.

A grants file that does not load is never overwritten: the operator fixes it first (the
gateway serves the tenant's last good version meanwhile).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from sandgate.policy.errors import PolicyLoadError, PolicySetError
from sandgate.policy.model.grants import (
    Grant,
    grant_from_entry,
    load_grants_file,
    parse_grants_text,
    render_grants_file,
)

__all__ = ["GrantsFileError", "add_grant", "grants_path", "read_grants", "remove_grants"]


class GrantsFileError(Exception):
    """The grants file cannot be read back (it does not load) or written."""


def grants_path(tenant_source: str, tenant: str) -> Path:
    """Where a tenant's grants live: beside its tenant file."""
    return Path(tenant_source).parent / f"{tenant}.grants.yaml"


def read_grants(path: Path, tenant: str) -> list[Grant]:
    """The grants a file holds (none when it does not exist); GrantsFileError when it does not load."""
    if not path.exists():
        return []
    try:
        _, model = load_grants_file(path)
    except PolicySetError as e:
        raise GrantsFileError("; ".join(str(x) for x in e.errors[:5])) from None
    except PolicyLoadError as e:
        raise GrantsFileError(str(e)) from None
    if model.tenant != tenant:
        raise GrantsFileError(f"{path}: tenant: it names {model.tenant!r}, not {tenant!r}")
    return [grant_from_entry(tenant, entry, str(path)) for entry in model.grants]


def add_grant(path: Path, grant: Grant) -> None:
    """Add (or replace, by id) one grant in the tenant's file."""
    _change(path, grant.tenant, lambda grants: [*(g for g in grants if g.id != grant.id), grant])


def remove_grants(path: Path, tenant: str, ids: Iterable[str]) -> list[Grant]:
    """Remove grants by id; the ones that were there."""
    wanted = set(ids)
    removed: list[Grant] = []

    def without(grants: list[Grant]) -> list[Grant]:
        removed.extend(g for g in grants if g.id in wanted)
        return [g for g in grants if g.id not in wanted]

    _change(path, tenant, without)
    return removed


def _change(path: Path, tenant: str, change: Callable[[list[Grant]], list[Grant]]) -> None:
    before = read_grants(path, tenant)
    after = change(before)
    if after == before and path.exists():
        return
    text = render_grants_file(tenant, after)
    _check_reads_back(path, tenant, text, after)
    _write_atomically(path, text)


def _check_reads_back(path: Path, tenant: str, text: str, grants: list[Grant]) -> None:
    """What is written must load, and load as exactly these grants: a bug here never leaves a
    file the gateway refuses, or one that allows more than it was told."""
    try:
        _, model = parse_grants_text(text, str(path))
    except PolicyLoadError as e:
        raise GrantsFileError(f"{path}: not written: it would not load back: {e}") from None
    back = [grant_from_entry(tenant, entry, "") for entry in model.grants]
    if sorted(map(_shape, back), key=repr) != sorted(map(_shape, grants), key=repr):
        raise GrantsFileError(f"{path}: not written: it would not load back as the same grants")


def _shape(g: Grant) -> tuple[object, ...]:
    """What a grant allows, until when (times to the second, as the file writes them) and how
    many times."""
    methods = sorted(g.methods) if g.methods is not None else None
    expires = int(g.expires) if g.expires is not None else None
    return (g.id, g.host, g.port, methods, g.paths, expires, g.max_uses)


def _write_atomically(path: Path, text: str) -> None:
    folder = path.parent
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise GrantsFileError(f"{path}: cannot write: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(temp, path.stat().st_mode & 0o7777)
        else:
            os.chmod(temp, 0o644)
        os.replace(temp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise GrantsFileError(f"{path}: cannot write: {e.strerror}") from None
    # The rename is durable once the folder's entry is.
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
