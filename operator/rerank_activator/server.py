"""The activator's HTTP front: what it lets in, and its own routes.

``GET`` on ``/healthz``, ``/readyz``, ``/metrics`` and ``/pending`` (the latter with the operator's token) are the
activator's own; every other request is one to hold for a sleeping model and must carry the three activate headers
its route sets (:mod:`.contract`). A request is checked in this order, and refused without being held or forwarded:

- the model or the upstream header missing (or given twice): 400 ``invalid``;
- the token missing or not :func:`.contract.token` of that model and upstream: 401 ``unauthenticated``;
- the upstream not a Service of the model's own namespace (:func:`.contract.upstream_allowed`): 400 ``invalid``;
- the body's framing: a chunked body, or none stated on a method that carries one (POST, PUT, PATCH), is 411; a
  ``Content-Length`` that is not plain decimal digits is 400; one over ``max_body_bytes`` is 413; each is answered
  without reading the body, and the connection closed (what was not read must not be taken as a next request);
- past its namespace's share of what the activator holds, or past the whole (:mod:`.admission`): 503 ``overloaded``
  with ``Retry-After``, also before reading the body.

What one connection may cost is bounded: a client that has not sent a whole request (head and body)
:data:`CLIENT_TIMEOUT_SECONDS` after it began (or after its previous answer, on a kept-alive connection) is cut,
however it trickles its bytes (:class:`Deadlines`). Beyond ``max_connections`` open connections a new one waits in
the kernel's queue, first come first served, for up to :data:`ACCEPT_WAIT_SECONDS`, then is closed: a tenant's flood
is answered 503 past its share at once, so the others' requests still find a free connection. A held request is one
thread, sleeping between its connection tries (:mod:`.hold`).

On SIGTERM (:meth:`Running.drain`) ``/readyz`` fails first, so the Service stops sending new requests, then the
listener closes and the requests still held are given until their hold and the pool's answer run out.
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import json
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from rerank_contracts import activator

from .admission import Admission, Ticket, answer_limit
from .endpoints import Address
from .hold import RETRY_AFTER_SECONDS, Board, Holder, refusal
from .logs import LOGGER
from .metrics import Metrics
from .relay import Answer, Held

CLIENT_TIMEOUT_SECONDS = 10.0
#: How long a connection accepted beyond ``max_connections`` waits for a free one before it is closed.
ACCEPT_WAIT_SECONDS = 2.0
#: Methods whose requests carry a body: without a stated length they are refused (411), never read to the end.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_DECIMAL = re.compile(r"[0-9]{1,15}")
#: After /readyz starts failing, how long new requests are still taken while the endpoints catch up.
DRAIN_DELAY_SECONDS = 5.0


@dataclass(frozen=True)
class Settings:
    key: bytes
    #: Keys still accepted besides ``key`` while it is rotated (``activator.read_keys``).
    also_accepted: tuple[bytes, ...] = ()
    hold_seconds: float = 30.0
    remember_seconds: float = 60.0
    max_connections: int = 256
    max_body_bytes: int = 4 * 1024 * 1024
    #: All held requests' large bodies together (:mod:`.admission`; one namespace gets a quarter).
    max_held_bytes: int = 32 * 1024 * 1024
    #: Requests held for one namespace's models at once.
    max_held_per_namespace: int = 64


class Deadlines:
    """Cuts the connections whose request has not been read whole by its deadline: a socket timeout bounds each read,
    not the request, and a client sending a byte every few seconds would keep its connection for ever. One thread
    looks every :data:`TICK_SECONDS` and shuts overdue sockets down, which ends the read blocked on them."""

    TICK_SECONDS = 0.25

    def __init__(self) -> None:
        self._due: dict[int, tuple[Any, float]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        threading.Thread(target=self._run, name="activator-deadlines", daemon=True).start()

    def start(self, sock: Any, seconds: float) -> int:
        """``sock`` must have delivered a whole request within ``seconds``: a ticket for :meth:`stop`."""
        ticket = next(self._ids)
        with self._lock:
            self._due[ticket] = (sock, time.monotonic() + seconds)
        return ticket

    def stop(self, ticket: int) -> None:
        with self._lock:
            self._due.pop(ticket, None)

    def _run(self) -> None:
        while True:
            time.sleep(self.TICK_SECONDS)
            now = time.monotonic()
            with self._lock:
                overdue = [t for t, (_, due) in self._due.items() if due <= now]
                socks = [self._due.pop(t)[0] for t in overdue]
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class Front(ThreadingHTTPServer):
    """A threading HTTP server with at most ``max_connections`` connections open; more are closed at accept."""

    daemon_threads = True
    #: The listen backlog: a gateway opens many connections at once when a burst arrives (socketserver's 5 overflow,
    #: and the kernel answers the surplus with resets). The kernel caps it at net.core.somaxconn.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int) -> None:
        self.max_connections = max_connections
        self.open_connections = 0
        self.closed_at_accept = 0
        self.draining = False
        self.deadlines = Deadlines()
        self._count = threading.Condition()
        super().__init__(address, handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        # Runs in the accepting thread: while it waits, the next connections wait in the kernel's queue, in order.
        with self._count:
            if not self._count.wait_for(lambda: self.open_connections < self.max_connections, ACCEPT_WAIT_SECONDS):
                self.closed_at_accept += 1
                return False  # socketserver closes it unanswered
            self.open_connections += 1
            return True

    def _closed(self) -> None:
        with self._count:
            self.open_connections -= 1
            self._count.notify_all()

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

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that resets its connection is no error of ours (socketserver would print a trace to stderr)."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            logging.getLogger(LOGGER).exception("a connection failed")

    def wait_closed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for every connection to close; whether they did."""
        with self._count:
            return self._count.wait_for(lambda: self.open_connections == 0, timeout)


class _Refused(Exception):
    """The request has been answered with a refusal; nothing more is to be done with it."""


def _single(handler: BaseHTTPRequestHandler, name: str) -> str | None:
    """The header's one value (None when it is missing or given more than once)."""
    values = handler.headers.get_all(name) or []
    return values[0] if len(values) == 1 else None


def handler(settings: Settings, holder: Holder, metrics: Metrics, admission: Admission) -> type[BaseHTTPRequestHandler]:
    """The request handler class of one activator."""
    keys = (settings.key, *settings.also_accepted)
    pending_tokens = [activator.pending_token(k).encode() for k in keys]

    def signed_by_a_key(presented: bytes, token: Callable[[bytes], str]) -> bool:
        """Constant-time against each key (``any`` of a list: every comparison is made)."""
        return any([hmac.compare_digest(presented, token(k).encode()) for k in keys])

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive for the gateway's connection pool
        timeout = CLIENT_TIMEOUT_SECONDS
        server: Front

        def log_message(self, format: str, *args: Any) -> None:  # one structured line per outcome instead
            return

        def handle_one_request(self) -> None:
            self._reading = self.server.deadlines.start(self.connection, CLIENT_TIMEOUT_SECONDS)
            try:
                super().handle_one_request()
            finally:
                self.server.deadlines.stop(self._reading)

        def _answer(self, answer: Answer) -> None:
            if self.server.draining:
                self.close_connection = True
            try:
                self.send_response_only(answer.status)
                for name, value in answer.headers:
                    self.send_header(name, value)
                stated = any(n.lower() == "content-length" for n, _ in answer.headers)  # a HEAD's, relayed
                if answer.status != 204 and not (self.command == "HEAD" and stated):
                    self.send_header("Content-Length", str(len(answer.body)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD" and answer.status not in (204, 304):
                    self.wfile.write(answer.body)
            except OSError:  # the client left; the outcome is counted already
                self.close_connection = True

        def _own(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self._answer(Answer(status, [("Content-Type", content_type)], body, ""))

        def _refuse(self, status: int, outcome: str, error: str) -> _Refused:
            """Refuse a request without reading its body, and close the connection; what to raise."""
            metrics.count(outcome)
            self.close_connection = True
            self._answer(refusal(status, outcome, error))
            return _Refused()

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if path in ("/healthz", "/readyz"):
                ready = path == "/healthz" or not self.server.draining
                self._own(200 if ready else 503, b"ok\n" if ready else b"draining\n")
            elif path == "/metrics":
                self._own(200, metrics.page(), CONTENT_TYPE_LATEST)
            elif path == activator.PENDING_PATH:
                presented = (_single(self, activator.TOKEN_HEADER) or "").encode()
                if not any([hmac.compare_digest(presented, t) for t in pending_tokens]):
                    self._refuse(401, "unauthenticated", "the pending token is missing or wrong")
                    return
                body = json.dumps({"models": holder.board.pending()}, separators=(",", ":")).encode()
                self._own(200, body, "application/json")
            else:
                self._hold()

        def _hold(self) -> None:
            arrived = time.monotonic()
            try:
                request, ticket = self._admit()
            except _Refused:
                return
            self.server.deadlines.stop(self._reading)  # read whole: from here it is the hold that bounds it
            try:
                answer = holder.handle(request, arrived, answer_limit(ticket.body_bytes))
            finally:
                admission.give_back(ticket)
            self._answer(answer)

        def _admit(self) -> tuple[Held, Ticket]:
            """The request as it is to be held, and what it holds; raises :class:`_Refused` once refused."""
            model, upstream = _single(self, activator.MODEL_HEADER), _single(self, activator.UPSTREAM_HEADER)
            if model is None or upstream is None:
                raise self._refuse(400, "invalid", "not a request for a sleeping model")
            presented = (_single(self, activator.TOKEN_HEADER) or "").encode()
            if not signed_by_a_key(presented, lambda k: activator.token(k, model, upstream)):
                raise self._refuse(401, "unauthenticated", "the activation token is missing or wrong")
            if not activator.upstream_allowed(model, upstream):
                raise self._refuse(400, "invalid", "the upstream is not a Service of the model's namespace")
            if not self.path.startswith("/"):
                raise self._refuse(400, "invalid", "the request target must be a path")
            length = self._length()
            ticket = admission.take(model, length or 0)
            if isinstance(ticket, str):
                metrics.count("overloaded")
                self.close_connection = True
                self._answer(refusal(503, "overloaded", f"the activator holds too much: {ticket}",
                                     [("Retry-After", str(RETRY_AFTER_SECONDS))]))
                raise _Refused()
            try:
                body = None if length is None else self._body(length)
            except BaseException:
                admission.give_back(ticket)
                raise
            return Held(self.command, self.path, list(self.headers.items()), body, model, upstream), ticket

        def _length(self) -> int | None:
            """The body's stated length (None: the request states none); raises :class:`_Refused` once refused."""
            if self.headers.get("Transfer-Encoding") is not None:
                raise self._refuse(411, "invalid", "a chunked body is not taken: send Content-Length")
            stated = self.headers.get_all("Content-Length") or []
            if not stated:
                if self.command in BODY_METHODS:
                    raise self._refuse(411, "invalid", "Content-Length is required")
                return None
            if len(stated) > 1 or not _DECIMAL.fullmatch(stated[0]):
                raise self._refuse(400, "invalid", "Content-Length must be one decimal number")
            length = int(stated[0])
            if length > settings.max_body_bytes:
                raise self._refuse(413, "invalid", f"the body is larger than {settings.max_body_bytes} bytes")
            return length

        def _body(self, length: int) -> bytes:
            """The whole body of ``length`` bytes; raises :class:`_Refused` when the client stops short of it."""
            try:
                body = self.rfile.read(length)
            except OSError:  # stalled past the client timeout, or reset
                body = b""
            if len(body) < length:  # the client is gone or stalled: no answer it would read
                metrics.count("invalid")
                self.close_connection = True
                raise _Refused()
            return body

        do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _hold

    return Handler


@dataclass
class Running:
    """A started activator: its server, the thread serving it, and what it holds."""

    server: Front
    thread: threading.Thread
    holder: Holder
    metrics: Metrics

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def drain(self, delay: float = DRAIN_DELAY_SECONDS, grace: float | None = None) -> bool:
        """Fail /readyz, keep taking requests for ``delay`` s, stop listening, then wait up to ``grace`` s (default:
        a whole hold and a whole answer) for the held requests; whether every connection closed."""
        self.server.draining = True
        time.sleep(delay)
        self.server.shutdown()
        if grace is None:
            grace = self.holder.hold_seconds + self.holder.read_timeout + CLIENT_TIMEOUT_SECONDS
        done = self.server.wait_closed(grace)
        self.server.server_close()
        return done

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def start(settings: Settings, host: str = "127.0.0.1", port: int = 0, *,
          locate: Callable[[str, str, int], list[Address]],
          holder_options: Mapping[str, Any] | None = None) -> Running:
    """Serve in a background thread. ``locate``: a Service's ready addresses (:meth:`.endpoints.Endpoints.locate`;
    tests name local listeners). ``holder_options``: :class:`.hold.Holder`'s other keyword arguments (tests shorten
    its timings)."""
    board = Board(settings.remember_seconds)
    admission = Admission(settings.max_held_bytes, settings.max_held_per_namespace,
                          max(1, settings.max_connections * 3 // 4))
    metrics = Metrics(board.waiting, admission.held_bytes)
    holder = Holder(board, metrics, settings.hold_seconds, locate=locate, **(holder_options or {}))
    front = Front((host, port), handler(settings, holder, metrics, admission), settings.max_connections)
    thread = threading.Thread(target=front.serve_forever, name="activator-http", daemon=True)
    thread.start()
    return Running(front, thread, holder, metrics)

