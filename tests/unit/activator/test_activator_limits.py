"""What the activator lets in and what it answers when the pool misbehaves (rerank_activator/server.py, relay.py):
body framing and size, connection bounds, slow clients; a pool that hangs up or stalls after the request was sent is
answered 502 or 504 and never sent the request twice."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from rerank_activator import server
from rerank_devcluster.processes import free_port
from rerank_devcluster.waiting import eventually
from tests.unit.activator.activator_helpers import (
    MODEL,
    Pool,
    activator,
    call,
    outcome_counts,
    raw,
    signed,
    upstream_of,
)

NEVER = upstream_of(1)  # nothing listens on port 1: a request that got through would be held, then 503


def head(method: str, *lines: str, upstream: str = NEVER) -> bytes:
    """A request's head with the model's signed headers and ``lines``."""
    own = [f"{k}: {v}" for k, v in signed(MODEL, upstream).items()]
    return "\r\n".join([f"{method} /rerank HTTP/1.1", "Host: activator", *own, *lines, "", ""]).encode()


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


@pytest.mark.parametrize(("request_bytes", "code"), [
    (head("POST"), 411),                                                     # no length on a body method
    (head("POST", "Transfer-Encoding: chunked") + b"2\r\n{}\r\n0\r\n\r\n", 411),
    (head("POST", "Content-Length: 1e3"), 400),
    (head("POST", "Content-Length: -1"), 400),
    (head("POST", "Content-Length: +2") + b"{}", 400),
    (head("POST", "Content-Length: 2", "Content-Length: 2") + b"{}", 400),
    (head("POST", "Content-Length: 1001"), 413),                             # answered without the body sent
    (head("PUT", "Content-Length: 99999999999999"), 413),
])
def test_body_framing_and_size_are_checked_before_reading(request_bytes: bytes, code: int) -> None:
    with activator(hold_seconds=0.5, max_body_bytes=1000) as act:
        started = time.monotonic()
        answer = raw(act.url, request_bytes, timeout=5)
        elapsed = time.monotonic() - started
        counts = outcome_counts(act.url)
    assert status(answer) == code, answer[:200]
    assert b"Connection: close" in answer
    assert elapsed < 2.0, "answered at once, not after reading or holding"
    assert counts["invalid"] == 1 and counts["timeout"] == 0


def test_a_body_at_the_limit_is_taken_and_one_request_without_a_body_may_omit_its_length() -> None:
    pool = Pool(delay=0).wake()
    try:
        eventually(lambda: pool.listening_at, timeout=5, every=0.02)
        with activator(max_body_bytes=1000) as act:
            at_limit = call(act.url, "POST", "/rerank", signed(MODEL, pool.upstream), b"x" * 1000)
            info = call(act.url, "GET", "/info", signed(MODEL, pool.upstream))
            counts = outcome_counts(act.url)
    finally:
        pool.stop()
    assert (at_limit.status, info.status) == (201, 201)
    assert [(s.method, s.path, len(s.body)) for s in pool.seen] == [("POST", "/rerank", 1000), ("GET", "/info", 0)]
    assert "content-length" not in {name.lower() for name, _ in pool.seen[1].headers}
    assert counts["forwarded"] == 2


def test_surplus_connections_are_closed_at_accept_and_slow_clients_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "CLIENT_TIMEOUT_SECONDS", 0.8)
    monkeypatch.setattr(server, "ACCEPT_WAIT_SECONDS", 0.2)
    with activator(max_connections=2) as act:
        host, port = act.url.removeprefix("http://").split(":")
        stalled = []
        for _ in range(2):  # part of a head each: both connections taken, neither request admitted yet
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"POST /rerank HTTP/1.1\r\nHost: a\r\n")
            stalled.append(s)
        eventually(lambda: act.server.open_connections == 2, timeout=5, every=0.02)
        assert raw(act.url, b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n", timeout=5) == b""
        assert act.server.closed_at_accept == 1
        started = time.monotonic()
        for s in stalled:
            assert s.recv(100) == b"", "cut, not answered"
            s.close()
        waited = time.monotonic() - started
        eventually(lambda: act.server.open_connections == 0, timeout=5, every=0.02)
        healthy = call(act.url, "GET", "/healthz")
        counts = outcome_counts(act.url)
    assert waited < 3.0
    assert healthy.status == 200 and counts["timeout"] == counts["forwarded"] == 0


class HangUp:
    """A pool that accepts, reads the request, then closes without answering (or, ``stall``, answers nothing)."""

    def __init__(self, stall: bool = False) -> None:
        self.accepted = 0
        self.stall = stall
        self.port = free_port()
        self.sock = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.recv(65536)
            if self.stall:
                threading.Timer(5, conn.close).start()
            else:
                conn.close()


@pytest.fixture
def hang_up() -> Iterator[HangUp]:
    h = HangUp()
    yield h
    h.sock.close()


def test_a_pool_that_hangs_up_is_a_502_and_is_not_asked_again(hang_up: HangUp) -> None:
    with activator(hold_seconds=5) as act:
        reply = call(act.url, "POST", "/rerank", signed(MODEL, upstream_of(hang_up.port)), b"{}")
        counts = outcome_counts(act.url)
    assert reply.status == 502 and "error" in reply.json()
    assert hang_up.accepted == 1, "sent once: the pool may have acted on it"
    assert counts["upstream_error"] == 1 and counts["forwarded"] == 0


def test_a_pool_that_does_not_answer_is_a_504_after_the_read_timeout() -> None:
    stalled = HangUp(stall=True)
    try:
        with activator(hold_seconds=5, read_timeout=0.5) as act:
            started = time.monotonic()
            reply = call(act.url, "POST", "/rerank", signed(MODEL, upstream_of(stalled.port)), b"{}")
            elapsed = time.monotonic() - started
            counts = outcome_counts(act.url)
    finally:
        stalled.sock.close()
    assert reply.status == 504 and 0.5 <= elapsed < 3.0
    assert stalled.accepted == 1 and counts["upstream_error"] == 1


def test_a_surplus_connection_waits_its_turn_for_a_free_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond max_connections a new connection is not refused at once: it waits (in order) for one to close."""
    monkeypatch.setattr(server, "CLIENT_TIMEOUT_SECONDS", 0.8)
    with activator(max_connections=1) as act:
        host, port = act.url.removeprefix("http://").split(":")
        stalled = socket.create_connection((host, int(port)), timeout=5)
        stalled.sendall(head("POST", "Content-Length: 50") + b"part")
        eventually(lambda: act.server.open_connections == 1, timeout=5, every=0.02)
        started = time.monotonic()
        answer = raw(act.url, b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n", timeout=5)
        waited = time.monotonic() - started
        stalled.close()
    assert status(answer) == 200 and act.server.closed_at_accept == 0
    assert 0.3 <= waited < server.ACCEPT_WAIT_SECONDS, "served once the stalled client was cut"


def test_a_client_trickling_its_request_is_cut_at_the_deadline_of_the_whole_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each byte arrives well within the timeout of one read; the request as a whole does not."""
    monkeypatch.setattr(server, "CLIENT_TIMEOUT_SECONDS", 1.0)
    with activator() as act:
        host, port = act.url.removeprefix("http://").split(":")
        s = socket.create_connection((host, int(port)), timeout=5)
        started, cut_after = time.monotonic(), None
        try:
            for byte in head("POST", "Content-Length: 2") + b"{}":
                s.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:  # reset: the activator cut it
            cut_after = time.monotonic() - started
        if cut_after is None:  # everything was written into the socket's buffer: the cut shows on reading
            s.settimeout(5)
            assert s.recv(100) == b""
            cut_after = time.monotonic() - started
        s.close()
        counts = outcome_counts(act.url)
    assert cut_after < 2.5, f"cut after {cut_after:.1f} s"
    assert counts["forwarded"] == counts["timeout"] == 0
