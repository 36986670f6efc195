"""Score evaluation pairs under TEI-like ONNX Runtime settings, time them, and apply the quality gate."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantizer_job.steps.evaluation import metrics
from quantizer_job.steps.tei.layout import TEI_INPUTS

#: ``onnxruntime.InferenceSession`` (the library ships no type information).
Session = Any

#: TEI sends at most this many pairs per forward pass on CPU.
TEI_MAX_BATCH = 8


def make_session(path: str | Path, threads: int) -> Session:
    """The session TEI's ORT backend builds: all CPU threads, one inference at a time, ORT_ENABLE_ALL."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _feeds(sess: Session, batches: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    names = [i.name for i in sess.get_inputs()]
    return [{n: b[n] for n in names} for b in batches]


@dataclass
class Timed:
    scores: np.ndarray  # first logit of every pair, in input order
    pairs_per_s: float
    p50_ms: float
    p95_ms: float
    passes: int
    seconds: float

    def speed(self) -> dict[str, float]:
        return {"pairs_per_s": round(self.pairs_per_s, 3), "p50_ms": round(self.p50_ms, 3),
                "p95_ms": round(self.p95_ms, 3)}


def score_timed(sess: Session, batches: Sequence[dict[str, np.ndarray]], min_seconds: float = 2.0,
                max_passes: int = 20) -> Timed:
    """Score every batch (first pass gives the scores); repeat passes until ``min_seconds`` to time throughput.

    One warm-up run of the first batch precedes the timing (ORT allocates and prepacks on first use).
    """
    feeds = _feeds(sess, batches)
    if not feeds:
        raise ValueError("no batches to score")
    sess.run(["logits"], feeds[0])
    scores: list[np.ndarray] = []
    lat: list[float] = []
    pairs = 0
    passes = 0
    t_start = time.perf_counter()
    while True:
        for f in feeds:
            t0 = time.perf_counter()
            out = sess.run(["logits"], f)[0]
            lat.append(time.perf_counter() - t0)
            if passes == 0:
                scores.append(np.asarray(out, dtype=np.float32).reshape(out.shape[0], -1)[:, 0])
            pairs += out.shape[0]
        passes += 1
        if time.perf_counter() - t_start >= min_seconds or passes >= max_passes:
            break
    total = time.perf_counter() - t_start
    return Timed(scores=np.concatenate(scores), pairs_per_s=pairs / total,
                 p50_ms=metrics.percentile(lat, 50) * 1000, p95_ms=metrics.percentile(lat, 95) * 1000,
                 passes=passes, seconds=total)


def check_output(sess: Session) -> list[str]:
    """What TEI requires of the graph's signature: int64 inputs it knows, float32 ``logits`` [batch, 1]."""
    problems: list[str] = []
    allowed = TEI_INPUTS
    names = [i.name for i in sess.get_inputs()]
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values"):
            problems.append(f"input {i.name!r}: TEI would feed a key/value cache; export the model without one")
        elif i.name not in allowed:
            problems.append(f"input {i.name!r} is not one TEI feeds ({', '.join(allowed)})")
        if i.type != "tensor(int64)":
            problems.append(f"input {i.name} is {i.type}, TEI feeds int64")
    for req in ("input_ids", "attention_mask"):
        if req not in names:
            problems.append(f"input {req} missing")
    outs = {o.name: o for o in sess.get_outputs()}
    if "logits" not in outs:
        problems.append(f"no output named 'logits' (outputs: {sorted(outs)})")
    else:
        o = outs["logits"]
        if o.type != "tensor(float)":
            problems.append(f"logits is {o.type}, TEI reads float32")
        if len(o.shape) != 2 or (isinstance(o.shape[1], int) and o.shape[1] != 1):
            problems.append(f"logits shape {o.shape}, expected [batch, 1]")
    return problems


def quality(groups: Sequence[object], ref: np.ndarray, cand: np.ndarray, k: int) -> dict[str, float]:
    finite = metrics.all_finite(cand)
    lo, hi = metrics.bootstrap_ci(metrics.spearman, ref, cand) if finite else (float("nan"), float("nan"))
    return {
        "spearman": metrics.spearman(ref, cand) if finite else float("nan"),
        "spearman_ci95_low": lo,
        "spearman_ci95_high": hi,
        "topk_agreement": metrics.topk_agreement(groups, ref, cand, k) if finite else float("nan"),
        "max_abs_diff": metrics.max_abs_diff(ref, cand) if finite else float("inf"),
        "finite": 1.0 if finite else 0.0,
        "pairs": float(len(ref)),
    }


def gate(q: dict[str, float], min_spearman: float, min_topk: float) -> list[str]:
    """Reasons the candidate fails the gate (empty list: passes). NaN never passes (nothing was proven)."""
    why = []
    if not q.get("finite"):
        why.append("INT8 scores are not all finite")
        return why
    sp = q.get("spearman", float("nan"))
    if not (sp >= min_spearman):
        why.append(f"spearman {sp:.4f} < {min_spearman}")
    tk = q.get("topk_agreement", float("nan"))
    if not np.isnan(tk) and not (tk >= min_topk):
        why.append(f"top-k agreement {tk:.3f} < {min_topk}")
    return why

