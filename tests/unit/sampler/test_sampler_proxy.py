"""The sampler as a proxy (rerank_sampler/server.py, relay.py): TEI's answers come back byte for byte, TEI receives
what the client sent (less the mirror token), connections to TEI are kept alive and never reused once TEI closed
them, and what the sampler cannot forward faithfully is refused before it reaches TEI."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from rerank_contracts.guard import MIRROR_TOKEN_HEADER, SAMPLER_HEALTH_PATH
from tests.unit.sampler.sampler_helpers import (
    RERANK,
    Guard,
    Tei,
    ask,
    call,
    counts,
    kept_alive,
    nowhere,
    raw_answer,
    raw_until_closed,
    sampler,
)


@pytest.fixture
def tei() -> Iterator[Tei]:
    t = Tei()
    yield t
    t.stop()


@pytest.fixture
def guard() -> Iterator[Guard]:
    g = Guard()
    yield g
    g.stop()


def request(method: str, path: str, body: bytes = b"", *extra: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: model.tenant-a.example", "User-Agent: test/1", *extra]
    if body or method == "POST":
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return "\r\n".join([*lines, "", ""]).encode() + body


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("POST", "/rerank", RERANK, 200),
    ("POST", "/rerank?raw_scores=true", RERANK, 200),
    ("GET", "/health", b"", 200),
    ("HEAD", "/health", b"", 200),
    ("GET", "/metrics", b"", 200),
    ("POST", "/rerank", b'{"query":"","texts":["a"]}', 422),
    ("GET", "/nothing-here", b"", 404),
])
def test_answers_are_the_upstreams_byte_for_byte(tei: Tei, guard: Guard, method: str, path: str, body: bytes,
                                                 status: int) -> None:
    with sampler(tei.url, guard.url) as s:
        direct = raw_answer(tei.url, request(method, path, body))
        via = raw_answer(s.url, request(method, path, body))
    assert direct.startswith(f"HTTP/1.1 {status} ".encode()), direct
    assert via == direct
    # And TEI received the same request both times: method, target, every header in order, the body.
    first, second = tei.seen
    assert (second.method, second.path, second.headers, second.body) == (first.method, first.path, first.headers,
                                                                         first.body)


def test_a_client_token_header_never_reaches_tei(tei: Tei, guard: Guard) -> None:
    with sampler(tei.url, guard.url) as s:
        reply = call(s.url, "POST", "/rerank", {MIRROR_TOKEN_HEADER: "forged", "Content-Type": "application/json",
                                                "Connection": "X-Private", "X-Private": "hop"}, RERANK)
        lower = call(s.url, "POST", "/rerank", {MIRROR_TOKEN_HEADER.lower(): "forged"}, RERANK)
    assert (reply.status, lower.status) == (200, 200)
    for seen in tei.seen:
        names = {k.lower() for k, _ in seen.headers}
        assert MIRROR_TOKEN_HEADER.lower() not in names
        assert "x-private" not in names and "connection" not in names  # hop-by-hop, and what Connection names
    assert tei.seen[0].header("Content-Type") == ["application/json"]


def test_own_health_route_never_reaches_tei(tei: Tei, guard: Guard) -> None:
    with sampler(nowhere(), guard.url) as s:  # TEI down: the sampler still answers its probe
        own = call(s.url, "GET", SAMPLER_HEALTH_PATH)
        teis = call(s.url, "GET", "/health")
        requests = counts(s.metrics_url, "requests")
    assert (own.status, own.body) == (200, b"ok\n")
    assert teis.status == 502 and b"error" in teis.body
    assert requests == {"proxied": 0, "upstream_error": 1, "invalid": 0, "translated": 0}


def test_connections_to_tei_are_kept_alive(tei: Tei, guard: Guard) -> None:
    with sampler(tei.url, guard.url, fraction=0.0) as s, kept_alive(s.url) as conn:
        statuses = {ask(conn, "POST", "/rerank", {"Content-Type": "application/json"}, RERANK).status
                    for _ in range(50)}
        opened = s.pool.opened
    assert statuses == {200}
    assert opened == 1, "one client, one request at a time: one connection to TEI"


def test_a_connection_tei_closed_while_idle_is_not_reused() -> None:
    tei = Tei(idle_timeout=0.2)  # closes an idle keep-alive connection after 0.2 s, as hyper does after its timeout
    try:
        with sampler(tei.url, nowhere(), fraction=0.0) as s:
            first = call(s.url, "POST", "/rerank", {}, RERANK)
            time.sleep(0.6)
            second = call(s.url, "POST", "/rerank", {}, RERANK)
            opened = s.pool.opened
    finally:
        tei.stop()
    assert (first.status, second.status) == (200, 200), second
    assert opened == 2 and len(tei.seen) == 2, "a fresh connection, and the request sent once"


def test_an_answer_of_unstated_length_is_streamed_rechunked(tei: Tei, guard: Guard) -> None:
    with sampler(tei.url, guard.url) as s:
        direct = call(tei.url, "GET", "/stream")
        via = call(s.url, "GET", "/stream")
        old = raw_until_closed(s.url, b"GET /stream HTTP/1.0\r\n\r\n")
    assert via.status == 200 and via.body == direct.body == b"data: 1\n\ndata: 2\n\n" + b"x" * 100_000
    assert via.header("Transfer-Encoding") == ["chunked"] and via.header("Content-Type") == ["text/event-stream"]
    # An HTTP/1.0 client gets the body as is, ended by the end of the connection.
    head, _, body = old.partition(b"\r\n\r\n")
    assert b"Connection: close" in head and b"chunked" not in head and body == direct.body


def test_a_chunked_request_is_sent_with_its_length(tei: Tei, guard: Guard) -> None:
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(RERANK[i:i + 10]), RERANK[i:i + 10]) for i in range(0, len(RERANK), 10))
    head = b"POST /rerank HTTP/1.1\r\nHost: m\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
    with sampler(tei.url, guard.url) as s:
        answer = raw_answer(s.url, head + chunks + b"0\r\nX-Trailer: 1\r\n\r\n")
        time.sleep(0.2)
    assert answer.startswith(b"HTTP/1.1 200 OK")
    (seen,) = tei.seen
    assert seen.body == RERANK and seen.header("Content-Length") == [str(len(RERANK))]
    assert seen.header("Transfer-Encoding") == []
    assert [c.body for c in guard.received] == [RERANK]


@pytest.mark.parametrize(("lines", "body", "code"), [
    (["Content-Length: 1001"], b"", 413),                              # answered without the body sent
    (["Content-Length: 1e3"], b"", 400),
    (["Content-Length: 2", "Content-Length: 2"], b"{}", 400),
    (["Transfer-Encoding: gzip"], b"", 501),
    (["Transfer-Encoding: chunked", "Content-Length: 5"], b"", 400),   # two framings: never guess
    (["Transfer-Encoding: chunked"], b"400\r\n" + b"x" * 1024 + b"\r\n0\r\n\r\n", 413),
    (["Transfer-Encoding: chunked"], b"zz\r\n", 400),
])
def test_what_cannot_be_forwarded_faithfully_is_refused_before_tei(tei: Tei, guard: Guard, lines: list[str],
                                                                   body: bytes, code: int) -> None:
    head = "\r\n".join(["POST /rerank HTTP/1.1", "Host: m", *lines, "", ""]).encode()
    with sampler(tei.url, guard.url, max_body_bytes=1000) as s:
        started = time.monotonic()
        answer = raw_until_closed(s.url, head + body, timeout=5)
        elapsed = time.monotonic() - started
        requests = counts(s.metrics_url, "requests")
    assert answer.startswith(f"HTTP/1.1 {code} ".encode()), answer[:200]
    assert b"Connection: close" in answer and elapsed < 2.0
    assert tei.seen == [] and requests["invalid"] == 1


def test_a_body_at_the_limit_is_forwarded(tei: Tei, guard: Guard) -> None:
    body = RERANK[:-1] + b" " * (1000 - len(RERANK)) + b"}"
    with sampler(tei.url, guard.url, max_body_bytes=1000) as s:
        reply = call(s.url, "POST", "/rerank", {}, body)
    assert reply.status == 200 and tei.seen[0].body == body


def test_tei_down_is_a_502_and_nothing_is_copied(guard: Guard) -> None:
    with sampler(nowhere(), guard.url, fraction=1.0) as s:
        reply = call(s.url, "POST", "/rerank", {}, RERANK)
        time.sleep(0.2)
        copies = counts(s.metrics_url, "copies")
    assert reply.status == 502 and "error" in reply.body.decode()
    assert guard.received == [] and copies == {"sent": 0, "dropped": 0, "failed": 0}


class Scripted:
    """An upstream that reads one request's head and answers ``script`` byte for byte, then closes."""

    def __init__(self, script: bytes) -> None:
        self.script = script
        self.sock = socket.create_server(("127.0.0.1", 0))
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
            with conn:
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                    data += chunk
                conn.sendall(self.script)


@pytest.mark.parametrize(("script", "status", "body"), [
    # No length and no chunking: the body runs until TEI closes; re-chunked for the client.
    (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nuntil the end", 200, b"until the end"),
    (b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, b"ok"),
    (b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n", 204, b""),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok", 200, b"ok"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Trailer: 1\r\n\r\n", 200, b"ok"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", 502, None),      # hung up within the body
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nok", 502, None),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok", 502, None),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n", 200, None),  # cut mid-answer
    (b"garbage\r\n\r\n", 502, None),
    (b"", 502, None),                                                          # hung up without an answer
])
def test_what_tei_answers_is_framed_as_http_says(guard: Guard, script: bytes, status: int,
                                                 body: bytes | None) -> None:
    upstream = Scripted(script)
    try:
        with sampler(upstream.url, guard.url, fraction=0.0) as s:
            try:
                reply = call(s.url, "GET", "/x")
            except http.client.IncompleteRead:
                reply = None  # the head was out when TEI's answer broke off: the connection is cut
            requests = counts(s.metrics_url, "requests")
    finally:
        upstream.sock.close()
    if body is None and status == 200:
        assert reply is None and requests["upstream_error"] == 1
        return
    assert reply is not None and reply.status == status, reply
    if body is None:
        assert b"error" in reply.body and requests["upstream_error"] == 1
    else:
        assert reply.body == body and requests["proxied"] == 1
        assert not reply.header("Transfer-Encoding") or reply.header("Transfer-Encoding") == ["chunked"]


def test_tei_slower_than_the_timeout_is_a_504(tei: Tei, guard: Guard) -> None:
    with sampler(tei.url, guard.url, upstream_timeout=0.3) as s:
        started = time.monotonic()
        reply = call(s.url, "GET", "/slow?s=1")
        elapsed = time.monotonic() - started
    assert reply.status == 504 and 0.3 <= elapsed < 1.0
    assert [seen.path for seen in tei.seen] == ["/slow?s=1"], "sent once, never retried"
