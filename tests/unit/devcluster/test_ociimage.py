"""OCI image archives for the real node (its pause image): the layout a container runtime imports must hang together."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from rerank_devcluster import ociimage


def _layer(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _read(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def _blob(files: dict[str, bytes], digest: str) -> bytes:
    data = files[f"blobs/sha256/{digest.removeprefix('sha256:')}"]
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest, f"blob {digest} does not match its content"
    return data


def test_archive_is_a_consistent_oci_layout(tmp_path: Path) -> None:
    base = _layer(tmp_path / "base.tar", {"etc/os-release": b"ID=debian\n"})
    top = _layer(tmp_path / "top.tar", {"opt/app/run": b"#!/bin/sh\n"})
    config = ociimage.ImageConfig(entrypoint=("run",), env=("A=1",), user="65532:65532", working_dir="/tmp")
    digest = ociimage.write_archive(tmp_path / "img.tar", "rerank.local/x:1", [base, top], config)

    files = _read(tmp_path / "img.tar")
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    [entry] = json.loads(files["index.json"])["manifests"]
    assert entry["digest"] == digest and entry["annotations"]["io.containerd.image.name"] == "rerank.local/x:1"
    manifest = json.loads(_blob(files, digest))
    assert manifest["mediaType"] == ociimage.MANIFEST_TYPE and entry["size"] == len(_blob(files, digest))
    layers = [_blob(files, layer["digest"]) for layer in manifest["layers"]]
    assert layers == [base.read_bytes(), top.read_bytes()]  # bottom first, byte for byte
    image_config = json.loads(_blob(files, manifest["config"]["digest"]))
    # Uncompressed layers: the diff_ids the runtime verifies after unpacking are the layer digests themselves.
    assert image_config["rootfs"]["diff_ids"] == [layer["digest"] for layer in manifest["layers"]]
    assert image_config["config"]["User"] == "65532:65532" and image_config["config"]["Entrypoint"] == ["run"]
    assert not (tmp_path / "img.tar.tmp").exists()


def test_a_layer_shared_twice_is_stored_once(tmp_path: Path) -> None:
    base = _layer(tmp_path / "base.tar", {"a": b"1"})
    ociimage.write_archive(tmp_path / "img.tar", "x:1", [base, base], ociimage.ImageConfig())
    with tarfile.open(tmp_path / "img.tar") as tar:
        names = [m.name for m in tar.getmembers()]
    assert len(names) == len(set(names))
