"""Reads the quality guards' verdicts: each guarded model's guard pod's ``/metrics``, all at once, within a deadline.

The guard decides (``quality_guard/detector.py``); the operator only reads what it decided
(``core/quality/assessment.py``). A guard that does not answer in time is no verdict this tick, never a healthy one:
the model keeps what its status recorded. The address goes through ``tei_scrape.pod_address`` (the one place pod
addresses are made, which the dev cluster's tests redirect to local servers).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from rerank_operator.adapters import tei_scrape
from rerank_operator.core import names
from rerank_operator.core.quality import assessment as quality
from rerank_operator.core.reconcile.observed import PoolsView


@dataclass(frozen=True)
class GuardTarget:
    """A guarded model's guard pod (its namespace is the model's)."""

    name: str
    ip: str
    port: int = names.GUARD_PORT


class GuardReader:
    """One per operator process: a small executor shared by every guarded model."""

    def __init__(self, max_workers: int = 4, timeout_seconds: float = 1.5,
                 fetch: tei_scrape.Fetch = tei_scrape.http_fetch) -> None:
        self._timeout = timeout_seconds
        self._fetch = fetch
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="guard-scrape")

    def read(self, targets: Mapping[names.ModelKey, GuardTarget | None],
             deadline_seconds: float = 2.0) -> dict[names.ModelKey, quality.Verdict | None]:
        """A verdict per model (None: the model's guard has no ready pod)."""
        futures: dict[names.ModelKey, Future[quality.Verdict]] = {
            key: self._executor.submit(self._one, key, target) for key, target in targets.items() if target}
        wait(list(futures.values()), timeout=deadline_seconds)
        found: dict[names.ModelKey, quality.Verdict | None] = {key: None for key in targets}
        for key, future in futures.items():
            if future.done():
                found[key] = future.result()
            else:
                future.cancel()
                found[key] = quality.Verdict(error=f"the guard {targets[key]} did not answer within "
                                                   f"{deadline_seconds:g}s")
        return found

    def _one(self, key: names.ModelKey, target: GuardTarget | None) -> quality.Verdict:
        assert target is not None
        address = f"{target.ip}:{target.port}"
        try:
            address = tei_scrape.pod_address(target)
            text = self._fetch(f"http://{address}/metrics", self._timeout)
        except Exception as exc:  # one guard's failure is that model's missing verdict, never the round's
            return quality.Verdict(error=f"the guard's /metrics at {address}: {exc}")
        return quality.parse_metrics(text, key[0], key[1])

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def target_of(view: PoolsView) -> GuardTarget | None:
    """The guard pod to read: the first ready one by name (a guard Deployment runs one; during a rollout any ready
    pod's verdict is the same model's), or None when none is ready."""
    pods = view.guard_pods()
    if not pods:
        return None
    pod = sorted(pods, key=lambda x: str(x["metadata"]["name"]))[0]
    return GuardTarget(pod["metadata"]["name"], pod["status"]["podIP"])
