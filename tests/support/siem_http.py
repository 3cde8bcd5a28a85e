"""A local HTTP receiver for SIEM sinks: OTLP/HTTP logs, Splunk HEC and Elasticsearch bulk.

One class, three endpoints, each decoding the wire format the way its real receiver does:
`/v1/logs` parses the protobuf ExportLogsServiceRequest with the official definitions
(opentelemetry-proto; no OpenTelemetry collector installs here), `/services/collector/event`
reads newline-joined HEC event objects and checks `Authorization: Splunk <token>`, `/_bulk`
reads NDJSON `create` actions and answers per item, 409 for an `_id` it holds already.
`script` queues answers for the next requests (a status, a Retry-After, a partial success,
per-item bulk statuses), so a test can make it fail. `stop()` closes the port and every open
connection (an outage); `start()` binds the same port again.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

__all__ = ["Answer", "Received", "SiemReceiver"]


@dataclass(frozen=True)
class Answer:
    """A scripted answer for one request: a status (with Retry-After), or for a 200 a partial
    success rejecting the last `rejected` OTLP records, or per-item bulk statuses."""

    status: int = 200
    retry_after: float | None = None
    rejected: int = 0
    items: tuple[int, ...] = ()


@dataclass(frozen=True)
class Received:
    """One event the receiver accepted: its id, its body and what came beside it."""

    uid: str
    body: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    receiver: SiemReceiver

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client gone mid-answer (cut by stop(), or a sink's timeout): nothing to report


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.receiver._opened(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, headers, payload = self.server.receiver.handle(self.path, dict(self.headers), body)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class SiemReceiver:
    """Receives OTLP, HEC and bulk batches on 127.0.0.1:`port` (0: a free one)."""

    def __init__(self, port: int = 0, *, hec_token: str = "", index: str = "sandgate-audit") -> None:
        self.port = port
        self.hec_token = hec_token
        self.index = index
        self.script: deque[Answer] = deque()
        self.received: list[Received] = []
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, headers) of every POST
        self.ids: set[str] = set()  # bulk documents held (by _id)
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._conns: set[socket.socket] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SiemReceiver:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.receiver = self
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        """Refuse connections from now on and cut the open ones (a receiver gone)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def uids(self) -> list[str]:
        with self._lock:
            return [r.uid for r in self.received]

    def _opened(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.add(conn)

    def _next(self) -> Answer:
        with self._lock:
            return self.script.popleft() if self.script else Answer()

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            self.requests.append((path, headers))
        answer = self._next()
        if answer.status != 200:
            extra = {"Retry-After": str(answer.retry_after)} if answer.retry_after is not None else {}
            return answer.status, extra, b"{}"
        if path == "/v1/logs":
            return self._otlp(body, answer)
        if path == "/services/collector/event":
            return self._hec(headers, body)
        if path == "/_bulk":
            return self._bulk(body, answer)
        return 404, {}, b"{}"

    def _otlp(self, body: bytes, answer: Answer) -> tuple[int, dict[str, str], bytes]:
        request = ExportLogsServiceRequest()
        request.ParseFromString(body)
        got = []
        for rl in request.resource_logs:
            resource = {kv.key: kv.value.string_value for kv in rl.resource.attributes}
            for sl in rl.scope_logs:
                for lr in sl.log_records:
                    attrs = {kv.key: kv.value.string_value for kv in lr.attributes}
                    meta = {**attrs, "resource": resource, "time_unix_nano": lr.time_unix_nano}
                    got.append(Received(attrs["event.id"], json.loads(lr.body.string_value), meta))
        kept = got[: len(got) - answer.rejected]
        with self._lock:
            self.received.extend(kept)
        reply = ExportLogsServiceResponse()
        if answer.rejected:
            reply.partial_success.CopyFrom(
                ExportLogsPartialSuccess(rejected_log_records=answer.rejected, error_message="test rejects")
            )
        return 200, {"Content-Type": "application/x-protobuf"}, reply.SerializeToString()

    def _hec(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        if headers.get("Authorization") != f"Splunk {self.hec_token}":
            return 401, {}, b'{"text":"Invalid authorization","code":3}'
        got = []
        for line in body.decode().split("\n"):
            if line.strip():
                obj = json.loads(line)
                meta = {k: v for k, v in obj.items() if k != "event"}
                got.append(Received(obj["fields"]["event_id"], obj["event"], meta))
        with self._lock:
            self.received.extend(got)
        return 200, {"Content-Type": "application/json"}, b'{"text":"Success","code":0}'

    def _bulk(self, body: bytes, answer: Answer) -> tuple[int, dict[str, str], bytes]:
        lines = [line for line in body.decode().split("\n") if line]
        statuses = deque(answer.items)
        items = []
        with self._lock:
            for action_line, doc_line in zip(lines[::2], lines[1::2], strict=True):
                action = json.loads(action_line)["create"]
                uid = action["_id"]
                status = statuses.popleft() if statuses else (409 if uid in self.ids else 201)
                if status == 201:
                    self.ids.add(uid)
                    self.received.append(Received(uid, json.loads(doc_line), {"_index": action["_index"]}))
                item: dict[str, Any] = {"_index": action["_index"], "_id": uid, "status": status}
                if status >= 300:
                    item["error"] = {"type": "version_conflict_engine_exception" if status == 409 else "test"}
                items.append({"create": item})
        errors = any(i["create"]["status"] >= 300 for i in items)
        reply = json.dumps({"took": 1, "errors": errors, "items": items}).encode()
        return 200, {"Content-Type": "application/json"}, reply
