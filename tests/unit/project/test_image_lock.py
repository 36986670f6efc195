"""The quantizer image installs quantizer_job/image-requirements*.txt: they must be the stack this suite runs on."""

from __future__ import annotations

import subprocess
import sys

from rerank_devcluster.binaries import REPO_ROOT


def test_image_requirements_are_the_installed_quantizer_stack() -> None:
    done = subprocess.run([sys.executable, str(REPO_ROOT / "hack" / "lock_image_requirements.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_lock_pins_the_quantizers_direct_needs_and_no_cuda_runtime_in_the_main_file() -> None:
    pins = dict(line.split("==") for line in (REPO_ROOT / "quantizer_job" / "image-requirements.txt").read_text()
                .splitlines() if line and not line.startswith("#"))
    for needed in ("torch", "onnxruntime", "optimum-onnx", "transformers", "tokenizers", "prometheus-client"):
        assert needed in pins, needed
    assert pins["onnxruntime"] == "1.22.0"  # what TEI 1.9 embeds
    assert not [n for n in pins if n.startswith(("nvidia-", "cuda-", "triton"))]
    cuda = (REPO_ROOT / "quantizer_job" / "image-requirements-cuda.txt").read_text()
    assert "nvidia-cublas==" in cuda
