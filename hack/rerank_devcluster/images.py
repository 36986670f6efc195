"""The project's images built from its Dockerfiles with buildah: no daemon, no registry, cached by content.

``operator/Dockerfile`` and ``quantizer_job/Dockerfile`` are the recipes, built as they are with one build argument
changed: ``PYTHON_IMAGE`` names a local base (the node's Debian rootfs, :mod:`rerank_devcluster.nodeimage`) instead
of ``python:3.11-slim`` from a registry nobody can reach here. ``RUN`` steps install from the package index this
machine's pip uses (its ``index-url``, ``cert``), through a pip cache kept under ``~/.cache/rerank-operator`` so a
rebuild downloads nothing. The result is an OCI archive, pushed to the dev cluster's registry (``registry.py``)
for the node to pull.

Cache key (the image's tag): the Dockerfile, the base, the build arguments and every file the build context sends
(``.dockerignore`` says which). Same key, same archive: nothing is built.

buildah's own storage lives under the cache too (``buildah/``), apart from the machine's ``/var/lib/containers``;
``--isolation chroot`` runs ``RUN`` steps without a container runtime's network setup (the host's network).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rerank_devcluster import binaries

#: where this machine's pip settings are read from, and the subset passed on to the build
PIP_KEYS = ("index-url", "extra-index-url", "cert", "trusted-host")
BUILD_CA = "/etc/rerank-build/ca.pem"
BUILD_PIP_CACHE = "/rerank-pip-cache"
DEFAULT_INDEX = "https://pypi.org/simple"


class ImageBuildError(RuntimeError):
    """buildah failed; the message has the step's output tail."""


@dataclass(frozen=True)
class Image:
    """A built image: the name pods use and the archive to import."""

    name: str
    archive: Path


def store() -> Path:
    return binaries.cache_dir() / "buildah"


def _buildah(*args: str, timeout: float = 3600, capture: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["buildah", "--root", str(store() / "root"), "--runroot", str(store() / "run"),
           "--storage-driver", "overlay", *args]
    done = subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = ((done.stdout or "") + (done.stderr or ""))[-4000:]
        raise ImageBuildError(f"{' '.join(cmd[7:9])} failed ({done.returncode}):\n{tail}")
    return done


def context_files(root: Path = binaries.REPO_ROOT) -> list[Path]:
    """The files the build context sends: ``.dockerignore``'s rules (``*`` then ``!kept`` paths, then excluded
    patterns), the subset of Docker's syntax that file uses."""
    rules = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    kept = [r[1:] for r in rules if r.startswith("!")]
    excluded = [r.removeprefix("**/") for r in rules if not r.startswith("!") and r != "*"]
    files = []
    for top in kept:
        path = root / top
        for f in ([path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())):
            if not any(fnmatch.fnmatch(part, pat) for part in f.relative_to(root).parts for pat in excluded):
                files.append(f)
    return files


def content_key(dockerfile: Path, base: str, build_args: dict[str, str], root: Path = binaries.REPO_ROOT) -> str:
    h = hashlib.sha256()
    h.update(dockerfile.read_bytes() + b"\0" + base.encode() + b"\0")
    for k, v in sorted(build_args.items()):
        h.update(f"{k}={v}\0".encode())
    for f in context_files(root):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def host_pip_settings() -> dict[str, str]:
    """This machine's effective pip settings (config files and PIP_* variables) for the keys the build needs."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    found: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in PIP_KEYS and value:
            found[name] = value.strip().strip("'\"")
    for name in PIP_KEYS:
        env = os.environ.get("PIP_" + name.upper().replace("-", "_"))
        if env:
            found[name] = env
    return found


def host_pip_cache() -> Path:
    """pip's cache on this machine, shared with the build: the wheels ``hack/setup.sh`` downloaded are not
    downloaded again."""
    out = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else binaries.cache_dir() / "pip"


def build_pip_conf(settings: dict[str, str]) -> str:
    """The pip.conf ``RUN`` steps see: the host's index and trust, its CA bundle at :data:`BUILD_CA`, the cache."""
    lines = ["[global]", f"cache-dir = {BUILD_PIP_CACHE}", "disable-pip-version-check = true"]
    for key in ("index-url", "extra-index-url", "trusted-host"):
        if key in settings:
            lines.append(f"{key} = {settings[key]}")
    if "cert" in settings:
        lines.append(f"cert = {BUILD_CA}")
    return "\n".join(lines) + "\n"


def ensure_base(name: str, rootfs: Path) -> None:
    """The local base image ``name`` from a rootfs tarball (once per name: the name carries the rootfs' key)."""
    if subprocess.run(["buildah", "--root", str(store() / "root"), "--runroot", str(store() / "run"),
                       "--storage-driver", "overlay", "inspect", "--type", "image", name],
                      capture_output=True).returncode == 0:
        return
    container = _buildah("from", "scratch").stdout.strip()
    try:
        _buildah("add", container, str(rootfs), "/")
        _buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "--env", "LANG=C.UTF-8", "--cmd", "python3", container)
        _buildah("commit", "--quiet", container, name)
    finally:
        _buildah("rm", container)


def build(dockerfile: Path, repo: str, *, base: str, build_args: dict[str, str] | None = None,
          root: Path = binaries.REPO_ROOT) -> Image:
    """Build ``dockerfile`` (context: the repository root) as ``repo:<content key>``; an OCI archive, cached."""
    args = {"PYTHON_IMAGE": base, **(build_args or {})}
    tag = content_key(dockerfile, base, args, root)
    name = f"{repo}:{tag}"
    out_dir = binaries.cache_dir() / "images"
    archive = out_dir / f"{repo.rsplit('/', 1)[-1]}-{tag}.oci.tar"
    if archive.is_file():
        return Image(name, archive)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = host_pip_settings()
    conf = out_dir / "pip.conf"
    conf.write_text(build_pip_conf(settings))
    pip_cache = host_pip_cache()
    pip_cache.mkdir(parents=True, exist_ok=True)
    volumes = ["-v", f"{conf}:/etc/pip.conf:ro", "-v", f"{pip_cache}:{BUILD_PIP_CACHE}"]
    if "cert" in settings:
        volumes += ["-v", f"{settings['cert']}:{BUILD_CA}:ro"]
    cmd = ["bud", "--isolation", "chroot", "--pull-never", "--layers", "-f", str(dockerfile), "-t", name,
           *volumes, *(f"--build-arg={k}={v}" for k, v in sorted(args.items())), str(root)]
    _buildah(*cmd)
    tmp = archive.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    _buildah("push", "--quiet", "--disable-compression", name, f"oci-archive:{tmp}:{name}")
    tmp.rename(archive)
    clear_store()
    for old in out_dir.glob(f"{repo.rsplit('/', 1)[-1]}-*.oci.tar"):  # one archive per image kept
        if old != archive:
            old.unlink(missing_ok=True)
    return Image(name, archive)


def clear_store() -> None:
    """Empty buildah's storage once an archive is written: its layers (the build stage's venv, the final stage's
    copy, their caches) reach tens of GB after a few builds, and a CI disk is not that large. The next build starts
    from the base (re-imported in seconds) and downloads its wheels again."""
    _buildah("rm", "--all")
    _buildah("rmi", "--all", "--force")


def quantizer_build_args(settings: dict[str, str] | None = None) -> dict[str, str]:
    """Where the quantizer image's torch comes from here: the index this machine's pip uses, i.e. PyPI's CUDA
    build with the CUDA libraries it links (PyTorch's CPU index, the Dockerfile's own default, is not reachable)."""
    settings = host_pip_settings() if settings is None else settings
    return {"TORCH_INDEX_URL": settings.get("index-url", DEFAULT_INDEX), "TORCH_CUDA_LIBS": "true"}
