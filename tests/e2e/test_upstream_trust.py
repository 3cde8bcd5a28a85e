"""Upstream TLS is verified against the host's trust store when the config names no CA file.

The gateway is started without `upstream.trusted_ca`; `SSL_CERT_FILE` stands for the host's
system store (OpenSSL's default CA file, which `update-ca-certificates` fills on Debian).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import SANDGATE, TOKEN, curl, tenant_yaml, write_gateway_files
from support import RecordingUpstream, TestPKI, wait_for_port

StartUntrusting = Callable[[Path], tuple[int, Path]]


@pytest.fixture
def start_untrusting(tmp_path: Path, https_upstream: RecordingUpstream) -> Iterator[StartUntrusting]:
    """Start a gateway with no `upstream.trusted_ca`, under a given SSL_CERT_FILE."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(cert_file: Path) -> tuple[int, Path]:
        root = tmp_path / f"gw{len(procs)}"
        tenant = tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [https_upstream.port], "inspect": True}])
        config, port = write_gateway_files(root, {"t1.yaml": tenant})
        with (root / "gateway.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [SANDGATE, "run", "--config", str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "SSL_CERT_FILE": str(cert_file)},
                )
            )
        wait_for_port("127.0.0.1", port, timeout=30)
        return port, root / "state" / "ca" / "mitmproxy-ca-cert.pem"

    yield start
    for p in procs:
        p.terminate()
        p.wait(15)


def fetch(port: int, gateway_ca: Path, upstream: RecordingUpstream) -> tuple[str, str]:
    result = curl(
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %header{x-sandgate-reason}",
        "--cacert",
        str(gateway_ca),
        "-x",
        f"http://sb1:{TOKEN}@127.0.0.1:{port}",
        f"{upstream.url_for('api.test')}/v1/x",
    )
    status, _, reason = result.stdout.partition(" ")
    return status, reason


def test_an_upstream_the_system_store_trusts_is_reached(
    start_untrusting: StartUntrusting, pki: TestPKI, https_upstream: RecordingUpstream
) -> None:
    port, gateway_ca = start_untrusting(pki.ca_file)
    assert fetch(port, gateway_ca, https_upstream) == ("200", "")
    assert [r.target for r in https_upstream.requests] == ["/v1/x"]


def test_an_upstream_the_system_store_does_not_trust_is_refused(
    start_untrusting: StartUntrusting, tmp_path: Path, https_upstream: RecordingUpstream
) -> None:
    other = TestPKI(["api.test"], directory=tmp_path)
    port, gateway_ca = start_untrusting(other.ca_file)
    status, reason = fetch(port, gateway_ca, https_upstream)
    assert status == "502", (status, reason)
    assert https_upstream.requests == []
