"""A scripted DNS server on loopback (UDP and TCP on the same port) for resolver tests.

Answers come from a mapping `{name: answers}`. `answers` is either a list of addresses
(the same answer every time) or a list of lists: the n-th A (or AAAA) query for the
name gets the n-th list, and the last list repeats. That scripts DNS rebinding:
`{"evil.test": [["127.0.0.2"], ["169.254.169.254"]]}` answers the first A query with
127.0.0.2 and every later one with 169.254.169.254. A and AAAA queries pick the IPv4
and IPv6 addresses of the chosen list; other types get an empty answer (NODATA);
unknown names get NXDOMAIN.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import socketserver
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

__all__ = ["Answers", "DNSQuery", "ScriptedDNSServer"]

type Answers = Sequence[str] | Sequence[Sequence[str]]

_BIND_ATTEMPTS = 20
_POLL_INTERVAL = 0.05  # how fast serve_forever notices shutdown()


@dataclass(frozen=True, slots=True)
class DNSQuery:
    """One query as received and answered."""

    name: str  # lower case, without the final dot
    rdtype: str  # "A", "AAAA", ...
    transport: str  # "udp" or "tcp"
    client: tuple[str, int]
    rcode: str  # "NOERROR", "NXDOMAIN", ...
    answers: tuple[str, ...]


def _normalise_name(name: str) -> str:
    return name.rstrip(".").lower()


def _answer_sets(answers: Answers) -> tuple[tuple[str, ...], ...]:
    """Turn a flat list or a list of lists into validated answer sets."""
    if isinstance(answers, str):
        raise TypeError("answers must be a list of addresses, not a string")
    if answers and all(isinstance(a, str) for a in answers):
        sets: list[Sequence[str]] = [answers]  # type: ignore[list-item]
    else:
        sets = [s for s in answers if not isinstance(s, str)]
        if len(sets) != len(answers):
            raise TypeError("mix of addresses and lists of addresses")
    if not sets:
        sets = [()]
    return tuple(tuple(str(ipaddress.ip_address(a)) for a in s) for s in sets)


class ScriptedDNSServer:
    """Answers A/AAAA from a script, NXDOMAIN otherwise, and logs every query.

    Use as `with ScriptedDNSServer(records={...}) as dns: ...` or `start()`/`stop()`.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        records: Mapping[str, Answers] | None = None,
        ttl: int = 0,
    ) -> None:
        self.host = host
        self.ttl = ttl
        self._requested_port = port
        self._lock = threading.Lock()
        self._records: dict[str, tuple[tuple[str, ...], ...]] = {}
        self._served: Counter[tuple[str, str]] = Counter()
        self._queries: list[DNSQuery] = []
        self._tcp_clients: set[socket.socket] = set()
        self._stopping = False
        self._udp: _UDPServer | None = None
        self._tcp: _TCPServer | None = None
        self._threads: list[threading.Thread] = []
        for name, answers in (records or {}).items():
            self.set_records(name, answers)

    # --- script ----------------------------------------------------------------------

    def set_records(self, name: str, answers: Answers) -> None:
        """Set (or replace) the answers for `name` and restart its rotation."""
        sets = _answer_sets(answers)
        key = _normalise_name(name)
        with self._lock:
            self._records[key] = sets
            for served in [k for k in self._served if k[0] == key]:
                del self._served[served]

    def remove(self, name: str) -> None:
        """Forget `name`: it answers NXDOMAIN from now on."""
        with self._lock:
            self._records.pop(_normalise_name(name), None)

    # --- life cycle ------------------------------------------------------------------

    def start(self) -> Self:
        """Bind UDP and TCP on the same port and serve each from a background thread."""
        if self._udp is not None:
            raise RuntimeError("already started")
        self._stopping = False
        self._udp, self._tcp = self._bind()
        for server in (self._udp, self._tcp):
            thread = threading.Thread(
                target=server.serve_forever, args=(_POLL_INTERVAL,), name=f"dns-{self.port}"
            )
            thread.start()
            self._threads.append(thread)
        return self

    def _bind(self) -> tuple[_UDPServer, _TCPServer]:
        """Bind UDP first (to port 0 if asked), then TCP to the same port, retrying clashes."""
        last: OSError | None = None
        for _ in range(_BIND_ATTEMPTS):
            udp = _UDPServer(self, (self.host, self._requested_port))
            try:
                return udp, _TCPServer(self, (self.host, udp.server_address[1]))
            except OSError as e:
                udp.server_close()
                last = e
                if self._requested_port:
                    break
        raise OSError(f"cannot bind UDP and TCP on {self.host}:{self._requested_port}") from last

    def stop(self) -> None:
        """Stop both listeners, end open TCP connections, and join every thread."""
        udp, tcp = self._udp, self._tcp
        if udp is None or tcp is None:
            return
        udp.shutdown()
        tcp.shutdown()
        with self._lock:
            self._stopping = True  # a connection handler that starts now ends at once
            clients = list(self._tcp_clients)
        for sock in clients:
            with contextlib.suppress(OSError):  # already gone
                sock.shutdown(socket.SHUT_RDWR)
        udp.server_close()
        tcp.server_close()  # joins the per-connection threads
        for thread in self._threads:
            thread.join()
        self._udp = self._tcp = None
        self._threads.clear()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- what tests read ------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port, the same for UDP and TCP (after `start()`)."""
        if self._udp is None:
            raise RuntimeError("not started")
        port: int = self._udp.server_address[1]
        return port

    @property
    def queries(self) -> list[DNSQuery]:
        """A snapshot of the queries received since the last `reset()`, in order."""
        with self._lock:
            return list(self._queries)

    def count(self, name: str, rdtype: str | None = None) -> int:
        """How many queries for `name` (of `rdtype`, if given) arrived since `reset()`."""
        key = _normalise_name(name)
        with self._lock:
            return sum(1 for q in self._queries if q.name == key and rdtype in (None, q.rdtype))

    def reset(self) -> None:
        """Forget the query log and restart every rotation."""
        with self._lock:
            self._queries.clear()
            self._served.clear()

    # --- answering -------------------------------------------------------------------

    def reply(self, wire: bytes, transport: str, client: tuple[str, int]) -> bytes | None:
        """The wire response to one wire query, or None if it cannot be parsed."""
        try:
            query = dns.message.from_wire(wire)
        except dns.exception.DNSException:
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if len(query.question) != 1:
            response.set_rcode(dns.rcode.FORMERR)
            return response.to_wire()
        question = query.question[0]
        name = _normalise_name(question.name.to_text())
        rdtype = dns.rdatatype.to_text(question.rdtype)
        rcode, addresses = self._lookup(name, rdtype)
        response.set_rcode(rcode)
        if addresses:
            response.answer.append(
                dns.rrset.from_text_list(
                    question.name, self.ttl, dns.rdataclass.IN, question.rdtype, addresses
                )
            )
        with self._lock:
            self._queries.append(
                DNSQuery(name, rdtype, transport, client, dns.rcode.to_text(rcode), tuple(addresses))
            )
        return response.to_wire()

    def _lookup(self, name: str, rdtype: str) -> tuple[dns.rcode.Rcode, list[str]]:
        """The rcode and addresses for one question, advancing the name's rotation."""
        version = {"A": 4, "AAAA": 6}.get(rdtype)
        with self._lock:
            sets = self._records.get(name)
            if sets is None:
                return dns.rcode.NXDOMAIN, []
            if version is None:
                return dns.rcode.NOERROR, []
            served = self._served[(name, rdtype)]
            self._served[(name, rdtype)] += 1
            chosen = sets[min(served, len(sets) - 1)]
        return dns.rcode.NOERROR, [a for a in chosen if ipaddress.ip_address(a).version == version]

    def _track(self, sock: socket.socket, open_: bool) -> bool:
        """Register or forget an open TCP connection; False if the server is stopping."""
        with self._lock:
            if open_:
                self._tcp_clients.add(sock)
            else:
                self._tcp_clients.discard(sock)
            return not self._stopping


# --- socketserver plumbing ------------------------------------------------------------


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class _UDPServer(socketserver.UDPServer):
    def __init__(self, owner: ScriptedDNSServer, address: tuple[str, int]) -> None:
        self.owner = owner
        self.address_family = _family(address[0])
        super().__init__(address, _UDPHandler)


class _TCPServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    block_on_close = True
    daemon_threads = False

    def __init__(self, owner: ScriptedDNSServer, address: tuple[str, int]) -> None:
        self.owner = owner
        self.address_family = _family(address[0])
        super().__init__(address, _TCPHandler)


class _UDPHandler(socketserver.BaseRequestHandler):
    server: _UDPServer

    def handle(self) -> None:
        data, sock = self.request
        reply = self.server.owner.reply(data, "udp", self.client_address[:2])
        if reply is not None:
            sock.sendto(reply, self.client_address)


class _TCPHandler(socketserver.BaseRequestHandler):
    server: _TCPServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        owner = self.server.owner
        try:
            if not owner._track(sock, True):
                return
            while (length := _recv_exact(sock, 2)) is not None:
                wire = _recv_exact(sock, int.from_bytes(length))
                reply = owner.reply(wire, "tcp", self.client_address[:2]) if wire else None
                if reply is None:
                    return
                sock.sendall(len(reply).to_bytes(2) + reply)
        except OSError:
            return
        finally:
            owner._track(sock, False)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    """Exactly `size` bytes, or None if the peer closed first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data
