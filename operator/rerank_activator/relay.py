"""One exchange with a woken pool over a socket already connected to it: the held request out, the answer back.

What is forwarded is what the client sent end to end: the method, the path and query, the body, and every header
but the hop-by-hop ones (RFC 9110 section 7.6.1: ``Connection`` and what it names, ``Keep-Alive``,
``Transfer-Encoding``, ...) and the three activate headers, which are for the activator alone (the token must not
reach a tenant's pod). ``Host`` becomes the upstream's own, the body's length is stated again. The answer comes back
the same way: status, end-to-end headers and body, read whole (a rerank answer is small; the caller bounds it,
:func:`.admission.answer_limit`) so that a read that stalls can still be answered 504 instead of cut halfway.

There is no retry here: once the request is on the wire the pool may have acted on it, and the client, not the
activator, decides whether to send it again.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from rerank_contracts import activator

#: Headers that describe one connection, never forwarded either way (plus those a ``Connection`` header names).
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade"})
#: Request headers the activator consumes or restates: the activate headers, Host, the body framing, Expect (the
#: activator already read the whole body, so there is nothing to continue).
REQUEST_ONLY = frozenset({activator.MODEL_HEADER.lower(), activator.UPSTREAM_HEADER.lower(),
                          activator.TOKEN_HEADER.lower(), "host", "content-length", "expect"})
#: How long the pool may take to answer (per read); longer: 504.
READ_TIMEOUT_SECONDS = 60.0

Headers = list[tuple[str, str]]


@dataclass(frozen=True)
class Held:
    """A request as the activator holds it: authenticated, its body read whole (None: the client sent none)."""

    method: str
    target: str  # path and query, as the client sent them
    headers: Headers
    body: bytes | None
    model: str
    upstream: str


@dataclass(frozen=True)
class Answer:
    """What the activator answers a held request, and under which outcome it is counted."""

    status: int
    headers: Headers
    body: bytes
    outcome: str


class UpstreamError(Exception):
    """Connected, but no usable answer: the status to give the client instead (502, or 504 for a read timeout)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def end_to_end(headers: Iterable[tuple[str, str]], drop: frozenset[str] = frozenset()) -> Headers:
    """``headers`` without the hop-by-hop ones, those the ``Connection`` header names, and ``drop``."""
    pairs = list(headers)
    named = {token.strip().lower() for name, value in pairs if name.lower() == "connection"
             for token in value.split(",")}
    return [(name, value) for name, value in pairs if name.lower() not in HOP_BY_HOP | named | drop]


def exchange(sock: socket.socket, request: Held, read_timeout: float, max_answer_bytes: int) -> Answer:
    """Send ``request`` on ``sock`` (connected to its upstream; closed here) and read the whole answer, of at most
    ``max_answer_bytes``. Raises :class:`UpstreamError` when the pool gives no usable answer."""
    host, port = activator.upstream_address(request.upstream)
    conn = http.client.HTTPConnection(host, port, timeout=read_timeout)
    sock.settimeout(read_timeout)
    conn.sock = sock  # already connected: http.client connects only when it has no socket
    try:
        conn.putrequest(request.method, request.target, skip_host=True, skip_accept_encoding=True)
        for name, value in end_to_end(request.headers, REQUEST_ONLY):
            conn.putheader(name, value)
        conn.putheader("Host", f"{host}:{port}")
        if request.body is not None:
            conn.putheader("Content-Length", str(len(request.body)))
        conn.endheaders(request.body)
        response = conn.getresponse()
        stated = response.length  # None: chunked or until close, read in pieces up to the limit
        if stated is not None and stated > max_answer_bytes:
            raise UpstreamError(502, f"the answer is larger than {max_answer_bytes} bytes")
        body = response.read(max_answer_bytes + 1)
        if len(body) > max_answer_bytes:
            raise UpstreamError(502, f"the answer is larger than {max_answer_bytes} bytes")
        # A HEAD answer's Content-Length describes the body a GET would get: it stays as the pool said it.
        drop = frozenset() if request.method == "HEAD" else frozenset({"content-length"})
        return Answer(response.status, end_to_end(response.getheaders(), drop), body, "forwarded")
    except TimeoutError as exc:
        raise UpstreamError(504, f"no answer within {read_timeout:g} s") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise UpstreamError(502, f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
