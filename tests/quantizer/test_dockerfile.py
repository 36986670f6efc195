"""quantizer_job/Dockerfile cannot be built here (no container daemon): check the base is pinned, the final stage is
non-root with no build tools, and that the wheel built from exactly the files it COPYs carries a working
``rerank-quantize`` entry point (run against this venv's ML stack, which stands in for the image's)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.quantizer

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "quantizer_job" / "Dockerfile"


def stages() -> list[list[tuple[str, str]]]:
    text = re.sub(r"\\\n", " ", "\n".join(
        line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")))
    out: list[list[tuple[str, str]]] = []
    for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", text, re.M):
        if m.group(1).upper() == "FROM":
            out.append([])
        if out:
            out[-1].append((m.group(1).upper(), m.group(2).strip()))
    return out


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
    ctx = tmp_path / "src"
    for k, a in stages()[0]:
        if k != "COPY" or a.startswith("--from"):
            continue
        *srcs, dest = a.split()
        for src in (REPO_ROOT / p for p in srcs):
            if src.is_dir():  # COPY quantizer_job/ quantizer_job/
                shutil.copytree(src, ctx / dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:  # COPY pyproject.toml README.md ./
                (ctx / dest).mkdir(parents=True, exist_ok=True)
                shutil.copy(src, ctx / dest / src.name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "--wheel-dir", str(tmp_path / "wheels"), str(ctx)], check=True, timeout=300)
    (wheel,) = (tmp_path / "wheels").glob("rerank_operator-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = next(z.read(n).decode() for n in names if n.endswith("entry_points.txt"))
        z.extractall(tmp_path / "site")
    assert "quantizer_job/cli.py" in names and "quantizer_job/contract.py" in names
    assert "rerank-quantize = quantizer_job.cli:main" in entry_points
    # The unpacked wheel first on the path, this venv's packages after it for the ML stack.
    out = subprocess.run([sys.executable, "-c", "import sys; from quantizer_job.cli import main; "
                          "import quantizer_job; print(quantizer_job.__file__); sys.argv=['rerank-quantize','--help']; main()"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith(str(tmp_path / "site"))
    for flag in ("--model", "--output", "--artifact-id", "--eval-pairs", "--min-spearman"):
        assert flag in out.stdout
