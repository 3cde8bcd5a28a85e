"""Which gateway owns an nftables table: one table per state directory.

The default table name is `sandgate_<8 hex of sha256(realpath(state_dir))>` (proxy.table_name),
so two gateways with different state directories in one network namespace never share a table
(one's `sandbox remove` used to delete the other's); `host_rules.table` names it explicitly. The
table carries its owner in its comment (`sandgate state_dir=<path>`). Before any write the
owner is checked: a table another state directory owns is refused while that gateway runs
(its status file's pid is alive) and taken over otherwise.

Migration from the single shared name `sandgate`: at start, a table `inet sandgate` without an
owner (written by an older sandgate) whose every interface and address is registered in
this state directory was this gateway's: its rules move to the new name in one transaction
and the old table is gone. A `sandgate` table that is not provably ours is left alone (another
gateway may still use it) and a warning says so.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import structlog

from sandgate.proxy.errors import ConfigError
from sandgate.proxy.state.statusfile import STATUS_FILE, read_status

# Re-exported: the config derives the name (proxy.table_name), callers have read it from here.

__all__ = ["LEGACY_TABLE", "legacy_sources", "owner_comment", "table_owner"]

log = structlog.get_logger("sandgate.hosttable")

LEGACY_TABLE = "sandgate"
_OWNER = "sandgate state_dir="
# nft keeps at most 128 bytes of a comment: longer paths are named by their digest.
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./+@-]{0,108}$")
_COMMENT = re.compile(r'^\tcomment "([^"]*)"$', re.MULTILINE)


def owner_comment(state_path: Path) -> str:
    """The table comment naming its owner (a digest when the path cannot be quoted safely)."""
    path = str(state_path.resolve())
    if _SAFE_PATH.match(path):
        return _OWNER + path
    return "sandgate state_dir_sha256=" + hashlib.sha256(path.encode()).hexdigest()


def table_exists_text(table: str) -> str | None:
    """`nft list table inet <table>` (None: no such table)."""
    result = _run(["nft", "list", "table", "inet", table])
    if result.returncode != 0:
        if "No such file or directory" in result.stderr:
            return None
        raise RuntimeError(f"nft list table inet {table}: {result.stderr.strip()}")
    return result.stdout


def table_owner(table: str) -> str | None:
    """The table's owner comment ("" when it has none; None when there is no such table)."""
    text = table_exists_text(table)
    if text is None:
        return None
    found = _COMMENT.search(text)
    return found.group(1) if found else ""


def check_owner(table: str, state_path: Path) -> None:
    """Raise ConfigError when `table` belongs to another gateway that is running."""
    owner = table_owner(table)
    ours = owner_comment(state_path)
    if not owner or owner == ours:
        return
    other = Path(owner.removeprefix(_OWNER)) if owner.startswith(_OWNER) else None
    if other is not None and read_status(other / STATUS_FILE) is None:
        log.warning("host_rules.table_taken_over", table=table, previous_owner=str(other))
        return
    where = f"state_dir {other}" if other is not None else owner
    raise ConfigError(
        f"nftables table inet {table} belongs to the running gateway of {where}: "
        "give this gateway its own state_dir or host_rules.table"
    )


def legacy_sources() -> set[tuple[str, str]] | None:
    """(interface, address) pairs of an owner-less `inet sandgate` table an older sandgate wrote,
    or None when there is no such table (or it has an owner: then it is not a legacy one)."""
    if table_owner(LEGACY_TABLE) != "":
        return None
    result = _run(["nft", "-j", "list", "table", "inet", LEGACY_TABLE])
    if result.returncode != 0:
        return None
    pairs: set[tuple[str, str]] = set()
    for item in json.loads(result.stdout).get("nftables", []):
        found = item.get("set")
        if not found or found.get("name") not in {"sources", "sources4", "sources6"}:
            continue
        for elem in found.get("elem", []):
            concat = elem.get("concat") if isinstance(elem, dict) else None
            if isinstance(concat, list) and len(concat) == 2:
                pairs.add((str(concat[0]), str(concat[1])))
    return pairs


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)
