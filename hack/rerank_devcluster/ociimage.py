"""OCI image archives made from plain tarballs (the real node's pause image, TEI's stand-in image).

The dev cluster's registry takes these as they are (``registry.push_archive``): an OCI image layout (``oci-layout``,
``index.json``, ``blobs/sha256/...``) in one tar, the image's name in the index's annotations. Layers stay
uncompressed (an allowed OCI media type): gzip would cost CPU on every cold build and save nothing locally.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class ImageConfig:
    """What the runtime needs to start the image: the parts of an OCI image config this project uses."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    user: str = ""
    working_dir: str = ""
    labels: dict[str, str] = field(default_factory=dict)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def config_document(config: ImageConfig, layer_digests: list[str]) -> dict[str, Any]:
    """The image config JSON; ``diff_ids`` equal the layer digests because the layers are uncompressed."""
    cfg: dict[str, Any] = {"Env": list(config.env)}
    if config.entrypoint:
        cfg["Entrypoint"] = list(config.entrypoint)
    if config.cmd:
        cfg["Cmd"] = list(config.cmd)
    if config.user:
        cfg["User"] = config.user
    if config.working_dir:
        cfg["WorkingDir"] = config.working_dir
    if config.labels:
        cfg["Labels"] = dict(config.labels)
    return {
        "architecture": "amd64", "os": "linux", "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": list(layer_digests)},
    }


def manifest_document(config_blob: bytes, layers: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": _digest(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": d, "size": s} for d, s in layers],
    }


def index_document(name: str, manifest_blob: bytes) -> dict[str, Any]:
    return {
        "schemaVersion": 2, "mediaType": INDEX_TYPE,
        "manifests": [{
            "mediaType": MANIFEST_TYPE, "digest": _digest(manifest_blob), "size": len(manifest_blob),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name},
        }],
    }


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def write_archive(out: Path, name: str, layer_tars: list[Path], config: ImageConfig) -> str:
    """Write an OCI image layout archive for ``name`` made of ``layer_tars`` (bottom first); return the manifest
    digest. Written next to ``out`` and renamed, so a crash never leaves half an archive."""
    layers = [(file_digest(p), p.stat().st_size) for p in layer_tars]
    config_blob = json.dumps(config_document(config, [d for d, _ in layers]), sort_keys=True).encode()
    manifest_blob = json.dumps(manifest_document(config_blob, layers), sort_keys=True).encode()
    index_blob = json.dumps(index_document(name, manifest_blob), sort_keys=True).encode()
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add_bytes(tar, "index.json", index_blob)
        _add_bytes(tar, f"blobs/sha256/{_digest(config_blob)[7:]}", config_blob)
        _add_bytes(tar, f"blobs/sha256/{_digest(manifest_blob)[7:]}", manifest_blob)
        seen: set[str] = set()
        for (digest, _), path in zip(layers, layer_tars, strict=True):
            if digest not in seen:
                seen.add(digest)
                tar.add(str(path), arcname=f"blobs/sha256/{digest[7:]}")
    shutil.move(str(tmp), str(out))
    return _digest(manifest_blob)
