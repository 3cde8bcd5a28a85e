"""What the compiler (`rego.compiler`) and its worker processes (`rego.worker`) must spell alike.

Standard library only: the compiler imports it without loading regopy, which only the worker
process needs.
"""

from __future__ import annotations

__all__ = ["BUNDLE_STEP"]

# The step a test group reports before building its bundle (a crash there: run it query by query).
BUNDLE_STEP = "<bundle>"
