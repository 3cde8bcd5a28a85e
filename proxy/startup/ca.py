"""The gateway's certificate authority, on disk in the layout mitmproxy loads.

mitmproxy's `CertStore.from_store(confdir, "mitmproxy", key_size)` reads three files:

- `mitmproxy-ca.pem`: the CA private key followed by exactly one certificate (0600).
  Every further certificate in it would be served to clients as a chain.
- `mitmproxy-ca-cert.pem`: the certificate alone, for clients to trust (0644).
- `mitmproxy-dhparam.pem`: DH parameters; from_store writes it itself when missing,
  so it is written here to keep the confdir complete (and allow it to be read-only).

If `mitmproxy-ca.pem` is missing, from_store silently mints its own RSA CA (and a
PKCS#12 copy of its key): call `ensure_ca` before mitmproxy configures its TLS.
The CA key is EC P-256; mitmproxy signs every leaf with it and reuses it as the
leaf key, so a leaf handshake costs an ECDSA signature instead of an RSA one.

`new_ca` and `issue_leaf` build certificates in memory, for tests that need an
upstream TLS server with its own CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from mitmproxy.certs import DEFAULT_DHPARAM

from sandgate.proxy.errors import CAError

__all__ = [
    "CA_BASENAME",
    "CA_VALIDITY",
    "LEAF_VALIDITY",
    "CAPaths",
    "PrivateKey",
    "ca_paths",
    "ensure_ca",
    "export_ca",
    "init_ca",
    "issue_leaf",
    "new_ca",
]

type PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

CA_BASENAME = "mitmproxy"
"""The basename mitmproxy's tlsconfig addon passes to CertStore.from_store."""

CA_VALIDITY = datetime.timedelta(days=3650)
LEAF_VALIDITY = datetime.timedelta(days=30)
# Backdate so that a client whose clock is slightly behind still accepts the certificate.
_CLOCK_SKEW = datetime.timedelta(days=1)
_KEY_MODE = 0o600
_PUBLIC_MODE = 0o644
_DIR_MODE = 0o700


@dataclass(frozen=True, slots=True)
class CAPaths:
    """The files of a CA inside a confdir."""

    key_file: Path
    cert_file: Path
    dhparam_file: Path


def ca_paths(confdir: Path) -> CAPaths:
    """Return where the CA files live inside `confdir`."""
    return CAPaths(
        key_file=confdir / f"{CA_BASENAME}-ca.pem",
        cert_file=confdir / f"{CA_BASENAME}-ca-cert.pem",
        dhparam_file=confdir / f"{CA_BASENAME}-dhparam.pem",
    )


# --- in memory -----------------------------------------------------------------------


def new_ca(
    common_name: str, *, now: datetime.datetime | None = None
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Create a self-signed EC P-256 CA certificate and its key, valid for CA_VALIDITY."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sandgate"),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    start = (now or _utcnow()) - _CLOCK_SKEW
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + CA_VALIDITY)
        # path_length=0: this CA signs leaves only, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue_leaf(
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    names: Sequence[str],
    *,
    key: PrivateKey | None = None,
    valid_for: datetime.timedelta = LEAF_VALIDITY,
    now: datetime.datetime | None = None,
) -> tuple[x509.Certificate, PrivateKey]:
    """Sign a server certificate for DNS names, `*.` wildcards and IP addresses (SAN).

    The first name becomes the subject CN. A new EC P-256 key is made unless `key` is
    given. Pass `now` in the past with a short `valid_for` to make an expired certificate.
    """
    if not names:
        raise ValueError("issue_leaf needs at least one name")
    leaf_key: PrivateKey = key if key is not None else ec.generate_private_key(ec.SECP256R1())
    start = (now or _utcnow()) - _CLOCK_SKEW
    issuer_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0][:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + valid_for)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False, rsa_key=isinstance(leaf_key, rsa.RSAPrivateKey)), True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(issuer_ski), False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, leaf_key


def _key_usage(*, cert_sign: bool, rsa_key: bool = False) -> x509.KeyUsage:
    """keyCertSign+cRLSign for a CA; digitalSignature (+keyEncipherment for RSA) for a leaf."""
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=not cert_sign and rsa_key,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(name: str) -> x509.GeneralName:
    """An IPAddress SAN for an address literal, a DNSName SAN otherwise."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        pass
    if not name or not name.isascii():
        raise ValueError(f"not an ASCII DNS name or IP address: {name!r}")
    return x509.DNSName(name.lower())


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# --- on disk -------------------------------------------------------------------------


def init_ca(confdir: Path, *, common_name: str = "sandgate CA", force: bool = False) -> Path:
    """Create a new CA in `confdir` (refusing to replace one unless `force`); return its cert path.

    The key file is written first and is the commit point: it is created exclusively,
    so two concurrent inits cannot both succeed, and `ensure_ca` restores the public
    files if a crash leaves the key file alone.
    """
    paths = ca_paths(confdir)
    _make_private_dir(confdir)
    if paths.key_file.exists() and not force:
        raise CAError(
            f"a CA already exists in {confdir} ({paths.key_file.name}); "
            "replace it with `sandgate ca init --force` (clients must then trust the new one)"
        )
    cert, key = new_ca(common_name)
    try:
        _write_file(paths.key_file, _key_file_pem(cert, key), _KEY_MODE, replace=force)
    except FileExistsError:
        raise CAError(f"a CA was created concurrently in {confdir}; not replacing it") from None
    _write_public_files(paths, cert)
    return paths.cert_file


def export_ca(confdir: Path) -> str:
    """Return the CA certificate as PEM, for clients to trust; never the key."""
    paths = ca_paths(confdir)
    try:
        data = paths.cert_file.read_bytes()
    except FileNotFoundError:
        hint = "start the gateway to restore it" if paths.key_file.exists() else "run `sandgate ca init`"
        raise CAError(f"no CA certificate at {paths.cert_file}: {hint}") from None
    except OSError as e:
        raise CAError(f"cannot read {paths.cert_file}: {e.strerror}") from e
    # Re-serialise the parsed certificate so nothing else in the file is ever passed on.
    cert = _single_certificate(data, paths.cert_file)
    return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")


def ensure_ca(confdir: Path) -> Path:
    """Create the CA if missing, else check it is private and consistent; return its cert path."""
    paths = ca_paths(confdir)
    if not paths.key_file.exists():
        return init_ca(confdir)
    _check_private(paths.key_file)
    cert = _load_key_file(paths.key_file)
    if not paths.cert_file.exists():
        _write_public_files(paths, cert)
    elif _single_certificate(_read(paths.cert_file), paths.cert_file) != cert:
        raise CAError(
            f"{paths.cert_file} does not match the CA in {paths.key_file}; "
            f"delete {paths.cert_file.name} to have it rewritten from the key file"
        )
    if not paths.dhparam_file.exists():
        _write_file(paths.dhparam_file, DEFAULT_DHPARAM, _PUBLIC_MODE, replace=True)
    return paths.cert_file


def _key_file_pem(cert: x509.Certificate, key: PrivateKey) -> bytes:
    """The private key followed by exactly one certificate, as CertStore.from_files reads it."""
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem + cert.public_bytes(serialization.Encoding.PEM)


def _write_public_files(paths: CAPaths, cert: x509.Certificate) -> None:
    """Write the certificate-only file and the DH parameters, both world-readable."""
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    _write_file(paths.cert_file, cert_pem, _PUBLIC_MODE, replace=True)
    _write_file(paths.dhparam_file, DEFAULT_DHPARAM, _PUBLIC_MODE, replace=True)


def _load_key_file(path: Path) -> x509.Certificate:
    """Check the key file holds one unexpired CA certificate and its matching key."""
    data = _read(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (TypeError, ValueError):
        raise CAError(f"{path} holds no readable, unencrypted private key") from None
    cert = _single_certificate(data, path)
    if key.public_key() != cert.public_key():
        raise CAError(f"the private key in {path} does not belong to its certificate")
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    if not constraints.ca:
        raise CAError(f"the certificate in {path} is not a CA certificate")
    if cert.not_valid_after_utc <= _utcnow():
        raise CAError(
            f"the CA in {path} expired on {cert.not_valid_after_utc:%Y-%m-%d}; "
            "replace it with `sandgate ca init --force`"
        )
    return cert


def _single_certificate(data: bytes, path: Path) -> x509.Certificate:
    """Parse exactly one PEM certificate out of `data` (other PEM blocks are ignored)."""
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CAError(f"{path} holds no readable PEM certificate") from None
    if len(certs) != 1:
        # mitmproxy would serve the extra certificates to every client as a chain.
        raise CAError(f"{path} holds {len(certs)} certificates; expected exactly one")
    return certs[0]


def _check_private(path: Path) -> None:
    """Refuse a key file that anyone but its owner may read, write or execute."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise CAError(
            f"{path} has mode {mode:04o}; the CA key must be private to its owner (chmod 600 {path})"
        )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise CAError(f"cannot read {path}: {e.strerror}") from e


def _make_private_dir(confdir: Path) -> None:
    """Create `confdir` with mode 0700 whatever the umask; leave an existing one alone."""
    if confdir.is_dir():
        return
    try:
        confdir.mkdir(mode=_DIR_MODE, parents=True)
    except FileExistsError:
        if not confdir.is_dir():
            raise CAError(f"{confdir} exists and is not a directory") from None
        return
    os.chmod(confdir, _DIR_MODE)


def _write_file(path: Path, data: bytes, mode: int, *, replace: bool) -> None:
    """Write `data` to `path` with exactly `mode`, atomically; FileExistsError if not `replace`.

    The data goes to a fresh temporary file (O_CREAT|O_EXCL, fchmod'ed before any byte
    is written, so a key is never readable by others) and is then renamed over `path`,
    or hard-linked to it when it must not replace an existing file.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # os.open's mode is filtered by the umask
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
