"""Every example in examples/ is accepted by the real API server with the project's CRD (schema, defaults and CEL).

`kubectl apply --dry-run=server` runs admission and validation exactly as a real apply would, without persisting.
The Argo CD Application example is checked statically (Argo CD's CRDs are not installed in the test cluster).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
ARGOCD_APP = EXAMPLES / "argocd-application.yaml"
RESOURCE_EXAMPLES = sorted(p for p in EXAMPLES.glob("*.yaml") if p != ARGOCD_APP)


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_examples_cover_the_promised_cases() -> None:
    models = {p.name: [d for d in docs(p) if d["kind"] == "RerankModel"] for p in RESOURCE_EXAMPLES}
    specs = [m["spec"] for ms in models.values() for m in ms]
    assert all(len(ms) == 1 for ms in models.values()), "one RerankModel per example"
    assert any(s["pools"].get("gpu", {}).get("enabled") is not True and s["routing"]["policy"] == "cpu-only"
               for s in specs), "a CPU-only example"
    assert any(s["pools"].get("gpu", {}).get("enabled") and s["routing"].get("gateway", {}).get("parentRefs")
               and s.get("autoscaling", {}).get("spillover") for s in specs), "GPU+CPU with spillover behind a Gateway"
    assert any("tokenSecretRef" in s["model"] for s in specs), "a private model with a token Secret"
    assert any(s.get("quantization", {}).get("mode") == "static"
               and "configMapRef" in s["quantization"].get("calibrationData", {}) for s in specs), "static calibration"


def test_referenced_secrets_and_configmaps_ship_with_the_example() -> None:
    for path in RESOURCE_EXAMPLES:
        objs = docs(path)
        shipped = {(d["kind"], d["metadata"]["name"]) for d in objs}
        for m in (d for d in objs if d["kind"] == "RerankModel"):
            spec = m["spec"]
            if "tokenSecretRef" in spec["model"]:
                assert ("Secret", spec["model"]["tokenSecretRef"]["name"]) in shipped, path.name
            for data in ("calibrationData", "evaluationData"):
                ref = spec.get("quantization", {}).get(data, {}).get("configMapRef")
                if ref:
                    cm = next(d for d in objs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == ref["name"])
                    assert ref["key"] in cm["data"], f"{path.name}: {data} key {ref['key']}"
                    for line in cm["data"][ref["key"]].splitlines():
                        row = json.loads(line)
                        assert isinstance(row["query"], str) and isinstance(row["text"], str)


def test_argocd_application_points_at_this_repository() -> None:
    apps = docs(ARGOCD_APP)
    assert apps and all(a["apiVersion"] == "argoproj.io/v1alpha1" and a["kind"] == "Application" for a in apps)
    for app in apps:
        src = app["spec"]["source"]
        assert (REPO_ROOT / src["path"]).is_dir(), src["path"]
        include = src.get("directory", {}).get("include")
        if include:
            assert (REPO_ROOT / src["path"] / include).is_file()
    chart_app = next(a for a in apps if a["spec"]["source"]["path"] == "charts/rerank-operator")
    assert "ServerSideApply=true" in chart_app["spec"]["syncPolicy"]["syncOptions"]


@pytest.mark.parametrize("example", RESOURCE_EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid_against_the_crd(cluster, crds_installed, namespace: str, example: Path) -> None:
    out = cluster.kubectl_run("apply", "--dry-run=server", "-n", namespace, "-f", str(example), "-o", "json",
                              check=False)
    assert out.returncode == 0, f"{example.name} refused by the API server:\n{out.stderr}"
    result = json.loads(out.stdout)
    items = result.get("items", [result])
    kinds = sorted(i["kind"] for i in items)
    assert kinds == sorted(d["kind"] for d in docs(example))
    model = next(i for i in items if i["kind"] == "RerankModel")
    # The server applied the CRD's defaults: the returned object is what the operator will see.
    assert "quantization" in model["spec"] and "routing" in model["spec"]
