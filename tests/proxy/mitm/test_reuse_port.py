"""SO_REUSEPORT on the explicit listener (proxy/mitm/reuse_port.py): the seam is where it was."""

from __future__ import annotations

import asyncio
import socket

from mitmproxy.proxy import mode_servers

from sandgate.proxy.mitm import reuse_port


def test_the_seam_in_mitmproxy_is_where_the_patch_expects_it() -> None:
    reuse_port.self_test()


async def test_two_regular_listeners_share_a_port_once_installed() -> None:
    reuse_port.install()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def handle(*_: object) -> None:
        return None

    class Fake:
        mode = type("M", (), {"transport_protocol": "tcp"})()
        handle_stream = staticmethod(handle)

    listen = mode_servers.RegularInstance.listen
    first = await listen(Fake(), "127.0.0.1", port)  # type: ignore[arg-type]
    second = await listen(Fake(), "127.0.0.1", port)  # type: ignore[arg-type]
    try:
        for server in (*first, *second):
            assert isinstance(server, asyncio.Server)
            (sock,) = server.sockets
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
            assert sock.getsockname()[1] == port
    finally:
        for server in (*first, *second):
            server.close()
