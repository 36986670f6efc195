"""Fixtures for the quantizer tier: tiny local cross-encoders (no hub) and runs of the real command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from quantizer_job.steps.common import isa

REPO = Path(__file__).resolve().parents[2]

#: ``--recipe fixed`` as this machine's INT8 kernels need it: on AVX2-only CPUs (no VNNI) full-range weights
#: saturate and a tiny random model then fails the gate for the machine's sake, not the code's (seen on AMD EPYC);
#: on VNNI and arm64 it is the CRD's default, reduceRange false.
FIXED_RECIPE = ["--recipe", "fixed",
                "--reduce-range" if isa.REDUCE_RANGE_REQUIRED[isa.detect_local_target()] else "--no-reduce-range"]


@dataclass
class Run:
    rc: int
    result: dict
    stdout: str
    stderr: str
    termination: str | None


def run_quantize(args: list[str], tmp: Path, env: dict | None = None, timeout: int = 300) -> Run:
    """Run ``python -m quantizer_job`` as the Job container would (termination message to a file)."""
    term = tmp / f"termination-{os.getpid()}-{len(list(tmp.glob('termination-*')))}.log"
    e = dict(os.environ, TERMINATION_MESSAGE_PATH=str(term), RERANK_QUANTIZE_TIMING_SECONDS="0.2")
    e.update(env or {})
    p = subprocess.run([sys.executable, "-m", "quantizer_job", *args], capture_output=True, text=True,
                       timeout=timeout, env=e, cwd=str(REPO))
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "{}"
    return Run(rc=p.returncode, result=json.loads(last), stdout=p.stdout, stderr=p.stderr,
               termination=term.read_text() if term.exists() else None)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def bert_model(models_dir) -> Path:
    from rerank_devcluster import devmodels

    return devmodels.bert_cross_encoder(models_dir / "tiny-bert", seed=1)


@pytest.fixture(scope="session")
def xlmr_model(models_dir) -> Path:
    """Ships only sentencepiece.bpe.model (no tokenizer.json): the Job must convert one."""
    from rerank_devcluster import devmodels

    d = devmodels.xlmr_cross_encoder(models_dir / "tiny-xlmr", seed=2)
    assert not (d / "tokenizer.json").exists()
    return d


@pytest.fixture(scope="session")
def volume(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("volume")


@pytest.fixture(scope="session")
def published_bert(bert_model, volume, tmp_path_factory) -> tuple[Path, Run]:
    r = run_quantize(["--model", str(bert_model), "--output", str(volume), "--artifact-id", "bert-tiny-1",
                      *FIXED_RECIPE, "--operators", "MatMul,Attention"], tmp_path_factory.mktemp("t"))
    assert r.rc == 0, r.stderr[-3000:]
    return volume / "artifacts" / "bert-tiny-1", r


@pytest.fixture(scope="session")
def published_xlmr(xlmr_model, volume, tmp_path_factory) -> tuple[Path, Run]:
    # Tiny random XLM-R with an 800-token vocabulary ranks less robustly than a trained model; the gate is
    # relaxed here because this test is about the directory layout, not about quality.
    r = run_quantize(["--model", str(xlmr_model), "--output", str(volume), "--artifact-id", "xlmr-tiny-1",
                      "--recipe", "fixed", "--min-spearman", "0.9", "--min-topk-agreement", "0.6"],
                     tmp_path_factory.mktemp("t"))
    assert r.rc == 0, r.stderr[-3000:]
    return volume / "artifacts" / "xlmr-tiny-1", r
