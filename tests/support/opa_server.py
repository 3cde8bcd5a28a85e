"""A small OPA-compatible HTTP server on loopback, backed by the embedded Rego interpreter.

No OPA server binary is available on these machines (not in Debian, PyPI or npm), so the
`opa` engine is tested against this: the parts of OPA's REST API sandgate uses, with
OPA's shapes, evaluated by regopy (the interpreter behind the embedded engine).

    GET    /health                      200 {}
    GET    /v1/policies                 {"result": [{"id": ..., "raw": ...}]}
    PUT    /v1/policies/<id>            text/plain Rego; 400 with OPA's error shape if it does not compile
    DELETE /v1/policies/<id>
    PUT    /v1/data/<path>              JSON document at data.<path>; 204
    POST   /v1/data/<path>              {"input": ...} → {"result": value}, or {} when undefined

`fault` makes it misbehave for fail-closed tests: "slow" (sleeps `delay` s), "garbage"
(a body that is not JSON), "status500", "close" (drops the connection), "not_object"
(a JSON array). `connections` counts accepted TCP connections (connection reuse).

`start_real_opa(binary)` runs a real `opa run --server` instead, for SANDGATE_OPA_BIN.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from regopy import Input, Interpreter, LogLevel, RegoError
from regopy.rego_shared import (
    rego_bundle_query_entrypoint,
    rego_free_output,
    rego_output_ok,
    rego_output_string,
)

from .ports import free_port

__all__ = ["FakeOpaServer", "RealOpa", "start_real_opa"]


class FakeOpaServer:
    """OPA's Data and Policy APIs on 127.0.0.1 (or `host`:`port`), evaluated with regopy; a
    context manager. The socket is bound here, in the caller's network namespace."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.policies: dict[str, str] = {}
        self.data: dict[str, Any] = {}
        self.fault: str | None = None
        self.delay = 0.0
        self.connections = 0
        self.queries = 0
        self._lock = threading.Lock()
        self._bundles: dict[str, Any] = {}
        self._host = host
        self._server = _Server((host, port), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-opa", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._server.server_address[1]}"

    def __enter__(self) -> FakeOpaServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def reset(self) -> None:
        with self._lock:
            self.policies.clear()
            self.data.clear()
            self._bundles.clear()
            self.fault, self.delay = None, 0.0

    # --- the API ----------------------------------------------------------------------------

    def put_policy(self, pid: str, text: str) -> dict[str, Any] | None:
        """Store a module; OPA's error document when it does not compile with the others."""
        with self._lock:
            candidate = {**self.policies, pid: text}
            problem = _compile_problem(candidate)
            if problem:
                return {
                    "code": "invalid_parameter",
                    "message": "error(s) occurred while compiling module(s)",
                    "errors": [{"code": "rego_parse_error", "message": problem, "location": {"file": pid}}],
                }
            self.policies = candidate
            self._bundles.clear()
            return None

    def put_data(self, path: list[str], value: Any) -> None:
        with self._lock:
            if not path:
                self.data = value if isinstance(value, dict) else {}
            else:
                node = self.data
                for part in path[:-1]:
                    node = node.setdefault(part, {})
                node[path[-1]] = value
            self._bundles.clear()

    def query(self, path: list[str], document: Any) -> dict[str, Any]:
        """OPA's answer for POST /v1/data/<path>: {"result": v} or {} (undefined)."""
        entrypoint = "/".join(path)
        with self._lock:
            self.queries += 1
            bundle = self._bundles.get(entrypoint)
            if bundle is None:
                bundle = self._bundles[entrypoint] = _build(self.policies, self.data, entrypoint)
            runner = Interpreter()
            runner.log_level = LogLevel.NONE
            runner.set_input(Input(document))
            out = rego_bundle_query_entrypoint(runner._impl, bundle._impl, entrypoint)
            try:
                if not rego_output_ok(out):
                    raise ValueError("evaluation failed")
                text = rego_output_string(out)
            finally:
                rego_free_output(out)
        if text == "undefined":
            return {}
        parsed = json.loads(text)
        return {"result": parsed["expressions"][0]}


def _compile_problem(policies: dict[str, str]) -> str:
    r = Interpreter()
    r.log_level = LogLevel.NONE
    try:
        for pid, text in policies.items():
            r.add_module(pid, text)
        bundle = r.build("x := true", [])
    except RegoError as e:
        return str(e)[:500]
    return "" if bundle.ok() else "the modules do not compile"


def _build(policies: dict[str, str], data: dict[str, Any], entrypoint: str) -> Any:
    r = Interpreter()
    r.log_level = LogLevel.NONE
    for pid, text in policies.items():
        r.add_module(pid, text)
    r.add_data(data)
    bundle = r.build(None, [entrypoint])
    if not bundle.ok():
        raise ValueError("the policies do not compile")
    return bundle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FakeOpaServer

    def get_request(self) -> tuple[socket.socket, Any]:
        conn = super().get_request()
        self.owner.connections += 1
        return conn

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client closing its kept-alive connection (as the push CLI does when done) resets
        # the read of a next request: not a fault of the server. The traceback would go to the
        # test's captured stderr, where the CLI's own errors are checked.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: Any) -> None:
        self._send(status, json.dumps(value).encode())

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        owner = self.server.owner
        if self.path.startswith("/health"):
            self._json(200, {})
        elif self.path.rstrip("/") == "/v1/policies":
            self._json(200, {"result": [{"id": k, "raw": v} for k, v in owner.policies.items()]})
        else:
            self._json(404, {"code": "resource_not_found", "message": "not found"})

    def do_PUT(self) -> None:
        owner = self.server.owner
        body = self._body()
        if self.path.startswith("/v1/policies/"):
            error = owner.put_policy(self.path.removeprefix("/v1/policies/"), body.decode())
            if error:
                self._json(400, error)
            else:
                self._json(200, {})
        elif self.path.startswith("/v1/data"):
            owner.put_data(_data_path(self.path), json.loads(body or b"null"))
            self._send(204, b"")
        else:
            self._json(404, {"code": "resource_not_found", "message": "not found"})

    def do_DELETE(self) -> None:
        owner = self.server.owner
        pid = self.path.removeprefix("/v1/policies/")
        with owner._lock:
            owner.policies.pop(pid, None)
            owner._bundles.clear()
        self._json(200, {})

    def do_POST(self) -> None:
        owner = self.server.owner
        body = self._body()
        fault = owner.fault
        if fault == "slow":
            time.sleep(owner.delay)
        elif fault == "close":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        elif fault == "garbage":
            self._send(200, b"<html>not json</html>", "text/html")
            return
        elif fault == "status500":
            self._json(500, {"code": "internal_error", "message": "boom"})
            return
        elif fault == "not_object":
            self._json(200, ["not", "an", "object"])
            return
        if not self.path.startswith("/v1/data"):
            self._json(404, {"code": "resource_not_found", "message": "not found"})
            return
        try:
            document = json.loads(body or b"{}").get("input")
            answer = owner.query(_data_path(self.path), document)
        except (ValueError, RegoError) as e:
            self._json(500, {"code": "internal_error", "message": str(e)[:200]})
            return
        self._json(200, answer)


def _data_path(path: str) -> list[str]:
    rest = path.split("?", 1)[0].removeprefix("/v1/data").strip("/")
    return [p for p in rest.split("/") if p]


class RealOpa:
    """A real `opa run --server` process on loopback (when SANDGATE_OPA_BIN names a binary)."""

    def __init__(self, binary: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "run", "--server", "--addr", f"127.0.0.1:{self.port}", "--log-level", "error"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"opa did not start on port {self.port}") from None
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        with urllib.request.urlopen(f"{self.url}/v1/policies") as r:
            for p in json.load(r).get("result", []):
                req = urllib.request.Request(f"{self.url}/v1/policies/{p['id']}", method="DELETE")
                urllib.request.urlopen(req).close()
        req = urllib.request.Request(
            f"{self.url}/v1/data", data=b"{}", method="PUT", headers={"Content-Type": "application/json"}
        )
        urllib.request.urlopen(req).close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_real_opa(binary: str | Path) -> RealOpa:
    """Start a real OPA server; the caller stops it."""
    return RealOpa(str(binary))
