"""The ``rerank-activator`` process (rerank_activator/main.py, logs.py): it will not start without a usable key,
serves its routes on the port it is given, logs one JSON line per held request, and drains on SIGTERM."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import certifi
import pytest

from rerank_activator import logs, main, server
from rerank_contracts.activator import PENDING_PATH, TOKEN_HEADER, pending_token
from rerank_devcluster.processes import free_port
from rerank_devcluster.waiting import eventually
from tests.unit.activator.activator_helpers import KEY, MODEL, activator, call, signed, upstream_of, wait_ready


def run_activator(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "rerank_activator", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize(("content", "says"), [(None, "No such file"), (b"\n", "empty"), (b"short\n", "5 bytes")])
def test_no_usable_key_no_start(tmp_path: Path, content: bytes | None, says: str) -> None:
    key_file = tmp_path / "key"
    if content is not None:
        key_file.write_bytes(content)
    proc = run_activator("--key-file", str(key_file), "--port", str(free_port()))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert str(key_file) in err and says in err, err


def test_the_flags_and_their_defaults() -> None:
    defaults = main.parse_args([])
    assert (defaults.port, defaults.key_file, defaults.hold_seconds, defaults.remember_seconds) == (
        8080, "/var/run/rerank-activator/key", 30.0, 60.0)
    assert (defaults.max_connections, defaults.max_body_bytes, defaults.log_format) == (256, 4 * 1024 * 1024, "json")
    given = main.parse_args(["--port", "9", "--key-file", "/k", "--hold-seconds", "2.5", "--remember-seconds", "7",
                             "--max-connections", "3", "--max-body-bytes", "10", "--log-format", "text"])
    assert (given.port, given.key_file, given.hold_seconds, given.remember_seconds, given.max_connections,
            given.max_body_bytes, given.log_format) == (9, "/k", 2.5, 7.0, 3, 10, "text")
    for bad in (["--hold-seconds", "0"], ["--max-connections", "-1"], ["--log-format", "xml"]):
        with pytest.raises(SystemExit):
            main.parse_args(bad)


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    logs.configure("json", stream)
    yield stream
    logs.configure("json")


def test_one_json_line_per_held_request(log_lines: io.StringIO) -> None:
    with activator(hold_seconds=0.3) as act:
        call(act.url, "POST", "/rerank", signed(MODEL, upstream_of(free_port())), b"{}")
        call(act.url, "POST", "/rerank", {**signed(MODEL, upstream_of(1)), TOKEN_HEADER: "x"}, b"{}")
    (line,) = log_lines.getvalue().splitlines()  # the refused one is counted, not logged
    record = json.loads(line)
    assert record["severity"] == "info" and record["message"] and record["timestamp"].endswith("+00:00")
    assert (record["model"], record["outcome"], record["status"]) == (MODEL, "timeout", 503)
    assert 0.3 <= record["held_seconds"] < 1.5


def test_the_process_serves_its_routes_and_drains_on_sigterm(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY + b"\n")
    port = free_port()
    token = tmp_path / "token"
    token.write_text("t")
    no_api = ["--api-server", f"https://127.0.0.1:{free_port()}", "--api-ca-file", certifi.where(),
              "--api-token-file", str(token)]
    proc = run_activator("--key-file", str(key_file), "--port", str(port), "--hold-seconds", "1", *no_api)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        assert call(base, "GET", "/healthz").status == 200
        listed = call(base, "GET", PENDING_PATH, {TOKEN_HEADER: pending_token(KEY)})
        assert (listed.status, listed.json()) == (200, {"models": {}})
        assert b"rerank_activator_waiting 0.0" in call(base, "GET", "/metrics").body
        held = call(base, "POST", "/rerank", signed(MODEL, upstream_of(free_port())), b"{}")
        assert held.status == 503  # no pool here, nor an API server to list its endpoints
        assert b"the API server could not be reached" in held.body
        proc.send_signal(signal.SIGTERM)
        eventually(lambda: call(base, "GET", "/readyz", timeout=2).status == 503, timeout=server.DRAIN_DELAY_SECONDS,
                   every=0.1)
        assert call(base, "GET", "/healthz").status == 200  # alive while draining
        started = time.monotonic()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    # It drains: nothing held, so it leaves after the drain delay, not after a hold or the kill's grace period.
    assert time.monotonic() - started < server.DRAIN_DELAY_SECONDS + 20
    events = [json.loads(line) for line in err.splitlines()]
    assert [e["message"] for e in events] == ["activator listening", "held request answered", "draining", "stopped"]
    assert events[1]["outcome"] == "timeout" and events[-1]["drained"] is True
