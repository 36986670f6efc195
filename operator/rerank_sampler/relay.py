"""One request to TEI and its answer, over a small pool of keep-alive connections.

Why a pool: the sampler sits on the path of every request the pod serves, and TEI is on the pod's loopback; a new TCP
connection per request would add a handshake (and leave a TIME_WAIT socket) for nothing. A connection is taken from
the pool for one exchange and given back once TEI's whole answer has been read, so the pool holds at most as many
connections as requests were in flight at once (idle ones beyond :data:`MAX_IDLE` are closed).

Why an idle connection is checked before it is used, and never a request retried: once a request is on the wire TEI
may have acted on it, and the client (the gateway), not the sampler, decides whether to send it again; a connection
that TEI closed while it sat idle would be such a failed send. So a connection idle longer than
:data:`IDLE_SECONDS`, or readable while idle (TEI closed it: end of file), is discarded before anything is written to
it, and a new one is made.

What is forwarded is what the client sent, end to end: the method, the path and query, every header but the hop-by-hop
ones (RFC 9110 section 7.6.1: ``Connection`` and what it names, ``Keep-Alive``, ``Transfer-Encoding``, ...) and the
quality guard's mirror token (:data:`rerank_contracts.guard.MIRROR_TOKEN_HEADER`: only the sampler sets it, on its
copies to the guard, and a client must not reach TEI or the guard with its own), and the body, its length stated
again. ``Host`` stays as the client sent it. The answer comes back the same way: status, reason, end-to-end headers.

Why by hand and not with http.client: this side speaks to one trusted server on the loopback, and http.client's
header parsing (the email package) and its separate sends of head and body were a third of the sampler's CPU time
per request. The request goes out in one send; the answer's head is read line by line; its body is framed as
RFC 9112 section 6 says (no body for HEAD, 1xx, 204, 304; else chunked, ``Content-Length``, or until TEI closes).
"""

from __future__ import annotations

import re
import select
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from rerank_contracts.guard import MIRROR_TOKEN_HEADER

#: Headers that describe one connection, never forwarded either way (plus those a ``Connection`` header names).
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade"})
#: Request headers the sampler consumes or restates: the mirror token (never from a client), the body's framing (the
#: body is read whole and its length stated again), Expect (the body is already read: nothing to continue).
REQUEST_ONLY = frozenset({MIRROR_TOKEN_HEADER.lower(), "content-length", "expect"})
#: Idle connections kept for the next request; more are closed when given back.
MAX_IDLE = 64
#: An idle connection older than this is closed, not used: below the 30 s that hyper (TEI's HTTP server) waits for a
#: next request's head, so the sampler gives a connection up before TEI may close it under a request being sent.
IDLE_SECONDS = 20.0
#: How long TEI may take to answer (each read); longer: 504. A loaded CPU pool queues requests for seconds.
READ_TIMEOUT_SECONDS = 60.0
#: The longest line of an answer's head, and the most header lines, taken from TEI (as http.client's limits).
MAX_LINE = 65536
MAX_HEADERS = 100
_STATUS = re.compile(r"HTTP/1\.([01]) ([0-9]{3})(?: (.*))?")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")

Headers = list[tuple[str, str]]


class UpstreamError(Exception):
    """TEI gave no usable answer: the status to answer instead (502, or 504 for a read timeout)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class Unforwardable(ValueError):
    """The request cannot be written out as it came (a line break in a header's value, a control character in the
    target): the client's error, answered 400, never sent."""


def end_to_end(headers: Iterable[tuple[str, str]], drop: frozenset[str] = frozenset()) -> Headers:
    """``headers`` without the hop-by-hop ones, those the ``Connection`` header names, and ``drop`` (lower case)."""
    pairs = list(headers)
    named = {token.strip().lower() for name, value in pairs if name.lower() == "connection"
             for token in value.split(",")}
    dropped = HOP_BY_HOP | named | drop
    return [(name, value) for name, value in pairs if name.lower() not in dropped]


def address(url: str) -> tuple[str, int]:
    """The host and port of an ``http://host[:port]`` URL (no path); ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"not an http://host:port URL: {url!r}")
    return parts.hostname, parts.port or 80


@dataclass(frozen=True)
class Outgoing:
    """A request as it goes to TEI: ``headers`` already end to end; ``body`` None when the client sent none."""

    method: str
    target: str  # path and query, as the client sent them
    headers: Headers
    body: bytes | None

    def encode(self, default_host: str) -> bytes:
        """The request's bytes: its head, then its body. Raises :class:`Unforwardable`."""
        if _CONTROL.search(self.target):
            raise Unforwardable("a control character or space in the request target")
        lines = [f"{self.method} {self.target} HTTP/1.1\r\n"]
        has_host = False
        for name, value in self.headers:
            if "\r" in value or "\n" in value:  # a folded line: written as is it would be a second header
                raise Unforwardable(f"a line break in the value of {name}")
            has_host = has_host or name.lower() == "host"
            lines.append(f"{name}: {value}\r\n")
        if not has_host:  # an HTTP/1.0 client's
            lines.append(f"Host: {default_host}\r\n")
        if self.body is not None:
            lines.append(f"Content-Length: {len(self.body)}\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("latin-1")  # the server decoded them as latin-1: the same bytes back
        return head + self.body if self.body else head


class Connection:
    """One connection to TEI: its socket, a buffered reader on it, and when it was last given back."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile = self.sock.makefile("rb")
        self.idle_since = 0.0

    def quiet(self) -> bool:
        """Whether the connection is still open while idle: nothing to read on it (readable while idle means TEI
        closed it, or sent what no request asked for)."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        return not poller.poll(0)

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()

    def line(self) -> bytes:
        line = self.rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise ValueError("a line of the answer's head is too long")
        if not line.endswith(b"\n"):
            raise ConnectionError("the connection closed within the answer's head")
        return line


class Exchange:
    """TEI's answer to one request: its head read, its body still to be read; :meth:`release` gives the connection
    back (reused only when the body was read to its end and TEI keeps the connection open)."""

    def __init__(self, pool: Pool, conn: Connection, method: str) -> None:
        self._pool, self._conn = pool, conn
        version, self.status, self.reason, raw = self._head()
        names = {name.lower(): value for name, value in raw}
        connection = {t.strip().lower() for t in names.get("connection", "").split(",")}
        self._keep = version == "1" and "close" not in connection
        codings = [c.strip().lower() for c in names.get("transfer-encoding", "").split(",") if c.strip()]
        self._chunked = False
        self._left: int | None = None  # body bytes still to read (of the current chunk, when chunked)
        self._done = False
        if method == "HEAD" or self.status in (204, 304) or 100 <= self.status < 200:
            self._left, self._done = 0, True
        elif codings:
            if codings[-1] != "chunked":  # framed by the end of the connection
                self._keep = False
            else:
                self._chunked, self._left = True, 0
        elif "content-length" in names:
            stated = names["content-length"].strip()
            if not stated.isdigit() or any(v.strip() != stated for n, v in raw if n.lower() == "content-length"):
                raise ValueError(f"Content-Length {names['content-length']!r}")
            self._left = int(stated)
            self._done = self._left == 0
        else:
            self._keep = False  # read until TEI closes the connection
        self.headers = end_to_end(raw)

    def _head(self) -> tuple[str, int, str, Headers]:
        while True:
            status_line = self._conn.line().decode("latin-1").rstrip("\r\n")
            matched = _STATUS.fullmatch(status_line)
            if matched is None:
                raise ValueError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
            headers: Headers = []
            while (line := self._conn.line()) not in (b"\r\n", b"\n"):
                if len(headers) >= MAX_HEADERS:
                    raise ValueError(f"more than {MAX_HEADERS} header lines")
                text = line.decode("latin-1").rstrip("\r\n")
                if text[:1] in (" ", "\t") and headers:  # an obsolete folded line: part of the previous value
                    name, value = headers.pop()
                    headers.append((name, f"{value} {text.strip()}"))
                    continue
                name, colon, value = text.partition(":")
                if not colon or not name or name != name.strip():
                    raise ValueError(f"not a header line: {text[:80]!r}")
                headers.append((name, value.strip(" \t")))
            status = int(matched.group(2))
            if not 100 <= status < 200 or status == 101:  # a 1xx but 101 is followed by the answer itself
                return matched.group(1), status, matched.group(3) or "", headers

    @property
    def length(self) -> int | None:
        """The body's length still to read (0 for HEAD, 204, 304), or None when TEI did not state it."""
        return None if self._chunked or self._left is None else self._left

    @property
    def done(self) -> bool:
        """Whether the body has been read to its end."""
        return self._done

    def read_all(self) -> bytes:
        """The whole body. Raises :class:`UpstreamError` when TEI stalls or hangs up."""
        parts = []
        while piece := self.read_some(1 << 20):
            parts.append(piece)
        return b"".join(parts)

    def read_some(self, most: int) -> bytes:
        """Up to ``most`` bytes of the body as they arrive (b"": the end). Raises :class:`UpstreamError`."""
        if self._done:
            return b""
        try:
            return self._read(most)
        except TimeoutError as exc:
            raise UpstreamError(504, f"no answer within {self._pool.timeout:g} s") from exc
        except (OSError, ValueError) as exc:
            raise UpstreamError(502, f"{type(exc).__name__}: {exc}") from exc

    def _read(self, most: int) -> bytes:
        rfile = self._conn.rfile
        if self._chunked and self._left == 0:
            size = self._conn.line().split(b";", 1)[0].strip()
            if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
                raise ValueError(f"a chunk size {size[:20]!r}")
            self._left = int(size, 16)
            if self._left == 0:
                while self._conn.line() not in (b"\r\n", b"\n"):  # trailers: dropped, as hop-by-hop
                    pass
                self._done = True
                return b""
        if self._left is None:  # until TEI closes
            piece = rfile.read1(most)
            self._done = not piece
            return piece
        piece = rfile.read(min(most, self._left)) if self._chunked else rfile.read1(min(most, self._left))
        if not piece:
            raise ConnectionError("the connection closed within the answer's body")
        self._left -= len(piece)
        if self._left == 0:
            if self._chunked:
                if self._conn.line() not in (b"\r\n", b"\n"):
                    raise ValueError("a chunk does not end with CRLF")
            else:
                self._done = True
        return piece

    def release(self) -> None:
        self._pool.give(self._conn, self._done and self._keep)


class Pool:
    """Keep-alive connections to one upstream, shared by the server's threads (thread-safe)."""

    def __init__(self, url: str, timeout: float = READ_TIMEOUT_SECONDS, *, max_idle: int = MAX_IDLE,
                 idle_seconds: float = IDLE_SECONDS) -> None:
        self.host, self.port = address(url)
        self.timeout, self.max_idle, self.idle_seconds = timeout, max_idle, idle_seconds
        self._idle: list[Connection] = []  # newest last
        self._lock = threading.Lock()
        self.opened = 0  # connections made so far (tests check reuse)

    def take(self) -> Connection:
        """An idle connection still open (the most recently used: its socket is warm), or a new one. Raises
        OSError when TEI cannot be reached."""
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._idle:
                    self.opened += 1
                    break
                conn = self._idle.pop()
            if now - conn.idle_since < self.idle_seconds and conn.quiet():
                return conn
            conn.close()
        return Connection(self.host, self.port, self.timeout)

    def give(self, conn: Connection, reusable: bool) -> None:
        if reusable:
            conn.idle_since = time.monotonic()
            with self._lock:
                if len(self._idle) < self.max_idle:
                    self._idle.append(conn)
                    return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def send(self, request: Outgoing) -> Exchange:
        """Send ``request`` once and read the head of TEI's answer. Raises :class:`Unforwardable` (before anything is
        sent) and :class:`UpstreamError` when TEI cannot be reached or answers nothing usable."""
        data = request.encode(f"{self.host}:{self.port}")
        conn: Connection | None = None
        try:
            conn = self.take()
            conn.sock.sendall(data)
            return Exchange(self, conn, request.method)
        except TimeoutError as exc:
            if conn is not None:
                conn.close()
            raise UpstreamError(504, f"no answer within {self.timeout:g} s") from exc
        except (OSError, ValueError) as exc:
            if conn is not None:
                conn.close()
            raise UpstreamError(502, f"{type(exc).__name__}: {exc}") from exc
