"""Peer proxies for bench/workers.py: squid (an allowlist CONNECT proxy) and the Node proxy of
`@anthropic-ai/sandbox-runtime` (`srt-proxy`: intercepts TLS and asks a decider per request).

Each `start_*` returns the running Service (bench/run.py's, so it is stopped on exit) or raises
Unavailable with the reason and how to get it. Everything listens on loopback only.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from run import PROXY_IP, Service

BENCH = Path(__file__).resolve().parent
SRT_PACKAGE = "@anthropic-ai/sandbox-runtime"
SRT_VERSION = "0.0.83"
SRT_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / f"sandgate-bench/srt-{SRT_VERSION}"
)


class Unavailable(Exception):
    """A peer cannot run here; the message says why and how to install it."""


# -- squid -------------------------------------------------------------------------------------


def squid_version() -> str:
    exe = shutil.which("squid")
    if exe is None:
        raise Unavailable("squid is not installed (`apt-get install -y squid`)")
    out = subprocess.run([exe, "-v"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0] if out else "squid"


def squid_conf(workdir: Path, port: int, hosts: dict[str, str], ports: list[int]) -> Path:
    """An allowlist proxy: CONNECT and plain HTTP to `hosts` on `ports`, nothing cached, access logged."""
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o777)  # squid drops to its own user (proxy) and writes its logs here
    (workdir / "hosts").write_text("".join(f"{ip} {name}\n" for name, ip in hosts.items()))
    conf = workdir / "squid.conf"
    conf.write_text(
        "\n".join(
            [
                f"http_port {PROXY_IP}:{port}",
                f"pid_filename {workdir}/squid.pid",
                f"cache_log {workdir}/cache.log",
                # Logged per request, as sandgate audits every decision.
                f"access_log stdio:{workdir}/access.log",
                f"hosts_file {workdir}/hosts",
                "dns_nameservers 127.0.0.1",  # never asked: every name is in hosts_file
                f"coredump_dir {workdir}",
                "cache deny all",
                "cache_mem 8 MB",
                "shutdown_lifetime 1 seconds",
                "workers 1",
                f"acl bench_hosts dstdomain {' '.join(hosts)}",
                f"acl bench_ports port {' '.join(map(str, ports))}",
                "acl CONNECT method CONNECT",
                "http_access allow CONNECT bench_hosts bench_ports",
                "http_access allow bench_hosts bench_ports",
                "http_access deny all",
                "",
            ]
        )
    )
    return conf


def start_squid(
    workdir: Path, port: int, hosts: dict[str, str], ports: list[int], core: list[str]
) -> Service:
    """squid in the foreground (`-N`: one process, no kid), pinned by `core` (a taskset prefix)."""
    exe = shutil.which("squid")
    if exe is None:
        raise Unavailable("squid is not installed (`apt-get install -y squid`)")
    conf = squid_conf(workdir / "squid", port, hosts, ports)
    return Service("squid", [*core, exe, "-N", "-f", str(conf)], workdir)


# -- the Node proxy (srt-proxy) ----------------------------------------------------------------


def srt_entry(install: bool) -> Path:
    """The package's standalone proxy entry, installed with npm into a cache folder if asked."""
    entry = SRT_CACHE / "node_modules" / SRT_PACKAGE / "dist" / "proxy-main.js"
    if entry.is_file():
        return entry
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise Unavailable("node and npm are needed (`apt-get install -y nodejs npm`)")
    if not install:
        raise Unavailable(
            f"{SRT_PACKAGE}@{SRT_VERSION} is not installed in {SRT_CACHE} (run without --no-install)"
        )
    SRT_CACHE.mkdir(parents=True, exist_ok=True)
    print(f"installing {SRT_PACKAGE}@{SRT_VERSION} into {SRT_CACHE} (npm)", file=sys.stderr, flush=True)
    cp = subprocess.run(
        [
            "npm",
            "install",
            "--no-audit",
            "--no-fund",
            "--prefix",
            str(SRT_CACHE),
            f"{SRT_PACKAGE}@{SRT_VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if cp.returncode != 0 or not entry.is_file():
        raise Unavailable(
            f"npm install {SRT_PACKAGE}@{SRT_VERSION} failed: {(cp.stderr or cp.stdout).strip()[-300:]}"
        )
    return entry


def node_version() -> str:
    return subprocess.run(["node", "--version"], capture_output=True, text=True, check=False).stdout.strip()


def write_rsa_ca(path: Path, cert_path: Path) -> None:
    """A throwaway RSA CA for the Node proxy (node-forge signs leaves with RSA only): key + cert PEM."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandgate bench srt-proxy CA")])
    now = dt.datetime.now(dt.UTC)
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    path.write_bytes(key_pem + pem)
    path.chmod(0o600)
    cert_path.write_bytes(pem)


@dataclass
class NodeProxy:
    """srt-proxy and its decider: two processes, both on the proxy core."""

    proxy: Service
    decider: Service
    ca_cert: Path  # what a client trusts for the intercepted TLS

    def stop(self) -> None:
        self.proxy.stop()
        self.decider.stop()


def start_node_proxy(
    workdir: Path, port: int, allowed: list[str], upstream_ca: Path, core: list[str], *, install: bool
) -> NodeProxy:
    """srt-proxy on PROXY_IP:port intercepting every CONNECT, deciding each request through
    bench/srt_decider.mjs over a socket pair; upstream TLS verified against upstream_ca."""
    entry = srt_entry(install)
    ca = workdir / "srt-ca.pem"
    ca_cert = workdir / "srt-ca-cert.pem"
    write_rsa_ca(ca, ca_cert)
    ours, theirs = socket.socketpair()
    ca_fd = os.open(ca, os.O_RDONLY)
    fds = [ours.detach(), theirs.detach(), ca_fd]
    env = {**os.environ, "NODE_EXTRA_CA_CERTS": str(upstream_ca)}
    proxy_argv = [
        *core,
        "node",
        str(entry),
        "--listen",
        f"{PROXY_IP}:{port}",
        "--decider-fd",
        str(fds[0]),
        "--ca-fd",
        str(ca_fd),
    ]
    decider_argv = [*core, "node", str(BENCH / "srt_decider.mjs"), str(fds[1]), json.dumps(allowed)]
    try:
        decider = Service("srt-decider", decider_argv, workdir, pass_fds=(fds[1],))
        try:
            proxy = Service("srt-proxy", proxy_argv, workdir, pass_fds=(fds[0], ca_fd), env=env)
        except BaseException:
            decider.stop()
            raise
    finally:
        for fd in fds:  # the children hold their own copies
            os.close(fd)
    return NodeProxy(proxy, decider, ca_cert)
