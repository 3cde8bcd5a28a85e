"""The gateway CA on disk: file modes, overwrite refusal, and that mitmproxy loads it."""

from __future__ import annotations

import os
import ssl
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from mitmproxy.certs import CertStore

from sandgate.proxy.errors import CAError, ProxyError, SandgateError
from sandgate.proxy.startup.ca import (
    ca_paths,
    ensure_ca,
    export_ca,
    init_ca,
    issue_leaf,
    new_ca,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def confdir(tmp_path: Path) -> Path:
    return tmp_path / "conf"


@pytest.fixture(params=[0o000, 0o022, 0o077], ids=["umask 000", "umask 022", "umask 077"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> None:
    """Run a TLS handshake between two in-memory endpoints; raise what the client raises."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname=hostname)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    c_done = s_done = False
    for _ in range(10):
        if not c_done:
            try:
                c.do_handshake()
                c_done = True
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        if not s_done:
            try:
                s.do_handshake()
                s_done = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                pass  # the client's alert; the client side raises the reason below
        c_in.write(s_out.read())
        if c_done and s_done:
            return
    raise AssertionError("handshake did not finish")


def test_errors_form_the_documented_tree() -> None:
    assert issubclass(CAError, ProxyError)
    assert issubclass(ProxyError, SandgateError)


def test_init_writes_key_0600_cert_0644_dir_0700_whatever_the_umask(confdir: Path, umask: int) -> None:
    cert_path = init_ca(confdir)
    paths = ca_paths(confdir)
    assert cert_path == paths.cert_file
    assert _mode(confdir) == 0o700
    assert _mode(paths.key_file) == 0o600
    assert _mode(paths.cert_file) == 0o644
    assert _mode(paths.dhparam_file) == 0o644
    assert sorted(p.name for p in confdir.iterdir()) == [
        "mitmproxy-ca-cert.pem",
        "mitmproxy-ca.pem",
        "mitmproxy-dhparam.pem",
    ], "no temporary files are left behind"


def test_init_makes_an_ec_ca_with_the_required_extensions(confdir: Path) -> None:
    init_ca(confdir, common_name="unit CA")
    cert = x509.load_pem_x509_certificate(ca_paths(confdir).cert_file.read_bytes())
    ext = cert.extensions
    assert cert.subject == cert.issuer
    assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "unit CA"
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    basic = ext.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical
    assert basic.value.ca
    usage = ext.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign
    assert usage.crl_sign
    ext.get_extension_for_class(x509.SubjectKeyIdentifier)
    with pytest.raises(x509.ExtensionNotFound):
        ext.get_extension_for_class(x509.NameConstraints)
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime.days == 3650


def test_init_refuses_to_overwrite_an_existing_ca(confdir: Path) -> None:
    init_ca(confdir)
    before = ca_paths(confdir).key_file.read_bytes()
    with pytest.raises(CAError, match="already exists"):
        init_ca(confdir)
    assert ca_paths(confdir).key_file.read_bytes() == before


def test_init_with_force_replaces_the_ca(confdir: Path) -> None:
    init_ca(confdir)
    old = export_ca(confdir)
    init_ca(confdir, force=True)
    assert export_ca(confdir) != old
    assert _mode(ca_paths(confdir).key_file) == 0o600
    ensure_ca(confdir)  # the key file and the cert file still match


def test_mitmproxy_certstore_loads_the_ca_and_creates_nothing(confdir: Path) -> None:
    init_ca(confdir)
    before = {p.name: p.read_bytes() for p in confdir.iterdir()}
    store = CertStore.from_store(confdir, "mitmproxy", 2048)
    after = {p.name: p.read_bytes() for p in confdir.iterdir()}
    assert after == before, "from_store must not write or replace any file"
    ours = x509.load_pem_x509_certificate(before["mitmproxy-ca-cert.pem"])
    assert store.default_ca.to_cryptography() == ours
    assert store.default_chain_file is None, "a single certificate, not a chain"
    assert isinstance(store.default_privatekey, ec.EllipticCurvePrivateKey)


def test_a_leaf_minted_by_mitmproxy_verifies_against_the_exported_ca(confdir: Path, tmp_path: Path) -> None:
    init_ca(confdir)
    store = CertStore.from_store(confdir, "mitmproxy", 2048)
    entry = store.get_cert("api.test", [x509.DNSName("api.test")])
    leaf = tmp_path / "leaf.pem"
    leaf.write_bytes(
        entry.privatekey.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        + entry.cert.to_pem()
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(leaf)
    # The default client context verifies with VERIFY_X509_STRICT on Python 3.13.
    client = ssl.create_default_context(cadata=export_ca(confdir))
    _handshake(server, client, "api.test")
    other = ssl.create_default_context(
        cadata=new_ca("someone else")[0].public_bytes(serialization.Encoding.PEM).decode()
    )
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, other, "api.test")


def test_export_returns_the_certificate_and_never_the_key(confdir: Path) -> None:
    init_ca(confdir)
    pem = export_ca(confdir)
    assert "PRIVATE KEY" not in pem
    assert pem.count("BEGIN CERTIFICATE") == 1
    assert x509.load_pem_x509_certificate(pem.encode()) == x509.load_pem_x509_certificate(
        ca_paths(confdir).key_file.read_bytes()
    )


def test_export_passes_on_nothing_but_the_certificate(confdir: Path) -> None:
    init_ca(confdir)
    paths = ca_paths(confdir)
    # Even if someone concatenates the key into the public file, export re-serialises.
    paths.cert_file.write_bytes(paths.key_file.read_bytes())
    assert "PRIVATE KEY" not in export_ca(confdir)


def test_export_without_a_ca_says_how_to_make_one(confdir: Path) -> None:
    with pytest.raises(CAError, match="run `sandgate ca init`"):
        export_ca(confdir)


def test_ensure_creates_a_missing_ca(confdir: Path) -> None:
    assert ensure_ca(confdir) == ca_paths(confdir).cert_file
    assert _mode(ca_paths(confdir).key_file) == 0o600


def test_ensure_keeps_an_existing_ca(confdir: Path) -> None:
    init_ca(confdir)
    pem = export_ca(confdir)
    ensure_ca(confdir)
    assert export_ca(confdir) == pem


def test_ensure_rejects_a_world_readable_key_naming_file_and_mode(confdir: Path) -> None:
    init_ca(confdir)
    key_file = ca_paths(confdir).key_file
    key_file.chmod(0o644)
    with pytest.raises(CAError, match="0644") as excinfo:
        ensure_ca(confdir)
    assert str(key_file) in str(excinfo.value)


def test_ensure_rejects_a_group_readable_key(confdir: Path) -> None:
    init_ca(confdir)
    ca_paths(confdir).key_file.chmod(0o640)
    with pytest.raises(CAError, match="0640"):
        ensure_ca(confdir)


def test_ensure_restores_a_missing_certificate_file(confdir: Path) -> None:
    init_ca(confdir)
    pem = export_ca(confdir)
    ca_paths(confdir).cert_file.unlink()
    ca_paths(confdir).dhparam_file.unlink()
    ensure_ca(confdir)
    assert export_ca(confdir) == pem
    assert ca_paths(confdir).dhparam_file.exists()


def test_ensure_rejects_a_certificate_file_of_another_ca(confdir: Path) -> None:
    init_ca(confdir)
    other, _ = new_ca("other")
    ca_paths(confdir).cert_file.write_bytes(other.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(CAError, match="does not match"):
        ensure_ca(confdir)


def test_ensure_rejects_a_key_file_with_a_chain(confdir: Path) -> None:
    init_ca(confdir)
    key_file = ca_paths(confdir).key_file
    other, _ = new_ca("other")
    with key_file.open("ab") as f:
        f.write(other.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(CAError, match="2 certificates"):
        ensure_ca(confdir)


def test_ensure_rejects_a_key_that_does_not_match(confdir: Path) -> None:
    paths = ca_paths(confdir)
    init_ca(confdir)
    cert = paths.cert_file.read_bytes()
    _, other_key = new_ca("other")
    key_pem = other_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    paths.key_file.write_bytes(key_pem + cert)
    with pytest.raises(CAError, match="does not belong"):
        ensure_ca(confdir)


@pytest.mark.parametrize(
    ("names", "dns", "ips"),
    [
        (["api.test"], ["api.test"], []),
        (["api.test", "*.api.test", "127.0.0.1"], ["api.test", "*.api.test"], ["127.0.0.1"]),
        (["::1"], [], ["::1"]),
    ],
    ids=["a single name", "names wildcards and an address", "an IPv6 address"],
)
def test_issue_leaf_puts_names_and_addresses_in_the_san(
    names: list[str], dns: list[str], ips: list[str]
) -> None:
    ca, ca_key = new_ca("test CA")
    leaf, _ = issue_leaf(ca, ca_key, names)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == dns
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ips
    assert leaf.issuer == ca.subject
    leaf.verify_directly_issued_by(ca)


def test_issue_leaf_refuses_a_non_ascii_name() -> None:
    ca, ca_key = new_ca("test CA")
    with pytest.raises(ValueError, match="ASCII"):
        issue_leaf(ca, ca_key, ["bücher.test"])
