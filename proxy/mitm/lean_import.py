"""Load mitmproxy's addon modules without its `mitmproxy.addons` package body.

That body imports every default addon of mitmdump (the onboarding app's flask, proxyauth's
ldap3, maplocal's werkzeug, ...) so that `default_addons()` can list them; sandgate builds
its own addon list and imports only the few it runs. Registering the package without running
its body lets `from mitmproxy.addons import proxyserver` load just that module: about 0.4 s of
CPU and 260 modules less in every gateway process (each worker), at start and in memory.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["skip_default_addons"]


def skip_default_addons() -> bool:
    """Register `mitmproxy.addons` as an empty package; False when it is already imported (or
    cannot be found), and then nothing changes. Call before anything imports mitmproxy.addons."""
    if "mitmproxy.addons" in sys.modules:
        return False
    spec = importlib.util.find_spec("mitmproxy.addons")
    if spec is None or spec.submodule_search_locations is None:
        return False
    package = importlib.util.module_from_spec(spec)
    # Not exec'd: the package has its path (submodules load) and no default_addons(), which
    # sandgate never calls; an import of it fails loudly rather than half-working.
    sys.modules["mitmproxy.addons"] = package
    # find_spec imported the parent package; a submodule is also an attribute of its parent.
    setattr(sys.modules["mitmproxy"], "addons", package)  # noqa: B010
    return True
