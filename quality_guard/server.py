"""The guard's process: receives mirrored ``/rerank`` requests, asks the pools and the reference, exports figures.

It is never in the serving path: a gateway's ``RequestMirror`` filter sends it copies of real requests and drops its
answers; only copies carrying the model's mirror token count (:mod:`.intake`, which also bounds what HTTP may cost).
Without a gateway, ``Replayer`` offers it the artifact's evaluation pairs (``Config.replay``) at a set pace.
``POST /rerank`` answers 202 at once and leaves the work to one worker thread through a bounded queue (full: the
copy is dropped and counted). For a sampled request (the model's fraction, within its budget of extra calls/s:
:mod:`.budget`) the worker POSTs the same body to the reference and to every pool,
compares each pool's scores with the reference's (:mod:`.compare`; the reference is a TEI endpoint, or FP32 scores
this process computes from the original weights: :mod:`.reference`), feeds that pool's :class:`.detector.Detector`
and updates the metrics served on ``GET /metrics`` (Prometheus text format):

- ``rerank_guard_spearman`` (over the window's pairs pooled, as the Job's gate computes it) and
  ``rerank_guard_topk_agreement`` (mean over requests), each with ``_ci95_low`` / ``_ci95_high``;
  ``rerank_guard_request_spearman`` (mean per request), ``rerank_guard_failure_ratio``,
  ``rerank_guard_max_abs_diff``, ``rerank_guard_window_requests``;
  ``rerank_guard_below_floor`` (1 while the pool is below the floor with confidence),
  ``rerank_guard_compared_requests`` (since the process started), and ``rerank_guard_state_info`` (1, with the
  pool's ``state`` and the ``reason`` it entered it as labels), all labelled
  ``namespace``, ``rerankmodel``, ``pool`` as the operator's own metrics are;
- counters: ``rerank_guard_transitions_total`` (per pool), ``rerank_guard_requests_total`` by ``outcome``
  (sampled, not_sampled, over_budget, queue_full, invalid, unauthenticated, reference_error) and
  ``rerank_guard_pool_errors_total``;
- with the tenant's consent (``Config.live_sample``), ``rerank_guard_live_sample_pairs``: the pairs of mirrored live
  traffic kept on the model's volume for a re-quantization on drift (:mod:`.sample`).

A pool that does not answer is an error, not a ranking: it is counted and not fed to the detector (availability is
the autoscaler's business). One process serves one model (``Config``); the operator runs one per guarded model
(``rerank_operator/core/builders/guard.py``), passing the configuration in an environment variable:

    python -m quality_guard.server --config guard.json --port 8080
    python -m quality_guard.server --config-env RERANK_GUARD_CONFIG
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from . import budget, compare, detector, intake, reference, sample

#: POST a /rerank body to a base URL, return the scores in ``texts`` order.
Post = Callable[[str, Mapping[str, Any]], list[float]]
LABELS = ("namespace", "rerankmodel", "pool")
#: Copies waiting for the worker; beyond this they are dropped (the guard must not queue without bound).
QUEUE_SIZE = 64


@dataclass(frozen=True)
class Config:
    """One model: its pools (name -> base URL), the reference's base URL, the floor and the cost limits."""

    namespace: str
    model: str
    pools: Mapping[str, str]
    reference: str
    floor: detector.Floor = field(default_factory=detector.Floor)
    settings: detector.Settings = field(default_factory=detector.Settings)
    fraction: float = 0.05
    calls_per_second: float = 1.0
    k: int = compare.DEFAULT_K
    timeout_seconds: float = 10.0
    seed: int = 0
    #: Pools that start below the floor: the operator carries its last recorded verdict into a new guard pod, so a
    #: restarted guard does not hand traffic back to a pool that has not proven itself (the recovery window applies).
    below_floor: Sequence[str] = ()
    #: Endpoint (a pool's name, or "reference") -> the environment variable holding its TEI API key, if it has one.
    api_key_env: Mapping[str, str] = field(default_factory=dict)
    #: Without mirrored traffic (no Gateway): a JSONL of {"query", "text"} pairs (the artifact's evaluation set)
    #: replayed as requests, ``replay_per_second`` of them (still within the budget).
    replay: str | None = None
    replay_per_second: float = 0.0
    #: With ``reference`` = ``"local"`` (:data:`.reference.LOCAL`): the directory of the original weights (the
    #: artifact's ``original/``) whose FP32 scores this process computes as the reference (:mod:`.reference`).
    reference_model: str | None = None
    #: The checked pool's TEI ``--max-batch-tokens`` and ``--auto-truncate``: a local reference truncates (or refuses)
    #: a long pair as that pool does.
    reference_max_batch_tokens: int | None = None
    reference_auto_truncate: bool = True
    #: With the tenant's consent: where and how much of the mirrored traffic to keep (:mod:`.sample`).
    live_sample: sample.Settings | None = None
    #: The environment variable holding the token the model's route sets on what it mirrors (:mod:`.intake`): POSTs
    #: without it are dropped. None (a guard run by hand): every POST counts.
    mirror_token_env: str | None = None

    def __post_init__(self) -> None:
        if self.reference == reference.LOCAL and not self.reference_model:
            raise ValueError("a local reference needs reference_model: the directory of the original weights")

    @property
    def calls_per_sample(self) -> int:
        return len(self.pools) + 1

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Config:
        floor = detector.Floor(**d.get("floor", {}))
        settings = detector.Settings(**d.get("settings", {}))
        rest = {k: v for k, v in d.items() if k not in ("floor", "settings")}
        if "below_floor" in rest:
            rest["below_floor"] = tuple(rest["below_floor"])
        if rest.get("live_sample") is not None:
            rest["live_sample"] = sample.Settings.from_dict(rest["live_sample"])
        return cls(floor=floor, settings=settings, **rest)


def tei_scores(body: Any, n: int) -> list[float]:
    """Scores in ``texts`` order from TEI's ``/rerank`` answer: ``[{"index": i, "score": s}, ...]`` by score."""
    if not isinstance(body, list) or len(body) != n:
        raise ValueError(f"expected a list of {n} results, got {str(body)[:200]}")
    out = [float("nan")] * n
    for item in body:
        out[int(item["index"])] = float(item["score"]) if item["score"] is not None else float("nan")
    return out


def http_post(timeout: float, keys: Mapping[str, str] | None = None) -> Post:
    """POST to a TEI base URL; ``keys``: base URL -> API key sent as a bearer token (TEI's --api-key)."""
    keys = dict(keys or {})

    def post(base: str, body: Mapping[str, Any]) -> list[float]:
        headers = {"Content-Type": "application/json"}
        if base in keys:
            headers["Authorization"] = f"Bearer {keys[base]}"
        req = urllib.request.Request(base.rstrip("/") + "/rerank", data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return tei_scores(json.loads(resp.read()), len(body["texts"]))

    return post


def valid(body: Any) -> bool:
    """A /rerank body worth checking: a query and at least one text, all strings."""
    return (isinstance(body, dict) and isinstance(body.get("query"), str) and isinstance(body.get("texts"), list)
            and len(body["texts"]) > 0 and all(isinstance(t, str) for t in body["texts"]))


def api_keys(config: Config, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Base URL -> API key, from the environment variables ``config.api_key_env`` names (Secrets in the pod)."""
    env = os.environ if environ is None else environ
    urls = {"reference": config.reference, **config.pools}
    return {urls[name]: env[var] for name, var in config.api_key_env.items() if name in urls and env.get(var)}


class Guard:
    """One model's sampling, comparisons, detectors and metrics; :meth:`check` does one sampled request."""

    def __init__(self, config: Config, post: Post | None = None, clock: Callable[[], float] = time.monotonic,
                 registry: CollectorRegistry | None = None, environ: Mapping[str, str] | None = None) -> None:
        self.config, self.clock = config, clock
        self.mirror_token = intake.expected_token(config.mirror_token_env, os.environ if environ is None else environ)
        remote = post or http_post(config.timeout_seconds, api_keys(config))
        self.local = (reference.LocalReference(config.reference_model,
                                               max_batch_tokens=config.reference_max_batch_tokens,
                                               auto_truncate=config.reference_auto_truncate)
                      if config.reference == reference.LOCAL and config.reference_model else None)
        local = self.local
        self.post: Post = remote if local is None else (
            lambda base, body: local(body) if base == reference.LOCAL else remote(base, body))
        self.sampler = budget.sampler(config.fraction, config.calls_per_second, config.calls_per_sample,
                                      seed=config.seed)
        self.detectors = {p: detector.Detector(config.floor, config.settings, state="below_floor",
                                               reason="below the floor at the last verdict before this process")
                          if p in config.below_floor else detector.Detector(config.floor, config.settings)
                          for p in config.pools}
        self.registry = registry or CollectorRegistry()
        self._lock = threading.Lock()
        g = self._gauge
        self.g = {"spearman": g("spearman", "Spearman of the pool's scores vs the reference over the window's pairs "
                                "pooled (the quantization Job's gate statistic)."),
                  "spearman_ci95_low": g("spearman_ci95_low", "95% interval of rerank_guard_spearman, low end."),
                  "spearman_ci95_high": g("spearman_ci95_high", "95% interval of rerank_guard_spearman, high end."),
                  "request_spearman": g("request_spearman", "Mean per-request Spearman vs the reference (window)."),
                  "topk": g("topk_agreement", "Mean top-k agreement with the reference (window)."),
                  "topk_ci95_low": g("topk_agreement_ci95_low", "95% interval of the top-k agreement, low end."),
                  "topk_ci95_high": g("topk_agreement_ci95_high", "95% interval of the top-k agreement, high end."),
                  "failure_ratio": g("failure_ratio", "Share of sampled requests with broken scores (window)."),
                  "max_abs_diff": g("max_abs_diff", "Largest score difference from the reference (window)."),
                  "window": g("window_requests", "Sampled requests in the detection window."),
                  "below": g("below_floor", "1 while the pool ranks below the quality floor with confidence."),
                  "compared": g("compared_requests", "Sampled requests compared on the pool since this process "
                                                     "started (what a canary's promotion counts).")}
        self.transitions = Counter("rerank_guard_transitions", "Changes of a pool's state.", LABELS,
                                   registry=self.registry)
        self.requests = Counter("rerank_guard_requests", "Mirrored requests by what the guard did with them.",
                                ["namespace", "rerankmodel", "outcome"], registry=self.registry)
        self.errors = Counter("rerank_guard_pool_errors", "Calls to a pool that gave no usable answer.", LABELS,
                              registry=self.registry)
        # The state and why it was entered, as labels of one series per pool: stable between transitions (the
        # figures move with every request, and the window is emptied at a transition), so a reader can quote it.
        self.state_info = Gauge("rerank_guard_state_info", "1, labelled with the pool's state and the reason it "
                                "was entered.", [*LABELS, "state", "reason"], registry=self.registry)
        self._state_labels: dict[str, tuple[str, str]] = {}
        for p in config.pools:
            self._export(p)
        self.sample = sample.LiveSample(config.live_sample) if config.live_sample is not None else None
        self.sample_pairs = Gauge("rerank_guard_live_sample_pairs", "Query-passage pairs in the live sample on the "
                                  "volume (with the tenant's consent: quantization.requantizeOnDrift).",
                                  ["namespace", "rerankmodel"], registry=self.registry)
        self.sample_errors = Counter("rerank_guard_live_sample_write_errors", "Writes of the live sample that "
                                     "failed (a full volume, or a directory the guard's user cannot write).",
                                     ["namespace", "rerankmodel"], registry=self.registry)

    def remember(self, body: Any) -> None:
        """Keep a mirrored request in the live sample (with consent; see :mod:`.sample`)."""
        if self.sample is not None:
            self.sample.add(body)

    def write_sample(self) -> None:
        """Write the live sample if it changed, and export how many pairs the file holds."""
        if self.sample is None:
            return
        try:
            pairs = self.sample.write()
        except OSError as exc:  # a full or read-only volume: the checks go on, the file is tried again
            self.sample_errors.labels(self.config.namespace, self.config.model).inc()
            print(f"quality guard: the live sample could not be written to {self.sample.settings.path}: {exc}",
                  file=sys.stderr, flush=True)
            pairs = self.sample.written_pairs
        self.sample_pairs.labels(self.config.namespace, self.config.model).set(pairs)

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(f"rerank_guard_{name}", doc, LABELS, registry=self.registry)

    def count(self, outcome: str) -> None:
        self.requests.labels(self.config.namespace, self.config.model, outcome).inc()

    def offer(self, body: Any) -> bool:
        """Should this copy be checked (valid, drawn, within budget)? Counts the outcome when not."""
        if not valid(body):
            self.count("invalid")
            return False
        with self._lock:
            before = self.sampler.over_budget
            if self.sampler.offer(self.clock()):
                return True
            self.count("over_budget" if self.sampler.over_budget > before else "not_sampled")
        return False

    def check(self, body: Mapping[str, Any]) -> dict[str, compare.Agreement]:
        """Ask the reference and every pool with ``body``; compare, feed the detectors, export."""
        cfg = self.config
        try:
            ref = np.asarray(self.post(cfg.reference, body), dtype=np.float64)
            if not np.all(np.isfinite(ref)):
                raise ValueError("reference scores are not finite")
        except Exception:  # the reference being down says nothing about the pools
            self.count("reference_error")
            return {}
        self.count("sampled")
        found: dict[str, compare.Agreement] = {}
        for pool, url in cfg.pools.items():
            try:
                got = self.post(url, body)
            except Exception:
                self.errors.labels(cfg.namespace, cfg.model, pool).inc()
                continue
            a = compare.agreement(ref, got, k=cfg.k, raw=bool(body.get("raw_scores", False)))
            with self._lock:
                if self.detectors[pool].observe(a):
                    self.transitions.labels(cfg.namespace, cfg.model, pool).inc()
                self._export(pool)
            found[pool] = a
        return found

    def _export(self, pool: str) -> None:
        st = self.detectors[pool].status()
        f = st.figures
        values = {"spearman": f.spearman.mean, "spearman_ci95_low": f.spearman.low,
                  "spearman_ci95_high": f.spearman.high, "request_spearman": f.request_spearman.mean,
                  "topk": f.topk.mean, "topk_ci95_low": f.topk.low, "topk_ci95_high": f.topk.high,
                  "failure_ratio": f.failure_rate, "max_abs_diff": f.max_abs_diff,
                  "window": float(f.requests), "below": 1.0 if st.state == "below_floor" else 0.0,
                  "compared": float(self.detectors[pool].samples)}
        for name, v in values.items():
            self.g[name].labels(self.config.namespace, self.config.model, pool).set(v)
        state = (st.state, st.reason)
        before = self._state_labels.get(pool)
        if before != state:
            if before is not None:
                self.state_info.remove(self.config.namespace, self.config.model, pool, *before)
            self.state_info.labels(self.config.namespace, self.config.model, pool, *state).set(1)
            self._state_labels[pool] = state

    def metrics(self) -> bytes:
        return generate_latest(self.registry)


class Worker:
    """The one thread that does the sampled checks, fed through a bounded queue."""

    def __init__(self, guard: Guard, size: int = QUEUE_SIZE) -> None:
        self.guard = guard
        self.queue: queue.Queue[Mapping[str, Any] | None] = queue.Queue(maxsize=size)
        self.thread = threading.Thread(target=self._run, name="guard-worker", daemon=True)
        self.done = 0

    def start(self) -> Worker:
        self.thread.start()
        return self

    def metrics(self) -> bytes:
        return self.guard.metrics()

    def count(self, outcome: str) -> None:
        self.guard.count(outcome)

    def receive(self, body: Any) -> bool:
        """A mirrored copy that passed :mod:`.intake`: kept in the live sample (the Replayer's bodies are not) and
        offered for a check."""
        self.guard.remember(body)
        return self.submit(body)

    def submit(self, body: Any) -> bool:
        if not self.guard.offer(body):
            return False
        try:
            self.queue.put_nowait(body)
        except queue.Full:
            self.guard.count("queue_full")
            return False
        return True

    def _run(self) -> None:
        while True:
            body = self.queue.get()
            if body is None:
                return
            try:
                self.guard.check(body)
            finally:
                self.done += 1
                self.queue.task_done()

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=30)


#: Passages per replayed request: within TEI's default --max-client-batch-size (32), like a typical rerank call.
REPLAY_MAX_TEXTS = 16


def replay_bodies(path: str, seed: int = 0) -> list[dict[str, Any]]:
    """/rerank bodies from a pairs file: one per query with (a seeded sample of at most REPLAY_MAX_TEXTS of) its
    texts; queries with a single text are left out (a ranking needs two)."""
    by_query: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                pair = json.loads(line)
                by_query.setdefault(str(pair["query"]), []).append(str(pair["text"]))
    rng = random.Random(seed)
    return [{"query": q, "texts": ts if len(ts) <= REPLAY_MAX_TEXTS else rng.sample(ts, REPLAY_MAX_TEXTS)}
            for q, ts in by_query.items() if len(ts) >= 2]


class Replayer:
    """Offers a random replayed body to the worker ``per_second`` times a second (the sampler and budget apply)."""

    def __init__(self, worker: Worker, bodies: Sequence[Mapping[str, Any]], per_second: float, seed: int = 0) -> None:
        if not bodies or per_second <= 0:
            raise ValueError("a replay needs bodies and a positive rate")
        self.worker, self.bodies, self.period = worker, list(bodies), 1.0 / per_second
        self.rng = random.Random(seed)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="guard-replay", daemon=True)

    def start(self) -> Replayer:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stopped.wait(self.period):
            self.worker.submit(self.rng.choice(self.bodies))

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)


class SampleWriter:
    """Writes the live sample every ``every`` seconds (if it changed), and once more when it stops."""

    def __init__(self, guard: Guard, every: float = sample.WRITE_SECONDS) -> None:
        self.guard, self.every = guard, every
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="guard-sample", daemon=True)

    def start(self) -> SampleWriter:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stopped.wait(self.every):
            self.guard.write_sample()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self.guard.write_sample()  # what came in since the last write (LiveSample.write runs one at a time)


@dataclass
class Running:
    server: intake.BoundedServer
    worker: Worker
    thread: threading.Thread
    replayer: Replayer | None = None
    writer: SampleWriter | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        if self.replayer is not None:
            self.replayer.stop()
        self.server.shutdown()
        if self.writer is not None:
            self.writer.stop()
        self.server.server_close()
        self.worker.stop()
        self.thread.join(timeout=10)


def _load_reference(local: reference.LocalReference, exit_on_failure: bool) -> None:
    """Load the FP32 reference beside the HTTP server (a large model takes a while; /healthz answers meanwhile).
    ``exit_on_failure`` (the guard's process): a guard without its reference can judge nothing, so it exits and its
    pod shows CrashLoopBackOff, rather than stay Ready counting reference errors."""
    try:
        local.load()
        print(f"quality guard: FP32 reference loaded from {local.model_dir} (max input length "
              f"{local.max_length} tokens)", file=sys.stderr, flush=True)
    except Exception as exc:  # in-process (tests): every sampled request counts a reference_error
        print(f"quality guard: the FP32 reference could not be loaded from {local.model_dir}: {exc!r}",
              file=sys.stderr, flush=True)
        if exit_on_failure:
            os._exit(3)


def serve(guard: Guard, host: str = "127.0.0.1", port: int = 0, *, exit_on_reference_failure: bool = False,
          sample_every: float = sample.WRITE_SECONDS) -> Running:
    """Start the HTTP server and the worker (and, configured so, the replay, the live sample's writer and the FP32
    reference's load) in background threads."""
    writer = None
    if guard.sample is not None:
        try:
            guard.sample.load()
        except OSError as exc:
            print(f"quality guard: the live sample at {guard.sample.settings.path} could not be read: {exc}",
                  file=sys.stderr, flush=True)
        guard.write_sample()
        writer = SampleWriter(guard, sample_every).start()
    worker = Worker(guard).start()
    server = intake.BoundedServer((host, port), intake.handler(worker, guard.mirror_token))
    t = threading.Thread(target=server.serve_forever, name="guard-http", daemon=True)
    t.start()
    cfg = guard.config
    if guard.local is not None:
        threading.Thread(target=_load_reference, args=(guard.local, exit_on_reference_failure),
                         name="guard-reference", daemon=True).start()
    replayer = None
    if cfg.replay and cfg.replay_per_second > 0:
        try:
            bodies = replay_bodies(cfg.replay, cfg.seed)
        except (OSError, ValueError, KeyError) as exc:  # e.g. an artifact published before it kept its pairs
            print(f"quality guard: no replay ({cfg.replay}: {exc}); checking mirrored requests only",
                  file=sys.stderr, flush=True)
            bodies = []
        if bodies:
            replayer = Replayer(worker, bodies, cfg.replay_per_second, cfg.seed).start()
    return Running(server, worker, t, replayer, writer)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="JSON file: namespace, model, pools {name: url}, reference, ...")
    source.add_argument("--config-env", help="the environment variable holding that JSON (how the operator "
                                             "passes it: builders/guard.py)")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8080)
    a = ap.parse_args(argv)
    if a.config_env:
        raw = os.environ.get(a.config_env)
        if not raw:
            ap.error(f"the environment variable {a.config_env} is not set")
        config = Config.from_dict(json.loads(raw))
    else:
        with open(a.config, encoding="utf-8") as f:
            config = Config.from_dict(json.load(f))
    running = serve(Guard(config), a.host, a.port, exit_on_reference_failure=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        stop.wait()
    running.stop()


if __name__ == "__main__":
    main()
