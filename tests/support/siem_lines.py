"""Trail lines as the gateway writes them, and a wait, for the SIEM sink tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sandgate.policy.reasons import Reason

from .audit_trail import at, decision, line

__all__ = ["trail_lines", "wait_for"]


def trail_lines(count: int, prefix: str = "d") -> list[str]:
    """`count` decision records (ids `<prefix>0`...), encoded as the audit writer does."""
    return [
        line(
            decision(f"{prefix}{i}", at(i / 60), Reason.HOST_NOT_ALLOWED, "evil.test", method="GET", path="/")
        )
        for i in range(count)
    ]


def wait_for(probe: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    """`probe()` once it is truthy; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
