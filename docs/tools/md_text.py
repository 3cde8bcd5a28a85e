"""Plain text from the code (descriptions, docstrings, help) made safe to place in Markdown.

The code's text is written for terminals: `<tenant>` is a placeholder, not an HTML tag, and
`'*.suffix' or '*'` is not emphasis. Outside backtick code spans those characters are
escaped; code spans are left as they are (Markdown shows them literally).
"""

from __future__ import annotations

import re

__all__ = ["cell", "prose"]

_SPECIAL = re.compile(r"([\\*_\[\]])")


def prose(text: str) -> str:
    """Text with Markdown's special characters escaped outside code spans (newlines kept)."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code span, escape it too
        return _escape(text).replace("`", "\\`")
    return "`".join(part if i % 2 else _escape(part) for i, part in enumerate(parts))


def _escape(text: str) -> str:
    # `\<` is no escape in Markdown: an entity keeps `<tenant>` from reading as a tag.
    return _SPECIAL.sub(r"\\\1", text).replace("<", "&lt;")


def cell(text: str) -> str:
    """Text for one table cell: on one line, with no pipe that would split the cell."""
    return prose(" ".join(text.split())).replace("|", "\\|")
