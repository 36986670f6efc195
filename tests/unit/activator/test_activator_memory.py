"""The ``rerank-activator`` process under a flood of maximal bodies stays under the memory limit the chart gives it.

The process runs with the chart's arguments and none of its own (the defaults are the chart's: 256 connections,
4 MiB bodies, 32 MiB held in all); 300 clients send 4 MiB bodies to 20 sleeping models as fast as they are answered,
for :data:`FLOOD_SECONDS`. Its peak resident memory (the kernel's VmHWM) must stay under the chart's
``activator.resources.limits.memory``, with room to spare for what a pod's memory accounting adds.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import yaml

from rerank_devcluster.processes import free_port
from tests.unit.activator.activator_helpers import KEY, outcome_counts, signed, upstream_of, wait_ready
from tests.unit.activator.test_activator_process import run_activator

REPO = Path(__file__).resolve().parents[3]
FLOOD_SECONDS = 12.0
CLIENTS, MODELS = 300, 20
BODY = 4 * 1024 * 1024  # the default --max-body-bytes


def chart_limit_bytes() -> int:
    values = yaml.safe_load((REPO / "charts" / "rerank-operator" / "values.yaml").read_text())
    limit = str(values["activator"]["resources"]["limits"]["memory"])
    assert limit.endswith("Mi"), limit
    return int(limit.removesuffix("Mi")) * 1024 * 1024


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_the_activator_stays_under_its_memory_limit_at_the_chart_defaults(tmp_path: Path) -> None:
    key_file, token = tmp_path / "key", tmp_path / "token"
    key_file.write_bytes(KEY + b"\n")
    token.write_text("t")
    port = free_port()
    proc = run_activator("--key-file", str(key_file), "--port", str(port), "--hold-seconds=30",
                         "--remember-seconds=60", "--log-format=json", "--api-server", f"https://127.0.0.1:{free_port()}",
                         "--api-ca-file", "/etc/ssl/certs/ca-certificates.crt", "--api-token-file", str(token))
    base = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    sent = [0] * CLIENTS
    body = b"x" * BODY

    def client(i: int) -> None:
        model = f"tenant-{i % MODELS}/m"
        headers = signed(model, upstream_of(1, namespace=f"tenant-{i % MODELS}"))
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = (f"POST /rerank HTTP/1.1\r\nHost: a\r\n{head}Content-Length: {BODY}\r\n\r\n").encode()
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=40) as s:
                    s.sendall(request + body)
                    s.recv(1024)
            except OSError:
                pass
            sent[i] += 1

    try:
        wait_ready(base, proc)
        baseline = peak_rss(proc.pid)
        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        time.sleep(FLOOD_SECONDS)
        peak = peak_rss(proc.pid)
        counts = outcome_counts(base)
        alive = proc.poll() is None
    finally:
        stop.set()
        proc.kill()
        proc.communicate()
    limit = chart_limit_bytes()
    print(json.dumps({"clients": CLIENTS, "models": MODELS, "body_bytes": BODY, "requests_sent": sum(sent),
                      "overloaded": counts["overloaded"], "rss_baseline_mib": round(baseline / 2**20, 1),
                      "rss_peak_mib": round(peak / 2**20, 1), "limit_mib": limit // 2**20}))
    assert alive, "the activator died under the flood"
    assert counts["overloaded"] > 0, "the flood reached the bounds"
    assert peak < 0.8 * limit, f"peak RSS {peak / 2**20:.0f} MiB against a limit of {limit / 2**20:.0f} MiB"
