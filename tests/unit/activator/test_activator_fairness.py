"""The activator is shared by every tenant's sleeping models (rerank_activator/admission.py, server.py): one tenant's
flood must not refuse another tenant's request, what it holds in memory is bounded per tenant (namespace) and in all,
and an answer cannot be made to cost more than its request. The memory of the real process under a flood of maximal
bodies at the chart's defaults is test_activator_memory.py's."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from rerank_activator.admission import (
    ANSWER_ALLOWANCE,
    SMALL_BODY_BYTES,
    TENANT_SHARE,
    Admission,
    Ticket,
    answer_limit,
)
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


BIG = SMALL_BODY_BYTES + 1


def test_admission_bounds_requests_per_tenant_and_large_bodies_per_tenant_and_in_all() -> None:
    admission = Admission(max_bytes=8 * BIG, max_requests=4, max_total=100)
    assert admission.tenant_bytes == 8 * BIG // TENANT_SHARE == 2 * BIG
    a1, a2 = admission.take("a/m1", BIG), admission.take("a/m2", BIG)  # two models, one tenant
    assert isinstance(a1, Ticket) and isinstance(a2, Ticket)
    assert f"namespace a's held bodies would exceed {2 * BIG} bytes" == admission.take("a/m3", BIG)
    small = admission.take("a/m1", SMALL_BODY_BYTES)  # small: the count alone bounds it
    assert isinstance(small, Ticket)
    assert isinstance(admission.take("a/m1", 10), Ticket)
    assert "4 requests are held for namespace a" in str(admission.take("a/m9", 0))
    others = [admission.take(f"{t}/m", 2 * BIG) for t in ("b", "c", "d")]  # 2 BIG held by a, then 2 BIG each
    assert [isinstance(t, Ticket) for t in others] == [True, True, True]
    assert admission.take("e/m", BIG) == f"the activator's held bodies would exceed {8 * BIG} bytes"
    assert isinstance(admission.take("e/m", 1000), Ticket)  # the budget is full; an ordinary request still held
    for ticket in (a1, a2, small, *others):
        assert isinstance(ticket, Ticket)
        admission.give_back(ticket)
    assert isinstance(admission.take("a/m3", 2 * BIG), Ticket)
    assert answer_limit(1000) == 1000 + ANSWER_ALLOWANCE


def test_however_many_tenants_flood_some_connections_stay_free_for_the_operator() -> None:
    admission = Admission(max_bytes=8 * BIG, max_requests=4, max_total=6)
    taken = [admission.take(f"t{i}/m", 10) for i in range(7)]
    assert [isinstance(t, Ticket) for t in taken] == [True] * 6 + [False]
    assert taken[6] == "6 requests are held in all (at most 6)"


def test_a_flood_on_one_sleeping_model_does_not_refuse_another() -> None:
    """300 clients flood a model that will not wake, each sending again as soon as it is answered; meanwhile another
    tenant's model gets a request and its pool wakes. The flood holds its share, its surplus is answered 503 at once,
    and the other model's request is held and answered by its pool; at the defaults (256 connections, 64 requests a
    namespace)."""
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


def test_past_a_tenants_share_of_large_bodies_its_requests_are_turned_away_and_others_still_held() -> None:
    with activator(hold_seconds=5, max_held_bytes=8 * BIG, max_body_bytes=2 * BIG) as act:
        replies: list[int] = []

        def hold(model: str, namespace: str) -> None:
            upstream = upstream_of(1, namespace=namespace)
            replies.append(call(act.url, "POST", "/rerank", signed(model, upstream), b"x" * (BIG + 10)).status)

        first = threading.Thread(target=hold, args=(FLOODED, "tenant-a"))
        first.start()
        eventually(lambda: pending(act.url).get(FLOODED, {}).get("waiting") == 1, timeout=5, every=0.02)
        started = time.monotonic()
        second = call(act.url, "POST", "/rerank", signed(FLOODED, NEVER), b"x" * BIG)  # past its share, 2 BIG
        turned_away = time.monotonic() - started
        other = threading.Thread(target=hold, args=(OTHER, "tenant-b"))
        other.start()
        eventually(lambda: pending(act.url).get(OTHER, {}).get("waiting") == 1, timeout=5, every=0.02)
        first.join()
        other.join()
        counts = outcome_counts(act.url)
    assert second.status == 503 and second.headers["Retry-After"] == "5"
    assert f"{2 * BIG} bytes" in second.json()["error"]
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
