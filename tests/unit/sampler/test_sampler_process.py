"""The ``rerank-sampler`` process (rerank_sampler/main.py, logs.py): it will not start without the mirror token,
serves and copies on the ports it is given, and on SIGTERM stops accepting, finishes what is in flight, exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from rerank_contracts import guard as contract
from rerank_devcluster.processes import free_port
from rerank_devcluster.waiting import eventually
from rerank_sampler import main
from tests.unit.sampler.sampler_helpers import RERANK, TOKEN, Guard, Reply, Tei, call, counts


def run_sampler(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if k != contract.MIRROR_TOKEN_ENV}
    return subprocess.Popen([sys.executable, "-m", "rerank_sampler", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**environ, **(env or {})})


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


@pytest.mark.parametrize("env", [{}, {contract.MIRROR_TOKEN_ENV: ""}, {"OTHER_TOKEN": TOKEN}])
def test_no_token_no_start(env: dict[str, str]) -> None:
    proc = run_sampler("--guard-url", "http://127.0.0.1:1", "--fraction", "0.1", "--port", str(free_port()),
                       "--metrics-port", str(free_port()), env=env)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert contract.MIRROR_TOKEN_ENV in err and "unset or empty" in err, err


def test_the_flags_and_their_defaults() -> None:
    defaults = main.parse_args(["--guard-url", "http://m1-guard.tenant-a.svc:80", "--fraction", "0.05"])
    assert (defaults.port, defaults.metrics_port, defaults.upstream, defaults.token_env) == (
        8082, 9091, "http://127.0.0.1:8080", "RERANK_GUARD_MIRROR_TOKEN")
    assert (defaults.queue_size, defaults.queue_bytes, defaults.max_body_bytes, defaults.max_connections) == (
        64, 16 * 1024 * 1024, 2 * 1024 * 1024, 1024)
    assert (defaults.upstream_timeout, defaults.drain_seconds, defaults.seed, defaults.log_format) == (
        60.0, 10.0, None, "json")
    assert (defaults.guard_url, defaults.fraction) == ("http://m1-guard.tenant-a.svc:80", 0.05)
    unguarded = main.parse_args(["--model-name", "m1", "--model-name", "tenant-a/m1", "--long-documents", "chunk"])
    assert (unguarded.guard_url, unguarded.fraction, unguarded.model_names, unguarded.long_documents) == (
        None, None, ["m1", "tenant-a/m1"], "chunk")
    assert main.parse_args([]).long_documents == "truncate"
    for bad in (["--fraction", "0.1"], ["--guard-url", "http://g:80"], ["--long-documents", "summarize"],
                ["--guard-url", "https://g:443", "--fraction", "0.1"],
                ["--guard-url", "http://g:80/rerank", "--fraction", "0.1"],
                ["--guard-url", "http://g:80", "--fraction", "1.5"],
                ["--guard-url", "http://g:80", "--fraction", "0.1", "--queue-size", "0"]):
        with pytest.raises(SystemExit):
            main.parse_args(bad)


def test_the_process_serves_copies_and_drains_on_sigterm(tei: Tei, guard: Guard) -> None:
    port, metrics_port = free_port(), free_port()
    proc = run_sampler("--guard-url", guard.url, "--fraction", "1", "--port", str(port), "--metrics-port",
                       str(metrics_port), "--upstream", tei.url, env={contract.MIRROR_TOKEN_ENV: TOKEN})
    base, metrics_base = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}"
    try:
        def up() -> bool:
            try:
                return call(base, "GET", contract.SAMPLER_HEALTH_PATH, timeout=2).status == 200
            except OSError:
                assert proc.poll() is None, proc.communicate()[1]
                return False

        eventually(up, timeout=30, every=0.1)
        served = call(base, "POST", "/rerank", {"Content-Type": "application/json"}, RERANK)
        assert served.status == 200 and json.loads(served.body)[0]["index"] == 0
        eventually(lambda: guard.count() == 1, timeout=10, every=0.05)
        assert guard.received[0].header(contract.MIRROR_TOKEN_HEADER) == [TOKEN]
        eventually(lambda: counts(metrics_base, "copies")["sent"] == 1, timeout=10, every=0.05)
        # A request in flight when SIGTERM comes is finished; a new connection after it is refused.
        slow: list[Reply] = []
        in_flight = threading.Thread(target=lambda: slow.append(call(base, "GET", "/slow?s=1.5")))
        in_flight.start()
        eventually(lambda: any(s.path.startswith("/slow") for s in tei.seen), timeout=10, every=0.02)
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()

        def refused() -> bool:
            try:
                call(base, "GET", contract.SAMPLER_HEALTH_PATH, timeout=1)
            except OSError:
                return True
            return False

        eventually(refused, timeout=5, every=0.05)
        in_flight.join(timeout=10)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    (reply,) = slow
    assert (reply.status, reply.body) == (200, b'"slow"') and reply.header("Connection") == ["close"]
    assert took < 1.5 + 5, "it left once the request in flight was answered, not after the whole drain"
    events = [json.loads(line) for line in err.splitlines()]
    assert [e["message"] for e in events] == ["sampler listening", "draining", "stopped"], err
    assert events[0]["fraction"] == 1.0 and events[0]["port"] == port
    # In flight at the signal: the slow request (and perhaps a probe of the listener, answered before it closed).
    assert events[1]["in_flight"] >= 1 and events[-1]["drained"] is True and events[-1]["sent"] == 1
    assert all(e["severity"] == "info" and e["timestamp"].endswith("+00:00") for e in events)
