"""The artifact's identity: a content hash of everything that changes the bytes the quantization Job publishes.

Two specs with the same hash would produce the same files, so a change that keeps the hash (replicas, resources,
images of the pools, routing, the Job's deadline) never re-quantizes, and a change that alters it (model, revision,
any recipe knob, the quality gate, the data it is judged on, the quantizer image) starts exactly one new Job.
The quality gate and the evaluation data are included because the auto recipe keeps the fastest recipe *that passes
the gate*: they decide which bytes win. The time budget is included for the same reason (it bounds the search).
Data is identified by reference (ConfigMap name/key or path), not content: reading ConfigMaps would need more RBAC;
editing a ConfigMap in place therefore does not re-quantize (documented on the field).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rerank_operator.core.spec.model import DataSource, RerankModelSpec

#: Bump when the meaning of the hashed inputs changes (e.g. the quantizer's layout), to force new artifacts.
SCHEMA = 1
ID_LENGTH = 16  # 64 bits of sha256: a directory name and a label value, collision-free at this scale


def _data(source: DataSource | None) -> dict[str, Any] | None:
    if source is None:
        return None
    if source.config_map is not None:
        return {"configMap": source.config_map.name, "key": source.config_map.key}
    return {"path": source.path}


def inputs(spec: RerankModelSpec) -> dict[str, Any]:
    """The canonical hashed inputs (also useful to explain, in a test or a log, why an id changed)."""
    q = spec.quantization
    return {
        "schema": SCHEMA,
        "model": {"id": spec.model.id, "path": spec.model.path, "revision": spec.model.revision},
        "quantizerImage": q.image,
        "recipe": {
            "mode": q.mode,
            "target": q.target,
            "recipe": q.recipe,
            "perChannel": q.per_channel,
            "reduceRange": q.reduce_range,
            "operators": sorted(q.operators),
            "optimizationLevel": q.optimization_level,
            "timeBudgetSeconds": q.time_budget_seconds,
        },
        "qualityGate": {
            "minSpearman": q.quality_gate.min_spearman,
            "minTopKAgreement": q.quality_gate.min_topk_agreement,
            "topK": q.quality_gate.topk,
        },
        "evaluationData": _data(q.evaluation_data),
        "calibrationData": _data(q.calibration_data),
        # A re-quantization on drift reads the same sample file as the last one did, refreshed: its round tells them
        # apart (absent before the first, so the ids of models that never drifted stay as they were).
        **({"liveRound": q.live_round} if q.live_round else {}),
    }


def artifact_id(spec: RerankModelSpec) -> str | None:
    """The id of the artifact the spec asks for, or None when quantization is disabled (pools serve the source)."""
    if not spec.quantization.enabled:
        return None
    canonical = json.dumps(inputs(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:ID_LENGTH]
