"""The real node's images, assembled here without a registry: a Debian rootfs and the quantizer's code.

- The rootfs: Debian bookworm (the ``essential`` set) with Python 3.11 and the C++ runtime the ML wheels need,
  made by ``mmdebstrap`` from Debian's packages and cached under ``~/.cache/rerank-operator`` keyed by its recipe.
- ``rerank.local/pause``: the pod sandbox image (containerd starts one per pod): the same rootfs layer, sleeping.
- ``rerank.local/quantizer``: the rootfs plus a small layer with the quantizer's package from this checkout, a
  virtualenv skeleton at ``/opt/venv`` and ``rerank-quantize`` on PATH, user 65532, like quantizer_job/Dockerfile.

How it differs from the published image: the ML stack (torch, optimum, transformers, onnxruntime: gigabytes) is
not copied into a layer. The node's container runtime bind-mounts this checkout's virtualenv ``site-packages``
read-only at ``/opt/venv/lib/python3.11/site-packages`` in every container (:func:`dependency_mount`), so the pod
spec stays exactly what the operator wrote. Everything else is the container's own: Debian's python3.11 (not the
host's), its own root filesystem (read-only, as the Job asks), namespaces, cgroups and uid.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sysconfig
import tarfile
from dataclasses import dataclass
from pathlib import Path

from rerank_devcluster import binaries, ociimage

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3.11-minimal", "libpython3.11-stdlib", "libstdc++6", "libgomp1", "busybox-static")
ROOTFS_RECIPE = f"mmdebstrap --variant=essential {SUITE} {' '.join(PACKAGES)}"

PAUSE_IMAGE = "rerank.local/pause:1"
QUANTIZER_REPO = "rerank.local/quantizer"
VENV = "/opt/venv"
SITE_PACKAGES = f"{VENV}/lib/python3.11/site-packages"
CODE_DIR = "/opt/rerank"
RUN_AS = "65532:65532"
QUANTIZER_ENV = (
    f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    f"PYTHONPATH={CODE_DIR}",
    "PYTHONUNBUFFERED=1",
    "PYTHONDONTWRITEBYTECODE=1",
    "TOKENIZERS_PARALLELISM=false",
    "HF_HOME=/tmp/hf",
    "HF_HUB_DISABLE_TELEMETRY=1",
)


@dataclass(frozen=True)
class NodeImages:
    """OCI archives to import into the node's containerd, and the names the pods use."""

    pause: Path
    quantizer: Path
    quantizer_image: str


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
                    "--format=tar", SUITE, str(tmp), MIRROR], check=True)
    tmp.rename(out)
    return out


def host_site_packages() -> Path:
    """The virtualenv whose ML stack the quantizer's containers borrow (the one running this code)."""
    return Path(sysconfig.get_paths()["purelib"])


def dependency_mount() -> dict[str, object]:
    """The OCI mount the node's runtime adds to every container: the ML stack, read-only."""
    return {"destination": SITE_PACKAGES, "type": "bind", "source": str(host_site_packages()),
            "options": ["rbind", "ro", "nosuid", "nodev"]}


def _dir(name: str, mode: int = 0o755) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    return info


def _file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def code_layer(out: Path, package: Path) -> None:
    """The quantizer's layer: its package under /opt/rerank and a virtualenv skeleton whose python is Debian's."""
    with tarfile.open(out, "w") as tar:
        for d in ("opt", CODE_DIR[1:], VENV[1:], f"{VENV[1:]}/bin", f"{VENV[1:]}/lib", f"{VENV[1:]}/lib/python3.11",
                  SITE_PACKAGES[1:]):
            tar.addfile(_dir(d))
        link = tarfile.TarInfo(f"{VENV[1:]}/bin/python3")
        link.type, link.linkname = tarfile.SYMTYPE, "/usr/bin/python3.11"
        tar.addfile(link)
        link = tarfile.TarInfo(f"{VENV[1:]}/bin/python")
        link.type, link.linkname = tarfile.SYMTYPE, "python3"
        tar.addfile(link)
        _file(tar, f"{VENV[1:]}/pyvenv.cfg", b"home = /usr/bin\ninclude-system-site-packages = false\n")
        _file(tar, f"{VENV[1:]}/bin/rerank-quantize",
              f"#!{VENV}/bin/python3\nimport sys\nfrom quantizer_job.cli import main\nsys.exit(main())\n".encode(),
              0o755)
        for src in sorted(package.rglob("*.py")):
            _file(tar, f"{CODE_DIR[1:]}/{package.name}/{src.relative_to(package)}", src.read_bytes())


def _package_key(package: Path) -> str:
    h = hashlib.sha256()
    for src in sorted(package.rglob("*.py")):
        h.update(str(src.relative_to(package)).encode() + b"\0" + src.read_bytes())
    return h.hexdigest()[:12]


def ensure_images(package: Path | None = None) -> NodeImages:
    """Both image archives, rebuilt only when the rootfs recipe or the quantizer's code changed."""
    package = package or binaries.REPO_ROOT / "quantizer_job"
    rootfs = ensure_rootfs()
    pause = rootfs.parent / "pause.oci.tar"
    if not pause.is_file():
        ociimage.write_archive(pause, PAUSE_IMAGE, [rootfs],
                               ociimage.ImageConfig(entrypoint=("/bin/busybox", "sleep", "2147483647")))
    tag = _package_key(package)
    image = f"{QUANTIZER_REPO}:{tag}"
    archive = rootfs.parent / f"quantizer-{tag}.oci.tar"
    if not archive.is_file():
        layer = rootfs.parent / f"quantizer-{tag}.layer.tar"
        code_layer(layer, package)
        ociimage.write_archive(archive, image, [rootfs, layer], ociimage.ImageConfig(
            entrypoint=("rerank-quantize",), env=QUANTIZER_ENV, user=RUN_AS, working_dir="/tmp",
            labels={"org.opencontainers.image.title": "rerank-quantizer (dev node)"}))
        layer.unlink()
        for old in rootfs.parent.glob("quantizer-*.oci.tar"):  # keep the cache from growing with every edit
            if old != archive:
                old.unlink(missing_ok=True)
    return NodeImages(pause=pause, quantizer=archive, quantizer_image=image)
