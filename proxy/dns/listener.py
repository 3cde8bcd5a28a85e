"""The guests' DNS listener (UDP and TCP): the DNS-exfiltration control.

A name that no allow rule of the sandbox's tenant could match gets NXDOMAIN and an audit
record `dns_denied` (sandgate.policy.decide.decide_name decides); an allowed name is resolved
with the gateway's resolver, its answers filtered through the address guard (as the explicit
proxy would pick them), returned, and remembered as name bindings. When the guard refuses
every address of the asked family the guest gets an empty answer and the record says
`private_address` with the refusal. Nothing a guest sends is ever forwarded raw: other record
types get an empty answer, malformed or oversized queries an error. The gateway's own name
(sandgate.proxy.approvals.reserved) is answered here, never looked up: type A with
`approvals.endpoint_address`, other types empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
from collections.abc import Callable
from dataclasses import replace

import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import structlog

from sandgate.policy.decide import decide_name, guard_answers
from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.policy.errors import HostError, ResolveError
from sandgate.policy.hosts import normalise_host
from sandgate.policy.reasons import Reason
from sandgate.proxy.audit.records import DecisionContext, decision_record
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.dns.name_bindings import NameBindings
from sandgate.proxy.tasks import TaskSet

__all__ = ["ALL_ADDRESSES", "MAX_QUERY_BYTES", "DnsListener"]

log = structlog.get_logger("sandgate.dns")

MAX_QUERY_BYTES = 512
# A listener host meaning every address of both families (one socket per family).
ALL_ADDRESSES = "*"
_ANSWER_TYPES = {dns.rdatatype.A: 4, dns.rdatatype.AAAA: 6}


class DnsListener:
    """Answers guests' DNS queries on one address, over UDP and TCP."""

    def __init__(
        self,
        ctx: GatewayContext,
        bindings: NameBindings,
        host: str,
        port: int,
        *,
        listener: str | None = None,
        max_ttl: int = 300,
    ) -> None:
        self.ctx = ctx
        self.bindings = bindings
        self.host = host
        self.port = port
        self.listener = listener or f"dns@{host}:{port}"
        self.max_ttl = max_ttl
        self._udp: list[asyncio.DatagramTransport] = []
        self._tcp: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # "*": IPv4 and IPv6 guests, on separate sockets (IPv6-only), so a source address is
        # never seen in its IPv4-mapped spelling; every socket on the first one's port.
        hosts = ["0.0.0.0", "::"] if self.host == ALL_ADDRESSES else [self.host]
        for host in hosts:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _UdpProtocol(self.answer), sock=_udp_socket(host, self.port)
            )
            self._udp.append(transport)
            self.port = transport.get_extra_info("sockname")[1]
        self._tcp = await asyncio.start_server(self._serve_tcp, hosts, self.port)

    async def stop(self) -> None:
        for udp in self._udp:
            udp.close()
        if self._tcp is not None:
            self._tcp.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp.wait_closed(), 2)

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            while True:
                header = await asyncio.wait_for(reader.readexactly(2), 10)
                (length,) = struct.unpack("!H", header)
                if length > MAX_QUERY_BYTES:
                    break
                wire = await asyncio.wait_for(reader.readexactly(length), 10)
                reply = await self.answer(wire, peer)
                if reply is None:
                    break
                writer.write(struct.pack("!H", len(reply)) + reply)
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:
            log.exception("dns.tcp_failed")
        finally:
            writer.close()

    async def answer(self, wire: bytes, peer: tuple[str, int]) -> bytes | None:
        """The reply to one query (None: drop it). Never raises."""
        try:
            return await self._answer(wire, peer)
        except Exception:
            log.exception("dns.failed")
            return _error_reply(wire, dns.rcode.SERVFAIL)

    async def _answer(self, wire: bytes, peer: tuple[str, int]) -> bytes | None:
        if len(wire) > MAX_QUERY_BYTES:
            return _error_reply(wire, dns.rcode.FORMERR)
        try:
            query = dns.message.from_wire(wire)
        except dns.exception.DNSException:
            return _error_reply(wire, dns.rcode.FORMERR)
        if query.opcode() != dns.opcode.QUERY or len(query.question) != 1 or query.flags & dns.flags.QR:
            return _reply(
                query, dns.rcode.NOTIMP if query.opcode() != dns.opcode.QUERY else dns.rcode.FORMERR
            )
        question = query.question[0]
        client = f"{peer[0]}:{peer[1]}"
        identity = self.ctx.policy.identify_address(peer[0])
        dctx = DecisionContext(
            phase=Phase.DNS, listener=self.listener, client=client, identity=identity, port=53
        )
        try:
            name = normalise_host(question.name.to_text(omit_final_dot=True))
        except HostError:
            return _reply(query, dns.rcode.NXDOMAIN)
        dctx = replace(dctx, host=name, method=dns.rdatatype.to_text(question.rdtype))
        reserved = self.ctx.reserved
        if reserved is not None and name == reserved.name and identity is not None:
            return _reserved_reply(query, reserved.address, self.max_ttl)
        decision = await decide_name(self.ctx.policy, identity, name, grants=self.ctx.grants)
        if not decision.allowed:
            await self.ctx.audit.emit(decision_record(dctx, decision))
            return _reply(
                query, dns.rcode.NXDOMAIN if decision.reason is not Reason.NO_IDENTITY else dns.rcode.REFUSED
            )
        if question.rdclass != dns.rdataclass.IN or question.rdtype not in _ANSWER_TYPES:
            return _reply(query, dns.rcode.NOERROR)  # no data for other types; nothing forwarded
        assert identity is not None  # allowed: the policy knew the sandbox
        return await self._resolved(query, dctx, decision, identity, name)

    async def _resolved(
        self,
        query: dns.message.Message,
        dctx: DecisionContext,
        decision: Decision,
        identity: Identity,
        name: str,
    ) -> bytes:
        """The answer to a name `decision` allowed: resolved, its addresses guarded, recorded,
        then answered."""
        question = query.question[0]
        try:
            resolution = await self.ctx.resolver.resolve(name)
        except ResolveError as e:
            failed = Decision(
                reason=Reason.DNS_FAILURE, policy_version=decision.policy_version, detail=str(e)
            )
            await self.ctx.audit.emit(decision_record(dctx, failed))
            return _reply(query, dns.rcode.SERVFAIL)
        family = _ANSWER_TYPES[question.rdtype]
        tenant = self.ctx.policy.tenant(identity.tenant)
        if tenant is None:  # the tenant went away in a reload while the name was resolved
            return _reply(query, dns.rcode.REFUSED)
        of_family = tuple(a for a in resolution.addresses if ipaddress.ip_address(a).version == family)
        addresses, refused = guard_answers(tenant, name, of_family, self.ctx.guard)
        if of_family and not addresses:
            # Every address is one the guest may not reach: no answer, and the record says why.
            decision = Decision(
                reason=Reason.PRIVATE_ADDRESS,
                policy_version=decision.policy_version,
                mode=decision.mode,
                detail=f"every resolved address is refused ({refused})",
            )
        if not await self.ctx.audit.emit(decision_record(dctx, decision)):
            return _reply(query, dns.rcode.SERVFAIL)  # no answer goes without its record
        self.bindings.remember(identity.sandbox, name, addresses, resolution.ttl)
        ttl = int(min(resolution.ttl, self.max_ttl))
        response = dns.message.make_response(query)
        if addresses:
            response.answer.append(
                dns.rrset.from_text_list(
                    question.name, ttl, dns.rdataclass.IN, question.rdtype, list(addresses)
                )
            )
        return response.to_wire()


def _udp_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class _UdpProtocol(asyncio.DatagramProtocol):
    def __init__(self, answer: Callable[[bytes, tuple[str, int]], object]) -> None:
        self._answer = answer
        self._transport: asyncio.DatagramTransport | None = None
        # Tasks in flight, held so they are not garbage-collected mid-answer.
        self._tasks = TaskSet()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.DatagramTransport)
        self._transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self._tasks.spawn(self._reply(data, addr), name="sandgate-dns-reply")

    async def _reply(self, data: bytes, addr: tuple[str, int]) -> None:
        reply = await self._answer(data, addr)  # type: ignore[misc]
        if reply is not None and self._transport is not None:
            self._transport.sendto(reply, addr)


def _reply(query: dns.message.Message, rcode: dns.rcode.Rcode) -> bytes:
    response = dns.message.make_response(query)
    response.set_rcode(rcode)
    return response.to_wire()


def _reserved_reply(query: dns.message.Message, address: str, ttl: int) -> bytes:
    """The answer for the gateway's own name: its endpoint address (A), nothing of other types."""
    question = query.question[0]
    response = dns.message.make_response(query)
    if question.rdclass == dns.rdataclass.IN and question.rdtype == dns.rdatatype.A:
        response.answer.append(
            dns.rrset.from_text_list(question.name, ttl, dns.rdataclass.IN, dns.rdatatype.A, [address])
        )
    return response.to_wire()


def _error_reply(wire: bytes, rcode: dns.rcode.Rcode) -> bytes | None:
    """An error reply echoing only the query id, or None when not even that can be read."""
    if len(wire) < 12:
        return None
    (qid,) = struct.unpack("!H", wire[:2])
    flags = 0x8000 | int(rcode)  # QR set, RCODE
    return struct.pack("!HHHHHH", qid, flags, 0, 0, 0, 0)
