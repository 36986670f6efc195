"""The real node's images, made here without a registry: a Debian rootfs, and the project's images from its Dockerfiles.

- The rootfs: Debian bookworm (the ``essential`` set) with Python 3.11 (``venv`` included, ``python`` on PATH as
  the ``python`` images have it), ``passwd`` and the C++ runtime the ML wheels need, made by ``mmdebstrap`` from
  Debian's packages and cached under ``~/.cache/rerank-operator`` keyed by its recipe. It stands in for
  ``python:3.11-slim-bookworm`` (the Dockerfiles' ``PYTHON_IMAGE``), which no registry here serves.
- ``rerank.local/pause``: the pod sandbox image (containerd starts one per pod): the rootfs, sleeping.
- ``rerank.local/operator`` and ``rerank.local/quantizer``: ``operator/Dockerfile`` and ``quantizer_job/Dockerfile``
  built by buildah on that base (:mod:`rerank_devcluster.images`): the ML stack lives inside the quantizer image,
  nothing of this checkout is mounted into a container.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rerank_devcluster import binaries, images, ociimage

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3.11", "python3.11-venv", "passwd", "libstdc++6", "libgomp1", "busybox-static")
#: the python images' ``python`` on PATH, which the Dockerfiles call
PYTHON_LINK = 'ln -sf /usr/bin/python3.11 "$1/usr/local/bin/python"'
ROOTFS_RECIPE = f"mmdebstrap --variant=essential {SUITE} {' '.join(PACKAGES)} {PYTHON_LINK}"

PAUSE_IMAGE = "rerank.local/pause:1"
BASE_REPO = "rerank.local/python"
OPERATOR_REPO = "rerank.local/operator"
QUANTIZER_REPO = "rerank.local/quantizer"
OPERATOR_DOCKERFILE = binaries.REPO_ROOT / "operator" / "Dockerfile"
QUANTIZER_DOCKERFILE = binaries.REPO_ROOT / "quantizer_job" / "Dockerfile"


@dataclass(frozen=True)
class NodeImages:
    """OCI archives to import into the node's containerd, and the names the pods use."""

    pause: Path
    quantizer: images.Image
    operator: images.Image

    @property
    def quantizer_image(self) -> str:
        return self.quantizer.name

    @property
    def archives(self) -> tuple[Path, ...]:
        return (self.pause, self.quantizer.archive, self.operator.archive)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def rootfs_dir() -> Path:
    return binaries.cache_dir() / f"node-rootfs-{SUITE}-{_key(ROOTFS_RECIPE)}"


def ensure_rootfs() -> Path:
    """The rootfs tarball, made once per recipe (about a minute: downloads from Debian's mirror)."""
    out = rootfs_dir() / "rootfs.tar"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name("rootfs.tar.tmp")
    subprocess.run(["mmdebstrap", "--quiet", "--variant=essential", f"--include={','.join(PACKAGES)}",
                    f"--customize-hook={PYTHON_LINK}", "--format=tar", SUITE, str(tmp), MIRROR], check=True)
    tmp.rename(out)
    return out


def base_image() -> str:
    """The local stand-in for ``python:3.11-slim-bookworm`` in buildah's store, named by the rootfs recipe."""
    name = f"{BASE_REPO}:3.11-{SUITE}-{_key(ROOTFS_RECIPE)}"
    images.ensure_base(name, ensure_rootfs())
    return name


def ensure_images() -> NodeImages:
    """The pause archive and both project images, rebuilt only when their recipe or inputs changed."""
    rootfs = ensure_rootfs()
    pause = rootfs.parent / "pause.oci.tar"
    if not pause.is_file():
        ociimage.write_archive(pause, PAUSE_IMAGE, [rootfs],
                               ociimage.ImageConfig(entrypoint=("/bin/busybox", "sleep", "2147483647")))
    base = base_image()
    return NodeImages(
        pause=pause,
        quantizer=images.build(QUANTIZER_DOCKERFILE, QUANTIZER_REPO, base=base,
                               build_args=images.quantizer_build_args()),
        operator=images.build(OPERATOR_DOCKERFILE, OPERATOR_REPO, base=base),
    )
