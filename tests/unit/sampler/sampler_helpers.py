"""What the sampler's tests share: a TEI stand-in, a guard stand-in, a started sampler, and plain HTTP clients.

Nothing here stands in for the sampler: it is its real server on real ports. TEI's stand-in is a stdlib HTTP/1.1
server that answers ``/rerank`` with a JSON list and writes every header itself (no ``Date``, no ``Server``), so that
two answers to the same request are the same bytes; it records what reaches it. The guard's stand-in records the
copies it receives and answers 202, as ``quality_guard/intake.py`` does; :class:`Hanging` accepts and never answers.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rerank_devcluster.processes import free_port
from rerank_sampler import server

TOKEN = secrets.token_hex(16)
RERANK = b'{"query":"what is a panda?","texts":["a bear","a city"]}'


@dataclass
class Seen:
    """One request as a stand-in received it."""

    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


class _Listener(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as TEI's server does: a head and a body
        return sock, address                                         # written apart are not held for an ACK

    def handle_error(self, request: Any, client_address: Any) -> None:  # a client the test cut off: expected
        return


@dataclass
class Tei:
    """TEI's stand-in: ``POST /rerank`` answers a score per text (422 when the query is empty), ``GET /health`` 200,
    ``GET /metrics`` a TEI-like series, ``/slow?s=`` after a pause, ``/stream`` a chunked answer, others 404.
    ``idle_timeout``: how long it keeps an idle keep-alive connection before closing it (as hyper does)."""

    idle_timeout: float | None = None
    seen: list[Seen] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        tei = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = self.idle_timeout

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _answer(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response_only(status)
                self.send_header("Content-Type", ctype)
                self.send_header("X-Tei-Stand-In", "1")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with tei._lock:
                    tei.seen.append(Seen(self.command, self.path, list(self.headers.items()), body))
                path, _, query = self.path.partition("?")
                if path == "/rerank" and self.command == "POST":
                    request = json.loads(body)
                    if not request.get("query"):
                        self._answer(422, b'{"error":"`query` cannot be empty","error_type":"Validation"}')
                        return
                    scores = [{"index": i, "score": round(1 / (i + 2), 6)} for i in range(len(request["texts"]))]
                    self._answer(200, json.dumps(scores).encode())
                elif path == "/health":
                    self._answer(200, b"")
                elif path == "/metrics":
                    self._answer(200, b"te_request_count 7\n", "text/plain; version=0.0.4")
                elif path == "/slow":
                    time.sleep(float(query.removeprefix("s=")))
                    self._answer(200, b'"slow"')
                elif path == "/stream":
                    self.send_response_only(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for piece in (b"data: 1\n\n", b"data: 2\n\n", b"x" * 100_000):
                        self.wfile.write(b"%x\r\n%b\r\n" % (len(piece), piece))
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self._answer(404, b'{"error":"not found"}')

            do_GET = do_POST = do_HEAD = do_PUT = _handle

        self.server = _Listener(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Guard:
    """The guard's stand-in: records every POST and answers 202 (HTTP/1.0 and a closed connection, as the guard);
    on ``port``, or a free one."""

    port: int = 0
    received: list[Seen] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        guard = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with guard._lock:
                    guard.received.append(Seen("POST", self.path, list(self.headers.items()), body))
                self.send_response(202)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.server = _Listener(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def count(self) -> int:
        with self._lock:
            return len(self.received)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Hanging:
    """A guard that accepts connections, reads what comes, and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def stop(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def nowhere() -> str:
    """A URL nothing listens on."""
    return f"http://127.0.0.1:{free_port()}"


@contextlib.contextmanager
def sampler(upstream: str, guard_url: str, fraction: float = 1.0, **options: Any) -> Iterator[server.Running]:
    """A running sampler on free ports (``options``: :class:`rerank_sampler.server.Settings`' other fields)."""
    settings = server.Settings(guard_url=guard_url, token=TOKEN, fraction=fraction, upstream=upstream,
                               **{"seed": 1, **options})
    running = server.start(settings)
    try:
        yield running
    finally:
        running.stop()


@dataclass(frozen=True)
class Reply:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


def _connection(base: str, timeout: float) -> http.client.HTTPConnection:
    host, port = base.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def ask(conn: http.client.HTTPConnection, method: str, path: str, headers: dict[str, str] | None = None,
        body: bytes | None = None) -> Reply:
    """One request on ``conn`` (kept alive)."""
    conn.request(method, path, body=body, headers=dict(headers or {}))
    response = conn.getresponse()
    return Reply(response.status, response.reason, response.getheaders(), response.read())


def call(base: str, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None,
         timeout: float = 30.0) -> Reply:
    """One request on a fresh connection; ``body`` None sends no body at all."""
    conn = _connection(base, timeout)
    try:
        return ask(conn, method, path, headers, body)
    finally:
        conn.close()


@contextlib.contextmanager
def kept_alive(base: str, timeout: float = 30.0) -> Iterator[http.client.HTTPConnection]:
    conn = _connection(base, timeout)
    try:
        yield conn
    finally:
        conn.close()


def raw_answer(base: str, request: bytes, timeout: float = 10.0) -> bytes:
    """Write ``request`` as is and read one answer, byte for byte: its head and the ``Content-Length`` bytes after."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        stated = [int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                  if line.lower().startswith(b"content-length:")]
        want = stated[0] if stated else 0
        while len(rest) < want and (chunk := s.recv(65536)):
            rest += chunk
        return head + b"\r\n\r\n" + rest


def raw_until_closed(base: str, request: bytes, timeout: float = 10.0) -> bytes:
    """Write ``request`` as is and read until the other side closes (or ``timeout``)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := s.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def samples(metrics_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The sampler's /metrics page as {(sample name, sorted labels): value}."""
    text = call(metrics_url, "GET", "/metrics").body.decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def counts(metrics_url: str, family: str) -> dict[str, float]:
    """``rerank_sampler_<family>_total`` by outcome."""
    return {dict(labels)["outcome"]: v for (name, labels), v in samples(metrics_url).items()
            if name == f"rerank_sampler_{family}_total"}
