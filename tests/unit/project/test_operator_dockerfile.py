"""operator/Dockerfile cannot be built here (no container daemon), so check what can be checked without one:
the base is pinned, the final stage runs as non-root with no build tools, the labels are there, and the wheel the
build stage makes from exactly the files it COPYs installs a working ``rerank-operator`` entry point.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests import dockerfiles
from tests.dockerfiles import REPO_ROOT

DOCKERFILE = REPO_ROOT / "operator" / "Dockerfile"
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def instructions() -> list[tuple[str, str]]:
    return dockerfiles.instructions(DOCKERFILE)


def stages() -> list[list[tuple[str, str]]]:
    return dockerfiles.stages(DOCKERFILE)


def test_base_is_a_pinned_python_311_slim() -> None:
    args = dict(a.split("=", 1) for k, a in instructions() if k == "ARG" and "=" in a)
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", base), base
    assert all(a.split()[0] == "${PYTHON_IMAGE}" for k, a in instructions() if k == "FROM")


def test_multi_stage_and_final_stage_is_lean_and_non_root() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2
    final = all_stages[-1]
    runs = " ".join(a for k, a in final if k == "RUN")
    for tool in ("apt-get", "apk", "gcc", "build-essential", "pip install", "pip wheel"):
        assert tool not in runs, f"final stage must not install things ({tool})"
    assert [a for k, a in final if k == "USER"] == ["65532:65532"]
    assert ("ENTRYPOINT", '["rerank-operator"]') in final
    copies = [a for k, a in final if k == "COPY"]
    assert copies and all(a.startswith("--from=") for a in copies), "final stage only copies from the build stage"
    labels = " ".join(a for k, a in final if k == "LABEL")
    for key in ("title", "description", "source", "licenses", "version", "revision"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_installs_only_the_operator_extra() -> None:
    runs = " ".join(a for k, a in stages()[0] if k == "RUN")
    extras = re.findall(r"\.whl\)\[([a-z,]+)\]", runs)
    assert extras == ["operator"]
    assert "operator" in PYPROJECT["project"]["optional-dependencies"]


def test_entrypoint_is_a_console_script_of_the_package() -> None:
    assert PYPROJECT["project"]["scripts"]["rerank-operator"] == "rerank_operator.main:main"
    # The activator ships in the same image (the chart's templates/activator.yaml runs `rerank-activator`).
    assert PYPROJECT["project"]["scripts"]["rerank-activator"] == "rerank_activator.main:main"
    runs = " ".join(a for k, a in stages()[0] if k == "RUN")
    assert "/opt/rerank/bin/rerank-activator --help" in runs, "the build stage runs the activator's entry point"
    # ... and the fetcher of shared artifacts (the pools' init container; the chart's --artifact-fetcher-image).
    assert PYPROJECT["project"]["scripts"]["rerank-fetch-artifact"] == "rerank_contracts.shared_store:main"
    assert "/opt/rerank/bin/rerank-fetch-artifact --help" in runs, "the build stage runs the fetcher's entry point"


def _copied_sources() -> list[Path]:
    return [src for srcs, _ in dockerfiles.build_stage_copies(DOCKERFILE) for src in srcs]


def test_copied_sources_exist() -> None:
    srcs = _copied_sources()
    assert srcs
    for p in srcs:
        assert p.exists(), p


@pytest.mark.slow
def test_wheel_from_the_build_context_runs_the_entry_point(tmp_path: Path) -> None:
    """Build the wheel from only the COPY'd files (as the build stage does) and run its entry point."""
    wheel = dockerfiles.wheel_from_build_context(DOCKERFILE, tmp_path)
    names, entry_points = wheel.names, wheel.entry_points
    assert "rerank_operator/main.py" in names
    assert not any(n.startswith("rerank_devcluster/") for n in names), "the dev-cluster harness stays out"
    assert "rerank-operator = rerank_operator.main:main" in entry_points
    assert "rerank_activator/main.py" in names and "rerank_contracts/activator.py" in names
    assert "rerank-fetch-artifact = rerank_contracts.shared_store:main" in entry_points
    assert not any(n.startswith("quantizer_job/") for n in names), "the operator's image holds no quantizer code"
    assert "rerank-activator = rerank_activator.main:main" in entry_points
    # Run the entry point from the unpacked wheel (dependencies from this venv stand in for the `operator` extra)
    # and check it pulls in none of the quantizer's ML stack.
    probe = (
        "import sys, json\n"
        "from rerank_operator.main import main\n"
        "sys.argv = ['rerank-operator', '--help']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
        "heavy = sorted(m for m in ('torch', 'optimum', 'transformers', 'onnxruntime') if m in sys.modules)\n"
        "print(json.dumps({'code': code, 'heavy': heavy, 'file': sys.modules['rerank_operator'].__file__}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(wheel.site), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] in (0, None)
    assert result["heavy"] == []
    assert result["file"].startswith(str(wheel.site))
    assert "--all-namespaces" in out.stdout and "--namespace" in out.stdout
    # The activator's entry point from the same wheel: its flags, and its package is the wheel's.
    probe = ("import sys\nimport rerank_activator\nfrom rerank_activator.main import main\n"
             "print(rerank_activator.__file__)\nmain(['--help'])\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(wheel.site), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(wheel.site))
    assert "--hold-seconds" in out.stdout and "--key-file" in out.stdout


@pytest.mark.parametrize("dockerfile", ["operator/Dockerfile", "quantizer_job/Dockerfile"])
def test_every_path_a_dockerfile_copies_is_in_the_build_context_and_its_cache_key(dockerfile: str) -> None:
    """.dockerignore decides what the build context sends and what the images' cache key hashes
    (rerank_devcluster.images.context_files): a COPY of a path it leaves out either fails, or is not in the key, so a
    change to that path alone would serve a stale image."""
    from rerank_devcluster import images

    sent = {f.relative_to(REPO_ROOT).as_posix() for f in images.context_files(REPO_ROOT)}
    sources = [source for line in (REPO_ROOT / dockerfile).read_text().splitlines()
               if line.startswith("COPY ") and not line.split()[1].startswith("--")
               for source in line.split()[1:-1]]  # the last word is the destination
    assert sources
    for source in sources:
        assert any(p == source or p.startswith(source.rstrip("/") + "/") for p in sent), \
            f"{dockerfile} copies {source}, which .dockerignore leaves out"
