"""The nftables table a gateway's host rules use by default: one per state directory."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["default_table"]


def default_table(state_path: Path) -> str:
    """The table name for a state directory: short, stable, a valid nft identifier."""
    digest = hashlib.sha256(str(state_path.resolve()).encode()).hexdigest()[:8]
    return f"sandgate_{digest}"
