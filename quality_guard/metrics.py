"""What the guard exports on ``GET /metrics`` (Prometheus text format): its verdicts, and what it did with the copies.

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

The operator reads the verdicts back from this page (``rerank_operator/adapters/guard_scrape.py``,
``core/quality/assessment.py``); the names and labels are its contract with the guard.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from . import detector

LABELS = ("namespace", "rerankmodel", "pool")


class Metrics:
    """One model's series in ``registry``; every pool's figures are exported once at the start."""

    def __init__(self, namespace: str, model: str, registry: CollectorRegistry | None = None) -> None:
        self.namespace, self.model = namespace, model
        self.registry = registry or CollectorRegistry()
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
        self.sample_pairs = Gauge("rerank_guard_live_sample_pairs", "Query-passage pairs in the live sample on the "
                                  "volume (with the tenant's consent: quantization.requantizeOnDrift).",
                                  ["namespace", "rerankmodel"], registry=self.registry)
        self.sample_errors = Counter("rerank_guard_live_sample_write_errors", "Writes of the live sample that "
                                     "failed (a full volume, or a directory the guard's user cannot write).",
                                     ["namespace", "rerankmodel"], registry=self.registry)

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(f"rerank_guard_{name}", doc, LABELS, registry=self.registry)

    def count(self, outcome: str) -> None:
        """A mirrored request, by what the guard did with it."""
        self.requests.labels(self.namespace, self.model, outcome).inc()

    def transition(self, pool: str) -> None:
        self.transitions.labels(self.namespace, self.model, pool).inc()

    def pool_error(self, pool: str) -> None:
        self.errors.labels(self.namespace, self.model, pool).inc()

    def export(self, pool: str, st: detector.Status) -> None:
        """A pool's figures and state, as its detector now has them."""
        f = st.figures
        values = {"spearman": f.spearman.mean, "spearman_ci95_low": f.spearman.low,
                  "spearman_ci95_high": f.spearman.high, "request_spearman": f.request_spearman.mean,
                  "topk": f.topk.mean, "topk_ci95_low": f.topk.low, "topk_ci95_high": f.topk.high,
                  "failure_ratio": f.failure_rate, "max_abs_diff": f.max_abs_diff,
                  "window": float(f.requests), "below": 1.0 if st.state == "below_floor" else 0.0,
                  "compared": float(st.samples)}
        for name, v in values.items():
            self.g[name].labels(self.namespace, self.model, pool).set(v)
        state = (st.state, st.reason)
        before = self._state_labels.get(pool)
        if before != state:
            if before is not None:
                self.state_info.remove(self.namespace, self.model, pool, *before)
            self.state_info.labels(self.namespace, self.model, pool, *state).set(1)
            self._state_labels[pool] = state

    def live_sample(self, pairs: int) -> None:
        """The pairs the live sample's file holds."""
        self.sample_pairs.labels(self.namespace, self.model).set(pairs)

    def live_sample_write_failed(self) -> None:
        self.sample_errors.labels(self.namespace, self.model).inc()

    def page(self) -> bytes:
        return generate_latest(self.registry)
