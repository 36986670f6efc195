"""OCI image archives for the real node: the layout a container runtime imports must hang together."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from rerank_devcluster import nodeimage, ociimage


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


def test_quantizer_code_layer_runs_debians_python_with_the_checkout_package(tmp_path: Path) -> None:
    package = tmp_path / "quantizer_job"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "m.py").write_text("X = 1\n")
    (package / "notes.txt").write_text("not code")
    nodeimage.code_layer(tmp_path / "layer.tar", package)
    with tarfile.open(tmp_path / "layer.tar") as tar:
        members = {m.name: m for m in tar.getmembers()}
        script = tar.extractfile(members["opt/venv/bin/rerank-quantize"]).read().decode()  # type: ignore[union-attr]
    assert members["opt/venv/bin/python3"].linkname == "/usr/bin/python3.11"
    assert script.startswith("#!/opt/venv/bin/python3\n") and "quantizer_job.cli import main" in script
    assert members["opt/venv/bin/rerank-quantize"].mode & 0o111
    assert {"opt/rerank/quantizer_job/__init__.py", "opt/rerank/quantizer_job/sub/m.py"} <= set(members)
    assert "opt/rerank/quantizer_job/notes.txt" not in members
    assert members[nodeimage.SITE_PACKAGES.lstrip("/")].isdir()  # the runtime's read-only mount point


@pytest.mark.parametrize("extra", [[], [{"destination": "/x", "type": "bind", "source": "/y", "options": ["ro"]}]])
def test_base_runtime_spec_keeps_the_runtime_defaults(extra: list[dict[str, object]]) -> None:
    from rerank_devcluster import realnode

    default = {"ociVersion": "1.0.2", "process": {"cwd": "/"}, "mounts": [{"destination": "/proc", "type": "proc"}]}
    spec = realnode.base_runtime_spec(default, extra)
    assert spec["mounts"] == [*default["mounts"], *extra] and spec["process"] == default["process"]
    assert default["mounts"] == [{"destination": "/proc", "type": "proc"}]  # not modified in place
