"""mitmproxy's per-event costs that sandgate cuts without changing what mitmproxy does."""

from __future__ import annotations

from sandgate.proxy.mitm import dispatch, message_check, option_reads

__all__ = ["install"]


def install() -> None:
    """Hook dispatch through per-hook tables; message field checks through per-class tables;
    option reads without deep copies of immutable values."""
    dispatch.install()
    message_check.install()
    option_reads.install()
