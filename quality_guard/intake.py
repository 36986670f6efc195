"""What the guard lets in: the mirror's authenticity check and the HTTP limits, in front of :mod:`.worker`.

Why a check at all: a guard's verdict takes a pool out of traffic or rolls a canary back, and with the tenant's
consent its input becomes the next Job's calibration data (:mod:`.sample`). So only the copies the model's own
HTTPRoute mirrors may count. The Gateway API's standard filters cannot sign a request, but they can set a header:
the operator puts a per-model random token in a ``RequestHeaderModifier`` filter placed before the
``RequestMirror`` on the model's route (``rerank_operator/core/builders/routing.py``), and the same token in the
guard's environment. A POST without it, or with another, is answered 401, counted (``outcome="unauthenticated"``)
and dropped: never scored, never stored. The token is as secret as the model's HTTPRoute and guard Deployment
(readable by who may read those in the tenant's namespace); the model's NetworkPolicy keeps every other pod from
reaching the guard at all (``rerank_operator/core/tenancy/network.py``), so the token is the second fence, not the
only one.

The HTTP limits: a body must say its length (``Content-Length``, 0..``MAX_BODY_BYTES``; anything else is 400 or 411
or 413 without reading it), a client that has not sent a whole request ``CLIENT_TIMEOUT_SECONDS`` after it began is
cut, however it trickles its bytes (:class:`DeadlineReader`: each read may wait only what is left), and at most
``MAX_CONNECTIONS`` connections are served at once (more are closed at accept): a flood or a slow-loris costs the
guard a bounded number of threads and never its /metrics for long.
"""

from __future__ import annotations

import hmac
import io
import json
import socket
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from rerank_contracts import rerank_api
from rerank_contracts.guard import MIRROR_TOKEN_HEADER

__all__ = ["MIRROR_TOKEN_HEADER", "BoundedServer", "Receiver", "authentic", "body_length", "expected_token",
           "handler", "tei_shaped"]
#: The paths a copy may come to: TEI's own, and the rerank API's (a route's mirror copies every request as it came).
COPY_PATHS = frozenset({rerank_api.TEI_PATH, *rerank_api.API_PATHS})
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Connections served at once; one more is closed as soon as it is accepted.
MAX_CONNECTIONS = 32
#: A client that sends nothing for this long (headers or body) is disconnected.
CLIENT_TIMEOUT_SECONDS = 10.0


class Receiver(Protocol):
    """What the HTTP front hands requests to (``worker.Worker``)."""

    def metrics(self) -> bytes:
        """The Prometheus page."""

    def count(self, outcome: str) -> None:
        """Count a request by what became of it (``rerank_guard_requests_total``)."""

    def receive(self, body: Any) -> bool:
        """An authenticated mirrored copy: keep it (live sample) and offer it for a check; whether it was sampled."""


def expected_token(env_var: str | None, environ: Mapping[str, str], accept_unsigned: bool = False) -> str | None:
    """The token a POST must carry; "" (which nothing matches: fail closed) when the configuration names a variable
    that is unset, or names none without saying ``accept_unsigned``; None (nothing checked) only when it names none
    and says ``accept_unsigned`` (a guard run by hand on a trusted network)."""
    if not env_var:
        return None if accept_unsigned else ""
    return environ.get(env_var, "")


def tei_shaped(path: str, raw: bytes, content_type: str | None) -> Any:
    """A copy's body as TEI's ``{"query", "texts"}``: TEI's own as it came (the worker judges it), a Cohere or Jina
    request read by the rerank API's rules (None when they refuse it: the pools refused it too)."""
    shape = rerank_api.API_PATHS.get(path)
    if shape is None:
        try:
            return json.loads(raw or b"null")
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError; deep nesting recurses
            return None
    try:
        request = rerank_api.parse(shape, raw, content_type)
    except rerank_api.ApiError:
        return None
    return {"query": request.query, "texts": list(request.texts)}


def authentic(expected: str | None, presented: str | None) -> bool:
    """Whether a request carries the mirror's token (constant-time compare; no token configured: every one does)."""
    if expected is None:
        return True
    return bool(expected) and presented is not None and hmac.compare_digest(expected.encode(), presented.encode())


def body_length(header: str | None) -> int | None:
    """``Content-Length`` as a size within bounds, or None when it is missing, not a plain decimal, or negative (a
    sign, spaces or digits beyond what any body here has are refused, not parsed leniently as ``int`` would)."""
    if header is None or not header.isascii() or not header.isdigit() or len(header) > 12:
        return None
    return int(header)


class BoundedServer(ThreadingHTTPServer):
    """A threading HTTP server that serves at most ``MAX_CONNECTIONS`` connections at once."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.slots = threading.BoundedSemaphore(max_connections)
        self.refused = 0
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class DeadlineReader(io.RawIOBase):
    """A socket's reads under one deadline for the whole request: a socket timeout bounds each read, so a client
    sending a byte every few seconds would otherwise keep a connection (and a thread) for ever. Each read waits at
    most what is left until :attr:`deadline` (monotonic), then fails with ``TimeoutError``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline = time.monotonic() + CLIENT_TIMEOUT_SECONDS

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


def handler(receiver: Receiver, token: str | None) -> type[BaseHTTPRequestHandler]:
    """The guard's routes: ``GET /metrics``, ``GET /healthz`` and ``POST`` :data:`COPY_PATHS` (the copies)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = CLIENT_TIMEOUT_SECONDS

        def setup(self) -> None:
            super().setup()
            self.reader = DeadlineReader(self.connection)
            self.rfile = io.BufferedReader(self.reader)

        def handle_one_request(self) -> None:
            self.reader.deadline = time.monotonic() + CLIENT_TIMEOUT_SECONDS  # each request, its own deadline
            super().handle_one_request()

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the metrics say what happened
            return

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _refuse(self, code: int, outcome: str) -> None:
            """Answer without reading the body, and close: what was not read must not be taken as a next request."""
            receiver.count(outcome)
            self.close_connection = True
            self._send(code, b"{}")

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, receiver.metrics(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            if self.path not in COPY_PATHS:
                self._refuse(404, "invalid")
                return
            if not authentic(token, self.headers.get(MIRROR_TOKEN_HEADER)):
                self._refuse(401, "unauthenticated")
                return
            if self.headers.get("Transfer-Encoding"):
                self._refuse(411, "invalid")
                return
            length = body_length(self.headers.get("Content-Length"))
            if length is None:
                self._refuse(400, "invalid")
                return
            if length > MAX_BODY_BYTES:
                self._refuse(413, "invalid")
                return
            try:
                raw = self.rfile.read(length)
            except OSError:  # a timeout is one
                self.close_connection = True
                receiver.count("invalid")
                return
            if len(raw) < length:  # the client closed early
                self._refuse(400, "invalid")
                return
            sampled = receiver.receive(tei_shaped(self.path, raw, self.headers.get("Content-Type")))
            self._send(202, json.dumps({"sampled": sampled}).encode())

    return Handler
