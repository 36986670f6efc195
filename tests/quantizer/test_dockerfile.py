"""quantizer_job/Dockerfile, read without building it (the node tier builds it for real with buildah and runs the
Job from it): the base is pinned, the final stage is non-root with no build tools, and the wheel built from exactly
the files it COPYs carries a working ``rerank-quantize`` entry point (run against this venv's ML stack)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import dockerfiles
from tests.dockerfiles import REPO_ROOT

pytestmark = pytest.mark.quantizer

DOCKERFILE = REPO_ROOT / "quantizer_job" / "Dockerfile"


def stages() -> list[list[tuple[str, str]]]:
    return dockerfiles.stages(DOCKERFILE)


def test_pinned_base_lean_non_root_final_stage() -> None:
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert base and re.fullmatch(r"python:3\.11\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", base.group(1))
    build, final = stages()[0], stages()[-1]
    assert len(stages()) >= 2
    runs = " ".join(a for k, a in final if k == "RUN")
    assert not any(t in runs for t in ("apt-get", "build-essential", "pip install")), runs
    assert [a for k, a in final if k == "USER"] == ["65532:65532"]
    assert ("ENTRYPOINT", '["rerank-quantize"]') in final
    assert all(a.startswith("--from=") for k, a in final if k == "COPY")
    assert "onnxruntime.__version__ == '1.22.0'" in " ".join(a for k, a in build if k == "RUN")


def test_wheel_from_the_build_context_runs_rerank_quantize(tmp_path: Path) -> None:
    wheel = dockerfiles.wheel_from_build_context(DOCKERFILE, tmp_path)
    names, entry_points = wheel.names, wheel.entry_points
    assert "quantizer_job/cli.py" in names and "rerank_contracts/quantize_job.py" in names
    assert "rerank-quantize = quantizer_job.cli:main" in entry_points
    # The pools' helpers when the operator names no image of its own for them (--artifact-fetcher-image).
    assert "rerank-sampler = rerank_sampler.main:main" in entry_points and "rerank_sampler/main.py" in names
    assert "rerank-fetch-artifact = rerank_contracts.shared_store:main" in entry_points
    # The unpacked wheel first on the path, this venv's packages after it for the ML stack.
    out = subprocess.run([sys.executable, "-c", "import sys; from quantizer_job.cli import main; "
                          "import quantizer_job; print(quantizer_job.__file__); "
                          "sys.argv=['rerank-quantize','--help']; main()"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(wheel.site), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith(str(wheel.site))
    for flag in ("--model", "--output", "--artifact-id", "--eval-pairs", "--min-spearman"):
        assert flag in out.stdout
