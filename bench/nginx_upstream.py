"""nginx as the benchmark's upstream: the same answers as bench/upstream.py (`200` with a 3-byte
body; `/bulk/<n>` sends n bytes) for a fraction of its CPU, so the client on core 1 is left
most of that core.

`start(...)` writes a config into a folder and returns a running bench/run.py Service
(`nginx -g 'daemon off;'`, one worker process); the caller stops it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from run import Service

BULK_SIZES = (100_000_000, 10 * 1024 * 1024)  # bench/run.py; bench/intbulk.py


def available() -> bool:
    return shutil.which("nginx") is not None


def start(
    workdir: Path,
    host: str,
    http_port: int,
    tls_port: int,
    cert: Path,
    key: Path,
    prefix: list[str],
    name: str = "nginx",
) -> Service:
    """nginx on host:http_port (plain) and host:tls_port (TLS with cert/key); `prefix` goes
    before the command (taskset, `ip netns exec`)."""
    exe = shutil.which("nginx")
    if exe is None:
        raise FileNotFoundError("nginx is not installed (`apt-get install -y nginx-light`)")
    folder = workdir / name
    (folder / "bulk").mkdir(parents=True, exist_ok=True)
    for size in BULK_SIZES:
        with (folder / "bulk" / str(size)).open("wb") as f:
            f.truncate(size)  # sparse: read from the page cache, no disk
    conf = folder / "nginx.conf"
    user = "user root;\n" if os.geteuid() == 0 else ""
    temp = "".join(
        f"  {t}_temp_path {folder}/{t};\n" for t in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    conf.write_text(
        f"""{user}worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
{temp}  default_type text/plain;
  keepalive_requests 100000000;
  keepalive_timeout 120s;
  tcp_nodelay on;
  sendfile on;
  server {{
    listen {host}:{http_port} reuseport;
    listen {host}:{tls_port} ssl reuseport;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_session_cache shared:bench:1m;
    location / {{ return 200 "ok\\n"; }}
    location /bulk/ {{ alias {folder}/bulk/; }}
  }}
}}
"""
    )
    argv = [*prefix, exe, "-e", str(folder / "error.log"), "-c", str(conf), "-g", "daemon off;"]
    return Service(name, argv, workdir)
