"""The Argo CD health check for RerankModel (argocd/health.lua), run in Lua 5.1 as Argo CD runs it.

argocd/resource-customizations.yaml embeds health.lua verbatim; regenerate it after editing the Lua with
``.venv/bin/python tests/unit/project/test_argocd_health.py --write``.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

lua51 = pytest.importorskip("lupa.lua51")

REPO_ROOT = Path(__file__).resolve().parents[3]
HEALTH_LUA = REPO_ROOT / "argocd" / "health.lua"
SNIPPET = REPO_ROOT / "argocd" / "resource-customizations.yaml"
KEY = "resource.customizations.health.rerank.io_RerankModel"

SNIPPET_HEADER = """\
# Argo CD health check for RerankModel: merge into the argocd-cm ConfigMap, e.g.
#   kubectl -n argocd patch configmap argocd-cm --patch-file argocd/resource-customizations.yaml
# GENERATED from argocd/health.lua (tests/unit/project/test_argocd_health.py checks it); do not edit by hand.
apiVersion: v1
kind: ConfigMap
metadata:
  name: argocd-cm
  namespace: argocd
  labels:
    app.kubernetes.io/name: argocd-cm
    app.kubernetes.io/part-of: argocd
data:
"""


def render_snippet(lua: str) -> str:
    body = "".join(f"    {line}\n" if line else "\n" for line in lua.splitlines())
    return f"{SNIPPET_HEADER}  {KEY}: |\n{body}"


def _to_lua(runtime: Any, value: Any) -> Any:
    """JSON -> Lua as Argo CD does it: objects and arrays become tables (arrays 1-based), scalars stay."""
    if isinstance(value, dict):
        return runtime.table_from({k: _to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, v) for v in value])
    return value


def run_health(lua_source: str, obj: dict[str, Any]) -> tuple[str, str]:
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    runtime.globals().obj = _to_lua(runtime, obj)
    hs = runtime.execute(lua_source)
    return hs["status"], hs["message"]


# -- fixtures built from modifiers ------------------------------------------------------------------------------

def cond(type_: str, status: str, reason: str, message: str = "", generation: int | None = 3) -> dict[str, Any]:
    c = {"type": type_, "status": status, "reason": reason, "message": message,
         "lastTransitionTime": "2025-01-01T00:00:00Z"}
    if generation is not None:
        c["observedGeneration"] = generation
    return c


def model(*mods: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """A Ready RerankModel at generation 3, changed by each modifier in turn."""
    obj: dict[str, Any] = {
        "apiVersion": "rerank.io/v1alpha1", "kind": "RerankModel",
        "metadata": {"name": "bge", "namespace": "ml", "generation": 3},
        "spec": {"model": {"id": "BAAI/bge-reranker-v2-m3"}},
        "status": {
            "observedGeneration": 3, "phase": "Ready",
            "conditions": [
                cond("Ready", "True", "Serving", "2 CPU and 1 GPU replicas serve artifact 1a2b"),
                cond("ModelReady", "True", "ArtifactPublished"),
                cond("PoolsAvailable", "True", "Available"),
                cond("Degraded", "False", "AsExpected"),
            ],
        },
    }
    for m in mods:
        m(obj)
    return obj


def phase(p: str) -> Callable[[dict[str, Any]], None]:
    return lambda o: o["status"].__setitem__("phase", p)


def condition(type_: str, status: str, reason: str, message: str = "", generation: int | None = 3):
    def mod(o: dict[str, Any]) -> None:
        conds = [c for c in o["status"].get("conditions", []) if c["type"] != type_]
        o["status"]["conditions"] = [*conds, cond(type_, status, reason, message, generation)]
    return mod


def generation(g: int) -> Callable[[dict[str, Any]], None]:
    return lambda o: o["metadata"].__setitem__("generation", g)


def no_status(o: dict[str, Any]) -> None:
    o.pop("status")


def status_without(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda o: o["status"].pop(key, None)


CASES = {
    "ready": (model(), "Healthy", "Serving"),
    "ready-condition-without-generation": (model(condition("Ready", "True", "Serving", generation=None)),
                                           "Healthy", "Serving"),
    "no-status-yet": (model(no_status), "Progressing", "observe"),
    "no-observed-generation": (model(status_without("observedGeneration")), "Progressing", "generation 3"),
    "spec-newer-than-observed": (model(generation(4)), "Progressing", "generation 4"),
    "spec-newer-even-if-degraded": (model(generation(4), condition("Degraded", "True", "QuantizationFailed")),
                                    "Progressing", "generation 4"),
    "ready-condition-for-older-generation": (model(condition("Ready", "True", "Serving", generation=2)),
                                             "Progressing", "generation 2"),
    "pending": (model(phase("Pending"), condition("Ready", "False", "AwaitingArtifact")),
                "Progressing", "Pending"),
    "quantizing": (model(phase("Quantizing"), condition("Ready", "False", "Quantizing", "job bge-q-1a2b running")),
                   "Progressing", "job bge-q-1a2b running"),
    "deploying": (model(phase("Progressing"), condition("Ready", "False", "RollingOut", "updating bge-cpu")),
                  "Progressing", "RollingOut: updating bge-cpu"),
    "no-conditions-yet": (model(phase("Pending"), status_without("conditions")), "Progressing", "Pending"),
    "degraded-condition": (model(phase("Degraded"), condition("Degraded", "True", "QualityGateFailed",
                                                              "spearman 0.91 < 0.99")),
                           "Degraded", "QualityGateFailed: spearman 0.91 < 0.99"),
    "degraded-condition-while-ready": (model(condition("Degraded", "True", "RolloutStuck")),
                                       "Degraded", "RolloutStuck"),
    "failed-phase": (model(phase("Failed"), condition("Ready", "False", "QuantizationFailed", "oom"),
                           condition("Degraded", "False", "AsExpected")),
                     "Degraded", "QuantizationFailed: oom"),
    "degraded-phase-without-condition": (model(phase("Degraded"), condition("Ready", "False", "ReplicasUnavailable")),
                                         "Degraded", "ReplicasUnavailable"),
}


@pytest.mark.parametrize("obj,want_status,want_in_message", CASES.values(), ids=CASES.keys())
def test_health(obj: dict[str, Any], want_status: str, want_in_message: str) -> None:
    status, message = run_health(HEALTH_LUA.read_text(), copy.deepcopy(obj))
    assert status == want_status, message
    assert want_in_message in message


def test_snippet_embeds_health_lua_verbatim() -> None:
    want = render_snippet(HEALTH_LUA.read_text())
    assert SNIPPET.read_text() == want, (
        "argocd/resource-customizations.yaml is stale: run .venv/bin/python tests/unit/project/test_argocd_health.py"
        " --write")


def test_snippet_is_an_argocd_cm_patch_and_runs() -> None:
    doc = yaml.safe_load(SNIPPET.read_text())
    assert (doc["kind"], doc["metadata"]["name"]) == ("ConfigMap", "argocd-cm")
    assert run_health(doc["data"][KEY], model())[0] == "Healthy"
    assert run_health(doc["data"][KEY], model(generation(9)))[0] == "Progressing"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        SNIPPET.write_text(render_snippet(HEALTH_LUA.read_text()))
        print(f"wrote {SNIPPET.relative_to(REPO_ROOT)}")
    else:
        sys.exit(f"usage: {sys.argv[0]} --write")
