"""hack/release's pure parts: where a --registry points, and the chart values that name the pushed images."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from rerank_contracts import oci
from rerank_devcluster import ociimage, registry, release
from rerank_devcluster.processes import free_port

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("target", "host", "prefix"), [
    ("registry.example.com/platform", "registry.example.com", "platform"),
    ("registry.example.com", "registry.example.com", ""),
    ("127.0.0.1:5000/rerank/", "127.0.0.1:5000", "rerank"),
    ("localhost:5000", "localhost:5000", ""),
])
def test_a_registry_is_a_host_and_a_path(target: str, host: str, prefix: str) -> None:
    assert release.split_registry(target) == (host, prefix)


@pytest.mark.parametrize("target", ["platform", "https://registry.example.com", "registry example.com/x"])
def test_what_is_not_a_registry_is_refused(target: str) -> None:
    with pytest.raises(release.ReleaseError, match="expected host"):
        release.split_registry(target)


def test_the_released_chart_names_the_pushed_images_by_digest_and_keeps_the_rest() -> None:
    text = release.CHART.joinpath("values.yaml").read_text()
    quantizer = f"registry.example.com/platform/rerank-quantizer@{DIGEST}"
    out = release.chart_values(text, f"registry.example.com/platform/rerank-operator@{DIGEST}", quantizer)
    before, after = yaml.safe_load(text), yaml.safe_load(out)
    assert after["image"] == {**before["image"], "repository": "registry.example.com/platform/rerank-operator",
                              "digest": DIGEST}
    assert after["workloads"] == {**before["workloads"], "quantizerImage": quantizer}
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"image", "workloads"}
    assert out.count("\n#") == text.count("\n#")  # the comments users read stay


def test_a_chart_whose_values_moved_is_refused_not_released_half_pointed() -> None:
    with pytest.raises(release.ReleaseError, match="no longer has"):
        release.chart_values("image:\n  repository: x\n", f"r/o@{DIGEST}", f"r/q@{DIGEST}")


def test_the_registry_speaks_plain_http_on_loopback_only_and_never_deletes(tmp_path: object) -> None:
    config = yaml.safe_load(registry.config(tmp_path, 5005))  # type: ignore[arg-type]
    assert config["http"]["addr"] == "127.0.0.1:5005"
    assert config["storage"]["delete"] == {"enabled": False}
    hosts = registry.hosts_toml("127.0.0.1:5005")
    assert 'server = "http://127.0.0.1:5005"' in hosts and 'capabilities = ["pull", "resolve"]' in hosts


def test_an_image_archive_is_pushed_by_digest_and_a_second_push_sends_no_blob(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The dev cluster's and hack/release's push, against a real registry: the reference it returns names the
    manifest the registry serves, every blob arrives byte for byte, and pushing again uploads nothing."""
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        _add(tar, "bin/hello", b"#!/bin/sh\necho rerank\n")
    archive = tmp_path / "image.tar"
    manifest_digest = ociimage.write_archive(archive, "rerank.local/hello:1", [layer],
                                             ociimage.ImageConfig(entrypoint=("/bin/hello",)))
    with registry.standalone(tmp_path / "registry") as running:
        ref = running.push_archive(archive, "rerank/hello", "1")
        assert ref == f"{running.host}/rerank/hello@{manifest_digest}"
        store = oci.Registry(running.host, insecure=True)
        assert store.resolve("rerank/hello", "1") == manifest_digest
        manifest = json.loads(store.get_manifest("rerank/hello", manifest_digest)[0])
        assert store.get_blob_bytes("rerank/hello", manifest["layers"][0]["digest"]) == layer.read_bytes()
        assert running.tags("rerank/hello") == ["1"]
        uploads: list[str] = []
        upload = oci.Registry._upload

        def counted(self: oci.Registry, repo: str, digest: str, *rest: Any) -> None:
            uploads.append(digest)
            upload(self, repo, digest, *rest)
        monkeypatch.setattr(oci.Registry, "_upload", counted)
        assert running.push_archive(archive, "rerank/hello", "2") == ref
        assert uploads == []  # the blobs were there: only HEADs and the manifest
        running.push_archive(archive, "rerank/other", "1")
        assert len(uploads) == 2  # a new repository gets the config and the layer (no cross-repository mount)
        assert sorted(running.tags("rerank/hello")) == ["1", "2"]


def test_a_push_the_registry_refuses_names_the_image_and_the_answer(tmp_path: Path) -> None:
    """A layer whose bytes are not its digest: the registry refuses the upload (400 DIGEST_INVALID) and the error
    names the archive, where it went and the registry's answer. No registry, no archive: said as clearly."""
    archive = _archive_with_a_tampered_layer(tmp_path)
    with registry.standalone(tmp_path / "registry") as running:
        digest_invalid = rf"tampered\.tar -> {re.escape(running.host)}/rerank/broken:1: .*HTTP 400.*DIGEST_INVALID"
        with pytest.raises(registry.RegistryError, match=digest_invalid):
            running.push_archive(archive, "rerank/broken", "1")
        assert running.tags("rerank/broken") == []  # nothing tagged
    nobody = f"127.0.0.1:{free_port()}"
    refused = rf"tampered\.tar -> {re.escape(nobody)}/rerank/broken:1: .*ConnectionRefused"
    with pytest.raises(registry.RegistryError, match=refused):
        registry.Client(nobody, insecure=True).push_archive(archive, "rerank/broken", "1")
    index_only = tmp_path / "index-only.tar"
    with tarfile.open(index_only, "w") as tar:
        _add(tar, "index.json", json.dumps({"manifests": [{"digest": "sha256:" + "0" * 64}]}).encode())
    with pytest.raises(registry.RegistryError, match="not an OCI layout archive"):
        registry.Client(nobody, insecure=True).push_archive(index_only, "rerank/broken", "1")


def _archive_with_a_tampered_layer(tmp_path: Path) -> Path:
    """An OCI layout archive written by ociimage whose layer's bytes were changed after its digest was taken."""
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        _add(tar, "hello", b"rerank\n")
    good = tmp_path / "good.tar"
    ociimage.write_archive(good, "rerank.local/broken:1", [layer], ociimage.ImageConfig())
    layer_digest = "sha256:" + hashlib.sha256(layer.read_bytes()).hexdigest()
    archive = tmp_path / "tampered.tar"
    with tarfile.open(good) as src, tarfile.open(archive, "w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name.endswith(layer_digest.split(":")[1]):
                data = data[:-1] + bytes([data[-1] ^ 1])  # same size, other bytes
            _add(dst, member.name, data)
    return archive


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size = len(data)
    tar.addfile(member, io.BytesIO(data))
