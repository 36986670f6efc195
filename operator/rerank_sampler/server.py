"""The sampler's HTTP fronts: the serving port (TEI's, proxied) and the metrics port (its own).

Every request on the serving port goes to TEI as it came (:mod:`.relay`) and TEI's answer comes back as it went,
except the sampler's one own route, ``GET`` :data:`rerank_contracts.guard.SAMPLER_HEALTH_PATH`, answered 200 by the
sampler itself so that the kubelet probes the sampler without reaching TEI (TEI's own ``/health`` passes through, as
do ``/metrics``, ``/info`` and the rest). Once a ``/rerank`` answer has been written to its client, the request is
offered to the sampling (:mod:`.sampling`), which may queue a copy for the guard.

What the sampler refuses itself, before anything reaches TEI, is only what it cannot forward faithfully: a body beyond
``max_body_bytes`` or framed ambiguously (:mod:`.framing`: 400, 413, 501), a header value with a line break or a
target with a control character (:class:`.relay.Unforwardable`: 400); each answered without reading further and the
connection closed.

Latency: the client's socket has Nagle's algorithm off, an answer up to :data:`BUFFER_BYTES` is read whole and
written in one send together with its head, and TEI's connections are kept alive (:class:`.relay.Pool`); a larger
answer, or one whose length TEI does not state, is streamed as it arrives (re-chunked for an HTTP/1.1 client).

One thread per client connection (a gateway keeps a few alive and sends on each in turn), at most
``max_connections`` open at once (more are closed at accept). On SIGTERM (:meth:`Running.drain`) the listener closes
at once, the requests in flight are finished (each answered with ``Connection: close``), the queued copies get a
short grace, and the process ends.
"""

from __future__ import annotations

import hmac
import http
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rerank_contracts import guard, rerank_api

from .framing import Gone, Refused, read_body
from .metrics import CONTENT_TYPE, Metrics
from .relay import (
    READ_TIMEOUT_SECONDS,
    REQUEST_ONLY,
    Exchange,
    Outgoing,
    Pool,
    Unforwardable,
    UpstreamError,
    end_to_end,
)
from .sampling import COPY_TIMEOUT_SECONDS, QUEUE_BYTES, QUEUE_SIZE, SAMPLED_PATHS, Courier, Draw
from .translation import ApiSettings, Translator

#: How long a client connection may sit idle (or stall mid-request) before it is closed: longer than the idle
#: timeouts of the gateways' upstream pools (nginx 60 s, Traefik 90 s), so that the gateway closes an idle connection
#: first and never sends on one the sampler is closing.
CLIENT_TIMEOUT_SECONDS = 120.0
#: TEI's own default ``--payload-limit`` is 2 MB; the sampler holds a request's body whole, up to this.
MAX_BODY_BYTES = 2 * 1024 * 1024
MAX_CONNECTIONS = 1024
#: Answers up to this size are read whole and written in one send; larger ones are streamed.
BUFFER_BYTES = 1024 * 1024
STREAM_BYTES = 64 * 1024
#: On SIGTERM: how long the requests in flight are given, then the copies still queued.
DRAIN_SECONDS = 10.0
COPIES_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class Settings:
    """``guard_url``: the model's quality guard (None: an unguarded model, nothing is copied); ``api``: the rerank
    API's settings (:mod:`.translation`)."""

    guard_url: str | None
    token: str
    fraction: float
    api: ApiSettings = field(default_factory=ApiSettings)
    upstream: str = "http://127.0.0.1:8080"
    queue_size: int = QUEUE_SIZE
    queue_bytes: int = QUEUE_BYTES
    max_body_bytes: int = MAX_BODY_BYTES
    max_connections: int = MAX_CONNECTIONS
    upstream_timeout: float = READ_TIMEOUT_SECONDS
    copy_timeout: float = COPY_TIMEOUT_SECONDS
    seed: int | None = None


class Front(ThreadingHTTPServer):
    """A threading HTTP server with at most ``max_connections`` connections open (more are closed at accept) that
    counts the requests in flight, for the drain."""

    daemon_threads = True
    #: The listen backlog: a gateway opens many connections at once when a burst arrives (socketserver's 5 overflow,
    #: and the kernel answers the surplus with resets). The kernel caps it at net.core.somaxconn.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int) -> None:
        self.max_connections = max_connections
        self.open_connections = 0
        self.closed_at_accept = 0
        self.in_flight = 0
        self.draining = False
        self._count = threading.Condition()
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a streamed answer goes out in several writes
        return sock, address

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._count:
            if self.open_connections >= self.max_connections:
                self.closed_at_accept += 1
                return False  # socketserver closes it unanswered
            self.open_connections += 1
            return True

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except BaseException:
            self._closed()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._closed()

    def _closed(self) -> None:
        with self._count:
            self.open_connections -= 1

    def begin(self) -> None:
        with self._count:
            self.in_flight += 1

    def end(self) -> None:
        with self._count:
            self.in_flight -= 1
            self._count.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for no request to be in flight; whether none is."""
        with self._count:
            return self._count.wait_for(lambda: self.in_flight == 0, timeout)


def _from_the_guard(presented: str | None, token: str) -> bool:
    """A request carrying the model's mirror token is the guard's own check of this pool: copying it back to the guard
    would feed the guard its own calls (the token is stripped before TEI either way)."""
    return presented is not None and bool(token) and hmac.compare_digest(presented.encode(), token.encode())


def handler(settings: Settings, pool: Pool, courier: Courier, metrics: Metrics) -> type[BaseHTTPRequestHandler]:
    """The serving port's request handler class."""
    translator = Translator(pool, settings.api, metrics)

    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive for the gateway's connection pool
        timeout = CLIENT_TIMEOUT_SECONDS
        server: Front

        def log_message(self, format: str, *args: Any) -> None:  # the metrics count; one line a request is noise
            return

        def _serve(self) -> None:
            self.server.begin()
            try:
                self._proxy()
            finally:
                self.server.end()

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _serve

        def _proxy(self) -> None:
            if self.server.draining or self.request_version != "HTTP/1.1":
                self.close_connection = True
            path = self.path.partition("?")[0]
            if path == guard.SAMPLER_HEALTH_PATH and self.command in ("GET", "HEAD"):
                if "Content-Length" in self.headers or "Transfer-Encoding" in self.headers:
                    self.close_connection = True  # a body nobody reads
                self._own(200, b"ok\n", "text/plain; charset=utf-8")
                return
            try:
                body = read_body(self.headers, self.rfile, settings.max_body_bytes)
            except Refused as refused:
                metrics.request("invalid")
                self.close_connection = True
                self._error(refused.status, refused.error)
                return
            except Gone:  # no answer it would read
                metrics.request("invalid")
                self.close_connection = True
                return
            shape = rerank_api.API_PATHS.get(path)
            if shape is not None and self.command == "POST":
                self._translate(shape, body)
                return
            request = Outgoing(self.command, self.path, end_to_end(self.headers.items(), REQUEST_ONLY), body)
            try:
                exchange = pool.send(request)
            except Unforwardable as exc:
                metrics.request("invalid")
                self.close_connection = True
                self._error(400, f"the request cannot be forwarded: {exc}")
                return
            except UpstreamError as exc:
                metrics.request("upstream_error")
                self._error(exc.status, f"the model server gave no usable answer: {exc}")
                return
            try:
                whole = self._relay(exchange)
            finally:
                exchange.release()
            if (whole and self.command == "POST" and path in SAMPLED_PATHS and 200 <= exchange.status < 300
                    and body is not None and not _from_the_guard(self.headers.get(guard.MIRROR_TOKEN_HEADER),
                                                                 settings.token)):
                courier.offer(path, self.headers.get("Content-Type"), body)  # after the answer: off its path

        def _translate(self, shape: rerank_api.Shape, body: bytes | None) -> None:
            """A Cohere or Jina request, answered through TEI's own routes; what TEI scored is offered to the
            sampling after the answer is written, as a request to TEI's route would be."""
            scored: list[bytes] = []
            sampled = not _from_the_guard(self.headers.get(guard.MIRROR_TOKEN_HEADER), settings.token)
            status, payload = translator.handle(shape, self.headers.items(), body, self.headers.get("Content-Type"),
                                                scored.append)
            metrics.request("translated")
            self._own(status, json.dumps(payload, ensure_ascii=False).encode(), "application/json")
            if sampled and status == 200:
                for copy in scored:
                    courier.offer(rerank_api.TEI_PATH, "application/json", copy)

        def _relay(self, exchange: Exchange) -> bool:
            """Write TEI's answer to the client, and count it before the write that completes it (a client that has
            its answer finds it counted); whether TEI answered in full (a client that leaves meanwhile is not TEI's
            failure)."""
            length = exchange.length
            if length is None and self.request_version != "HTTP/1.1":
                self.close_connection = True  # an HTTP/1.0 client: the end of the body is the end of the connection
            if length is not None and length <= BUFFER_BYTES:
                try:
                    body = exchange.read_all()
                except UpstreamError as exc:  # nothing written yet: the client still gets an answer
                    metrics.request("upstream_error")
                    self._error(exc.status, f"the model server broke off its answer: {exc}")
                    return False
                metrics.request("proxied")
                self._write(self._head(exchange.status, exchange.reason, exchange.headers) + body)
                return True
            chunked = length is None and self.request_version == "HTTP/1.1"
            headers = [*exchange.headers, ("Transfer-Encoding", "chunked")] if chunked else exchange.headers
            if not self._write(self._head(exchange.status, exchange.reason, headers)):
                metrics.request("proxied")
                return True
            while True:
                try:
                    piece = exchange.read_some(STREAM_BYTES)
                except UpstreamError:
                    metrics.request("upstream_error")
                    self.close_connection = True  # the head is out: cutting the connection is the only signal left
                    return False
                framed = b"%x\r\n%b\r\n" % (len(piece), piece) if chunked and piece else piece
                if exchange.done:
                    metrics.request("proxied")
                    self._write(framed + (b"0\r\n\r\n" if chunked else b""))
                    return True
                if not self._write(framed):
                    metrics.request("proxied")
                    return True

        def _head(self, status: int, reason: str, headers: list[tuple[str, str]]) -> bytes:
            lines = [f"HTTP/1.1 {status} {reason}\r\n", *(f"{name}: {value}\r\n" for name, value in headers)]
            if self.server.draining:  # began before the drain: answered, and the connection closed after it
                self.close_connection = True
            if self.close_connection:
                lines.append("Connection: close\r\n")
            lines.append("\r\n")
            return "".join(lines).encode("latin-1")  # http.client decoded them as latin-1: the same bytes back

        def _write(self, data: bytes) -> bool:
            try:
                self.wfile.write(data)
                return True
            except OSError:  # the client left
                self.close_connection = True
                return False

        def _own(self, status: int, body: bytes, content_type: str) -> None:
            headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
            self._write(self._head(status, http.HTTPStatus(status).phrase, headers)
                        + (b"" if self.command == "HEAD" else body))

        def _error(self, status: int, error: str) -> None:
            self._own(status, json.dumps({"error": error}).encode(), "application/json")

    return Proxy


def metrics_handler(metrics: Metrics) -> type[BaseHTTPRequestHandler]:
    """The metrics port: ``GET /metrics``, nothing else."""

    class Page(BaseHTTPRequestHandler):
        timeout = 10.0

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            found = self.path.partition("?")[0] == "/metrics"
            body = metrics.page() if found else b"not found\n"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", CONTENT_TYPE if found else "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Page


class MetricsFront(ThreadingHTTPServer):
    daemon_threads = True


@dataclass
class Running:
    """A started sampler: its two servers, TEI's connection pool, the courier and the counters."""

    front: Front
    metrics_front: MetricsFront
    threads: list[threading.Thread]
    pool: Pool
    courier: Courier
    metrics: Metrics

    @property
    def url(self) -> str:
        host, port = self.front.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def metrics_url(self) -> str:
        host, port = self.metrics_front.server_address[:2]
        return f"http://{host!s}:{port}"

    def drain(self, grace: float = DRAIN_SECONDS, copies_grace: float = COPIES_GRACE_SECONDS) -> bool:
        """Stop listening, give the requests in flight up to ``grace`` s and the queued copies up to
        ``copies_grace`` s, then close everything; whether every request in flight was finished."""
        self.front.draining = True
        self.front.shutdown()
        self.front.server_close()  # new connections are refused from here on
        drained = self.front.wait_idle(grace)
        self.courier.stop(copies_grace)
        self.metrics_front.shutdown()
        self.metrics_front.server_close()
        self.pool.close()
        return drained

    def stop(self) -> None:
        """Stop at once (tests): what is in flight or queued is abandoned."""
        self.drain(grace=0.0, copies_grace=0.0)
        for thread in self.threads:
            thread.join(timeout=10)


def start(settings: Settings, host: str = "127.0.0.1", port: int = 0, metrics_port: int = 0) -> Running:
    """Serve both ports in background threads and start the courier."""
    fraction = settings.fraction if settings.guard_url else 0.0
    metrics = Metrics(fraction)
    courier = Courier(settings.guard_url, settings.token, metrics, Draw(fraction, settings.seed),
                      queue_size=settings.queue_size, queue_bytes=settings.queue_bytes,
                      timeout=settings.copy_timeout)
    metrics.queued = courier.queued
    pool = Pool(settings.upstream, settings.upstream_timeout)
    front = Front((host, port), handler(settings, pool, courier, metrics), settings.max_connections)
    try:
        metrics_front = MetricsFront((host, metrics_port), metrics_handler(metrics))
    except BaseException:
        front.server_close()
        raise
    threads = [threading.Thread(target=front.serve_forever, args=(0.25,), name="sampler-http", daemon=True),
               threading.Thread(target=metrics_front.serve_forever, args=(0.25,), name="sampler-metrics", daemon=True)]
    for thread in threads:
        thread.start()
    courier.start()
    return Running(front, metrics_front, threads, pool, courier, metrics)
