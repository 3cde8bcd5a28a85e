"""Streamed responses through the scrubber: every byte arrives, in order, as a direct fetch
gets it, with the injected key turned back into its placeholder.

A model API streams its answer as server-sent events in small chunks to an agent whose key
the gateway injects: the scrubber is on for exactly those responses. Real gateway, a real
upstream that writes each planned chunk on its own (plain HTTP and TLS), real httpx clients.
"""

from __future__ import annotations

import gzip
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from conftest import OTHER_TOKEN, OTHER_TOKEN_REF, TOKEN, TOKEN_REF, GatewayFactory, RunningGateway
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import TestPKI
from support.chunked_upstream import ECHO, ChunkedUpstream, Plan

pytestmark = pytest.mark.slow

REAL = "sk-live-STREAMED-REAL-0123456789abcdef"
KEY = b"Bearer " + REAL.encode()


class Lab:
    """A gateway with two tenants before two chunked upstreams (plain and TLS): t1's sandbox
    sb1 has the key injected (so its responses are scrubbed), t2's sb2 has no credential."""

    def __init__(
        self, gw: RunningGateway, plain: ChunkedUpstream, tls: ChunkedUpstream, pki: TestPKI
    ) -> None:
        self.gw, self.plain, self.tls, self.pki = gw, plain, tls, pki
        self.placeholder = gw.placeholders("sb1")["OPENAI_API_KEY"]

    def upstream(self, scheme: str) -> ChunkedUpstream:
        return self.tls if scheme == "https" else self.plain

    def fetch(self, scheme: str, plan: Plan, *, via_gateway: bool, sandbox: str = "sb1") -> bytes:
        """The body of one GET as the client reads it (decoded where it is gzip)."""
        up = self.upstream(scheme)
        up.plan(plan)
        url = f"{scheme}://api.test:{up.port}/v1/chat/completions"
        if via_gateway:
            token = TOKEN if sandbox == "sb1" else OTHER_TOKEN
            proxy: str | None = self.gw.proxy(sandbox, token)
            auth = f"Bearer {self.placeholder}" if sandbox == "sb1" else ""
            verify = ssl.create_default_context(cafile=str(self.gw.ca_file))
        else:
            proxy, auth = None, KEY.decode()
            url = url.replace("api.test", "127.0.0.2")
            verify = ssl.create_default_context(cafile=str(self.pki.ca_file))
            verify.check_hostname = False
        with (
            httpx.Client(proxy=proxy, verify=verify, timeout=20) as client,
            client.stream("GET", url, headers={"Authorization": auth}) as resp,
        ):
            assert resp.status_code == 200, resp.read()
            return b"".join(resp.iter_bytes())

    def expected(self, direct: bytes) -> bytes:
        """What the guest must get: the direct answer with the real key as its placeholder."""
        return direct.replace(REAL.encode(), self.placeholder.encode())


@pytest.fixture(scope="module")
def lab(start_module_gateway: GatewayFactory, pki: TestPKI) -> Iterator[Lab]:
    with ChunkedUpstream("127.0.0.2") as plain, ChunkedUpstream("127.0.0.2", pki) as tls:
        rules = [
            {"hosts": ["api.test"], "ports": [tls.port], "inspect": True},
            {"hosts": ["api.test"], "ports": [plain.port]},
        ]
        cred = {
            "name": "openai",
            "secret": "env:SANDGATE_TEST_SECRET",
            "hosts": ["api.test"],
            "ports": [tls.port, plain.port],
            "plaintext": True,
            "env": "OPENAI_API_KEY",
            "inject": {"header": "Authorization", "format": "Bearer {secret}"},
        }
        gw = start_module_gateway(
            {
                "t1.yaml": _tenant("t1", "sb1", TOKEN_REF, rules, [cred]),
                "t2.yaml": _tenant("t2", "sb2", OTHER_TOKEN_REF, rules, []),
            },
            env={"SANDGATE_TEST_SECRET": REAL},
        )
        yield Lab(gw, plain, tls, pki)


def _tenant(name: str, sandbox: str, token_ref: str, rules: Any, creds: Any) -> str:
    doc = {"tenant": name, "sandboxes": [{"id": sandbox, "token": token_ref}], "allow": rules}
    return yaml.safe_dump({**doc, "credentials": creds}, sort_keys=False)


def _sse(events: int) -> bytes:
    """Server-sent events as a model API streams them, the key echoed in one (an error text)."""
    body = b"".join(b'data: {"choices":[{"delta":{"content":"tok%d "}}]}\n\n' % i for i in range(events))
    return body + b'data: {"error":"invalid key ' + ECHO + b'"}\n\ndata: [DONE]\n\n'


PLANS = {
    "5-byte chunks of 1,200 bytes": Plan([b"0123456789" * 120], [5], "application/octet-stream"),
    "1-byte chunks with the key split at every byte": Plan([b"key=", ECHO, b";" * 40], [1]),
    "server-sent events in 7-byte chunks, the key echoed": Plan([_sse(40)], [7]),
    "server-sent events one by one, a pause between": Plan(_sse(5).split(b"\n\n"), pause=0.01),
    "4 KiB chunks": Plan([b"abcdefgh" * 3000, ECHO], [4096], "application/octet-stream"),
    "gzip server-sent events in 5-byte chunks": Plan([_sse(20)], [5], gzip=True),
}


@pytest.mark.parametrize("scheme", ["http", "https"], ids=["over plain HTTP", "over intercepted HTTPS"])
@pytest.mark.parametrize("plan", PLANS.values(), ids=list(PLANS))
def test_a_streamed_answer_arrives_whole_with_the_key_scrubbed(lab: Lab, scheme: str, plan: Plan) -> None:
    lab.gw.mark()
    direct = lab.fetch(scheme, plan, via_gateway=False)
    got = lab.fetch(scheme, plan, via_gateway=True)
    assert got == lab.expected(direct)
    assert REAL.encode() not in got
    if ECHO in b"".join(plan.parts):
        assert lab.placeholder.encode() in got
    requests = lab.gw.records_until(lambda rs: any(r["phase"] == "request" for r in rs))
    (record,) = [r for r in requests if r["phase"] == "request"]
    assert record["decision"] == "allow" and record["credentials"] == ["openai"]
    assert record["bytes"]["down"] == len(got), "the record counts what the guest was sent"


@pytest.mark.parametrize("scheme", ["http", "https"], ids=["over plain HTTP", "over intercepted HTTPS"])
def test_a_sandbox_without_credentials_gets_the_same_bytes(lab: Lab, scheme: str) -> None:
    plan = PLANS["5-byte chunks of 1,200 bytes"]
    assert lab.fetch(scheme, plan, via_gateway=True, sandbox="sb2") == b"0123456789" * 120


PIECES = [b"data: ", b"tok ", b"\n\n", ECHO, b"\xff\x00", b"x" * 100, b"Bearer ", b"sgph_"]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    pieces=st.lists(st.sampled_from(PIECES), min_size=1, max_size=30),
    sizes=st.lists(st.integers(1, 90), min_size=1, max_size=12),
    scheme=st.sampled_from(["http", "https"]),
    compressed=st.booleans(),
)
def test_any_chunking_arrives_as_a_direct_fetch_does(
    lab: Lab, pieces: list[bytes], sizes: list[int], scheme: str, compressed: bool
) -> None:
    plan = Plan(pieces, sizes, gzip=compressed)
    direct = lab.fetch(scheme, plan, via_gateway=False)
    assert lab.fetch(scheme, plan, via_gateway=True) == lab.expected(direct)


def test_a_compressed_stream_that_is_cut_never_looks_complete(lab: Lab) -> None:
    # A gzip stream that stops half-way cannot be scrubbed to its end: the guest's body is
    # cut (no last chunk), never ended as if it were whole.
    whole = gzip.compress(_sse(30))
    lab.plain.plan(Plan([whole[: len(whole) // 2]], [5], headers=[b"Content-Encoding: gzip"]))
    url = f"http://api.test:{lab.plain.port}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {lab.placeholder}"}
    with (
        httpx.Client(proxy=lab.gw.proxy("sb1", TOKEN), timeout=20) as client,
        pytest.raises(httpx.RemoteProtocolError),
        client.stream("GET", url, headers=auth) as resp,
    ):
        b"".join(resp.iter_raw())
