"""The README's test command runs the linters: ruff, ``mypy --strict`` and the import-linter layer contracts, all
configured in pyproject.toml, so a type error or a layering break fails the suite with the tool's own report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
#: What ruff checks; mypy's scope is `files` in [tool.mypy] (of the benchmarks: fleet, serving_e2e, guard_detection).
RUFF_SCOPE = ["operator/rerank_operator", "operator/rerank_activator", "operator/rerank_sampler", "rerank_contracts",
              "hack/rerank_devcluster", "hack/gen_api_docs.py", "hack/lock_image_requirements.py", "quantizer_job",
              "quality_guard", "benchmarks", "tests"]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_is_clean() -> None:
    result = run(sys.executable, "-m", "ruff", "check", "--no-cache", *RUFF_SCOPE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    result = run(sys.executable, "-m", "mypy", "--strict")  # files and settings: [tool.mypy] in pyproject.toml
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout


def test_import_contracts_are_kept() -> None:
    result = run(str(BIN / "lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
