"""One model's checks: which mirrored copies are checked, and what a check does with the pools' answers.

For a sampled request (the model's fraction, within its budget of extra calls/s: :mod:`.budget`) the guard POSTs the
same body to the reference and to every pool (:mod:`.endpoints`), compares each pool's scores with the reference's
(:mod:`.compare`; the reference is a TEI endpoint, or FP32 scores this process computes from the original weights:
:mod:`.reference`), feeds that pool's :class:`.detector.Detector` and exports the figures (:mod:`.metrics`).

A pool that does not answer is an error, not a ranking: it is counted and not fed to the detector (availability is
the autoscaler's business). With the tenant's consent the copies are also kept as the live sample (:mod:`.sample`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from rerank_contracts.guard import LOCAL_REFERENCE, GuardConfig

from . import budget, compare, detector, intake, metrics, reference, sample
from .endpoints import Post, api_keys, http_post


def valid(body: Any) -> bool:
    """A /rerank body worth checking: a query and at least one text, all strings."""
    return (isinstance(body, dict) and isinstance(body.get("query"), str) and isinstance(body.get("texts"), list)
            and len(body["texts"]) > 0 and all(isinstance(t, str) for t in body["texts"]))


class Guard:
    """One model's sampling, comparisons, detectors and metrics; :meth:`check` does one sampled request."""

    def __init__(self, config: GuardConfig, post: Post | None = None, clock: Callable[[], float] = time.monotonic,
                 registry: CollectorRegistry | None = None, environ: Mapping[str, str] | None = None) -> None:
        self.config, self.clock = config, clock
        self.mirror_token = intake.expected_token(config.mirror_token_env, os.environ if environ is None else environ,
                                                  config.accept_unsigned)
        remote = post or http_post(config.timeout_seconds, api_keys(config), self.mirror_token)
        self.local = (reference.LocalReference(config.reference_model,
                                               max_batch_tokens=config.reference_max_batch_tokens,
                                               auto_truncate=config.reference_auto_truncate)
                      if config.reference == LOCAL_REFERENCE and config.reference_model else None)
        local = self.local
        self.post: Post = remote if local is None else (
            lambda base, body: local(body) if base == LOCAL_REFERENCE else remote(base, body))
        self.sampler = budget.sampler(config.fraction, config.calls_per_second, config.calls_per_sample,
                                      seed=config.seed)
        evidence = detector.Settings(**config.evidence)
        self.detectors = {p: detector.Detector(config.floor, evidence, state="below_floor",
                                               reason="below the floor at the last verdict before this process")
                          if p in config.below_floor else detector.Detector(config.floor, evidence)
                          for p in config.pools}
        self._lock = threading.Lock()
        self.exported = metrics.Metrics(config.namespace, config.model, registry)
        for p in config.pools:
            self.exported.export(p, self.detectors[p].status())
        self.sample = sample.LiveSample(config.live_sample) if config.live_sample is not None else None

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
            self.exported.live_sample_write_failed()
            print(f"quality guard: the live sample could not be written to {self.sample.settings.path}: {exc}",
                  file=sys.stderr, flush=True)
            pairs = self.sample.written_pairs
        self.exported.live_sample(pairs)

    def count(self, outcome: str) -> None:
        self.exported.count(outcome)

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
                self.exported.pool_error(pool)
                continue
            a = compare.agreement(ref, got, k=cfg.k, raw=bool(body.get("raw_scores", False)))
            with self._lock:
                if self.detectors[pool].observe(a):
                    self.exported.transition(pool)
                self.exported.export(pool, self.detectors[pool].status())
            found[pool] = a
        return found

    def metrics(self) -> bytes:
        return self.exported.page()
