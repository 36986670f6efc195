"""The README's main command, end to end: its own control plane, the chart, the operator, the real quantizer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rerank_devcluster import realnode
from rerank_operator import __version__

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.quantizer, pytest.mark.node]


@pytest.mark.timeout(1800)  # the demo's own limit below; a cold image build alone takes minutes
def test_demo_reaches_ready_with_a_published_artifact(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "rerank_devcluster.demo", "--workdir", str(tmp_path),
                           "--timeout", "900"],
                          capture_output=True, text=True, timeout=1800)
    # The stderr's head carries the cause (a failed start says why before the components' log tails).
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[:8000] + "\n...\n" + done.stderr[-2000:]
    assert "Ready=True(Serving)" in done.stdout
    assert "quantizer exited 0" in done.stdout
    assert f"on {realnode.NAME}" in done.stdout  # the operator and the quantizer ran as pods on the real node
    # A release into the dev cluster's registry, installed from there: the chart and both images by digest.
    assert f"hack/release {__version__}: pushed 127.0.0.1:" in done.stdout
    assert "installed in rerank-system" in done.stdout and f"/charts/rerank-operator {__version__}" in done.stdout
    assert "/rerank/rerank-operator@sha256:" in done.stdout.split("installed in rerank-system", 1)[1].split("\n")[0]

    artifacts = [p for p in (tmp_path / "volume" / "artifacts").iterdir() if not p.name.startswith(".")
                 and p.is_dir()]
    assert len(artifacts) == 1, artifacts
    manifest = json.loads((artifacts[0] / "manifest.json").read_text())
    assert manifest["artifact_id"] == artifacts[0].name
    # The printed figures are the ones the Job measured and the operator recorded in status.
    assert f"Artifact {artifacts[0].name} at /models/artifacts/{artifacts[0].name}" in done.stdout
    assert (artifacts[0] / "cpu-int8" / "model.onnx").is_file()
    # Step 6: the model through a real gateway (Traefik, the operator's HTTPRoute, the pool's EndpointSlice).
    answered = next(line for line in done.stdout.splitlines() if "through the gateway, TEI's shape: HTTP 200" in line)
    results = json.loads(answered.split("HTTP 200 ", 1)[1])
    assert sorted(r["index"] for r in results) == [0, 1, 2]
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    assert all(0.0 < r["score"] < 1.0 for r in results)  # TEI's sigmoid over the INT8 model's logits
    assert "curl -s http://127.0.0.1:" in done.stdout and "/rerank -H 'Content-Type: application/json'" in done.stdout
    # The same documents in Cohere's shape, answered by the pods' real front: TEI's scores, the top two.
    cohere = next(line for line in done.stdout.splitlines() if "through the gateway, Cohere's shape: HTTP 200" in line)
    ranked = json.loads(cohere.split("HTTP 200 ", 1)[1])["results"]
    assert [(r["index"], r["relevance_score"]) for r in ranked] == [(r["index"], r["score"]) for r in results[:2]]
    assert "/v2/rerank -H 'Content-Type: application/json'" in done.stdout
    assert (artifacts[0] / "original" / "model.safetensors").is_file()
