"""The real node's images, made here without a registry: a Debian rootfs, and the project's images from its Dockerfiles.

- The rootfs: Debian bookworm (the ``essential`` set) with Python 3.11 (``venv`` included, ``python`` on PATH as
  the ``python`` images have it), ``passwd`` and the C++ runtime the ML wheels need, made by ``mmdebstrap`` from
  Debian's packages and cached under ``~/.cache/rerank-operator`` keyed by its recipe. It stands in for
  ``python:3.11-slim-bookworm`` (the Dockerfiles' ``PYTHON_IMAGE``), which no registry here serves.
- ``rerank.local/pause``: the pod sandbox image (containerd starts one per pod): the rootfs, sleeping.
- ``rerank.local/operator`` and ``rerank.local/quantizer``: ``operator/Dockerfile`` and ``quantizer_job/Dockerfile``
  built by buildah on that base (:mod:`rerank_devcluster.images`): the ML stack lives inside the quantizer image,
  nothing of this checkout is mounted into a container.
- ``rerank.local/tei`` (benchmarks only, :func:`tei_image`): the rootfs plus a TEI router binary someone built and
  ONNX Runtime's shared library: a stand-in for ``ghcr.io/huggingface/text-embeddings-inference:cpu-1.9``, which
  no registry here serves and which CI cannot build (TEI's source is not on crates.io).
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from rerank_devcluster import binaries, images, ociimage, registry

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3.11", "python3.11-venv", "passwd", "libstdc++6", "libgomp1", "busybox-static")
#: the python images' ``python`` on PATH, which the Dockerfiles call
PYTHON_LINK = 'ln -sf /usr/bin/python3.11 "$1/usr/local/bin/python"'
ROOTFS_RECIPE = f"mmdebstrap --variant=essential {SUITE} {' '.join(PACKAGES)} {PYTHON_LINK}"

PAUSE_IMAGE = "rerank.local/pause:1"
BASE_REPO = "rerank.local/python"
OPERATOR_REPO = "rerank.local/operator"
#: Where the dev cluster's registry keeps the images (``<registry>/rerank/rerank-operator``...): the names a release
#: pushes too (``hack/release --registry <registry>/rerank``), so a release into the dev cluster reuses every blob.
REGISTRY_PREFIX = "rerank"
OPERATOR_REPOSITORY = "rerank-operator"
QUANTIZER_REPOSITORY = "rerank-quantizer"
QUANTIZER_REPO = "rerank.local/quantizer"
TEI_REPO = "rerank.local/tei"
TEI_BIN = "/usr/local/bin/text-embeddings-router"
TEI_LIB_DIR = "/usr/local/lib/onnxruntime"
OPERATOR_DOCKERFILE = binaries.REPO_ROOT / "operator" / "Dockerfile"
QUANTIZER_DOCKERFILE = binaries.REPO_ROOT / "quantizer_job" / "Dockerfile"


@dataclass(frozen=True)
class NodeImages:
    """The node's images as OCI archives, and the names pods use: the built names until :meth:`pushed`, then their
    references by digest in the dev cluster's registry (what the kubelet pulls)."""

    pause: Path
    quantizer: images.Image
    operator: images.Image
    pause_image: str = PAUSE_IMAGE

    @property
    def quantizer_image(self) -> str:
        return self.quantizer.name

    def pushed(self, to: registry.LocalRegistry) -> NodeImages:
        """Push the three images to ``to`` (repository and tag as built); the same images named by digest there."""
        def push(archive: Path, name: str, repository: str) -> str:  # tag: the build's content key
            return to.push_archive(archive, f"{REGISTRY_PREFIX}/{repository}", name.rpartition(":")[2])

        return NodeImages(
            pause=self.pause,
            quantizer=images.Image(push(self.quantizer.archive, self.quantizer.name, QUANTIZER_REPOSITORY),
                                   self.quantizer.archive),
            operator=images.Image(push(self.operator.archive, self.operator.name, OPERATOR_REPOSITORY),
                                  self.operator.archive),
            pause_image=push(self.pause, PAUSE_IMAGE, "pause"))


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
    # base_image() before each build: a build that writes its archive empties buildah's store (images.clear_store),
    # base included, so the next build needs it imported again (seconds).
    return NodeImages(
        pause=pause,
        quantizer=images.build(QUANTIZER_DOCKERFILE, QUANTIZER_REPO, base=base_image(),
                               build_args=images.quantizer_build_args()),
        operator=images.build(OPERATOR_DOCKERFILE, OPERATOR_REPO, base=base_image()),
    )


def _add_file(tar: tarfile.TarFile, src: Path, arcname: str, mode: int = 0o755) -> None:
    info = tar.gettarinfo(str(src), arcname=arcname.lstrip("/"))
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = mode
    with src.open("rb") as f:
        tar.addfile(info, f)


def _add_link(tar: tarfile.TarFile, arcname: str, target: str) -> None:
    info = tarfile.TarInfo(arcname.lstrip("/"))
    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    tar.addfile(info, io.BytesIO(b""))


def tei_image(router: Path, ort_library: Path) -> tuple[Path, str]:
    """An OCI archive (and its image name) of TEI's router on the node's rootfs, for benchmarks with a real TEI.

    ``router``: a ``text-embeddings-router`` the user built with the ORT backend from TEI's own sources
    (``docs/tei-contract.md``; never built by this project); ``ort_library``: the ``libonnxruntime.so.1.x.y`` it
    links (onnxruntime's wheel ships it). The router's entrypoint and ``LD_LIBRARY_PATH`` are the image's; the pod's
    ``args`` are the operator's, as with TEI's own image. Cached by the two files' digests."""
    key = hashlib.sha256((ociimage.file_digest(router) + ociimage.file_digest(ort_library)).encode()).hexdigest()[:12]
    name = f"{TEI_REPO}:{key}"
    rootfs = ensure_rootfs()
    out = rootfs.parent / f"tei-{key}.oci.tar"
    if out.is_file():
        return out, name
    layer = rootfs.parent / f"tei-{key}.layer.tar"
    with tarfile.open(layer, "w") as tar:
        _add_file(tar, router, TEI_BIN)
        _add_file(tar, ort_library, f"{TEI_LIB_DIR}/{ort_library.name}")
        for link in ("libonnxruntime.so.1", "libonnxruntime.so"):
            if link != ort_library.name:
                _add_link(tar, f"{TEI_LIB_DIR}/{link}", ort_library.name)
    ociimage.write_archive(out, name, [rootfs, layer], ociimage.ImageConfig(
        entrypoint=(TEI_BIN,),
        env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"LD_LIBRARY_PATH={TEI_LIB_DIR}"),
        labels={"org.opencontainers.image.title": "text-embeddings-router (ORT backend), benchmarks only"}))
    layer.unlink()
    return out, name
