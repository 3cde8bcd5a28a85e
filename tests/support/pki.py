"""A throwaway PKI for upstream test servers: a test CA and one leaf, as PEM files."""

from __future__ import annotations

import ssl
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from sandgate.proxy.startup.ca import PrivateKey, issue_leaf, new_ca

__all__ = ["DEFAULT_NAMES", "TestPKI"]

DEFAULT_NAMES = ("api.test", "*.api.test", "localhost", "127.0.0.1", "::1")


class TestPKI:
    """A test CA plus a leaf for `names`, written as `ca_file`, `cert_file`, `key_file`.

    Files go to `directory`, or to a temporary directory removed by `cleanup()` (or
    on leaving the `with` block). The CA is not the gateway's: the gateway must be
    told to trust `ca_file` for upstream TLS.
    """

    __test__ = False  # not a pytest test class, despite its name

    def __init__(
        self,
        names: Sequence[str] = DEFAULT_NAMES,
        *,
        directory: Path | None = None,
        common_name: str = "sandgate test upstream CA",
    ) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sandgate-pki-")
            directory = Path(self._tmp.name)
        self.directory = directory
        self.names = tuple(names)
        self.ca_cert, self.ca_key = new_ca(common_name)
        self.cert, self.key = issue_leaf(self.ca_cert, self.ca_key, self.names)
        self.ca_file = self.directory / "ca.pem"
        self.cert_file = self.directory / "cert.pem"
        self.key_file = self.directory / "key.pem"
        self.ca_file.write_bytes(_cert_pem(self.ca_cert))
        self.cert_file.write_bytes(_cert_pem(self.cert))
        self.key_file.write_bytes(_key_pem(self.key))
        self.key_file.chmod(0o600)

    @property
    def ca_pem(self) -> str:
        """The test CA certificate as PEM text."""
        return _cert_pem(self.ca_cert).decode("ascii")

    def issue(self, names: Sequence[str], stem: str) -> tuple[Path, Path]:
        """Sign another leaf for `names` with the test CA; return (cert_file, key_file)."""
        cert, key = issue_leaf(self.ca_cert, self.ca_key, names)
        cert_file = self.directory / f"{stem}.cert.pem"
        key_file = self.directory / f"{stem}.key.pem"
        cert_file.write_bytes(_cert_pem(cert))
        key_file.write_bytes(_key_pem(key))
        key_file.chmod(0o600)
        return cert_file, key_file

    def server_context(self) -> ssl.SSLContext:
        """A server-side context presenting the leaf."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """A verifying client context that trusts only the test CA."""
        return ssl.create_default_context(cafile=self.ca_file)

    def cleanup(self) -> None:
        """Remove the temporary directory, if this object made one."""
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
