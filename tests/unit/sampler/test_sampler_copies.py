"""The copies to the guard (rerank_sampler/sampling.py): the fraction drawn, the token set on each copy and never
taken from a client, only answered POST /rerank copied, and the guard being down or hanging never felt by a client;
the sampler's own /metrics page counts it all (rerank_sampler/metrics.py)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from rerank_contracts.guard import MIRROR_TOKEN_HEADER
from rerank_devcluster.processes import free_port
from rerank_devcluster.waiting import eventually
from rerank_sampler import logs
from rerank_sampler.metrics import CONTENT_TYPE
from rerank_sampler.sampling import Draw
from tests.unit.sampler.sampler_helpers import (
    RERANK,
    TOKEN,
    Guard,
    Hanging,
    Tei,
    ask,
    call,
    counts,
    kept_alive,
    nowhere,
    sampler,
    samples,
)

JSON = {"Content-Type": "application/json"}


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


def body(i: int) -> bytes:
    return json.dumps({"query": f"query {i}", "texts": ["a bear", f"text {i}"]}).encode()


def send(base: str, n: int, path: str = "/rerank") -> list[bytes]:
    """``n`` distinct rerank requests on one kept-alive connection, each answered 200; their bodies."""
    sent = [body(i) for i in range(n)]
    with kept_alive(base) as conn:
        for b in sent:
            assert ask(conn, "POST", path, JSON, b).status == 200
    return sent


def test_a_fifth_of_the_answered_requests_are_copied_each_exact_and_with_the_token(tei: Tei, guard: Guard) -> None:
    seed = 20240601
    draw = Draw(0.2, seed)
    drawn = sum(draw() for _ in range(1000))  # one client, one request at a time: the sampler draws in this order
    assert 160 <= drawn <= 240
    with sampler(tei.url, guard.url, fraction=0.2, queue_size=1000, seed=seed) as s:
        sent = send(s.url, 1000)
        eventually(lambda: counts(s.metrics_url, "copies")["sent"] == drawn, timeout=10, every=0.05)
        time.sleep(0.2)  # nothing more arrives late
        copies = counts(s.metrics_url, "copies")
        page = samples(s.metrics_url)
    assert guard.count() == drawn and 160 <= guard.count() <= 240
    assert copies == {"sent": drawn, "dropped": 0, "failed": 0}
    assert page[("rerank_sampler_requests_total", (("outcome", "proxied"),))] == 1000
    assert page[("rerank_sampler_fraction", ())] == 0.2 and page[("rerank_sampler_copies_queued", ())] == 0
    positions = []
    for copy in guard.received:
        assert (copy.method, copy.path) == ("POST", "/rerank")
        assert copy.header(MIRROR_TOKEN_HEADER) == [TOKEN]
        assert copy.header("Content-Type") == ["application/json"]
        positions.append(sent.index(copy.body))  # the exact body of a request sent
    assert positions == sorted(set(positions)), "each copied once, in the order answered"


@pytest.mark.parametrize(("fraction", "expected"), [(0.0, 0), (1.0, 200)])
def test_fraction_zero_copies_none_and_one_copies_all(tei: Tei, guard: Guard, fraction: float, expected: int) -> None:
    with sampler(tei.url, guard.url, fraction=fraction, queue_size=1000) as s:
        sent = send(s.url, 200)
        eventually(lambda: counts(s.metrics_url, "copies")["sent"] == expected, timeout=10, every=0.05)
        time.sleep(0.3)  # nothing more arrives late
        copies = counts(s.metrics_url, "copies")
    assert [c.body for c in guard.received] == sent[:expected]
    assert copies == {"sent": expected, "dropped": 0, "failed": 0}


def test_draws_are_seeded_and_within_bounds() -> None:
    first, again = Draw(0.3, seed=5), Draw(0.3, seed=5)
    drawn = [first() for _ in range(10_000)]
    assert drawn == [again() for _ in range(10_000)]
    assert 2_800 <= sum(drawn) <= 3_200
    assert not any(Draw(0.0)() for _ in range(1000)) and all(Draw(1.0)() for _ in range(1000))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            Draw(bad)


def test_a_client_token_never_reaches_the_guard(tei: Tei, guard: Guard) -> None:
    with sampler(tei.url, guard.url, fraction=1.0) as s:
        for name in (MIRROR_TOKEN_HEADER, MIRROR_TOKEN_HEADER.lower(), MIRROR_TOKEN_HEADER.upper()):
            assert call(s.url, "POST", "/rerank", {**JSON, name: "forged"}, RERANK).status == 200
        eventually(lambda: guard.count() == 3, timeout=10, every=0.05)
    for copy in guard.received:
        assert copy.header(MIRROR_TOKEN_HEADER) == [TOKEN], copy.headers
        assert {k.lower() for k, _ in copy.headers} <= {"host", "accept-encoding", "content-length", "content-type",
                                                        MIRROR_TOKEN_HEADER.lower()}
    assert all(not seen.header(MIRROR_TOKEN_HEADER) for seen in tei.seen)


def test_the_guards_own_checks_are_not_copied_back_to_it(tei: Tei, guard: Guard) -> None:
    """The guard asks the pools with the model's token (quality_guard/endpoints.py): those calls are served, the token
    stripped before TEI, and never copied (the guard would check its own calls, over and over); a wrong token is a
    client's and is copied like any request."""
    with sampler(tei.url, guard.url, fraction=1.0) as s:
        assert call(s.url, "POST", "/rerank", {**JSON, MIRROR_TOKEN_HEADER: TOKEN}, RERANK).status == 200
        assert call(s.url, "POST", "/rerank", {**JSON, MIRROR_TOKEN_HEADER: TOKEN + "x"}, RERANK).status == 200
        eventually(lambda: guard.count() == 1, timeout=10, every=0.05)
        time.sleep(0.3)  # a second copy, were there one, would have arrived by now
        assert guard.count() == 1
    assert len(tei.seen) == 2 and all(not seen.header(MIRROR_TOKEN_HEADER) for seen in tei.seen)


def test_only_answered_post_rerank_is_copied(tei: Tei, guard: Guard) -> None:
    with sampler(tei.url, guard.url, fraction=1.0) as s:
        refused = call(s.url, "POST", "/rerank", JSON, b'{"query":"","texts":["a"]}')  # TEI: 422
        others = [call(s.url, "GET", "/health").status, call(s.url, "POST", "/health", JSON, RERANK).status,
                  call(s.url, "GET", "/rerank").status, call(s.url, "POST", "/nothing", JSON, RERANK).status,
                  call(s.url, "POST", "/rerank/x", JSON, RERANK).status]
        time.sleep(0.3)
        nothing_yet = guard.count()
        ok = call(s.url, "POST", "/rerank", JSON, RERANK)  # and then one that is: the guard does get copies
        eventually(lambda: guard.count() == 1, timeout=10, every=0.05)
        requests = counts(s.metrics_url, "requests")
    assert refused.status == 422 and others == [200, 200, 404, 404, 404] and ok.status == 200
    assert nothing_yet == 0 and [c.body for c in guard.received] == [RERANK]
    assert requests == {"proxied": 7, "upstream_error": 0, "invalid": 0, "translated": 0}


def timed_requests(base: str, n: int, clients: int = 4) -> list[tuple[int, float]]:
    """``n`` rerank requests from ``clients`` threads: (status, seconds) each."""
    def one(i: int) -> tuple[int, float]:
        started = time.monotonic()
        status = call(base, "POST", "/rerank", JSON, body(i), timeout=10).status
        return status, time.monotonic() - started

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, range(n)))


def test_the_guard_down_never_touches_serving(tei: Tei) -> None:
    with sampler(tei.url, nowhere(), fraction=1.0) as s:
        results = timed_requests(s.url, 60)
        copies = eventually(lambda: (c := counts(s.metrics_url, "copies"))["failed"] + c["dropped"] == 60 and c,
                            timeout=10, every=0.05)
    assert {status for status, _ in results} == {200}
    assert max(seconds for _, seconds in results) < 1.0
    assert copies["sent"] == 0 and copies["failed"] > 0


def test_a_hanging_guard_never_touches_serving() -> None:
    tei, hanging = Tei(), Hanging()
    try:
        with sampler(tei.url, hanging.url, fraction=1.0, queue_size=4, copy_timeout=0.5) as s:
            started = time.monotonic()
            results = timed_requests(s.url, 60)
            elapsed = time.monotonic() - started
            # The courier is stuck on one copy for 0.5 s at a time: the queue fills, the rest is dropped.
            copies = eventually(lambda: (c := counts(s.metrics_url, "copies"))["failed"] + c["dropped"] == 60 and c,
                                timeout=15, every=0.05)
            queued = samples(s.metrics_url)[("rerank_sampler_copies_queued", ())]
    finally:
        tei.stop()
        hanging.stop()
    assert {status for status, _ in results} == {200}
    assert max(seconds for _, seconds in results) < 1.0 and elapsed < 10.0
    assert copies["sent"] == 0 and copies["failed"] >= 1 and copies["dropped"] >= 60 - 4 - copies["failed"]
    assert queued == 0


def test_the_queue_is_bounded_in_bytes_too() -> None:
    tei, hanging = Tei(), Hanging()
    try:
        # Each body is 51 bytes: two fit in 150 bytes, a third does not.
        with sampler(tei.url, hanging.url, fraction=1.0, queue_bytes=150, copy_timeout=0.5) as s:
            results = timed_requests(s.url, 10, clients=1)
            copies = eventually(lambda: (c := counts(s.metrics_url, "copies"))["failed"] + c["dropped"] == 10 and c,
                                timeout=15, every=0.05)
    finally:
        tei.stop()
        hanging.stop()
    assert {status for status, _ in results} == {200}
    # By count the queue (64) would have taken them all; by bytes at most two wait while one is being sent.
    assert copies["dropped"] >= 5 and copies["sent"] == 0


def test_the_guard_becoming_unreachable_and_reachable_again_is_logged_once_each(tei: Tei) -> None:
    port = free_port()
    stream = io.StringIO()
    logs.configure("json", stream)
    try:
        with sampler(tei.url, f"http://127.0.0.1:{port}", fraction=1.0) as s:
            send(s.url, 5)
            eventually(lambda: counts(s.metrics_url, "copies")["failed"] == 5, timeout=10, every=0.05)
            back = Guard(port=port)
            try:
                send(s.url, 3)
                eventually(lambda: counts(s.metrics_url, "copies")["sent"] == 3, timeout=10, every=0.05)
            finally:
                back.stop()
    finally:
        logs.configure("json")
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["message"], e["severity"]) for e in events] == [("copies do not reach the guard", "warn"),
                                                               ("copies reach the guard again", "info")]
    assert "ConnectionRefusedError" in events[0]["error"] and events[0]["guard"] == f"127.0.0.1:{port}"


def test_the_metrics_page(tei: Tei, guard: Guard) -> None:
    with sampler(tei.url, guard.url, fraction=1.0) as s:
        call(s.url, "POST", "/rerank", JSON, RERANK)
        call(s.url, "POST", "/rerank", {"Content-Length": "99999999"}, None)  # refused: 413
        eventually(lambda: counts(s.metrics_url, "copies")["sent"] == 1, timeout=10, every=0.05)
        page = call(s.metrics_url, "GET", "/metrics")
        elsewhere = call(s.metrics_url, "GET", "/other")
        teis = call(s.url, "GET", "/metrics")  # the serving port's /metrics is TEI's
        values = samples(s.metrics_url)
    assert page.status == 200 and page.header("Content-Type") == [CONTENT_TYPE]
    assert elsewhere.status == 404
    assert teis.body == b"te_request_count 7\n"
    assert all(v == 0 for (name, _), v in values.items() if name.startswith("rerank_api_"))  # no API request
    assert {k: v for k, v in values.items() if not k[0].startswith("rerank_api_")} == {
        ("rerank_sampler_requests_total", (("outcome", "translated"),)): 0.0,
        ("rerank_sampler_requests_total", (("outcome", "proxied"),)): 2.0,  # the page's own read of TEI's /metrics
        ("rerank_sampler_requests_total", (("outcome", "upstream_error"),)): 0.0,
        ("rerank_sampler_requests_total", (("outcome", "invalid"),)): 1.0,
        ("rerank_sampler_copies_total", (("outcome", "sent"),)): 1.0,
        ("rerank_sampler_copies_total", (("outcome", "dropped"),)): 0.0,
        ("rerank_sampler_copies_total", (("outcome", "failed"),)): 0.0,
        ("rerank_sampler_copies_queued", ()): 0.0,
        ("rerank_sampler_fraction", ()): 1.0,
    }
