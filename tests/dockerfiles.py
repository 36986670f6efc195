"""Reading our Dockerfiles without a container engine, for the image tests (operator and quantizer)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(
        line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#")))
    return [(m.group(1).upper(), m.group(2).strip())
            for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", text, re.M)]


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """The instructions grouped by build stage (each starts at a FROM)."""
    out: list[list[tuple[str, str]]] = []
    for ins in instructions(dockerfile):
        if ins[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def build_stage_copies(dockerfile: Path) -> list[tuple[list[Path], str]]:
    """(sources, destination) of every COPY from the build context in the first stage."""
    copies = []
    for k, a in stages(dockerfile)[0]:
        if k == "COPY" and not a.startswith("--from"):
            *srcs, dest = a.split()
            copies.append(([REPO_ROOT / s for s in srcs], dest))
    return copies


@dataclass(frozen=True)
class Wheel:
    names: list[str]  # the files inside it
    entry_points: str
    site: Path  # where it was unpacked


def wheel_from_build_context(dockerfile: Path, workdir: Path) -> Wheel:
    """Build the project's wheel from only the files the build stage COPYs (as `docker build` would) and unpack it."""
    ctx = workdir / "src"
    for srcs, dest in build_stage_copies(dockerfile):
        for src in srcs:
            if src.is_dir():  # COPY quantizer_job/ quantizer_job/
                shutil.copytree(src, ctx / dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif len(srcs) == 1 and not dest.endswith(("/", ".")):  # COPY a/b.py a/b.py
                (ctx / dest).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, ctx / dest)
            else:  # COPY pyproject.toml README.md ./
                (ctx / dest).mkdir(parents=True, exist_ok=True)
                shutil.copy(src, ctx / dest / src.name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "--wheel-dir", str(workdir / "wheels"), str(ctx)], check=True, timeout=300)
    (wheel,) = (workdir / "wheels").glob("rerank_operator-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = next(z.read(n).decode() for n in names if n.endswith("entry_points.txt"))
        z.extractall(workdir / "site")
    return Wheel(names, entry_points, workdir / "site")
