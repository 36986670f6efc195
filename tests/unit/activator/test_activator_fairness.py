"""The activator is shared by every tenant's sleeping models (rerank_activator/admission.py, server.py): one model's
flood must not refuse another model's request, what it holds in memory is bounded per model and in all, and an
answer cannot be made to cost more than its request. The memory of the real process under a flood of maximal bodies
at the chart's defaults is test_activator_memory.py's."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from rerank_activator.admission import ANSWER_ALLOWANCE, MODEL_SHARE, Admission, Ticket, answer_limit
from rerank_devcluster.waiting import eventually
from tests.unit.activator.activator_helpers import (
    Pool,
    _Listener,
    activator,
    call,
    outcome_counts,
    pending,
    signed,
    upstream_of,
)

FLOODED, OTHER = "tenant-a/flooded", "tenant-b/other"
NEVER = upstream_of(1, namespace="tenant-a")  # the flooded model never wakes within the test


def test_admission_bounds_requests_and_bytes_per_model_and_in_all() -> None:
    admission = Admission(max_bytes=4000, max_requests=3)
    assert admission.model_bytes == 4000 // MODEL_SHARE == 1000
    a1, a2 = admission.take("a", 400), admission.take("a", 400)
    assert isinstance(a1, Ticket) and isinstance(a2, Ticket)
    assert "would exceed 1000 bytes" in str(admission.take("a", 400))  # a's share
    small = admission.take("a", 10)
    assert isinstance(small, Ticket)
    assert "3 requests are held" in str(admission.take("a", 0))  # a's count
    others = [admission.take(m, 900) for m in ("b", "c", "d", "e")]  # 810 held by a, then 900 each
    assert [isinstance(t, Ticket) for t in others] == [True, True, True, False]  # all together: 4000
    assert "activator's held requests would exceed 4000" in str(others[3])
    for ticket in (a1, a2, small, *others[:3]):
        assert isinstance(ticket, Ticket)
        admission.give_back(ticket)
    assert admission.held_bytes() == 0 and isinstance(admission.take("a", 1000), Ticket)
    assert answer_limit(1000) == 1000 + ANSWER_ALLOWANCE


def test_a_flood_on_one_sleeping_model_does_not_refuse_another() -> None:
    """300 clients flood a model that will not wake, each sending again as soon as it is answered; meanwhile another
    model's request arrives and its pool wakes. The flood holds its share, its surplus is answered 503 at once, and
    the other model's request is held and answered by its pool; at the defaults (256 connections, 64 a model)."""
    stop = threading.Event()
    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def flood() -> None:
        while not stop.is_set():
            try:
                code = call(act.url, "POST", "/rerank", signed(FLOODED, NEVER), b'{"q": 1}', timeout=30).status
            except OSError:
                code = 0
            with lock:
                statuses[code] = statuses.get(code, 0) + 1

    pool = Pool(delay=1.0)
    with activator(hold_seconds=20) as act:
        threads = [threading.Thread(target=flood, daemon=True) for _ in range(300)]
        for t in threads:
            t.start()
        try:
            eventually(lambda: pending(act.url).get(FLOODED, {}).get("waiting") == 64, timeout=20, every=0.1)
            eventually(lambda: statuses.get(503, 0) >= 300, timeout=20, every=0.1)  # the surplus, turned away
            pool.wake()
            started = time.monotonic()
            other = signed(OTHER, upstream_of(pool.port, namespace="tenant-b"))
            reply = call(act.url, "POST", "/rerank", other, b'{"other": 1}', timeout=30)
            took = time.monotonic() - started
            held_flood = pending(act.url)[FLOODED]["waiting"]
        finally:
            stop.set()
            pool.stop()
        counts = outcome_counts(act.url)
    assert reply.status == 201 and reply.body == b'{"other": 1}', reply
    assert took < pool.delay + 3.0, f"the other model's request took {took:.1f} s"
    assert held_flood <= 64
    assert counts["overloaded"] >= 300 and statuses.get(0, 0) == 0, statuses  # turned away with a 503, not reset


def test_past_a_models_share_of_bytes_its_requests_are_turned_away_and_others_still_held() -> None:
    with activator(hold_seconds=5, max_held_bytes=4000, max_body_bytes=1000) as act:
        replies: list[int] = []

        def hold(model: str, namespace: str) -> None:
            upstream = upstream_of(1, namespace=namespace)
            replies.append(call(act.url, "POST", "/rerank", signed(model, upstream), b"x" * 600).status)

        first = threading.Thread(target=hold, args=(FLOODED, "tenant-a"))
        first.start()
        eventually(lambda: pending(act.url).get(FLOODED, {}).get("waiting") == 1, timeout=5, every=0.02)
        started = time.monotonic()
        second = call(act.url, "POST", "/rerank", signed(FLOODED, NEVER), b"x" * 600)  # 1200 > 1000, its share
        turned_away = time.monotonic() - started
        other = threading.Thread(target=hold, args=(OTHER, "tenant-b"))
        other.start()
        eventually(lambda: pending(act.url).get(OTHER, {}).get("waiting") == 1, timeout=5, every=0.02)
        first.join()
        other.join()
        counts = outcome_counts(act.url)
    assert second.status == 503 and second.headers["Retry-After"] == "5" and "1000 bytes" in second.json()["error"]
    assert turned_away < 1.0
    assert replies == [503, 503]  # both held for the whole hold (nothing woke), neither turned away
    assert counts["overloaded"] == 1 and counts["timeout"] == 2


class Bloated(_Listener):
    """A pool answering more than it was asked: ``extra`` bytes beyond the request's body."""

    def __init__(self, extra: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                answer = body + b"y" * extra
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_an_answer_larger_than_its_request_allows_is_a_502() -> None:
    fits, bloated = Bloated(ANSWER_ALLOWANCE), Bloated(ANSWER_ALLOWANCE + 1)
    try:
        with activator(hold_seconds=5) as act:
            ok = call(act.url, "POST", "/rerank", signed(FLOODED, upstream_of(fits.server_address[1],
                                                                              namespace="tenant-a")), b"{}")
            too_big = call(act.url, "POST", "/rerank", signed(FLOODED, upstream_of(bloated.server_address[1],
                                                                                   namespace="tenant-a")), b"{}")
    finally:
        fits.shutdown()
        bloated.shutdown()
    assert ok.status == 200 and len(ok.body) == 2 + ANSWER_ALLOWANCE
    assert too_big.status == 502 and "larger than" in too_big.json()["error"]
