"""What the SIEM sink end-to-end tests share: the receivers of all four sink types, the
`audit.sinks` config that points a gateway at them, steady load, the ids a trail should yield,
and the sinks' figures read from the gateway's /metrics."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sandgate.proxy.audit.sinks.events import encode_lines

from .rsyslog import Rsyslog
from .siem_http import SiemReceiver

__all__ = ["HEC_TOKEN", "Load", "Receivers", "duplicates", "expected_ids", "sink_metrics"]

HEC_TOKEN = "hec-e2e-token-7d0c4b2a9f61"


@dataclass
class Receivers:
    """rsyslogd (syslog over TLS) and the HTTP receivers for OTLP, HEC and bulk."""

    rsyslog: Rsyslog
    otlp: SiemReceiver
    hec: SiemReceiver
    bulk: SiemReceiver

    @classmethod
    def start(cls, folder: Path) -> Receivers:
        return cls(
            Rsyslog(folder / "rsyslog").start(),
            SiemReceiver().start(),
            SiemReceiver(hec_token=HEC_TOKEN).start(),
            SiemReceiver().start(),
        )

    def sinks(self, token_file: Path, **common: Any) -> list[dict[str, Any]]:
        """`audit.sinks` for all four: syslog and HEC native, OTLP and bulk OCSF."""
        token_file.write_text(HEC_TOKEN + "\n")
        token_file.chmod(0o600)
        common = {"max_backoff_seconds": 1.0, "timeout_seconds": 3, **common}
        return [
            {
                "type": "syslog",
                "name": "syslog",
                "format": "native",
                "host": "127.0.0.1",
                "port": self.rsyslog.tls_port,
                "tls": {"ca_file": str(self.rsyslog.pki.ca_file)},
                **common,
            },
            {"type": "otlp", "name": "otlp", "format": "ocsf", "url": self.otlp.url, **common},
            {
                "type": "hec",
                "name": "hec",
                "format": "native",
                "url": self.hec.url,
                "token": f"file:{token_file}",
                **common,
            },
            {"type": "elasticsearch", "name": "bulk", "format": "ocsf", "url": self.bulk.url, **common},
        ]

    def formats(self) -> dict[str, str]:
        return {"syslog": "native", "otlp": "ocsf", "hec": "native", "bulk": "ocsf"}

    def received(self) -> dict[str, list[str]]:
        """The ids each receiver holds (with repeats)."""
        return {
            "syslog": self.rsyslog.uids(),
            "otlp": self.otlp.uids(),
            "hec": self.hec.uids(),
            "bulk": self.bulk.uids(),
        }

    def stop_all(self) -> None:
        self.rsyslog.stop(signal.SIGTERM)
        for rx in (self.otlp, self.hec, self.bulk):
            rx.stop()

    def start_all(self) -> None:
        self.rsyslog.start()
        for rx in (self.otlp, self.hec, self.bulk):
            rx.start()


def expected_ids(audit_path: Path, fmt: str) -> list[str]:
    """The event ids the trail's records yield in a sink's format (checkpoints yield none)."""
    lines = [
        line + "\n"
        for line in audit_path.read_text().splitlines()
        if json.loads(line).get("event") != "checkpoint"
    ]
    return [e.uid for e in encode_lines(lines, fmt)]  # type: ignore[arg-type]


def duplicates(ids: list[str]) -> dict[str, int]:
    return {uid: n for uid, n in Counter(ids).items() if n > 1}


def sink_metrics(admin_socket: Path) -> dict[tuple[str, str], float]:
    """(metric name, sink) → value of the audit sink samples of the gateway's /metrics."""
    transport = httpx.HTTPTransport(uds=str(admin_socket))
    with httpx.Client(transport=transport, base_url="http://sandgate") as c:
        text = c.get("/metrics").text
    return {
        (s.name, s.labels["sink"] + (f"/{s.labels['why']}" if "why" in s.labels else "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("sandgate_audit_sink_")
    }


class Load:
    """Requests through the gateway from a thread, one after another, until `stop()`."""

    def __init__(self, proxy: str, url: str, *, pause: float = 0.0) -> None:
        self.proxy, self.url, self.pause = proxy, url, pause
        self.answers: Counter[int] = Counter()
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> Counter[int]:
        self._stop.set()
        self._thread.join(30)
        return self.answers

    def _run(self) -> None:
        with httpx.Client(proxy=self.proxy, timeout=10, trust_env=False) as client:
            while not self._stop.is_set():
                try:
                    self.answers[client.get(self.url).status_code] += 1
                except httpx.HTTPError:
                    self.errors += 1
                if self.pause:
                    time.sleep(self.pause)
