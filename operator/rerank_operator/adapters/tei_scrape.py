"""The default metrics source: scrape each ready TEI pod's /metrics and aggregate per pool.

No dependency beyond the pods themselves. One ``ScrapePool`` per operator process serves every model: a tick of the
fleet loop hands it all due models' ready pods at once, and it scrapes them concurrently on one persistent,
bounded thread pool, each request with the per-pod timeout, and answers within the tick's deadline however many
pods hang. What a slow or dead pod costs is confined to that pod:

- a pod whose scrape is not done by the deadline counts as an error for this tick; the scrape is not resubmitted
  while it is still running (a later tick picks up its result), so hung pods cannot pile up work on the pool;
- a pod whose scrape failed is retried with exponential backoff (2 s, doubling up to ``backoff_max_seconds``, reset
  by a success); while it backs off it counts as an error (saying so) and costs no request.

Rates and quantiles need two scrapes of the same pod, so the pool keeps the last successful scrape per pod, keyed
by (namespace, pod name), and compares addresses: a replaced pod starts over. A pod its model no longer lists is
forgotten; ``forget(key)`` drops a deleted model. Pods that do not answer are left out of the tick's aggregate
(the pure ``aggregate``); if no pod of a pool answers, the pool's signals carry an error and the policy holds.

A pod's address is ``pod_address(target)`` (its IP and TEI's port), looked up on every scrape; a caller may pass
``address_of`` instead (the unit tests point it at local servers; hack/rerank_devcluster/scrape_redirect.py, the
cluster tests' operator launcher, replaces ``pod_address`` because kwok pods have no network).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

from rerank_operator.core.autoscale import exposition
from rerank_operator.core.autoscale.config import Pool
from rerank_operator.core.autoscale.signals import PoolSignals, Signals
from rerank_operator.core.names import ModelKey

MAX_BODY_BYTES = 4 * 1024 * 1024
BACKOFF_BASE_SECONDS = 2.0

Fetch = Callable[[str, float], str]
#: A RerankModel: (namespace, name).
#: A pod: (namespace, pod name); pod names are unique within a namespace, so one model owns each.
PodKey = tuple[str, str]


@dataclass(frozen=True)
class PodTarget:
    """A ready pod of a pool, as the operator sees it in the API (its namespace is its model's)."""

    name: str
    pool: Pool
    ip: str
    port: int


@dataclass(frozen=True)
class ModelTargets:
    """One model's part of a ``ScrapePool.collect``: its ready pods to scrape, and the ready count per pool."""

    targets: tuple[PodTarget, ...]
    ready: Mapping[Pool, int]


@dataclass(frozen=True)
class Snapshot:
    """The te_* values of one pod at one scrape."""

    time: float
    address: str
    request_count: float
    success_count: float
    failure_count: float
    queue_size: float
    duration: exposition.Histogram
    queue_duration: exposition.Histogram
    pair_count: float = 0.0  # te_batch_next_size's sum: the entries (query-passage pairs) batched so far

    @classmethod
    def from_text(cls, text: str, time_: float, address: str) -> Snapshot:
        samples = exposition.parse(text)
        return cls(
            time=time_,
            address=address,
            # TEI creates a counter on its first increment: absent means zero so far.
            request_count=exposition.total(samples, "te_request_count") or 0.0,
            success_count=exposition.total(samples, "te_request_success") or 0.0,
            failure_count=exposition.total(samples, "te_request_failure") or 0.0,
            queue_size=exposition.total(samples, "te_queue_size") or 0.0,
            duration=exposition.histogram(samples, "te_request_duration") or exposition.Histogram.empty(),
            queue_duration=(exposition.histogram(samples, "te_request_queue_duration")
                            or exposition.Histogram.empty()),
            pair_count=(exposition.histogram(samples, "te_batch_next_size") or exposition.Histogram.empty()).sum,
        )


def http_fetch(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read(MAX_BODY_BYTES)
        return body.decode("utf-8", errors="replace")


class Addressable(Protocol):
    """A pod to ask: a TEI pod (``PodTarget``) or a quality guard's (``guard_scrape.GuardTarget``)."""

    @property
    def name(self) -> str: ...

    @property
    def ip(self) -> str: ...

    @property
    def port(self) -> int: ...


def pod_address(target: Addressable) -> str:
    """Where a ready pod's /metrics answers: its IP and its port."""
    return f"{target.ip}:{target.port}"


#: What one scrape gives: the pod's values, or why there are none ("address: error").
Outcome = Snapshot | str


@dataclass
class _PodState:
    """What the pool remembers of one pod between ticks."""

    last: Snapshot | None = None                  # the last successful scrape (the base of the next rates)
    failures: int = 0                             # consecutive failed scrapes
    retry_at: float = 0.0                         # clock() before which the pod is not asked again
    last_error: str = ""
    running: Future[Outcome] | None = None        # a scrape submitted and not yet settled
    started: float = 0.0                          # time.monotonic() of its submission


class ScrapePool:
    """The direct source of the whole fleet: one per operator process, shared by every model.

    ``collect`` scrapes all pods of all requested models concurrently on one persistent executor of
    ``max_workers`` threads (each request bounded by ``timeout_seconds``) and returns within its deadline. Thread
    safe: the state is only touched under a lock, never held while waiting for pods.
    """

    def __init__(self, max_workers: int = 16, timeout_seconds: float = 2.0, fetch: Fetch = http_fetch,
                 clock: Callable[[], float] = time.time, address_of: Callable[[PodTarget], str] | None = None,
                 backoff_max_seconds: float = 60.0) -> None:
        self._timeout = timeout_seconds
        self._fetch = fetch
        self._clock = clock
        self._address_of = address_of
        self._backoff_max = backoff_max_seconds
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tei-scrape")
        self._lock = threading.Lock()
        self._pods: dict[PodKey, _PodState] = {}
        self._members: dict[ModelKey, set[PodKey]] = {}

    def collect(self, requests: Mapping[ModelKey, ModelTargets], deadline_seconds: float) -> dict[ModelKey, Signals]:
        """Per-pool signals of every requested model, after at most ``deadline_seconds`` of scraping.

        A pod counts as an error for this tick when its scrape is not done by the deadline (it goes on running and
        is not submitted again until it ends), when it failed, or when it is backing off from earlier failures.
        Models not in ``requests`` keep their state; pods a requested model no longer lists are forgotten.
        """
        end = time.monotonic() + deadline_seconds
        previous: dict[PodKey, Snapshot] = {}
        waiting: dict[PodKey, tuple[PodTarget, Future[Outcome]]] = {}
        outcomes: dict[PodKey, Outcome] = {}
        with self._lock:
            now = self._clock()
            due: list[tuple[PodKey, PodTarget, _PodState]] = []
            seen: set[PodKey] = set()
            for (namespace, _), request in requests.items():
                for target in request.targets:
                    pod = (namespace, target.name)
                    if pod in seen:
                        continue
                    seen.add(pod)
                    state = self._pods.setdefault(pod, _PodState())
                    self._settle(state)
                    if state.last is not None:
                        previous[pod] = state.last
                    if state.running is not None:  # a hung scrape from an earlier tick: wait for it, do not add one
                        waiting[pod] = (target, state.running)
                    elif now < state.retry_at:
                        outcomes[pod] = (f"{target.name}: backing off after {state.failures} failed scrape(s), next "
                                         f"try in {state.retry_at - now:.0f}s (last: {state.last_error})")
                    else:
                        due.append((pod, target, state))
            # Pods that answered last time first: one that just came off its backoff queues behind the healthy.
            for pod, target, fresh in sorted(due, key=lambda d: d[2].failures):
                fresh.running = self._executor.submit(self._scrape, target)
                fresh.started = time.monotonic()
                waiting[pod] = (target, fresh.running)
        wait([future for _, future in waiting.values()], timeout=max(0.0, end - time.monotonic()))
        with self._lock:
            for pod, (target, future) in waiting.items():
                held = self._pods.get(pod)
                if future.done() and not future.cancelled():
                    outcome = future.result()
                    if held is not None and held.running is future:
                        self._apply(held, outcome)
                    outcomes[pod] = outcome
                elif future.cancel():  # still queued behind other pods: let the next tick submit it afresh
                    if held is not None and held.running is future:
                        held.running = None
                    outcomes[pod] = f"{target.name}: not scraped within {deadline_seconds:g}s (scrape pool busy)"
                else:
                    outcomes[pod] = (f"{target.name}: no answer within {deadline_seconds:g}s (scrape running for "
                                     f"{time.monotonic() - (held.started if held else end):.0f}s)")
            for key, request in requests.items():
                self._keep_only(key, {(key[0], t.name) for t in request.targets})
        return {key: self._signals(key[0], request, previous, outcomes) for key, request in requests.items()}

    def forget(self, key: ModelKey) -> None:
        """Drop a model's pods (it was deleted or no longer uses this source)."""
        with self._lock:
            self._keep_only(key, set())
            del self._members[key]

    def close(self) -> None:
        """Stop the executor: queued scrapes are cancelled, running ones end on their own (bounded by the timeout)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _keep_only(self, key: ModelKey, pods: set[PodKey]) -> None:
        for pod in self._members.get(key, set()) - pods:
            state = self._pods.pop(pod, None)
            if state is not None and state.running is not None:
                state.running.cancel()  # a running one ends on its own; its result is dropped
        self._members[key] = pods

    def _settle(self, state: _PodState) -> None:
        """Take in the result of a scrape that ended after the tick that submitted it."""
        if state.running is not None and state.running.done():
            future, state.running = state.running, None
            if not future.cancelled():
                self._apply(state, future.result())

    def _apply(self, state: _PodState, outcome: Outcome) -> None:
        state.running = None
        if isinstance(outcome, Snapshot):
            state.last, state.failures, state.retry_at, state.last_error = outcome, 0, 0.0, ""
        else:
            state.failures += 1
            state.last_error = outcome
            delay = min(BACKOFF_BASE_SECONDS * 2 ** min(state.failures - 1, 30), self._backoff_max)
            state.retry_at = self._clock() + delay

    def _scrape(self, target: PodTarget) -> Outcome:
        address = f"{target.ip}:{target.port}"
        try:
            address = (self._address_of or pod_address)(target)  # the module's, looked up now (module docstring)
            text = self._fetch(f"http://{address}/metrics", self._timeout)
            return Snapshot.from_text(text, self._clock(), address)
        except Exception as exc:  # any failure is this pod's error, never the tick's (it serves every model)
            return f"{address}: {exc}"

    @staticmethod
    def _signals(namespace: str, request: ModelTargets, previous: Mapping[PodKey, Snapshot],
                 outcomes: Mapping[PodKey, Outcome]) -> Signals:
        mine = {t.name: outcomes[(namespace, t.name)] for t in request.targets}
        current = {name: o for name, o in mine.items() if isinstance(o, Snapshot)}
        errors = {name: o for name, o in mine.items() if isinstance(o, str)}
        before = {t.name: previous[(namespace, t.name)] for t in request.targets if (namespace, t.name) in previous}
        pools = {pool: aggregate(request.ready.get(pool, 0), [t.name for t in request.targets if t.pool == pool],
                                 before, current, errors)
                 for pool in ("gpu", "cpu")}
        return Signals(gpu=pools["gpu"], cpu=pools["cpu"])


def aggregate(ready: int, names: Iterable[str], previous: Mapping[str, Snapshot],
              current: Mapping[str, Snapshot], errors: Mapping[str, str]) -> PoolSignals:
    """Pool signals from this tick's snapshots and the previous ones (pure; the heart of the direct source)."""
    names = list(names)
    answered = [n for n in names if n in current]
    if ready > 0 and not answered:
        detail = "; ".join(errors[n] for n in names if n in errors) or "no ready pod to scrape"
        return PoolSignals(ready_replicas=ready, error=f"no pod answered /metrics ({detail})"[:300])
    pairs = [(previous[n], current[n]) for n in answered
             if n in previous and previous[n].address == current[n].address and current[n].time > previous[n].time]
    base = PoolSignals(ready_replicas=ready, scraped_replicas=len(answered),
                       queue_size=sum(current[n].queue_size for n in answered),
                       sampled_at=max((current[n].time for n in answered), default=None))
    if not pairs:
        return base
    duration = sum((now.duration.since(before.duration) for before, now in pairs), exposition.Histogram.empty())
    waiting = sum((now.queue_duration.since(before.queue_duration) for before, now in pairs),
                  exposition.Histogram.empty())
    return PoolSignals(
        ready_replicas=ready,
        scraped_replicas=len(answered),
        # Per-pod rates summed, then scaled up to all answering pods (pods seen for the first time have no rate).
        request_rate=_rate(pairs, "request_count") * len(answered) / len(pairs),
        success_rate=_rate(pairs, "success_count") * len(answered) / len(pairs),
        failure_rate=_rate(pairs, "failure_count") * len(answered) / len(pairs),
        queue_size=base.queue_size,
        latency_p50_ms=_ms(exposition.quantile(0.5, duration)),
        latency_p95_ms=_ms(exposition.quantile(0.95, duration)),
        queue_time_p95_ms=_ms(exposition.quantile(0.95, waiting)),
        pair_rate=_rate(pairs, "pair_count") * len(answered) / len(pairs),
        latency=duration,
        sampled_at=base.sampled_at,
    )


def _rate(pairs: Sequence[tuple[Snapshot, Snapshot]], field: str) -> float:
    """Sum of per-pod counter increases per second (a counter that went down restarted from zero)."""
    total = 0.0
    for before, now in pairs:
        old, new = getattr(before, field), getattr(now, field)
        total += (new - old if new >= old else new) / max(now.time - before.time, 1e-9)
    return total


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
