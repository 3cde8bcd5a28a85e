"""rsyslog from Debian as a SIEM sink's receiver, run with the config docs/operations/siem.md shows.

The page's block that starts with `# /etc/rsyslog-sandgate/rsyslog.conf` is the config: this
module reads it from the page and changes only its paths (work directory, certificates, output file) and ports, so the
page cannot drift from what the tests run. rsyslogd runs in the foreground of a child process
(`-n -f CONF -i PIDFILE`); its omfile output holds one line per message,
`[sandgate@32473 id=".." ...] {json}`, which `events()` parses.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

from .pki import TestPKI
from .ports import free_port, wait_for_port

__all__ = ["RSYSLOGD", "Rsyslog", "page_config"]

RSYSLOGD = "/usr/sbin/rsyslogd"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations" / "siem.md"
_FIRST_LINE = "# /etc/rsyslog-sandgate/rsyslog.conf\n"
_SD = re.compile(r'^\[sandgate@32473 ((?:[a-z]+="(?:[^"\\]|\\.)*" ?)*)\] (.*)$')
_PARAM = re.compile(r'([a-z]+)="((?:[^"\\]|\\.)*)"')


def page_config() -> str:
    """The rsyslog config block of the SIEM page."""
    blocks = PAGE.read_text().split("```text\n")[1:]
    (block,) = [b for b in blocks if b.startswith(_FIRST_LINE)]
    return block.split("```", 1)[0]


class Rsyslog:
    """rsyslogd listening on 127.0.0.1: plain TCP on `port`, TLS on `tls_port` (its
    certificate for 127.0.0.1 and localhost, from `pki`'s CA, a CA of its own by default)."""

    def __init__(self, folder: Path, pki: TestPKI | None = None) -> None:
        self.folder = folder
        (folder / "pki").mkdir(parents=True, exist_ok=True)
        pki = pki or TestPKI(
            ("127.0.0.1", "localhost"), directory=folder / "pki", common_name="rsyslog test CA"
        )
        self.pki = pki
        self.port, self.tls_port = free_port(), free_port()
        self.output = folder / "siem.log"
        self.pidfile = folder / "rsyslogd.pid"
        conf = (
            page_config()
            .replace("/var/spool/rsyslog-sandgate", str(folder))
            .replace("/etc/rsyslog-sandgate/ca.pem", str(pki.ca_file))
            .replace("/etc/rsyslog-sandgate/cert.pem", str(pki.cert_file))
            .replace("/etc/rsyslog-sandgate/key.pem", str(pki.key_file))
            .replace("/var/log/sandgate/siem.log", str(self.output))
            .replace('port="1514"', f'port="{self.port}"')
            .replace('port="6514"', f'port="{self.tls_port}"')
        )
        self.conf = folder / "rsyslog.conf"
        self.conf.write_text(conf)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Rsyslog:
        with (self.folder / "rsyslogd.out").open("ab") as log:
            self.proc = subprocess.Popen(
                [RSYSLOGD, "-n", "-f", str(self.conf), "-i", str(self.pidfile)], stdout=log, stderr=log
            )
        wait_for_port("127.0.0.1", self.port, timeout=10)
        wait_for_port("127.0.0.1", self.tls_port, timeout=10)
        return self

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop rsyslogd (SIGTERM: it writes what it read; SIGKILL: it may not)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def events(self) -> list[tuple[dict[str, str], dict[str, object]]]:
        """(structured-data params, JSON body) of every message written so far."""
        if not self.output.exists():
            return []
        out = []
        for line in self.output.read_text().splitlines():
            found = _SD.match(line)
            assert found, f"not a sandgate message: {line[:200]}"
            params = {
                k: v.replace('\\"', '"').replace("\\]", "]").replace("\\\\", "\\")
                for k, v in _PARAM.findall(found.group(1))
            }
            out.append((params, json.loads(found.group(2))))
        return out

    def uids(self) -> list[str]:
        return [params["id"] for params, _ in self.events()]

    def wait_for(self, count: int, timeout: float = 20.0) -> list[str]:
        """The ids received once there are at least `count` (or at `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            uids = self.uids()
            if len(uids) >= count or time.monotonic() > deadline:
                return uids
            time.sleep(0.05)
