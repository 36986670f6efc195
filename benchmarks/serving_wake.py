"""Scale to zero with a real TEI router on the real node: a sleeping model woken again and again under a burst; JSON.

    .venv/bin/python -m benchmarks.serving_wake --router /path/to/text-embeddings-router [--wakes 5] [--burst 20]
        [--idle-seconds 30] [--after-seconds 30] [--measure-wakes N] [--workdir DIR] [--out FILE]

Opt-in, as ``benchmarks.serving_e2e`` (whose set-up it shares: ``serving_e2e.Stack``): the dev cluster with its real
node, the chart released, the MiniLM fixture's model quantized by the Job and served by a CPU pool of the TEI image
on the real node, here with every pool at ``minReplicas: 0``, ``idleSeconds`` and ``routing.gateway``, and the chart's
``activator.enabled``.

The dev cluster has no cluster DNS and no kube-proxy, so two things stand in for them, as the ramp's client stands in
for the Service: the activator that holds the requests runs in this process (``rerank_activator.server``, the code
of the chart's pod) with the release's key, on the node's bridge, and the operator pod is pointed at it (an extra
``--activator-url`` after the chart's); its connections to the pool's Service go to the pool's Ready pod, as
kube-proxy would send them. This process plays the Gateway: each request carries the headers the model's HTTPRoute
sets, read from the route, and goes to the activator while the route points there, to the pool's pod otherwise.

First the pool's steady p95 under a light load (``--load-rps``). Then each wake: wait until the model is asleep
(route to the activator, no CPU pod), send ``--burst`` requests at once (the fixture's held-out queries, 8 passages
each) and record when each is answered; then keep the light load for ``--after-seconds`` (p95 per 5 s window; after
the first ``--measure-wakes`` wakes only 5 s, so that a long run of wakes counts losses sooner); then stop and let it
sleep again. JSON: ``wake_first_answer_s`` per wake (and median, max), ``lost`` (answers other than 200, or none),
the p95 windows after each wake against the steady p95 and ``p95_back_after_s`` (from when on every window is within
20% of it: ``back_to_steady_after``), and the phases' timings.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.serving_e2e import (
    MODEL,
    NS,
    OPERATOR_NS,
    RELEASE,
    TEI_PORT,
    Stack,
    cpu_pods,
    emit,
    kget,
    log,
    percentile,
    ready,
    rerank_model,
)
from rerank_activator import server as activator_server
from rerank_contracts import activator
from rerank_devcluster import binaries, realnode
from rerank_devcluster.cluster import Cluster, free_port
from rerank_devcluster.operator_process import apply_and_wait_established
from rerank_devcluster.waiting import eventually

GATEWAY = {"parentRefs": [{"name": "shared", "namespace": "gateway-system"}]}


def sleepy_model(idle_seconds: int) -> Any:
    """serving_e2e's model, able to go to zero."""
    def build(quantizer: str, tei: str) -> dict[str, Any]:
        model = rerank_model(quantizer, tei, scale_down_seconds=30)
        spec = model["spec"]
        spec["pools"]["cpu"]["minReplicas"] = 0
        spec["autoscaling"]["idleSeconds"] = idle_seconds
        spec["routing"]["gateway"] = GATEWAY
        return model
    return build


class PoolAddress:
    """Where the pool's Service would send a connection now: its Ready pod (refreshed every 0.25 s)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.ip: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            pods = [p for p in cpu_pods(self.cluster) if ready(p) and not p["metadata"].get("deletionTimestamp")]
            self.ip = pods[0]["status"]["podIP"] if pods else None

    def locate(self, namespace: str, service: str, port: int) -> list[tuple[str, int]]:
        return [] if self.ip is None else [(self.ip, TEI_PORT)]

    def stop(self) -> None:
        self._stop.set()


class Gateway:
    """Sends ``/rerank`` as a Gateway would: to the activator with the route's headers while the route points at
    it, else to the pool (its Ready pod)."""

    def __init__(self, cluster: Cluster, activator_url: str, pool: PoolAddress,
                 groups: list[tuple[str, list[str]]]) -> None:
        self.cluster, self.activator_url, self.pool, self.groups = cluster, activator_url, pool, groups
        self.turn = 0

    def route(self) -> tuple[bool, dict[str, str]]:
        rule = (kget(self.cluster, "httproute", MODEL, "-n", NS) or {}).get("spec", {}).get("rules", [{}])[0]
        to_activator = any(ref.get("namespace") == OPERATOR_NS for ref in rule.get("backendRefs") or ())
        headers = {h["name"]: h["value"] for f in rule.get("filters") or ()
                   for h in (f.get("requestHeaderModifier") or {}).get("set") or ()}
        return to_activator, headers

    def send(self, via: tuple[bool, dict[str, str]], timeout: float = 90) -> tuple[int, float]:
        """One request; (HTTP status or 0 for none, seconds)."""
        query, texts = self.groups[self.turn % len(self.groups)]
        self.turn += 1
        to_activator, headers = via
        if to_activator:
            url, extra = f"{self.activator_url}/rerank", headers
        else:
            url, extra = f"http://{self.pool.ip}:{TEI_PORT}/rerank", {}
        request = urllib.request.Request(url, data=json.dumps({"query": query, "texts": texts}).encode(),
                                         headers={"Content-Type": "application/json", **extra})
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                resp.read()
                return resp.status, time.monotonic() - started
        except urllib.error.HTTPError as exc:
            return exc.code, time.monotonic() - started
        except OSError:
            return 0, time.monotonic() - started


def light_load(gateway: Gateway, rps: float, seconds: float) -> list[tuple[float, int, float]]:
    """Requests at ``rps`` for ``seconds`` (one thread each, the route re-read each second): (sent at, status, s)."""
    out: list[tuple[float, int, float]] = []
    lock = threading.Lock()
    start = time.monotonic()
    via = gateway.route()
    with ThreadPoolExecutor(16) as ex:
        n = 0
        while (now := time.monotonic()) - start < seconds:
            if n % max(1, int(rps)) == 0:
                via = gateway.route()
            sent = now - start

            def one(at: float = sent, route: tuple[bool, dict[str, str]] = via) -> None:
                status, took = gateway.send(route)
                with lock:
                    out.append((at, status, took))
            ex.submit(one)
            n += 1
            time.sleep(max(0.0, start + n / rps - time.monotonic()))
    return sorted(out)


def windows(samples: list[tuple[float, int, float]], width: float = 5.0) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if not samples:
        return rows
    end = max(at for at, _, _ in samples)
    t = 0.0
    while t <= end:
        took = [s for at, status, s in samples if t <= at < t + width and status == 200]
        p95 = percentile(took, 95)
        rows.append({"t": t, "n": len(took), "p95_ms": None if p95 is None else round(p95 * 1000, 1)})
        t += width
    return rows


def back_to_steady_after(rows: list[dict[str, Any]], steady_p95_ms: float | None,
                         tolerance: float = 1.2) -> float | None:
    """Seconds into the load after a wake from which every 5 s window's p95 is within ``tolerance`` x the steady p95
    (windows without an answer are skipped); None when it never gets there, or there is nothing to compare."""
    measured = [row for row in rows if row["n"] and row["p95_ms"] is not None]
    if steady_p95_ms is None or not measured:
        return None
    since: float | None = None
    for row in measured:
        if row["p95_ms"] <= steady_p95_ms * tolerance:
            since = row["t"] if since is None else since
        else:
            since = None
    return since


def asleep(cluster: Cluster) -> bool:
    model = kget(cluster, "rerankmodel", MODEL, "-n", NS) or {}
    phase = ((model.get("status") or {}).get("autoscaling") or {}).get("lastDecision", {}).get("scaleToZero")
    return phase == "asleep" and not cpu_pods(cluster)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--router", type=Path, required=True, help="a text-embeddings-router built with the ORT backend")
    ap.add_argument("--ort-library", type=Path, default=None)
    ap.add_argument("--workdir", type=Path, default=binaries.REPO_ROOT / ".serving-wake")
    ap.add_argument("--wakes", type=int, default=5)
    ap.add_argument("--burst", type=int, default=20)
    ap.add_argument("--idle-seconds", type=int, default=30)
    ap.add_argument("--after-seconds", type=float, default=30.0)
    ap.add_argument("--measure-wakes", type=int, default=None,
                    help="keep the load for --after-seconds after this many wakes only (default: every wake)")
    ap.add_argument("--load-rps", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    stack = Stack.prepare(args.router, args.ort_library, args.workdir)
    result = stack.result
    result["parameters"] = {"wakes": args.wakes, "burst": args.burst, "idle_seconds": args.idle_seconds,
                            "after_seconds": args.after_seconds, "measure_wakes": args.measure_wakes,
                            "load_rps": args.load_rps}
    cluster = stack.start()
    running = None
    pool = PoolAddress(cluster)
    try:
        apply_and_wait_established(cluster, binaries.gateway_api_crds())
        host, _ = cluster.pod_api_endpoint  # the host, as the node's pods see it
        port = free_port()
        # The release's activator key is made by the chart at install: the in-process activator starts with a
        # placeholder and is given the key once the release exists (before any model can sleep).
        values = {"activator": {"enabled": True, "replicas": 1},
                  "extraArgs": [f"--activator-url=http://{host}:{port}"]}
        placeholder = activator_server.Settings(key=b"0" * activator.MIN_KEY_BYTES, hold_seconds=45.0)
        running = activator_server.start(placeholder, "0.0.0.0", port, locate=pool.locate)
        failed: list[BaseException] = []

        def serve() -> None:
            try:
                stack.serve(cluster, sleepy_model(args.idle_seconds), values)
            except BaseException as exc:  # re-raised below, in the main thread
                failed.append(exc)

        ready_model = threading.Thread(target=serve, daemon=True)
        ready_model.start()
        secret = f"{RELEASE}-activator-key"
        key_b64 = eventually(lambda: (kget(cluster, "secret", secret, "-n", OPERATOR_NS) or {}).get("data", {})
                             .get("key"), 300, f"Secret {OPERATOR_NS}/{secret}", every=1, error=SystemExit)
        key = base64.b64decode(key_b64).strip()
        running.server.shutdown()
        running.server.server_close()
        running = activator_server.start(activator_server.Settings(key=key, hold_seconds=45.0), "0.0.0.0", port,
                                         locate=pool.locate)
        ready_model.join(timeout=1500)
        if failed or ready_model.is_alive():
            raise SystemExit(f"the model did not become Ready: {failed[0] if failed else 'timeout'}")
        gateway = Gateway(cluster, f"http://127.0.0.1:{port}", pool, stack.groups)
        eventually(lambda: pool.ip is not None, 60, "a Ready CPU pod", every=0.5, error=SystemExit)
        steady = light_load(gateway, args.load_rps, 20)
        steady_p95 = percentile([s for _, status, s in steady if status == 200], 95)
        result["steady_p95_ms"] = None if steady_p95 is None else round(steady_p95 * 1000, 1)
        wakes: list[dict[str, Any]] = []
        for n in range(args.wakes):
            went = time.monotonic()
            eventually(lambda: asleep(cluster), args.idle_seconds + 180, "the model asleep", every=1,
                       error=SystemExit)
            slept_after = time.monotonic() - went
            via = gateway.route()
            if not via[0]:
                raise SystemExit(f"asleep, but the route does not point at the activator: {via}")
            burst_at = time.monotonic()
            with ThreadPoolExecutor(args.burst) as ex:
                answers = list(ex.map(lambda _, route=via: gateway.send(route), range(args.burst)))
            answered = [s for status, s in answers if status == 200]
            first = min(answered) if answered else None
            measured = args.measure_wakes is None or n < args.measure_wakes
            after = light_load(gateway, args.load_rps, args.after_seconds if measured else 5.0)
            wake = {"wake": n + 1, "asleep_after_s": round(slept_after, 1), "measured": measured,
                    "first_answer_s": None if first is None else round(first, 2),
                    "last_answer_s": round(max(s for _, s in answers), 2),
                    "lost": sum(status != 200 for status, _ in answers) + sum(st != 200 for _, st, _ in after),
                    "statuses": sorted({status for status, _ in answers}),
                    "after_windows": (rows := windows(after)),
                    "p95_back_after_s": back_to_steady_after(rows, result["steady_p95_ms"]) if measured else None,
                    "burst_at_unix": round(time.time() - (time.monotonic() - burst_at), 1)}
            log(f"wake {n + 1}: first answer {wake['first_answer_s']} s, last {wake['last_answer_s']} s, "
                f"lost {wake['lost']}")
            wakes.append(wake)
        firsts = [w["first_answer_s"] for w in wakes if w["first_answer_s"] is not None]
        result.update({"wakes": wakes, "wake_first_answer_s": {
            "median": round(statistics.median(firsts), 2) if firsts else None,
            "max": max(firsts) if firsts else None},
            "lost_requests": sum(w["lost"] for w in wakes), "burst_requests": args.wakes * args.burst,
            "p95_back_after_s": _spread([w["p95_back_after_s"] for w in wakes if w["measured"]]),
            "node": realnode.NAME})
    finally:
        pool.stop()
        if running is not None:
            running.server.shutdown()
        cluster.stop()
    return emit(result, args.out)


def _spread(values: list[float | None]) -> dict[str, Any]:
    """How soon the measured wakes' p95 was back (``back_to_steady_after``): median and max, and how many wakes
    it was not back by the end of the load (or had nothing to compare)."""
    known = [v for v in values if v is not None]
    return {"wakes": len(values), "not_back": len(values) - len(known),
            "median": statistics.median(known) if known else None, "max": max(known) if known else None}


if __name__ == "__main__":
    sys.exit(main())
