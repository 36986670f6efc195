"""The fleet's objects: each RerankModel as the flags make it (awake, able to sleep, or asking for a shared
artifact), the names of the shared artifacts' store and class, and the kwok nodes that have room for them all."""

from __future__ import annotations

import argparse
import math
from typing import Any

from rerank_devcluster import operator_process as op

STORAGE_CLASS = "fleet-bench"
#: --distinct-models: the store's namespace, repository and class (RerankClass spec.artifactStore).
STORE_NS, STORE_REPOSITORY, SHARED_CLASS = "rerank-artifacts", "rerank/artifacts", "fleet-shared"


def model_manifest(name: str, ns: str, args: argparse.Namespace) -> dict[str, Any]:
    """The cluster tests' model (rerank_devcluster.operator_process.rerank_model), autoscaled; with ``--idle``, one
    that may go to zero (test_scale_to_zero.py's: a CPU pool from 0, no GPU pool, idleSeconds, a Gateway route)."""
    if args.distinct_models:
        body = op.rerank_model(name, ns, STORAGE_CLASS, pools={"cpu": {"minReplicas": 1, "maxReplicas": 4},
                                                              "gpu": {"enabled": False}},
                               autoscaling={"enabled": True, "intervalSeconds": args.interval,
                                            "metrics": {"source": args.metrics_source,
                                                        "staleAfterSeconds": max(60, 4 * args.interval)}})
        body["spec"]["className"] = SHARED_CLASS
        body["spec"]["model"] = {"id": f"bench/reranker-{int(name.rsplit('-', 1)[1]) % args.distinct_models}"}
        return body
    if args.idle:
        return op.rerank_model(
            name, ns, STORAGE_CLASS, pools={"cpu": {"minReplicas": 0, "maxReplicas": 4}, "gpu": {"enabled": False}},
            autoscaling={"enabled": True, "intervalSeconds": args.interval, "idleSeconds": args.idle_seconds,
                         "metrics": {"source": args.metrics_source, "staleAfterSeconds": max(60, 4 * args.interval)}},
            routing={"gateway": {"parentRefs": [{"name": "shared", "namespace": "gateway-system"}]}})
    return op.rerank_model(name, ns, STORAGE_CLASS, pools={"cpu": {"minReplicas": 1, "maxReplicas": 4}},
                           autoscaling={"enabled": True, "intervalSeconds": args.interval,
                                        "metrics": {"source": args.metrics_source,
                                                    "staleAfterSeconds": max(60, 4 * args.interval)}})


def fleet_nodes(models: int) -> dict[str, dict[str, Any]]:
    """Room for the fleet on big kwok nodes: two pool pods per model plus its quantizer pod. Every node takes all the
    pods (the scheduler spreads CPU-pool and quantizer pods over the GPU nodes too), and the GPU nodes' GPUs take
    every GPU-pool pod."""
    count = max(1, math.ceil(models / 250))
    big = {"cpu": "100000", "memory": "1000Ti", "pods": str(3 * models + 200)}
    nodes: dict[str, dict[str, Any]] = {}
    for i in range(count):
        nodes[f"kwok-fleet-cpu-{i}"] = {"labels": {"node.kubernetes.io/instance-type": "cpu-fleet"},
                                        "allocatable": big}
        nodes[f"kwok-fleet-gpu-{i}"] = {"labels": {"node.kubernetes.io/instance-type": "gpu-fleet",
                                                   "nvidia.com/gpu.present": "true"},
                                        "allocatable": {**big, "nvidia.com/gpu": str(2 * models + 50)}}
    return nodes
