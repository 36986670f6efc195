"""The shared activator under a flood, at the chart's defaults: what it holds, its peak memory, and how long another
model's request waits for its pool meanwhile; JSON.

    .venv/bin/python -m benchmarks.activator_flood [--clients 300] [--models 20] [--tenants 1] [--body-bytes 4194304]
        [--seconds 20] [--pool-delay 1.0] [--out FILE]

The activator runs as its own process with the chart's settings (``rerank_activator.server.Settings``' defaults
are the chart's: 256 connections, 4 MiB bodies, 32 MiB of large bodies held, 64 requests a namespace, a 30 s hold).
Its lookup of a pool's endpoints answers from a table here instead of an API server (what is measured is the front,
the admission and the hold): the flooded models never wake; the other model's pool starts listening
``--pool-delay`` s after its request is sent, as a pod would. ``--clients`` clients send ``--body-bytes`` bodies to
``--models`` sleeping models (of ``--tenants`` namespaces) as fast as each is answered, for ``--seconds``; halfway,
the other model's request. Reported: requests sent, by status (0: the connection was closed on a client still
sending its body, after the 503 was written); the most requests held at once (sampled /metrics every 0.2 s); the
process's peak RSS (VmHWM) against the chart's 256 MiB limit; the other model's wait and status.

Measured on "AMD EPYC" (family 25, model 17: Zen 4), 2 vCPUs, Python 3.11.7, clients, activator and pool on the same
2 vCPUs, defaults as above: see the module's last run in the closing note of issue 58 (peak RSS 60-70 MiB; the other
model answered about ``--pool-delay`` + 0.1-0.5 s after its request; before the bounds the same flood took the process
to 1061 MiB and refused the /metrics scrape at accept).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks.sampler_overhead import cpu_model
from rerank_contracts import activator
from rerank_devcluster.processes import free_port

KEY = b"k" * 48
OTHER_NAMESPACE = "other"
LIMIT_MIB = 256  # the chart's activator.resources.limits.memory


def serve(port: int, other_port: int) -> None:
    """The activator process: the chart's settings, endpoints from a table (the other model's pool, or none)."""
    from rerank_activator import server

    def locate(namespace: str, service: str, svc_port: int) -> list[tuple[str, int]]:
        return [("127.0.0.1", other_port)] if namespace == OTHER_NAMESPACE else []

    server.start(server.Settings(key=KEY), "127.0.0.1", port, locate=locate)
    threading.Event().wait()


def signed(model: str, namespace: str, port: int) -> dict[str, str]:
    upstream = f"http://m-cpu.{namespace}.svc:{port}"
    return {activator.MODEL_HEADER: model, activator.UPSTREAM_HEADER: upstream,
            activator.TOKEN_HEADER: activator.token(KEY, model, upstream)}


def request_bytes(headers: dict[str, str], body_bytes: int) -> bytes:
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"POST /rerank HTTP/1.1\r\nHost: a\r\n{head}Content-Length: {body_bytes}\r\n\r\n".encode()


def status_of(sock: socket.socket) -> int:
    data = sock.recv(1024)
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metric(port: int, name: str, labels: str = "") -> float:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        page = b""
        while chunk := s.recv(65536):
            page += chunk
    for line in page.decode().splitlines():
        if line.startswith(name + labels + " "):
            return float(line.split()[-1])
    return float("nan")


class Pool(ThreadingHTTPServer):
    """The other model's pool: answers /rerank with its body once it listens."""

    daemon_threads = True

    def __init__(self, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(("127.0.0.1", port), Handler)


def run(args: argparse.Namespace) -> dict[str, Any]:
    port, other_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.activator_flood", "--serve", str(port),
                             str(other_port)])
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the activator did not start") from None
            time.sleep(0.1)
    baseline = peak_rss_mib(proc.pid)
    stop = threading.Event()
    outcomes: dict[int, int] = {}
    lock = threading.Lock()
    body = b"x" * args.body_bytes

    def client(i: int) -> None:
        namespace = f"tenant-{i % args.tenants}"
        head = request_bytes(signed(f"{namespace}/m{i % args.models}", namespace, 8080), args.body_bytes)
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                    s.sendall(head + body)
                    code = status_of(s)
            except OSError:
                code = 0
            with lock:
                outcomes[code] = outcomes.get(code, 0) + 1

    held_max = 0.0

    def sample() -> None:
        nonlocal held_max
        while not stop.wait(0.2):
            with contextlib.suppress(OSError):
                held_max = max(held_max, metric(port, "rerank_activator_waiting"))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    for t in [*threads, threading.Thread(target=sample, daemon=True)]:
        t.start()
    time.sleep(args.seconds / 2)
    pool = Pool(other_port)
    threading.Timer(args.pool_delay, pool.serve_forever).start()
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            other = signed(f"{OTHER_NAMESPACE}/m", OTHER_NAMESPACE, 8080)
            s.sendall(request_bytes(other, 20) + b'{"q": "the other"}  ')
            other_status = status_of(s)
    except OSError:
        other_status = 0
    other_wait = time.monotonic() - started
    time.sleep(max(0.0, args.seconds / 2 - other_wait))
    peak = peak_rss_mib(proc.pid)
    overloaded = metric(port, "rerank_activator_requests_total", '{outcome="overloaded"}')
    stop.set()
    proc.kill()
    proc.wait()
    pool.shutdown()
    return {"benchmark": "activator_flood", "cpu": cpu_model(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "clients": args.clients, "models": args.models,
            "tenants": args.tenants,
            "body_bytes": args.body_bytes, "seconds": args.seconds,
            "requests_by_status": {str(k): v for k, v in sorted(outcomes.items())},
            "overloaded": overloaded, "held_at_most": held_max, "rss_baseline_mib": round(baseline, 1),
            "rss_peak_mib": round(peak, 1), "limit_mib": LIMIT_MIB,
            "other_model": {"status": other_status, "pool_listening_after_s": args.pool_delay,
                            "answered_after_s": round(other_wait, 2)}}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=300)
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--tenants", type=int, default=1, help="namespaces the flooded models are spread over")
    ap.add_argument("--body-bytes", type=int, default=4 * 1024 * 1024)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--pool-delay", type=float, default=1.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    text = json.dumps(run(args), indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
