"""Holding and forwarding (rerank_activator/hold.py, relay.py) through the real server: a request that arrives while
the model's pool is down is answered by the pool once it listens, exactly once, or by a 503 after the hold; the
operator sees the model on /pending meanwhile."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from rerank_activator.hold import Board
from rerank_contracts.activator import MODEL_HEADER, PENDING_PATH, TOKEN_HEADER, pending_token
from rerank_devcluster.processes import free_port
from rerank_devcluster.waiting import eventually
from tests.unit.activator.activator_helpers import (
    MODEL,
    Pool,
    Reply,
    activator,
    call,
    outcome_counts,
    pending,
    samples,
    signed,
    upstream_of,
)


@pytest.fixture
def pool() -> Iterator[Pool]:
    p = Pool(delay=1.5)
    yield p
    p.stop()


def test_a_held_request_reaches_the_pool_once_it_listens(pool: Pool) -> None:
    body = bytes(range(256)) + json.dumps({"query": "q", "texts": ["a", "b"]}).encode()
    path = "/rerank?raw_scores=true&x=%2Fy"
    headers = {**signed(MODEL, pool.upstream), "X-Request-Id": "r-1", "Content-Type": "application/json",
               "Connection": "X-Hop", "X-Hop": "only-for-the-activator", "Keep-Alive": "timeout=5"}
    with activator(hold_seconds=10) as act:
        started = time.monotonic()
        pool.wake()
        reply = call(act.url, "POST", path, headers, body)
        elapsed = time.monotonic() - started
    assert pool.listening_at is not None
    assert reply.status == 201 and reply.body == body and reply.headers["X-Pool"] == "cpu"
    assert elapsed >= 1.4, "answered before the pool listened"
    (seen,) = pool.seen
    assert (seen.method, seen.path, seen.body) == ("POST", path, body)
    names = {name.lower(): value for name, value in seen.headers}
    assert names["host"] == f"m1-cpu.tenant-a.svc:{pool.port}"
    assert names["x-request-id"] == "r-1" and names["content-type"] == "application/json"
    assert names["content-length"] == str(len(body))
    leaked = {"x-rerank-activate-model", "x-rerank-activate-upstream", "x-rerank-activate-token", "x-hop",
              "keep-alive"} & set(names)
    assert not leaked, leaked


def test_pending_lists_the_model_while_held_and_remembers_it_after(pool: Pool) -> None:
    replies: list[Reply] = []
    with activator(hold_seconds=10) as act:
        assert pending(act.url) == {}
        before = time.time()
        t = threading.Thread(target=lambda: replies.append(
            call(act.url, "POST", "/rerank", signed(MODEL, pool.upstream), b"{}")))
        t.start()
        during = eventually(lambda: pending(act.url).get(MODEL), timeout=1.2, every=0.05)
        assert pool.listening_at is None, "the pool was still asleep"
        assert during["waiting"] == 1 and during["first"] == during["last"]
        assert before - 0.01 <= during["first"] <= time.time()
        gauge = samples(act.url)[("rerank_activator_waiting", ())]
        pool.wake()
        t.join(10)
        after = pending(act.url)
    assert gauge == 1
    assert [r.status for r in replies] == [201]
    assert after == {MODEL: {"waiting": 0, "first": during["last"], "last": during["last"]}}


def test_pending_needs_the_operators_token() -> None:
    with activator() as act:
        assert call(act.url, "GET", PENDING_PATH).status == 401
        wrong = call(act.url, "GET", PENDING_PATH, {TOKEN_HEADER: pending_token(b"y" * 40)})
        assert wrong.status == 401
        # A model's own token does not open the list either.
        model_token = signed(MODEL, upstream_of(8080))[TOKEN_HEADER]
        assert call(act.url, "GET", PENDING_PATH, {TOKEN_HEADER: model_token}).status == 401


def test_the_board_forgets_a_model_remember_seconds_after_its_last_request() -> None:
    now = [1000.0]
    board = Board(remember_seconds=60, clock=lambda: now[0])
    first = board.arrive("ns/a")
    now[0] = 1010.0
    second = board.arrive("ns/a")
    board.leave("ns/a", first)
    assert board.pending() == {"ns/a": {"waiting": 1, "first": 1010.0, "last": 1010.0}}
    board.leave("ns/a", second)
    now[0] = 1070.0
    assert board.pending() == {"ns/a": {"waiting": 0, "first": 1010.0, "last": 1010.0}}
    now[0] = 1070.5
    assert board.pending() == {}
    third = board.arrive("ns/b")
    now[0] = 5000.0  # still held: listed however long ago it came
    assert board.pending() == {"ns/b": {"waiting": 1, "first": 1070.5, "last": 1070.5}}
    assert board.waiting() == 1
    board.leave("ns/b", third)


def test_fifty_requests_held_through_one_wake_are_each_answered_exactly_once(pool: Pool) -> None:
    n = 50
    sent = [0.0] * n

    def send(i: int) -> Reply:
        sent[i] = time.monotonic()
        return call(act.url, "PUT", f"/rerank?i={i}", signed(MODEL, pool.upstream), str(i).encode())

    with activator(hold_seconds=15) as act:
        pool.wake()
        with ThreadPoolExecutor(n) as ex:
            replies = list(ex.map(send, range(n)))
        metrics = samples(act.url)
    assert pool.listening_at is not None
    late = sum(t > pool.listening_at - 1.0 for t in sent)  # sent less than a second before the pool listened
    assert late < n // 2, "most requests must have been held"
    assert [(r.status, r.body) for r in replies] == [(201, str(i).encode()) for i in range(n)]
    assert sorted(int(s.body) for s in pool.seen) == list(range(n)), "every request reached the pool exactly once"
    assert sorted(s.path for s in pool.seen) == sorted(f"/rerank?i={i}" for i in range(n))
    assert metrics[("rerank_activator_requests_total", (("outcome", "forwarded"),))] == n
    assert metrics[("rerank_activator_hold_seconds_count", ())] == n
    # Held until the pool listened: under a second only those sent late; all within a few seconds of the wake.
    assert metrics[("rerank_activator_hold_seconds_bucket", (("le", "1.0"),))] <= late
    assert metrics[("rerank_activator_hold_seconds_bucket", (("le", "5.0"),))] == n
    assert metrics[("rerank_activator_waiting", ())] == 0


def test_no_pool_within_the_hold_is_a_503_with_retry_after() -> None:
    never = upstream_of(free_port())
    with activator(hold_seconds=1.0) as act:
        cpu, started = time.process_time(), time.monotonic()
        reply = call(act.url, "POST", "/rerank", signed(MODEL, never), b"{}")
        elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
        counts = outcome_counts(act.url)
        listed = pending(act.url)
    assert reply.status == 503 and reply.headers["Retry-After"] == "5"
    assert "error" in reply.json()
    assert 1.0 <= elapsed < 2.0
    assert cpu < 0.3 * elapsed, f"holding burned {cpu:.2f} s of CPU in {elapsed:.2f} s"
    assert counts == {"forwarded": 0, "timeout": 1, "unauthenticated": 0, "invalid": 0, "upstream_error": 0,
                      "overloaded": 0}
    assert listed[MODEL]["waiting"] == 0  # no longer held, still remembered: the pool should still wake


def test_a_wrong_token_is_refused_and_never_forwarded() -> None:
    pool = Pool(delay=0).wake()
    try:
        eventually(lambda: pool.listening_at, timeout=5, every=0.02)
        with activator() as act:
            forged = {**signed(MODEL, pool.upstream), TOKEN_HEADER: "0" * 64}
            other_key = signed(MODEL, pool.upstream, key=b"z" * 48)
            missing = {k: v for k, v in signed(MODEL, pool.upstream).items() if k != TOKEN_HEADER}
            # Signed for one model, presented for another.
            swapped = {**signed("tenant-a/other", pool.upstream), MODEL_HEADER: MODEL}
            statuses = [call(act.url, "POST", "/rerank", h, b"{}").status
                        for h in (forged, other_key, missing, swapped)]
            counts = outcome_counts(act.url)
            listed = pending(act.url)
    finally:
        pool.stop()
    assert statuses == [401, 401, 401, 401]
    assert pool.seen == [] and listed == {}
    assert counts["unauthenticated"] == 4 and counts["forwarded"] == 0


def test_a_signed_upstream_in_another_namespace_is_refused() -> None:
    pool = Pool(delay=0).wake()
    try:
        eventually(lambda: pool.listening_at, timeout=5, every=0.02)
        elsewhere = upstream_of(pool.port, namespace="tenant-b")
        with activator() as act:
            reply = call(act.url, "POST", "/rerank", signed(MODEL, elsewhere), b"{}")
            no_model = {k: v for k, v in signed(MODEL, pool.upstream).items() if k != MODEL_HEADER}
            unsigned = call(act.url, "POST", "/rerank", no_model, b"{}")
            counts = outcome_counts(act.url)
    finally:
        pool.stop()
    assert (reply.status, unsigned.status) == (400, 400)
    assert pool.seen == [] and counts["invalid"] == 2


def test_while_the_key_is_rotated_both_keys_are_accepted_and_no_other() -> None:
    """The Secret holds the new key, then the old one: the activator takes tokens of either (routes written before
    the operator restarted carry the old one), and a token of any other key is still a 401."""
    old = b"o" * 48
    with activator(hold_seconds=0.3, also_accepted=(old,)) as act:
        by_new = call(act.url, "POST", "/rerank", signed(MODEL, upstream_of(1)), b"{}")
        by_old = call(act.url, "POST", "/rerank", signed(MODEL, upstream_of(1), key=old), b"{}")
        by_other = call(act.url, "POST", "/rerank", signed(MODEL, upstream_of(1), key=b"x" * 48), b"{}")
        listed = call(act.url, "GET", PENDING_PATH, {TOKEN_HEADER: pending_token(old)})
    assert (by_new.status, by_old.status, by_other.status, listed.status) == (503, 503, 401, 200)
