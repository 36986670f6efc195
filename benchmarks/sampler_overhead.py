"""What the sampler (rerank_sampler) costs a request: the same /rerank load straight to an upstream and through a
``rerank-sampler`` process in front of it; JSON.

    .venv/bin/python -m benchmarks.sampler_overhead [--upstream URL] [--requests 3000] [--concurrency 4]
        [--texts 8] [--fraction 0.05] [--rounds 2] [--out FILE]

The upstream is a stand-in TEI by default (a stdlib HTTP/1.1 server in a process of its own that answers /rerank with
a JSON score list at once, so that what is measured is the proxy, not a model), or ``--upstream`` a real TEI router
(``text-embeddings-router --port 8080``); a stand-in guard (202 to every POST) takes the copies either way. The
sampler runs as it does in a pod: ``python -m rerank_sampler`` with its mirror token in the environment. The clients
are ``--concurrency`` processes, each sending its share of ``--requests`` on one kept-alive connection, the same
body (a query and ``--texts`` passages) to both targets; the targets alternate for ``--rounds`` rounds after a
warm-up. Per target and round: requests/s, p50, p95 and p99 latency; ``overhead`` compares the medians over the rounds.

The JSON names the CPU it ran on (``cpu``: /proc/cpuinfo's model name, family and model; ``cpus``); the clients, the
sampler and the stand-ins share those CPUs, so on a small machine the sampler's own CPU time is part of what a client
waits for. Measured on "AMD EPYC" (family 25, model 17: Zen 4), 2 vCPUs shared with other work (load average 2 to 5),
Python 3.11.7, the stand-in upstream, 8 passages (894 bytes), fraction 0.05:

- concurrency 1, 2000 requests: direct p50 0.27 ms, p95 0.39 ms; through the sampler p50 0.54 ms, p95 0.99 ms
  (+0.27 ms p50, steady from run to run);
- concurrency 4, 3000 requests (4 client processes, the stand-in and the sampler on 2 vCPUs): direct 3700 to 5250
  requests/s, p50 0.64 to 0.88 ms; through the sampler 1500 to 2600 requests/s, p50 1.4 to 2.6 ms over six runs
  (the machine's load moved them more than anything else).

The sampler costs about 0.3 ms of CPU a request on that machine (GIL-bound: one sampler process tops out near 3000
requests/s there), against a TEI rerank of tens of milliseconds on CPU.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rerank_contracts import guard as contract

TOKEN = "benchmark-mirror-token"


def cpu_model() -> str:
    """/proc/cpuinfo's first processor: its model name, family and model ("unknown" where there is none)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip() and fields:
                break  # the first processor's block ends
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or "unknown"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


# -- the stand-ins (run in a process of their own: ``--serve-stand-ins``) ----------------------------------------------

class _Listener(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


def _stand_in_tei() -> type[BaseHTTPRequestHandler]:
    class Tei(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            scores = [{"index": i, "score": round(1 / (i + 2), 6)} for i in range(len(request.get("texts", [])))]
            body = json.dumps(scores).encode()
            head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
            self.wfile.write(head.encode() + body)  # one send, as TEI's server writes a small answer

        def do_GET(self) -> None:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    return Tei


def _stand_in_guard() -> type[BaseHTTPRequestHandler]:
    class Guard(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.wfile.write(b"HTTP/1.0 202 Accepted\r\nContent-Length: 2\r\n\r\n{}")

    return Guard


def serve_stand_ins() -> None:
    """Serve the TEI and guard stand-ins on free ports; print them as one JSON line; run until SIGTERM."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    tei = _Listener(("127.0.0.1", 0), _stand_in_tei())
    guard = _Listener(("127.0.0.1", 0), _stand_in_guard())
    for srv in (tei, guard):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    print(json.dumps({"tei": tei.server_address[1], "guard": guard.server_address[1]}), flush=True)
    signal.sigwait({signal.SIGTERM})


# -- the load ------------------------------------------------------------------------------------------------------

def client(base: str, body: bytes, n: int) -> tuple[list[float], float, float, int]:
    """``n`` POST /rerank on one kept-alive connection: (latencies in s, first start, last end, answers not 200)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {"Content-Type": "application/json"}
    latencies, bad = [], 0
    first = time.time()
    try:
        for _ in range(n):
            started = time.perf_counter()
            conn.request("POST", "/rerank", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            latencies.append(time.perf_counter() - started)
            bad += response.status != 200
    finally:
        conn.close()
    return latencies, first, time.time(), bad


def load(pool: ProcessPoolExecutor, base: str, body: bytes, requests: int, concurrency: int) -> dict[str, float]:
    share = requests // concurrency
    results = list(pool.map(client, [base] * concurrency, [body] * concurrency, [share] * concurrency))
    latencies = sorted(x for r in results for x in r[0])
    wall = max(r[2] for r in results) - min(r[1] for r in results)

    def pct(p: float) -> float:
        return round(1000 * latencies[min(len(latencies) - 1, int(p * len(latencies)))], 3)

    return {"requests": len(latencies), "not_200": sum(r[3] for r in results),
            "requests_per_second": round(len(latencies) / wall, 1), "p50_ms": pct(0.50), "p95_ms": pct(0.95),
            "p99_ms": pct(0.99)}


def wait_until_up(base: str, timeout: float = 30) -> None:
    host, port = base.removeprefix("http://").split(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=2)
            conn.request("GET", contract.SAMPLER_HEALTH_PATH)
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class FrontProcess:
    """``python -m rerank_sampler`` (the pods' front) before ``upstream``, on free local ports, as a pod runs it:
    ``args`` are its other flags, ``env`` what its environment adds (a guarded front's mirror token). Up (its own
    health route answers) once constructed; ``close`` sends SIGTERM and waits for it to drain."""

    def __init__(self, upstream: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rerank_sampler", "--upstream", upstream, "--port", str(self.port),
             "--metrics-port", str(self.metrics_port), *args],
            env={**os.environ, **(env or {})}, stderr=subprocess.DEVNULL)
        self.url, self.metrics_url = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.metrics_port}"
        try:
            wait_until_up(self.url)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


def copies(metrics_base: str) -> dict[str, int]:
    host, port = metrics_base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return {line.split('"')[1]: int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
            if line.startswith("rerank_sampler_copies_total{")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--upstream", help="a real TEI router, http://host:port (default: a stand-in)")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--texts", type=int, default=8, help="passages per request")
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--serve-stand-ins", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_stand_ins:
        serve_stand_ins()
        return

    body = json.dumps({"query": "what does a reranker do with a query and its passages?",
                       "texts": [f"passage {i}: a reranker scores each passage against the query, one by one, and "
                                 f"the caller sorts them" for i in range(args.texts)]}).encode()
    stand_ins = subprocess.Popen([sys.executable, "-m", "benchmarks.sampler_overhead", "--serve-stand-ins"],
                                 stdout=subprocess.PIPE, text=True)
    sampler: FrontProcess | None = None
    try:
        assert stand_ins.stdout is not None
        ports = json.loads(stand_ins.stdout.readline())
        upstream = args.upstream or f"http://127.0.0.1:{ports['tei']}"
        sampler = FrontProcess(upstream, "--guard-url", f"http://127.0.0.1:{ports['guard']}", "--fraction",
                               str(args.fraction), "--seed", "1", env={contract.MIRROR_TOKEN_ENV: TOKEN})
        through = sampler.url
        targets = {"direct": upstream, "sampler": through}
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
        with ProcessPoolExecutor(args.concurrency) as pool:
            for base in targets.values():  # warm-up: connections, the processes' first requests
                load(pool, base, body, min(args.requests, 200 * args.concurrency), args.concurrency)
            for _ in range(args.rounds):
                for name, base in targets.items():
                    rounds[name].append(load(pool, base, body, args.requests, args.concurrency))
        sent_copies = copies(sampler.metrics_url)
    finally:
        if sampler is not None:
            sampler.close()
        stand_ins.send_signal(signal.SIGTERM)
        stand_ins.wait(timeout=30)

    def median(name: str, key: str) -> float:
        return round(statistics.median(r[key] for r in rounds[name]), 3)

    summary = {name: {key: median(name, key) for key in ("requests_per_second", "p50_ms", "p95_ms", "p99_ms")}
               for name in targets}
    result = {
        "cpu": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "upstream": args.upstream or "stand-in", "requests": args.requests, "concurrency": args.concurrency,
        "texts": args.texts, "body_bytes": len(body), "fraction": args.fraction, "rounds": rounds,
        "median": summary,
        "overhead": {
            "p50_ms": round(summary["sampler"]["p50_ms"] - summary["direct"]["p50_ms"], 3),
            "p95_ms": round(summary["sampler"]["p95_ms"] - summary["direct"]["p95_ms"], 3),
            "throughput_ratio": round(summary["sampler"]["requests_per_second"]
                                      / summary["direct"]["requests_per_second"], 3),
        },
        "copies": sent_copies,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
