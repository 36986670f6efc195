"""What the guard lets in (quality_guard/intake.py): only the copies the model's route mirrors, with its token, are
scored or kept; malformed, oversized, slow and surplus requests cost a bounded amount and change nothing.

The pools here answer at once with a fixed ranking (what they say does not matter; whether they were asked does), so
these tests run the real HTTP server without any model."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quality_guard import intake, server
from quality_guard.checks import Guard
from quality_guard.worker import Worker
from rerank_contracts.guard import GuardConfig, LiveSampleSettings

TOKEN = "s3cret-token-of-this-model"
TOKEN_ENV = "RERANK_GUARD_MIRROR_TOKEN"


def hostile(n: int) -> list[dict[str, Any]]:
    """Bodies an attacker would post: valid rerank requests (what the guard would score and keep)."""
    return [{"query": f"hostile query {i}", "texts": [f"passage {j}" for j in range(4)]} for i in range(n)]


class Pools:
    """The reference and the CPU pool in one: counts the calls a sampled request makes."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, base: str, body: Any) -> list[float]:
        with self._lock:
            self.calls += 1
        return [float(i) for i in range(len(body["texts"]))]


def guard_for(tmp_path: Path, pools: Pools, environ: dict[str, str] | None = None) -> Guard:
    live = LiveSampleSettings(path=str(tmp_path / "live.jsonl"), max_pairs=1000, max_age_seconds=3600)
    config = GuardConfig(namespace="team-a", model="search", pools={"cpu": "http://cpu"}, reference="http://ref",
                           fraction=1.0, calls_per_second=1e6, live_sample=live, mirror_token_env=TOKEN_ENV)
    return Guard(config, post=pools, environ={TOKEN_ENV: TOKEN} if environ is None else environ)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[server.Running, Pools]]:
    pools = Pools()
    up = server.serve(guard_for(tmp_path, pools), sample_every=0.05)
    yield up, pools
    up.stop()


def post(url: str, body: Any, token: str | None) -> int:
    headers = {"Content-Type": "application/json", **({intake.MIRROR_TOKEN_HEADER: token} if token else {})}
    req = urllib.request.Request(url + "/rerank", data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def outcomes(guard: Guard) -> dict[str, float]:
    page = guard.metrics().decode()
    found: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith("rerank_guard_requests_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            found[outcome] = float(line.rsplit(" ", 1)[1])
    return found


def settle(up: server.Running) -> None:
    """Let the worker check what was queued and the writer write the sample."""
    deadline = time.monotonic() + 10
    while not up.worker.queue.empty() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    up.worker.guard.write_sample()


def kept(tmp_path: Path) -> list[str]:
    path = tmp_path / "live.jsonl"
    return [json.loads(x)["query"] for x in path.read_text().splitlines()] if path.exists() else []


def test_an_unauthenticated_post_is_dropped_never_scored_or_stored(
        running: tuple[server.Running, Pools], tmp_path: Path) -> None:
    """A pod that reaches the guard without the route's token (another namespace, or the tenant's own) posts a
    stream: nothing of it reaches a pool, the detector or the live sample; the same stream through the mirror
    (with the token) is scored and kept."""
    up, pools = running
    guard = up.worker.guard
    stream = hostile(20)
    assert {post(up.url, b, None) for b in stream} == {401}
    assert {post(up.url, b, "a guess") for b in stream} == {401}
    assert {post(up.url, b, TOKEN[:-1]) for b in stream} == {401}
    settle(up)
    assert outcomes(guard) == {"unauthenticated": 60.0}
    assert pools.calls == 0 and guard.detectors["cpu"].samples == 0 and up.worker.done == 0
    assert kept(tmp_path) == []

    assert {post(up.url, b, TOKEN) for b in stream} == {202}
    settle(up)
    assert outcomes(guard) == {"unauthenticated": 60.0, "sampled": 20.0}
    assert guard.detectors["cpu"].samples == 20 and pools.calls == 40  # the reference and the pool, each
    assert kept(tmp_path) == [b["query"] for b in stream]


def test_a_guard_told_of_a_token_it_was_not_given_takes_nothing(tmp_path: Path) -> None:
    """The configuration names the variable but the pod has no value (a Secret gone, a typo): fail closed."""
    pools = Pools()
    guard = guard_for(tmp_path, pools, environ={})
    up = server.serve(guard)
    try:
        assert post(up.url, hostile(1)[0], None) == 401
        assert post(up.url, hostile(1)[0], "") == 401
    finally:
        up.stop()
    assert pools.calls == 0


def test_a_guard_configured_without_a_token_refuses_every_post_unless_told_to_accept_them(tmp_path: Path) -> None:
    """A guard run by hand, its configuration naming no token: it takes nothing, unless the configuration says
    ``accept_unsigned`` (then every POST counts, as on a trusted network)."""
    for accept, expected in ((False, 401), (True, 202)):
        pools = Pools()
        config = GuardConfig(namespace="n", model="m", pools={"cpu": "http://cpu"}, reference="http://ref",
                             fraction=1.0, calls_per_second=1e6, accept_unsigned=accept)
        up = server.serve(Guard(config, post=pools, environ={}), sample_every=0.05)
        try:
            assert post(up.url, hostile(1)[0], None) == expected
            settle(up)
        finally:
            up.stop()
        assert (pools.calls > 0) is accept


def raw(url: str, data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data`` as is and return all the server answers until it closes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        # The server may answer and hang up before all was sent (a header line too long, a refused request): a
        # broken pipe or a reset here is one of its answers, not the test's failure.
        with contextlib.suppress(OSError):
            s.sendall(data)
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:  # reset, or timed out
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


def request(body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in ("POST /rerank HTTP/1.1", "Host: guard", *headers))
    return head.encode() + b"\r\n" + body


@pytest.mark.parametrize(("headers", "body", "code"), [
    (("Content-Length: -5",), b"{}", 400),  # read "until the client closes" before
    (("Content-Length: +5",), b'{"a":', 400),
    (("Content-Length:  5 ",), b'{"a":', 400),  # http.client keeps inner spaces: " 5" after stripping the first
    (("Content-Length: 0x10",), b"{}", 400),
    (("Content-Length: 99999999999999999999",), b"{}", 400),
    ((f"Content-Length: {intake.MAX_BODY_BYTES + 1}",), b"{}", 413),
    (("Transfer-Encoding: chunked",), b"2\r\n{}\r\n0\r\n\r\n", 411),
    ((), b"{}", 400),  # no length at all
    (("Content-Length: 10",), b"{}", 400),  # fewer bytes than it said, then closed
    (("Content-Length: 200002",), b"[" * 100001 + b"]" * 100001, 202),  # deep nesting: parsed as invalid, not a crash
    (("Content-Length: 4",), b"\xff\xfe\x00\x01", 202),  # not UTF-8: invalid
])
def test_malformed_requests_are_refused_and_change_nothing(
        running: tuple[server.Running, Pools], tmp_path: Path, headers: tuple[str, ...], body: bytes,
        code: int) -> None:
    up, pools = running
    answer = raw(up.url, request(body, f"{intake.MIRROR_TOKEN_HEADER}: {TOKEN}", *headers))
    assert status_of(answer) == code, answer[:200]
    settle(up)
    assert pools.calls == 0 and kept(tmp_path) == []
    counted = outcomes(up.worker.guard)
    assert counted == {"invalid": 1.0}, counted
    with urllib.request.urlopen(up.url + "/healthz", timeout=5) as resp:
        assert resp.status == 200


def test_a_slow_client_is_cut_and_surplus_connections_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow-loris holds every slot it can: beyond MAX_CONNECTIONS a connection is closed at once, each held one is
    cut after CLIENT_TIMEOUT_SECONDS, and then the guard answers again."""
    monkeypatch.setattr(intake, "CLIENT_TIMEOUT_SECONDS", 1.0)
    pools = Pools()
    guard = Guard(GuardConfig(namespace="n", model="m", pools={"cpu": "http://cpu"},
                                       reference="http://ref"), post=pools)
    srv = intake.BoundedServer(("127.0.0.1", 0), intake.handler(Worker(guard), None), max_connections=3)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    host, port = srv.server_address[:2]
    try:
        held = [socket.create_connection((str(host), port), timeout=5) for _ in range(3)]
        for s in held:
            s.sendall(b"POST /rerank HTTP/1.1\r\nHost: g\r\n")  # headers never finished
        time.sleep(0.3)
        with socket.create_connection((str(host), port), timeout=5) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: g\r\n\r\n")
            assert extra.recv(100) == b""  # closed unanswered: no slot
        assert srv.refused == 1
        started = time.monotonic()
        for s in held:
            s.settimeout(5)
            assert s.recv(100) == b""  # the server hung up on it
            s.close()
        assert time.monotonic() - started < 3.0  # cut after about a second, not held until the client goes
        time.sleep(0.2)
        with urllib.request.urlopen(f"http://{host!s}:{port}/healthz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        srv.shutdown()
        srv.server_close()
    assert pools.calls == 0


def test_a_client_trickling_its_request_is_cut_at_the_deadline_of_the_whole_request(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each byte arrives well within the timeout of one read; the request as a whole does not, and is cut."""
    monkeypatch.setattr(intake, "CLIENT_TIMEOUT_SECONDS", 1.0)
    pools = Pools()
    up = server.serve(guard_for(tmp_path, pools))
    host, port = up.url.removeprefix("http://").split(":")
    body = json.dumps(hostile(1)[0]).encode()
    request = (f"POST /rerank HTTP/1.1\r\nHost: g\r\n{intake.MIRROR_TOKEN_HEADER}: {TOKEN}\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    try:
        s = socket.create_connection((host, int(port)), timeout=5)
        started, cut_after = time.monotonic(), None
        try:
            for byte in request:
                s.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:  # reset: the guard cut it
            cut_after = time.monotonic() - started
        if cut_after is None:
            assert s.recv(100) == b""
            cut_after = time.monotonic() - started
        s.close()
    finally:
        up.stop()
    assert cut_after < 2.5, f"cut after {cut_after:.1f} s"
    assert pools.calls == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(
    st.binary(max_size=2048),
    st.builds(lambda line, head, body: line + head + b"\r\n\r\n" + body,
              st.sampled_from([b"POST /rerank HTTP/1.1\r\n", b"POST /rerank HTTP/1.0\r\n", b"GET /metrics HTTP/1.1\r\n",
                               b"POST /rerank?x HTTP/1.1\r\n", b"PUT /rerank HTTP/1.1\r\n", b"POST  HTTP/1.1\r\n"]),
              st.lists(st.sampled_from([b"Content-Length: 5", b"Content-Length: -1", b"Content-Length: 1e3",
                                        b"Transfer-Encoding: chunked", b"Connection: keep-alive",
                                        b"X-Rerank-Mirror-Token: guess", b"Expect: 100-continue",
                                        b"X" * 70000, b"Content-Type: application/json"]),
                       max_size=4).map(lambda hs: b"\r\n".join(hs)),
              st.binary(max_size=512)),
))
def test_fuzzed_requests_without_the_token_are_never_scored_or_kept(
        running: tuple[server.Running, Pools], tmp_path: Path, data: bytes) -> None:
    """Whatever bytes a pod sends without the token: an answer or a closed connection, nothing scored or kept, and
    the guard still answers."""
    up, pools = running
    raw(up.url, data, timeout=3.0)
    assert pools.calls == 0 and up.worker.done == 0
    assert set(outcomes(up.worker.guard)) <= {"unauthenticated", "invalid"}
    with urllib.request.urlopen(up.url + "/healthz", timeout=5) as resp:
        assert resp.status == 200
    up.worker.guard.write_sample()
    assert kept(tmp_path) == []


def test_a_mirrored_copy_in_the_cohere_or_jina_shape_is_checked_as_teis(
        running: tuple[server.Running, Pools], tmp_path: Path) -> None:
    """A route's mirror copies every request as it came: one in the rerank API's shapes is read by its rules and
    checked and kept as TEI's; one those rules refuse (the pools refused it too) is not."""
    up, pools = running
    headers = {"Content-Type": "application/json", intake.MIRROR_TOKEN_HEADER: TOKEN}

    def send(path: str, body: Any) -> int:
        req = urllib.request.Request(up.url + path, data=json.dumps(body).encode(), method="POST", headers=headers)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)

    v2 = send("/v2/rerank", {"model": "search", "query": "cohere v2", "documents": ["a", "b"]})
    v1 = send("/v1/rerank", {"query": "jina v1", "documents": [{"text": "a"}, "b"], "top_n": 1})
    refused = send("/v2/rerank", {"query": "no documents", "documents": []})
    settle(up)
    assert (v2, v1, refused) == (202, 202, 202)
    assert sorted(kept(tmp_path)) == ["cohere v2", "jina v1"]
    assert pools.calls >= 4  # each kept copy checked on the reference and the pool


def test_the_rerank_apis_bodies_become_teis_and_anything_else_is_passed_as_it_came() -> None:
    assert intake.tei_shaped("/v1/rerank", b'{"query": "q", "documents": [{"text": "a", "id": 1}, "b"]}',
                             "application/json") == {"query": "q", "texts": ["a", "b"]}
    assert intake.tei_shaped("/v2/rerank", b'{"query": "q", "documents": "a"}', None) is None
    assert intake.tei_shaped("/rerank", b'{"query": "q", "texts": ["a"]}', None) == {"query": "q", "texts": ["a"]}
    assert intake.tei_shaped("/rerank", b"\xff", None) is None
