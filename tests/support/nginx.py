"""A real nginx with default settings on loopback: what common servers make of a path.

nginx keeps its defaults here (merge_slashes on, every escape decoded before dot segments
are resolved), so a test sees what a real server would serve for the bytes the gateway
forwarded. Locations answer with distinct bodies and an `X-Location` header:

    /admin   (prefix: /admin, /admin/x, /adminx)   "admin <uri>"
    /v1/                                            "v1 <uri>"
    /                                               "other <uri>"

Every request it answered is in its access log (`requests()`): the method, the target
exactly as it arrived (`raw`), nginx's own reading of the path (`uri`) and the location.
It runs as a non-daemon child (`daemon off`, no master process, so no user switch) with its
prefix, config, pid file, logs and temp folders under `workdir`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from .pki import TestPKI
from .ports import free_port, wait_for_port

__all__ = ["NginxRequest", "NginxServer"]

_CONFIG = """\
daemon off;
master_process off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/logs/error.log warn;
events {{ worker_connections 256; }}
http {{
    log_format sandgate escape=json
        '{{"method":"$request_method","raw":"$request_uri","uri":"$uri",'
        '"location":"$sent_http_x_location","status":$status}}';
    access_log {work}/logs/access.log sandgate;
    client_body_temp_path {work}/tmp/body;
    proxy_temp_path {work}/tmp/proxy;
    fastcgi_temp_path {work}/tmp/fastcgi;
    uwsgi_temp_path {work}/tmp/uwsgi;
    scgi_temp_path {work}/tmp/scgi;
    default_type text/plain;
    server {{
        listen {host}:{port};
        {tls_listen}
        location /admin {{ add_header X-Location admin; return 200 "admin $uri\\n"; }}
        location /v1/ {{ add_header X-Location v1; return 200 "v1 $uri\\n"; }}
        location / {{ add_header X-Location other; return 200 "other $uri\\n"; }}
    }}
}}
"""


@dataclass(frozen=True, slots=True)
class NginxRequest:
    """One request nginx answered: the target as sent, nginx's reading of it, the location."""

    method: str
    raw: str
    uri: str
    location: str
    status: int


class NginxServer:
    """`nginx` on `host` (plain HTTP on `port`, and HTTPS on `tls_port` with the PKI's leaf)."""

    def __init__(self, workdir: Path, host: str = "127.0.0.2", *, tls: TestPKI | None = None) -> None:
        self.workdir = workdir
        self.host = host
        self.tls = tls
        self.port = free_port(host)
        self.tls_port = free_port(host) if tls is not None else None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def access_log(self) -> Path:
        return self.workdir / "logs" / "access.log"

    def url_for(self, hostname: str, *, tls: bool = False) -> str:
        return f"https://{hostname}:{self.tls_port}" if tls else f"http://{hostname}:{self.port}"

    def start(self) -> Self:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(binary).exists():
            raise RuntimeError("nginx is not installed (deploy/install.sh --dev installs nginx-light)")
        for sub in ("logs", "tmp"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        tls_listen = ""
        if self.tls is not None:
            tls_listen = (
                f"listen {self.host}:{self.tls_port} ssl; "
                f"ssl_certificate {self.tls.cert_file}; ssl_certificate_key {self.tls.key_file};"
            )
        config = self.workdir / "nginx.conf"
        config.write_text(
            _CONFIG.format(work=self.workdir, host=self.host, port=self.port, tls_listen=tls_listen)
        )
        self.access_log.touch()
        self.process = subprocess.Popen(
            [
                binary,
                "-p",
                str(self.workdir),
                "-c",
                str(config),
                "-e",
                str(self.workdir / "logs" / "error.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(self.host, self.port, timeout=10)
            if self.tls_port is not None:
                wait_for_port(self.host, self.tls_port, timeout=10)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"nginx did not start: {self.error_log()}") from None
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def requests(self) -> list[NginxRequest]:
        """Every request nginx answered so far, in order."""
        out = []
        for line in self.access_log.read_text().splitlines():
            rec = json.loads(line)
            out.append(NginxRequest(rec["method"], rec["raw"], rec["uri"], rec["location"], rec["status"]))
        return out

    def reset(self) -> None:
        """Forget the requests answered so far (nginx keeps appending to the same file)."""
        self.access_log.write_text("")

    def error_log(self) -> str:
        path = self.workdir / "logs" / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
