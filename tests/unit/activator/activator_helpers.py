"""What the activator's tests share: a started activator, a pool that starts listening late, and plain HTTP clients.

Nothing here stands in for HTTP: the activator is its real server on a real port, the pool a stdlib HTTP server that
binds its port only after ``delay`` seconds (a pod starting), and the clients write bytes on sockets. The one thing
replaced is the API server the activator asks for a Service's ready endpoints: every Service is on this machine, at
its own port (``locate_locally``; ``endpoints.py`` is tested on its own and against a real API server).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import json
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rerank_activator import server
from rerank_contracts.activator import MODEL_HEADER, PENDING_PATH, TOKEN_HEADER, UPSTREAM_HEADER, pending_token
from rerank_devcluster.processes import free_port
from rerank_devcluster.waiting import eventually

KEY = secrets.token_hex(24).encode()  # 48 characters, as the chart's generated Secret
MODEL = "tenant-a/m1"
#: Fast retries so that tests measure the activator, not its pauses.
FAST = {"pause": 0.05, "connect_timeout": 0.5}


def locate_locally(namespace: str, service: str, port: int) -> list[tuple[str, int]]:
    """Every Service is on this machine, at its port (there is no API server in a unit test)."""
    return [("127.0.0.1", port)]


def upstream_of(port: int, namespace: str = "tenant-a", service: str = "m1-cpu") -> str:
    return f"http://{service}.{namespace}.svc:{port}"


def signed(model: str, upstream: str, key: bytes = KEY) -> dict[str, str]:
    """The three headers the model's route sets; the token computed here by hand, as the contract describes it."""
    digest = hmac.new(key, f"{model}\n{upstream}".encode(), hashlib.sha256).hexdigest()
    return {MODEL_HEADER: model, UPSTREAM_HEADER: upstream, TOKEN_HEADER: digest}


@contextlib.contextmanager
def activator(hold_seconds: float = 10.0, remember_seconds: float = 60.0, **limits: Any) -> Iterator[server.Running]:
    """A running activator on a free port (``limits``: max_connections, max_body_bytes; holder timings)."""
    holder = {**FAST, **{k: limits.pop(k) for k in list(limits) if k in ("pause", "connect_timeout", "read_timeout")}}
    settings = server.Settings(key=KEY, hold_seconds=hold_seconds, remember_seconds=remember_seconds, **limits)
    running = server.start(settings, locate=locate_locally, holder_options=holder)
    try:
        yield running
    finally:
        running.stop()


@dataclass
class Seen:
    """One request as the pool received it."""

    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes


class _Listener(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a whole burst of held requests connects at once when the pool wakes


@dataclass
class Pool:
    """A TEI pool's stand-in that starts listening ``delay`` s after :meth:`wake`; records what reaches it and answers
    201 with the request's body echoed and an ``X-Pool`` header."""

    delay: float = 1.5
    port: int = field(default_factory=free_port)
    seen: list[Seen] = field(default_factory=list)
    listening_at: float | None = None  # monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def upstream(self) -> str:
        return upstream_of(self.port)

    def wake(self) -> Pool:
        threading.Thread(target=self._listen_later, daemon=True).start()
        return self

    def _listen_later(self) -> None:
        time.sleep(self.delay)
        pool = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _record(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with pool._lock:
                    pool.seen.append(Seen(self.command, self.path, list(self.headers.items()), body))
                self.send_response(201)
                self.send_header("X-Pool", "cpu")
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET = do_PUT = _record

        srv = _Listener(("127.0.0.1", self.port), Handler)
        self._server = srv
        self.listening_at = time.monotonic()
        srv.serve_forever(poll_interval=0.05)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@dataclass(frozen=True)
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(base: str, method: str, path: str, headers: Mapping[str, str] | None = None, body: bytes | None = None,
         timeout: float = 30.0) -> Reply:
    """One request on a fresh connection; ``body`` None sends no body at all."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        response = conn.getresponse()
        return Reply(response.status, response.headers, response.read())
    finally:
        conn.close()


def raw(base: str, data: bytes, timeout: float = 10.0) -> bytes:
    """Write ``data`` as is and read until the activator closes the connection (or ``timeout``)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := s.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def pending(base: str, key: bytes = KEY) -> dict[str, Any]:
    reply = call(base, "GET", PENDING_PATH, {TOKEN_HEADER: pending_token(key)})
    assert reply.status == 200, reply
    models: dict[str, Any] = reply.json()["models"]
    return models


def samples(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The /metrics page as {(sample name, sorted labels): value}."""
    text = call(base, "GET", "/metrics").body.decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def outcome_counts(base: str) -> dict[str, float]:
    return {dict(labels)["outcome"]: v for (name, labels), v in samples(base).items()
            if name == "rerank_activator_requests_total"}



def wait_ready(base: str, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    """Until a ``rerank-activator`` process answers /readyz (failing at once with its stderr if it exits)."""
    def up() -> bool:
        try:
            return call(base, "GET", "/readyz", timeout=2).status == 200
        except OSError:
            assert proc.poll() is None, proc.communicate()[1]
            return False

    eventually(up, timeout=timeout, every=0.1)
