"""The Job's hub-loading code against a real HTTP hub mirror (``hub_mirror.py``): a class's mirror is reached through
HF_ENDPOINT, an outage or a busy hub is HubUnavailable (transient, retried by the operator), a missing repository or
a refused token stays ModelNotFound (permanent)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.storage import fetch
from rerank_contracts import artifact_layout, quantize_job

from . import hub_mirror
from .conftest import FIXED_RECIPE, run_quantize

pytestmark = pytest.mark.quantizer

REPO_ID = "tiny-org/tiny-bert-reranker"


def test_the_job_downloads_through_the_class_mirror_and_publishes(bert_model: Path, tmp_path: Path) -> None:
    with hub_mirror.running({REPO_ID: bert_model}) as mirror:
        run = run_quantize(["--model", REPO_ID, "--output", str(tmp_path / "volume"), "--artifact-id", "mirrored",
                            *FIXED_RECIPE, "--min-spearman", "0", "--min-topk-agreement", "0"], tmp_path,
                           env={"HF_ENDPOINT": mirror.endpoint, "HF_HUB_OFFLINE": "0",
                                "HF_HOME": str(tmp_path / "hf-home")})
        assert run.rc == 0, run.stderr[-3000:]
        res = quantize_job.parse_result(run.termination or "")
        assert res.reason == "Published"
        assert any(r.startswith(f"GET /api/models/{REPO_ID}/revision/main") for r in mirror.requests)
        assert any("/resolve/" in r and r.endswith("/model.safetensors") for r in mirror.requests)
        import json

        manifest = json.loads((Path(res.path) / artifact_layout.MANIFEST_FILE).read_text())
        assert manifest["source"] == "hub" and manifest["revision"] == mirror.commit(REPO_ID)


@pytest.mark.parametrize("state", ["down", "busy"])
def test_an_outage_or_a_busy_hub_is_transient(state: str, bert_model: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with hub_mirror.running({REPO_ID: bert_model}) as mirror:
        mirror.state = state  # type: ignore[assignment]
        monkeypatch.setenv("HF_ENDPOINT", mirror.endpoint)
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        with pytest.raises(JobError) as err:
            fetch.fetch(REPO_ID, None, tmp_path / "src", retries=2)
    assert err.value.reason == "HubUnavailable" and err.value.reason in quantize_job.TRANSIENT_FAILURES
    assert mirror.endpoint in err.value.message and "after 2 attempts" in err.value.message
    assert sum(r.startswith("GET /api/models/") for r in mirror.requests) == 2  # retried within the Job first


def test_an_unreachable_hub_is_transient(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(JobError) as err:
        fetch.fetch(REPO_ID, None, tmp_path / "src", retries=1)
    assert err.value.reason == "HubUnavailable"


def test_a_missing_repository_is_permanent(bert_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with hub_mirror.running({REPO_ID: bert_model}) as mirror:
        monkeypatch.setenv("HF_ENDPOINT", mirror.endpoint)
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        with pytest.raises(JobError) as err:
            fetch.fetch("tiny-org/no-such-model", None, tmp_path / "src", retries=3)
    assert err.value.reason == "ModelNotFound" and "tiny-org/no-such-model does not exist" in err.value.message
    assert sum(r.startswith("GET /api/models/") for r in mirror.requests) == 1  # not retried


def test_the_exit_codes_of_earlier_reasons_keep_their_values() -> None:
    """HubUnavailable was appended: an operator of the previous release reads a new quantizer's exit codes (and its
    podFailurePolicy lists them) as before. The codes are a wire contract between versions, so they are spelled
    here as that release shipped them."""
    previous_release = {"ModelNotFound": 10, "UnsupportedModel": 11, "ExportFailed": 12, "QuantizationFailed": 13,
                        "QualityGateFailed": 14, "InvalidInput": 15, "PublishFailed": 16, "InternalError": 17}
    assert {k: quantize_job.EXIT_CODES[k] for k in previous_release} == previous_release
    assert quantize_job.EXIT_CODES["HubUnavailable"] not in previous_release.values()
