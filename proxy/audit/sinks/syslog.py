"""Syslog: RFC 5424 messages over TCP with octet-counting framing (RFC 6587), or TLS (RFC 5425).

Each message: `<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID [sandgate@32473 id=".." class=".."
tenant=".." sandbox=".."] MSG`, MSG the event's JSON. Syslog has no acknowledgement, so a batch
counts as delivered once the receiver has read all of it: each batch goes on a connection of
its own, sandgate half-closes it after the last byte, and waits for the receiver to close its
side (rsyslog does once it has read to the end). A receiver that dies before that makes the
batch go again (at least once; the id in the structured data shows a repeat).
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from datetime import UTC, datetime

from sandgate.proxy.audit.sinks.events import Event
from sandgate.proxy.audit.sinks.transport import Retry, Sent

__all__ = ["SyslogTransport", "frame", "message"]

# A private enterprise number for the structured data's id (RFC 5424 section 7.2.2 wants one;
# 32473 is the one RFC 5612 sets aside for documentation).
SD_ID = "sandgate@32473"
_SEVERITY_INFO = 6


class SyslogTransport:
    """Sends batches to one syslog receiver, one connection per batch."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        context: ssl.SSLContext | None,
        timeout: float,
        facility: int = 16,
        app_name: str = "sandgate",
    ) -> None:
        self._host, self._port = host, port
        self._context = context
        self._timeout = timeout
        self._pri = facility * 8 + _SEVERITY_INFO
        self._app = app_name
        self._hostname = _sd_safe_token(socket.gethostname()) or "-"
        self._procid = str(os.getpid())

    @property
    def receiver(self) -> str:
        return f"syslog{'+tls' if self._context else ''}://{self._host}:{self._port}"

    def send(self, events: list[Event]) -> Sent:
        data = b"".join(frame(self.message(e)) for e in events)
        try:
            with self._connect() as sock:
                sock.sendall(data)
                _half_close_and_wait(sock, self._timeout)
        except ssl.SSLCertVerificationError as e:
            raise Retry(f"{self.receiver}: certificate not trusted ({e.verify_message})") from None
        except (OSError, ssl.SSLError) as e:
            raise Retry(f"{self.receiver}: {type(e).__name__}: {e.strerror or e}") from None
        return Sent()

    def message(self, event: Event) -> bytes:
        return message(event, pri=self._pri, hostname=self._hostname, app=self._app, procid=self._procid)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self._host, self._port), timeout=self._timeout)
        if self._context is None:
            return sock
        try:
            return self._context.wrap_socket(sock, server_hostname=self._host)
        except BaseException:
            sock.close()
            raise

    def close(self) -> None:
        pass


def frame(msg: bytes) -> bytes:
    """RFC 6587 octet counting: the message's length, a space, the message."""
    return b"%d %s" % (len(msg), msg)


def message(event: Event, *, pri: int, hostname: str, app: str, procid: str) -> bytes:
    """One RFC 5424 message for `event`."""
    stamp = datetime.fromtimestamp(event.time, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    msgid = _sd_safe_token(event.kind)[:32] or "-"
    params = " ".join(
        f'{k}="{_sd_escape(v)}"'
        for k, v in (
            ("id", event.uid),
            ("class", event.kind),
            ("tenant", event.tenant),
            ("sandbox", event.sandbox),
        )
        if v
    )
    head = f"<{pri}>1 {stamp} {hostname} {app} {procid} {msgid} [{SD_ID} {params}] "
    return head.encode() + event.json().encode()


def _sd_escape(value: str) -> str:
    """A PARAM-VALUE: `"`, `\\` and `]` escaped (RFC 5424 section 6.3.3)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]")


def _sd_safe_token(value: str) -> str:
    """Printable US-ASCII without spaces (HOSTNAME, MSGID)."""
    return "".join(c if "!" <= c <= "~" else "_" for c in value)


def _half_close_and_wait(sock: socket.socket, timeout: float) -> None:
    """Tell the receiver the batch is complete, wait until it closed: it has read it all."""
    # On a TLS socket this is a TCP half-close (no close_notify to wait an answer for): the
    # receiver reads every record before the end of the stream, as over plain TCP.
    sock.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("receiver did not close after the batch")
        sock.settimeout(left)
        if not sock.recv(4096):
            return
