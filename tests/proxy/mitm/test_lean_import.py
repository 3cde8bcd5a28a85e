"""A gateway process loads mitmproxy's addon modules without mitmdump's default addons."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_runtime_loads_without_the_default_addons_and_their_dependencies() -> None:
    out = _run(
        """
        import sys
        from sandgate.proxy.mitm.lean_import import skip_default_addons
        assert skip_default_addons()
        import sandgate.proxy.runtime
        from mitmproxy.addons import next_layer, proxyserver, tlsconfig
        heavy = [m for m in ("flask", "ldap3", "werkzeug", "mitmproxy.addons.onboarding") if m in sys.modules]
        print(heavy, hasattr(sys.modules["mitmproxy.addons"], "default_addons"))
        """
    )
    assert out == "[] False"


def test_it_changes_nothing_once_the_package_is_imported() -> None:
    out = _run(
        """
        import mitmproxy.addons
        from sandgate.proxy.mitm.lean_import import skip_default_addons
        print(skip_default_addons(), callable(mitmproxy.addons.default_addons))
        """
    )
    assert out == "False True"


def test_the_runtime_loads_neither_graphql_core_nor_a_dns_over_https_client() -> None:
    # graphql-core loads with a policy that has a `graphql:` section; sandgate asks nameservers
    # over UDP/TCP, so dnspython's DNS-over-HTTPS stack (httpcore2, httpx2, trio) never loads
    # (sandgate's own HTTP client, httpx, is another package).
    out = _run(
        """
        import sys
        from sandgate.proxy.mitm.lean_import import skip_default_addons
        skip_default_addons()
        import sandgate.proxy.runtime
        import sandgate.policy.resolver
        print(sorted(m for m in ("graphql", "httpcore2", "httpx2", "trio") if m in sys.modules))
        from sandgate.policy.protocols.rules import GraphqlSection
        GraphqlSection()
        print("graphql" in sys.modules)
        """
    )
    assert out == "[]\nTrue"
