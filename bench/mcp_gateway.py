"""MCP through the gateway: tools/call latency, the per-message decision cost, SSE streaming.

(Not `bench/mcp.py`: with bench/ first on sys.path that name would hide the `mcp` package.)

Run: `.venv/bin/python bench/mcp_gateway.py [--rounds 5] [--calls 200] [--events 20000] [--decisions 5000]
[--markdown out.md] [--json out.json]`; `--quick` is a smoke run of a few seconds (tests/bench).

(a) Decision cost, pure: `decide_mcp_body` (strict JSON read, JSON-RPC and MCP reading, the
decision) over one fixed `tools/call` body (~330 bytes, 5 arguments) under an `mcp:` section
with 0, 10 and 100 extra tool rules: each N adds N allow globs, N deny globs and N `arguments`
entries (globs that never match the call), beside the call's own allow glob and its 4 argument
predicates (`equals`, `one_of`, `max_length`, `labels[*]` by `glob`). Each message is timed on
its own (`perf_counter_ns`); the read alone (`read_mcp(parse_jsonrpc(...))`) is timed too, so
the decision is the difference. Within a round the sections take turns in slices of 50
messages (order reversed every other slice); p50 and p99 per round, then the median.

(b) `tools/call` latency: the official MCP SDK's server (`mcp` 2.x `MCPServer`, streamable
HTTP, its default SSE answers, stateful sessions) under uvicorn in its own process, and a raw
httpx client (one keep-alive connection) posting JSON-RPC: an initialize, then calls of one
tool, one at a time, timed from the request to the answer's last byte. Direct to the server,
and through `sandgate run` (one worker, explicit proxy, plain HTTP, a rule with an `mcp:`
section, audit to its file) with the server's session of its own. Each round runs a block
of calls on each path (order reversed every other round); the ratio is per round, then the
median. A check first: a denied tool through the gateway gets a JSON-RPC error, `tool_denied`.

(c) SSE streaming: a raw asyncio upstream (own process) answers a POST /mcp `tools/call` with
`text/event-stream`: N `notifications/progress` events of fixed size, then the result, chunked,
flushed every 64 events; the client reads it to the end and counts events, direct and through
the gateway (same rule, same host). MB/s (10^6 bytes) and events/s per round, then medians.

Loopback only; every process and temporary directory is removed on exit. Nothing is pinned:
on a shared 2-core machine the client, the server and the gateway share the cores, so read
the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests"))

import httpx  # noqa: E402
from approvals import process  # noqa: E402
from conftest import SANDGATE, TOKEN, TOKEN_REF, UPSTREAM_IP, write_gateway_files  # noqa: E402
from matcher import _timer_cost  # noqa: E402
from support import free_port, wait_for_port  # noqa: E402

from sandgate.policy.protocols.decide import decide_mcp_body  # noqa: E402
from sandgate.policy.protocols.jsonrpc import parse_jsonrpc  # noqa: E402
from sandgate.policy.protocols.mcp import read_mcp  # noqa: E402
from sandgate.policy.protocols.rules import McpSection  # noqa: E402

RULE_COUNTS = (0, 10, 100)
SLICE = 50  # messages timed in a row for one section before the next takes its turn
HOST = "api.test"  # conftest's TEST_HOSTS resolve it to UPSTREAM_IP
ACCEPT = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
PROTOCOL_VERSION = "2025-06-18"
OWN_PREDICATES: list[dict[str, Any]] = [
    {"path": "owner", "equals": "acme"},
    {"path": "repo", "one_of": ["api", "web", "docs"]},
    {"path": "title", "max_length": 200},
    {"path": "labels[*]", "glob": "kind/*"},
]
CALL_ARGUMENTS = {
    "owner": "acme",
    "repo": "api",
    "title": "The gateway should time its MCP decisions",
    "body": "Measured per message, with 0, 10 and 100 tool rules beside the one that matches.",
    "labels": ["kind/perf", "kind/mcp"],
}


def tools_call(ident: int, tool: str, arguments: dict[str, Any]) -> bytes:
    params = {"name": tool, "arguments": arguments}
    return json.dumps({"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": params}).encode()


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# -- (a) the decision, pure -----------------------------------------------------------------


def section(extra: int) -> McpSection:
    """The call's own allow glob and predicates, plus `extra` allow, deny and argument entries."""
    arguments: dict[str, Any] = {f"filler_{i}_*": [{"path": "x", "equals": i}] for i in range(extra)}
    arguments["create_issue"] = OWN_PREDICATES
    tools = {
        "allow": [f"filler_{i}_*" for i in range(extra)] + ["create_issue"],
        "deny": [f"drop_{i}_*" for i in range(extra)],
        "arguments": arguments,
    }
    return McpSection.model_validate({"tools": tools})


def _time_into(out: list[float], fn: Callable[[], object], count: int) -> None:
    clock = time.perf_counter_ns
    for _ in range(count):
        t0 = clock()
        fn()
        out.append((clock() - t0) / 1000)


def decision_costs(decisions: int, rounds: int) -> list[dict[str, Any]]:
    """µs per message (p50, p99: medians over rounds) of reading and deciding, per rule count.

    Within a round the sections take turns in slices of SLICE messages, so a busy moment of
    the machine falls on each of them alike."""
    body = tools_call(7, "create_issue", CALL_ARGUMENTS)
    sections = {n: section(n) for n in RULE_COUNTS}
    for n, s in sections.items():
        verdict, _ = decide_mcp_body(body, s)
        if not verdict.allowed:
            raise AssertionError(f"{n} extra rules: the call was {verdict.reason}, expected allowed")
    runs: dict[tuple[str, int], Callable[[], object]] = {
        ("read and decide", n): (lambda s=s: decide_mcp_body(body, s)) for n, s in sections.items()
    }
    runs[("read only", 0)] = lambda: read_mcp(parse_jsonrpc(body))
    per: dict[tuple[str, int], list[tuple[float, float]]] = {key: [] for key in runs}
    for r in range(rounds):
        samples: dict[tuple[str, int], list[float]] = {key: [] for key in runs}
        gc.collect()
        for i in range(max(1, decisions // SLICE)):
            for key in list(runs) if (r + i) % 2 == 0 else list(reversed(runs)):
                _time_into(samples[key], runs[key], SLICE)
        for key, values in samples.items():
            per[key].append((percentile(values, 0.5), percentile(values, 0.99)))
    return [
        {
            "what": what,
            "extra_rules": n,
            "body_bytes": len(body),
            "p50_us": round(median([p for p, _ in values]) or 0, 2),
            "p99_us": round(median([q for _, q in values]) or 0, 2),
            "p50_per_round": [round(p, 2) for p, _ in values],
        }
        for (what, n), values in per.items()
    ]


# -- the servers (each run as `bench/mcp_gateway.py --serve ...` in a process of its own) ------------


def serve_mcp(port: int) -> None:
    """The MCP SDK's server over streamable HTTP on UPSTREAM_IP:port."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from mcp.server.transport_security import TransportSecuritySettings

    server = MCPServer("sandgate-bench", log_level="WARNING")

    @server.tool()
    def search_issues(query: str) -> str:
        """Search issues."""
        return f"found: {len(query)} characters"

    @server.tool()
    def delete_repo(repo: str) -> str:
        """Delete a repository."""
        return f"deleted {repo}"

    # The Host the server sees names the gateway's destination (api.test), not loopback.
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = server.streamable_http_app(transport_security=security, host=UPSTREAM_IP)
    uvicorn.run(app, host=UPSTREAM_IP, port=port, log_level="warning")


def sse_event(i: int, size: int) -> bytes:
    """One progress notification as an SSE event of exactly `size` bytes (at least ~150)."""
    head = f'event: message\ndata: {{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"t","progress":{i:09d},"message":"'
    tail = '"}}\n\n'
    pad = max(0, size - len(head) - len(tail))
    return (head + "x" * pad + tail).encode()


async def _sse_answer(writer: asyncio.StreamWriter, ident: object, events: int, size: int) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    for start in range(0, events, 64):
        chunk = b"".join(sse_event(i, size) for i in range(start, min(events, start + 64)))
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
    result = {"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": "done"}]}}
    last = b"event: message\ndata: " + json.dumps(result).encode() + b"\n\n"
    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last))
    await writer.drain()


async def _sse_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, events: int, size: int
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = json.loads(await reader.readexactly(length)) if length else {}
            await _sse_answer(writer, body.get("id"), events, size)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def serve_sse(port: int, events: int, size: int) -> None:
    """A raw HTTP/1.1 upstream answering every POST with an SSE stream of `events` events."""

    async def main() -> None:
        server = await asyncio.start_server(
            lambda r, w: _sse_connection(r, w, events, size), UPSTREAM_IP, port
        )
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# -- (b) and (c): through the gateway and direct ---------------------------------------------


class McpClient:
    """A raw JSON-RPC client of one streamable HTTP endpoint, with its session."""

    def __init__(self, url: str, proxy: str | None) -> None:
        self.url = url
        self.http = httpx.Client(proxy=proxy, timeout=30)
        self.headers = dict(ACCEPT)
        self.next_id = 1

    def post(self, payload: dict[str, Any]) -> httpx.Response:
        response = self.http.post(self.url, content=json.dumps(payload).encode(), headers=self.headers)
        response.raise_for_status()
        return response

    def initialize(self) -> None:
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "sandgate-bench", "version": "1"},
        }
        answer = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
        session = answer.headers.get("mcp-session-id")
        if session:
            self.headers["mcp-session-id"] = session
        self.headers["mcp-protocol-version"] = PROTOCOL_VERSION
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """One tools/call; its JSON-RPC answer (the first `data:` of an SSE answer)."""
        self.next_id += 1
        params = {"name": tool, "arguments": arguments}
        response = self.post({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call", "params": params})
        text = response.text
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            text = next(x[5:] for x in text.splitlines() if x.startswith("data:"))
        answer: dict[str, Any] = json.loads(text)
        return answer

    def close(self) -> None:
        self.http.close()


def _timed_calls(client: McpClient, count: int) -> list[float]:
    """ms per tools/call, one at a time."""
    out = []
    for i in range(count):
        t0 = time.perf_counter_ns()
        answer = client.call("search_issues", {"query": f"label:bug is:open {i}"})
        out.append((time.perf_counter_ns() - t0) / 1e6)
        if "result" not in answer:
            raise AssertionError(f"tools/call failed: {answer}")
    return out


def _read_stream(http: httpx.Client, url: str, expected_events: int) -> tuple[float, int, int]:
    """Seconds to read one SSE answer to its end, its bytes and its events."""
    body = tools_call(1, "search_stream", {"query": "x"})
    size = events = 0
    previous_newline = False
    t0 = time.perf_counter()
    with http.stream("POST", url, content=body, headers=ACCEPT) as response:
        response.raise_for_status()
        for chunk in response.iter_raw():
            size += len(chunk)
            events += chunk.count(b"\n\n") + (1 if previous_newline and chunk.startswith(b"\n") else 0)
            previous_newline = chunk.endswith(b"\n") and not chunk.endswith(b"\n\n")
    seconds = time.perf_counter() - t0
    if events != expected_events:
        raise AssertionError(f"{url}: {events} SSE events read, expected {expected_events}")
    return seconds, size, events


@contextlib.contextmanager
def servers(root: Path, events: int, size: int) -> Iterator[tuple[int, int]]:
    """The MCP SDK server and the SSE upstream, each in its own process: their ports."""
    mcp_port, sse_port = free_port(UPSTREAM_IP), free_port(UPSTREAM_IP)
    me = [sys.executable, str(Path(__file__).resolve())]
    with (
        open(root / "servers.log", "wb") as log,
        process([*me, "--serve", "mcp", "--port", str(mcp_port)], stdout=log, stderr=subprocess.STDOUT),
        process([*me, "--serve", "sse", "--port", str(sse_port), "--events", str(events), "--event-size",
                 str(size)], stdout=log, stderr=subprocess.STDOUT),
    ):  # fmt: skip
        try:
            wait_for_port(UPSTREAM_IP, mcp_port, timeout=60)
            wait_for_port(UPSTREAM_IP, sse_port, timeout=60)
        except TimeoutError:
            raise RuntimeError(
                f"a server did not start: {(root / 'servers.log').read_text()[-2000:]}"
            ) from None
        yield mcp_port, sse_port


@contextlib.contextmanager
def gateway(root: Path, ports: tuple[int, int]) -> Iterator[str]:
    """`sandgate run`, one worker, tenant t1 with one MCP rule for both upstreams: its proxy URL."""
    rule = {
        "id": "mcp",
        "hosts": [HOST],
        "ports": list(ports),
        "paths": ["/mcp"],
        "mcp": {"tools": {"allow": ["search_*"], "deny": ["delete_*"]}},
    }
    tenant = {"tenant": "t1", "sandboxes": [{"id": "sb1", "token": TOKEN_REF}], "allow": [rule]}
    path, port = write_gateway_files(
        root, {"t1.yaml": json.dumps(tenant)}, config={"log": {"level": "warning"}, "workers": {"count": 1}}
    )
    with open(root / "gateway.log", "wb") as log, process([SANDGATE, "run", "--config", str(path)], stdout=log,
                                                          stderr=subprocess.STDOUT):  # fmt: skip
        try:
            wait_for_port("127.0.0.1", port, timeout=120)
        except TimeoutError:
            raise RuntimeError(
                f"the gateway did not start: {(root / 'gateway.log').read_text()[-2000:]}"
            ) from None
        yield f"http://sb1:{TOKEN}@127.0.0.1:{port}"


def _check_enforcing(proxy: str, mcp_port: int) -> None:
    """The gateway decides the calls: a denied tool is a JSON-RPC error with its reason."""
    client = McpClient(f"http://{HOST}:{mcp_port}/mcp", proxy)
    try:
        client.initialize()
        answer = client.call("delete_repo", {"repo": "x"})
    finally:
        client.close()
    reason = answer.get("error", {}).get("data", {}).get("reason")
    if reason != "tool_denied":
        raise AssertionError(f"the gateway did not refuse delete_repo: {answer}")


def latency_rounds(proxy: str, mcp_port: int, calls: int, rounds: int) -> dict[str, Any]:
    """tools/call ms p50/p99 per round, direct and through the gateway, and their ratios."""
    clients = {
        "direct": McpClient(f"http://{UPSTREAM_IP}:{mcp_port}/mcp", None),
        "gateway": McpClient(f"http://{HOST}:{mcp_port}/mcp", proxy),
    }
    per: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
    try:
        for client in clients.values():
            client.initialize()
            _timed_calls(client, min(20, calls))  # warm-up: connections, sessions, caches
        for r in range(rounds):
            for name in list(clients) if r % 2 == 0 else list(reversed(clients)):
                ms = _timed_calls(clients[name], calls)
                per[name].append((percentile(ms, 0.5), percentile(ms, 0.99)))
    finally:
        for client in clients.values():
            client.close()
    ratio = [g[0] / d[0] for g, d in zip(per["gateway"], per["direct"], strict=True)]
    added = [g[0] - d[0] for g, d in zip(per["gateway"], per["direct"], strict=True)]
    return {
        "calls_per_round": calls,
        "added_p50_ms_per_round": [round(x, 3) for x in added],
        "added_p50_ms": round(median(added) or 0, 3),
        "rows": {
            name: {
                "p50_ms": round(median([p for p, _ in v]) or 0, 3),
                "p99_ms": round(median([q for _, q in v]) or 0, 3),
                "p50_per_round": [round(p, 3) for p, _ in v],
            }
            for name, v in per.items()
        },
        "p50_ratio_per_round": [round(x, 2) for x in ratio],
        "p50_ratio": round(median(ratio) or 0, 2),
    }


def stream_rounds(proxy: str, sse_port: int, events: int, rounds: int) -> dict[str, Any]:
    """SSE MB/s and events/s per round, direct and through the gateway, and their ratios."""
    paths = {
        "direct": (httpx.Client(timeout=120), f"http://{UPSTREAM_IP}:{sse_port}/mcp"),
        "gateway": (httpx.Client(proxy=proxy, timeout=120), f"http://{HOST}:{sse_port}/mcp"),
    }
    per: dict[str, list[tuple[float, float, int]]] = {name: [] for name in paths}
    try:
        for http, url in paths.values():
            _read_stream(http, url, events + 1)  # warm-up
        for r in range(rounds):
            for name in list(paths) if r % 2 == 0 else list(reversed(paths)):
                http, url = paths[name]
                seconds, size, count = _read_stream(http, url, events + 1)
                per[name].append((size / seconds / 1e6, count / seconds, size))
    finally:
        for http, _ in paths.values():
            http.close()
    ratio = [g[0] / d[0] for g, d in zip(per["gateway"], per["direct"], strict=True)]
    return {
        "events": events + 1,
        "bytes": per["direct"][0][2] if per["direct"] else 0,
        "rows": {
            name: {
                "mb_per_s": round(median([m for m, _, _ in v]) or 0, 1),
                "events_per_s": round(median([e for _, e, _ in v]) or 0),
                "mb_per_s_per_round": [round(m, 1) for m, _, _ in v],
            }
            for name, v in per.items()
        },
        "ratio_per_round": [round(x, 2) for x in ratio],
        "ratio": round(median(ratio) or 0, 2),
    }


# -- the report --------------------------------------------------------------------------------


def _rule_ratios(rows: list[dict[str, Any]]) -> list[str]:
    """Each rule count's p50 over the 0-rule p50, per round (taken seconds apart), then the median."""
    base = next((r for r in rows if r["what"] == "read and decide" and r["extra_rules"] == 0), None)
    if base is None:
        return []
    lines = [""]
    for row in rows:
        if row["what"] != "read and decide" or row is base:
            continue
        per = [x / b for x, b in zip(row["p50_per_round"], base["p50_per_round"], strict=True) if b > 0]
        shown = ", ".join(f"{x:.2f}" for x in per)
        lines.append(f"{row['extra_rules']} / 0 extra rules, p50: {shown} → median {median(per) or 0:.2f}×")
    return lines


def report(results: dict[str, Any]) -> str:
    lines = [
        "# sandgate: MCP through the gateway",
        "",
        f"- {results['when']}, {results['rounds']} interleaved rounds, whole run {results['seconds']:.0f} s; "
        f"timer cost {results['timer_ns']} ns (not subtracted)",
        "",
        "## Per-message decision, pure (µs per message, median over rounds)",
        "",
        "| what | extra tool rules | p50 µs | p99 µs | p50 per round |",
        "|---|---:|---:|---:|---|",
    ]
    for row in results["decisions"]:
        n = row["extra_rules"] if row["what"] != "read only" else "–"
        per = ", ".join(f"{x:g}" for x in row["p50_per_round"])
        lines.append(f"| {row['what']} | {n} | {row['p50_us']} | {row['p99_us']} | {per} |")
    lines += _rule_ratios(results["decisions"])
    lat = results["latency"]
    lines += [
        "",
        f"## tools/call latency, one at a time ({lat['calls_per_round']} calls per path per round)",
        "",
        "| path | p50 ms | p99 ms | p50 per round |",
        "|---|---:|---:|---|",
    ]
    for name, row in lat["rows"].items():
        per = ", ".join(f"{x:g}" for x in row["p50_per_round"])
        lines.append(f"| {name} | {row['p50_ms']} | {row['p99_ms']} | {per} |")
    per = ", ".join(f"{x:g}" for x in lat["p50_ratio_per_round"])
    added = ", ".join(f"{x:g}" for x in lat["added_p50_ms_per_round"])
    lines += [
        "",
        f"gateway / direct, p50: {per} → median {lat['p50_ratio']}×",
        f"gateway − direct, p50 ms: {added} → median {lat['added_p50_ms']} ms added per call",
    ]
    sse = results["stream"]
    lines += [
        "",
        f"## SSE stream, {sse['events']:,} events, {sse['bytes'] / 1e6:.1f} MB per answer",
        "",
        "| path | MB/s | events/s | MB/s per round |",
        "|---|---:|---:|---|",
    ]
    for name, row in sse["rows"].items():
        per = ", ".join(f"{x:g}" for x in row["mb_per_s_per_round"])
        lines.append(f"| {name} | {row['mb_per_s']} | {row['events_per_s']:,} | {per} |")
    per = ", ".join(f"{x:g}" for x in sse["ratio_per_round"])
    lines += ["", f"gateway / direct, MB/s: {per} → median {sse['ratio']}×"]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rounds": args.rounds,
        "timer_ns": _timer_cost(),
    }
    print("decision cost", file=sys.stderr, flush=True)
    results["decisions"] = decision_costs(args.decisions, args.rounds)
    with tempfile.TemporaryDirectory(prefix="sgbench-mcp-") as tmp:
        root = Path(tmp)
        with (
            servers(root, args.events, args.event_size) as (mcp_port, sse_port),
            gateway(root, (mcp_port, sse_port)) as proxy,
        ):
            _check_enforcing(proxy, mcp_port)
            print("tools/call latency", file=sys.stderr, flush=True)
            results["latency"] = latency_rounds(proxy, mcp_port, args.calls, args.rounds)
            print("SSE stream", file=sys.stderr, flush=True)
            results["stream"] = stream_rounds(proxy, sse_port, args.events, args.rounds)
    results["seconds"] = time.monotonic() - started
    return results


def main() -> int:
    p = argparse.ArgumentParser(description="MCP through the gateway (loopback only)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=200, help="tools/call per path per round (200)")
    p.add_argument("--decisions", type=int, default=5000, help="timed decisions per section per round")
    p.add_argument("--events", type=int, default=20000, help="SSE events per answer (20000)")
    p.add_argument("--event-size", type=int, default=256, help="bytes per SSE event (256)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 round, a few of each")
    p.add_argument("--markdown", type=Path)
    p.add_argument("--json", type=Path)
    p.add_argument("--serve", choices=("mcp", "sse"), help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve == "mcp":
        serve_mcp(args.port)
        return 0
    if args.serve == "sse":
        serve_sse(args.port, args.events, args.event_size)
        return 0
    if args.quick:
        args.rounds, args.calls, args.decisions, args.events = 1, 5, 50, 200
    results = run(args)
    text = report(results)
    sys.stdout.write(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
