"""The CPU pool's check of its node before TEI starts (issue 61): an init container that refuses to let a pod serve
an INT8 artifact its node's CPU would serve wrongly (``rerank_contracts/cpu_target.py``): full-range weights chosen
on a VNNI CPU land on an AVX2 node, where MLAS's 16-bit sums saturate and rankings degrade without an error; an ARM64
artifact on x86 or the reverse. The pod then stays unready and the model's ``Ready`` condition says
``ArtifactTargetMismatch`` with the node and what to change (``core/status/readiness.py``).

Only artifacts that can be served wrongly get it (``cpu_target.needs_check``): a 7-bit x86 artifact runs on any x86
node, and a record from a Job that did not say its target gets none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rerank_contracts import cpu_target, quantize_job
from rerank_operator.core.builders import pods

CONTAINER = "check-cpu"


@dataclass(frozen=True)
class CpuCheck:
    """What the artifact was built for, and the image that checks (the fetcher's: ``rerank-fetch-artifact``)."""

    target: str
    reduce_range: bool
    image: str


def for_record(record: Mapping[str, Any] | None, image: str) -> CpuCheck | None:
    """The check an artifact record needs (``status.artifact.recipe.target``, ``.reduce_range``), if any."""
    recipe = (record or {}).get("recipe") or {}
    target = recipe.get("target")
    reduce_range = bool(recipe.get("reduce_range"))
    if not isinstance(target, str) or target not in cpu_target.TARGETS or not image:
        return None
    return CpuCheck(target, reduce_range, image) if cpu_target.needs_check(target, reduce_range) else None


#: Node Feature Discovery's labels for the CPU features a target needs (any one will do): where nodes carry them, the
#: pool's pods prefer nodes that can serve the artifact, so the check above rarely has to refuse.
NFD_LABELS = {"avx512_vnni": ("feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI",
                              "feature.node.kubernetes.io/cpu-cpuid.AVXVNNI",
                              "feature.node.kubernetes.io/cpu-cpuid.AMXINT8")}
#: The weight of that preference (the scheduler's 1..100): strong, yet a node the model's placement requires wins.
NFD_WEIGHT = 50


def preferring_capable_nodes(affinity: Mapping[str, Any] | None, check: CpuCheck) -> dict[str, Any] | None:
    """``affinity`` with a preference for nodes whose NFD labels say they can serve ``check``'s target (one term per
    label: a node with any of them scores); ``affinity`` unchanged for a target NFD labels do not name. A preference,
    never a requirement: on a cluster without NFD it changes nothing."""
    labels = NFD_LABELS.get(check.target, ())
    if not labels:
        return dict(affinity) if affinity else None
    out = dict(affinity or {})
    node = dict(out.get("nodeAffinity") or {})
    preferred = list(node.get("preferredDuringSchedulingIgnoredDuringExecution") or ())
    preferred += [{"weight": NFD_WEIGHT, "preference": {"matchExpressions": [
        {"key": label, "operator": "In", "values": ["true"]}]}} for label in labels]
    node["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    out["nodeAffinity"] = node
    return out


def init_container(check: CpuCheck) -> dict[str, Any]:
    return {
        "name": CONTAINER,
        "image": check.image,
        "command": ["rerank-fetch-artifact"],
        "args": ["--check-cpu", check.target, *(["--reduce-range"] if check.reduce_range else [])],
        # The message names the node: the platform team's fix is a node selector.
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "terminationMessagePath": quantize_job.TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": pods.container_security_context(),
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
    }
