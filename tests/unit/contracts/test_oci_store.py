"""The shared artifact store: artifacts pushed to and fetched from a real distribution registry (Debian's
``docker-registry``), every byte verified on the way in; the registry client's auth against stub servers."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rerank_contracts import oci, shared_store
from rerank_devcluster.processes import free_port
from rerank_devcluster.registry import LocalRegistry, standalone

try:  # the inventory the quantizer writes (layout imports numpy; the same function inline when it is absent)
    from quantizer_job.steps.tei.layout import file_inventory
except ImportError:  # pragma: no cover
    def file_inventory(root: Path) -> list[dict[str, Any]]:
        return [{"path": p.relative_to(root).as_posix(), "size": p.stat().st_size,
                 "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                for p in sorted(root.rglob("*")) if p.is_file() and p.name != "manifest.json"]


@pytest.fixture(scope="module")
def local_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    with standalone(tmp_path_factory.mktemp("registry"), delete=True) as running:
        yield running


@pytest.fixture
def reg(local_registry: LocalRegistry) -> oci.Registry:
    return oci.Registry(local_registry.host, insecure=True)


def make_artifact(root: Path, files: dict[str, bytes] | None = None) -> tuple[Path, str]:
    """An artifact directory as the quantizer publishes it (random bytes: no two tests share a blob); its
    manifest.json's sha256."""
    files = files or {"cpu-int8/model.onnx": os.urandom(3000), "cpu-int8/tokenizer.json": os.urandom(100),
                      "cpu-int8/sub/config.json": os.urandom(50), "original/model.safetensors": os.urandom(2000),
                      "evaluation.jsonl": os.urandom(70)}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    manifest = {"manifest_version": 1, "artifact_id": root.name, "files": file_inventory(root)}
    body = json.dumps(manifest, indent=2).encode()
    (root / "manifest.json").write_bytes(body)
    return root, hashlib.sha256(body).hexdigest()


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def no_leftovers(parent: Path) -> None:
    assert [p.name for p in parent.iterdir() if p.name.startswith(".tmp-")] == []


# Reference and credentials ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["127.0.0.1:5000/rerank/artifacts:abc", "reg.example.com/a/b/c@sha256:" + "0" * 64,
                                  "localhost/x:1@sha256:" + "a" * 64, "ghcr.io/org/name-x_y.z:v1.2-3"])
def test_a_reference_round_trips(text: str) -> None:
    assert str(oci.parse_reference(text)) == text


def test_a_reference_names_its_parts() -> None:
    ref = oci.parse_reference("127.0.0.1:5000/rerank/artifacts@sha256:" + "ab" * 32)
    assert (ref.host, ref.repository, ref.tag, ref.digest) == ("127.0.0.1:5000", "rerank/artifacts", None,
                                                             "sha256:" + "ab" * 32)
    assert oci.parse_reference("r.io:443/a/b:t").tag == "t"


@pytest.mark.parametrize("text", ["ubuntu:22.04", "library/ubuntu:1", "r.io/Upper:1", "r.io/a", "r.io/a@sha256:12",
                                  "r.io/a:bad tag", "r.io/a@md5:" + "0" * 32])
def test_a_bad_reference_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        oci.parse_reference(text)


def test_docker_credentials_read_both_forms_and_any_spelling_of_the_host(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"auths": {
        "https://reg.example.com/v1/": {"auth": base64.b64encode(b"robot$ci:pa:ss").decode()},
        "127.0.0.1:5000": {"username": "u", "password": "p"},
        "https://index.docker.io/v1/": {"auth": base64.b64encode(b"hub:secret").decode()}}}))
    assert oci.docker_credentials(path, "reg.example.com") == ("robot$ci", "pa:ss")
    assert oci.docker_credentials(path, "127.0.0.1:5000") == ("u", "p")
    assert oci.docker_credentials(path, "registry-1.docker.io") == ("hub", "secret")
    assert oci.docker_credentials(path, "other.example.com") is None
    assert oci.docker_credentials(tmp_path / "absent.json", "reg.example.com") is None


# Push ------------------------------------------------------------------------------------------------------------

class Recording(oci.Registry):
    """Records every request sent (method, path without the query)."""

    def __init__(self, host: str) -> None:
        super().__init__(host, insecure=True)
        self.sent: list[tuple[str, str]] = []

    def _send(self, method: str, url: str, *args: Any) -> Any:
        self.sent.append((method, url.split("://", 1)[1].split("/", 1)[1].split("?")[0]))
        return super()._send(method, url, *args)


def test_push_is_an_oci_artifact_whose_config_is_manifest_json_and_whose_tag_comes_last(
        tmp_path: Path, local_registry: LocalRegistry) -> None:
    artifact, manifest_sha = make_artifact(tmp_path / "a1")
    reg = Recording(local_registry.host)
    ref = shared_store.push(artifact, "rerank/push", "a1", registry=reg, scratch=tmp_path / "scratch")

    manifest_puts = [s for s in reg.sent if s[0] == "PUT" and "/manifests/" in s[1]]
    assert manifest_puts == [("PUT", "v2/rerank/push/manifests/a1")] and reg.sent[-1] == manifest_puts[0]
    host, _, digest = ref.partition("/rerank/push@")
    assert host == local_registry.host and reg.resolve("rerank/push", "a1") == digest
    assert list((tmp_path / "scratch").iterdir()) == []  # each layer's tar removed once pushed

    body, got_digest, media_type = reg.get_manifest("rerank/push", digest)
    manifest = json.loads(body)
    assert (got_digest, media_type) == (digest, shared_store.OCI_MANIFEST)
    assert manifest["schemaVersion"] == 2 and manifest["artifactType"] == shared_store.ARTIFACT_TYPE
    assert manifest["config"] == {"mediaType": shared_store.CONFIG_MEDIA_TYPE, "digest": "sha256:" + manifest_sha,
                                  "size": (artifact / "manifest.json").stat().st_size}
    assert [(la["annotations"]["org.opencontainers.image.title"], la["mediaType"]) for la in manifest["layers"]] == [
        ("cpu-int8", shared_store.PART_MEDIA_TYPE), ("evaluation.jsonl", shared_store.PART_MEDIA_TYPE),
        ("original", shared_store.PART_MEDIA_TYPE)]
    assert reg.get_blob_bytes("rerank/push", "sha256:" + manifest_sha) == (artifact / "manifest.json").read_bytes()

    layer = reg.get_blob_bytes("rerank/push", manifest["layers"][0]["digest"])
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["cpu-int8", "cpu-int8/model.onnx", "cpu-int8/sub", "cpu-int8/sub/config.json",
                                         "cpu-int8/tokenizer.json"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert [oct(m.mode) for m in members] == ["0o755", "0o644", "0o755", "0o644", "0o644"]


def test_pushing_the_same_directory_twice_gives_the_same_digest_and_uploads_nothing(
        tmp_path: Path, local_registry: LocalRegistry) -> None:
    artifact, _ = make_artifact(tmp_path / "a2")
    first = shared_store.push(artifact, "rerank/same", "one", registry=oci.Registry(local_registry.host, insecure=True),
                       scratch=tmp_path / "s")
    os.utime(artifact / "cpu-int8" / "model.onnx", (1, 1))  # times and owners are not in the tar
    again = Recording(local_registry.host)
    second = shared_store.push(artifact, "rerank/same", "two", registry=again, scratch=tmp_path / "s")
    assert first == second
    assert [s for s in again.sent if s[0] in ("POST", "PATCH")] == []  # every blob was there: HEADs only
    assert sorted(again.tags("rerank/same")) == ["one", "two"]


def test_a_symlink_in_an_artifact_is_refused(tmp_path: Path, reg: oci.Registry) -> None:
    artifact, _ = make_artifact(tmp_path / "a3")
    (artifact / "cpu-int8" / "link").symlink_to("model.onnx")
    with pytest.raises(shared_store.StoreError, match="only regular files"):
        shared_store.push(artifact, "rerank/link", "x", registry=reg, scratch=tmp_path / "s")
    assert reg.resolve("rerank/link", "x") is None


# Fetch -----------------------------------------------------------------------------------------------------------

def test_fetch_gives_back_exactly_the_pushed_directory(tmp_path: Path, reg: oci.Registry) -> None:
    artifact, manifest_sha = make_artifact(tmp_path / "b1")
    ref = shared_store.push(artifact, "rerank/fetch", "b1", registry=reg, scratch=tmp_path / "s")
    into = tmp_path / "models" / "artifacts" / "b1"
    got = shared_store.fetch(ref, manifest_sha, ["cpu-int8", "original", "evaluation.jsonl"], into, registry=reg)
    assert got == json.loads((artifact / "manifest.json").read_bytes())
    assert tree(into) == tree(artifact)
    no_leftovers(into.parent)

    (artifact / "cpu-int8" / "model.onnx").unlink()  # a second fetch into the same place keeps what is there
    assert shared_store.fetch(ref, manifest_sha, ["cpu-int8"], into, registry=oci.Registry("127.0.0.1:1", True)) == got


def test_fetch_of_one_part_leaves_the_others_out(tmp_path: Path, reg: oci.Registry) -> None:
    artifact, manifest_sha = make_artifact(tmp_path / "b2")
    ref = shared_store.push(artifact, "rerank/fetch", "b2", registry=reg, scratch=tmp_path / "s")
    into = tmp_path / "out" / "b2"
    shared_store.fetch(ref, manifest_sha, ["cpu-int8"], into, registry=reg)
    assert sorted(tree(into)) == ["cpu-int8/model.onnx", "cpu-int8/sub/config.json", "cpu-int8/tokenizer.json",
                                  "manifest.json"]
    assert tree(into)["cpu-int8/model.onnx"] == (artifact / "cpu-int8" / "model.onnx").read_bytes()


def test_fetch_refuses_a_tag_a_missing_part_and_another_manifest(tmp_path: Path, reg: oci.Registry) -> None:
    artifact, manifest_sha = make_artifact(tmp_path / "b3")
    ref = shared_store.push(artifact, "rerank/fetch", "b3", registry=reg, scratch=tmp_path / "s")
    into = tmp_path / "out" / "b3"
    with pytest.raises(shared_store.StoreError, match="by digest") as by_tag:
        shared_store.fetch(f"{reg.host}/rerank/fetch:b3", manifest_sha, ["cpu-int8"], into, registry=reg)
    assert not isinstance(by_tag.value, shared_store.ChecksumMismatch)
    with pytest.raises(shared_store.StoreError, match="no part 'gpu-fp16'"):
        shared_store.fetch(ref, manifest_sha, ["cpu-int8", "gpu-fp16"], into, registry=reg)
    wrong = hashlib.sha256(b"another").hexdigest()
    with pytest.raises(shared_store.ChecksumMismatch, match=f"sha256:{manifest_sha}.*sha256:{wrong}"):
        shared_store.fetch(ref, wrong, ["cpu-int8"], into, registry=reg)
    assert not into.exists()
    no_leftovers(into.parent)


def test_a_blob_tampered_with_in_the_registrys_storage_is_caught(tmp_path: Path, reg: oci.Registry,
                                                               local_registry: LocalRegistry) -> None:
    artifact, manifest_sha = make_artifact(tmp_path / "b4")
    ref = shared_store.push(artifact, "rerank/fetch", "b4", registry=reg, scratch=tmp_path / "s")
    manifest = json.loads(reg.get_manifest("rerank/fetch", ref.split("@")[1])[0])
    layer = manifest["layers"][0]["digest"].removeprefix("sha256:")
    data = local_registry.root / "storage" / "docker/registry/v2/blobs/sha256" / layer[:2] / layer / "data"
    tampered = bytearray(data.read_bytes())
    tampered[-2000] ^= 0xFF  # the same size: only the hash can tell
    data.write_bytes(bytes(tampered))
    into = tmp_path / "out" / "b4"
    with pytest.raises(shared_store.ChecksumMismatch, match=f"sha256:{layer}"):
        shared_store.fetch(ref, manifest_sha, ["cpu-int8"], into, registry=reg)
    assert not into.exists()
    no_leftovers(into.parent)


@pytest.mark.parametrize("lie", ["wrong sha256", "wrong size", "listed but absent", "present but not listed"])
def test_a_manifest_json_that_does_not_match_the_content_is_caught(tmp_path: Path, reg: oci.Registry,
                                                                  lie: str) -> None:
    artifact, _ = make_artifact(tmp_path / "b5")
    manifest = json.loads((artifact / "manifest.json").read_bytes())
    entry = next(f for f in manifest["files"] if f["path"] == "cpu-int8/tokenizer.json")
    if lie == "wrong sha256":
        entry["sha256"] = hashlib.sha256(b"x").hexdigest()
    elif lie == "wrong size":
        entry["size"] += 1
    elif lie == "listed but absent":
        manifest["files"].append({"path": "cpu-int8/extra.bin", "size": 1, "sha256": "0" * 64})
    else:
        manifest["files"].remove(entry)
    body = json.dumps(manifest).encode()
    (artifact / "manifest.json").write_bytes(body)
    ref = shared_store.push(artifact, "rerank/lies", "b5", registry=reg, scratch=tmp_path / "s")
    into = tmp_path / "out" / "b5"
    # A size or listing lie is caught from the tar's headers, before writing; a digest lie after.
    with pytest.raises(shared_store.ChecksumMismatch, match=r"part 'cpu-int8'.*manifest\.json"):
        shared_store.fetch(ref, hashlib.sha256(body).hexdigest(), ["cpu-int8"], into, registry=reg)
    assert not into.exists()
    no_leftovers(into.parent)


def push_hand_made(tmp_path: Path, reg: oci.Registry, members: list[tarfile.TarInfo]) -> tuple[str, str]:
    """An artifact whose one part (cpu-int8) is the tar of ``members`` (each with 5 bytes when a file)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m in members:
            m.size = 5 if m.isreg() else 0
            tar.addfile(m, io.BytesIO(b"evil!") if m.isreg() else None)
    config = json.dumps({"files": [{"path": "cpu-int8/ok", "size": 5,
                                    "sha256": hashlib.sha256(b"evil!").hexdigest()}]}).encode()
    layer = reg.push_bytes("rerank/evil", buf.getvalue())
    manifest = {"schemaVersion": 2, "mediaType": shared_store.OCI_MANIFEST, "artifactType": shared_store.ARTIFACT_TYPE,
                "config": {"mediaType": shared_store.CONFIG_MEDIA_TYPE, "digest": reg.push_bytes("rerank/evil", config),
                           "size": len(config)},
                "layers": [{"mediaType": shared_store.PART_MEDIA_TYPE, "digest": layer, "size": len(buf.getvalue()),
                            "annotations": {"org.opencontainers.image.title": "cpu-int8"}}]}
    digest = reg.put_manifest("rerank/evil", "x", json.dumps(manifest).encode(), shared_store.OCI_MANIFEST)
    return f"{reg.host}/rerank/evil@{digest}", hashlib.sha256(config).hexdigest()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("bad", [_member("cpu-int8/../escaped"), _member("/cpu-int8/abs"), _member("original/x"),
                                 _member("cpu-int8/link", tarfile.SYMTYPE, "/etc/passwd"),
                                 _member("cpu-int8/hard", tarfile.LNKTYPE, "cpu-int8/ok"),
                                 _member("cpu-int8/dev", tarfile.CHRTYPE), _member("cpu-int8/ok")])
def test_a_part_whose_tar_reaches_outside_or_holds_links_is_refused(tmp_path: Path, reg: oci.Registry,
                                                                   bad: tarfile.TarInfo) -> None:
    ref, manifest_sha = push_hand_made(tmp_path, reg, [_member("cpu-int8", tarfile.DIRTYPE), _member("cpu-int8/ok"),
                                                       bad])
    into = tmp_path / "out" / "evil"
    with pytest.raises(shared_store.ChecksumMismatch, match=r"outside the part|link or device|appears twice"):
        shared_store.fetch(ref, manifest_sha, ["cpu-int8"], into, registry=reg)
    assert not into.exists() and not (tmp_path / "out" / "escaped").exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


def push_tar(reg: oci.Registry, tar_bytes: bytes, listed: dict[str, bytes]) -> tuple[str, str]:
    """An artifact whose one part (cpu-int8) is ``tar_bytes``, its manifest.json listing ``listed`` (path: bytes)."""
    config = json.dumps({"files": [{"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                                   for p, b in listed.items()]}).encode()
    layer = reg.push_bytes("rerank/evil", tar_bytes)
    manifest = {"schemaVersion": 2, "mediaType": shared_store.OCI_MANIFEST, "artifactType": shared_store.ARTIFACT_TYPE,
                "config": {"mediaType": shared_store.CONFIG_MEDIA_TYPE, "digest": reg.push_bytes("rerank/evil", config),
                           "size": len(config)},
                "layers": [{"mediaType": shared_store.PART_MEDIA_TYPE, "digest": layer, "size": len(tar_bytes),
                            "annotations": {"org.opencontainers.image.title": "cpu-int8"}}]}
    digest = reg.put_manifest("rerank/evil", "y", json.dumps(manifest).encode(), shared_store.OCI_MANIFEST)
    return f"{reg.host}/rerank/evil@{digest}", hashlib.sha256(config).hexdigest()


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_sparse_oversized_or_unlisted_member_is_refused_before_it_is_written(tmp_path: Path,
                                                                               reg: oci.Registry) -> None:
    """A sparse member stores a few bytes that expand to any size on disk; an oversized or unlisted one fills the
    disk before the size check after writing could catch it. Each is refused from its header."""
    sparse = tarfile.TarInfo("cpu-int8/ok")
    sparse.pax_headers = {"GNU.sparse.map": "0,5", "GNU.sparse.size": str(10**12)}  # a terabyte from five bytes
    cases = {"sparse": tar_of((sparse, b"evil!")),
             "oversized": tar_of((tarfile.TarInfo("cpu-int8/ok"), b"evil!" * 1000)),
             "unlisted": tar_of((tarfile.TarInfo("cpu-int8/ok"), b"evil!"), (tarfile.TarInfo("cpu-int8/x"), b"x"))}
    for case, data in cases.items():
        ref, manifest_sha = push_tar(reg, data, {"cpu-int8/ok": b"evil!"})
        into = tmp_path / "out" / case
        with pytest.raises(shared_store.ChecksumMismatch, match=r"sparse|manifest.json lists 5|not in manifest"):
            shared_store.fetch(ref, manifest_sha, ["cpu-int8"], into, registry=reg)
        assert not into.exists()
        assert sum(p.stat().st_size for p in (tmp_path / "out").rglob("*") if p.is_file()) <= 5, case


def test_the_hand_made_part_fetches_when_it_holds_no_trick(tmp_path: Path, reg: oci.Registry) -> None:
    """The refusals above are the bad member's doing, not the hand-made artifact's."""
    ref, manifest_sha = push_hand_made(tmp_path, reg, [_member("cpu-int8", tarfile.DIRTYPE), _member("cpu-int8/ok")])
    into = tmp_path / "out" / "fine"
    shared_store.fetch(ref, manifest_sha, ["cpu-int8"], into, registry=reg)
    assert (into / "cpu-int8" / "ok").read_bytes() == b"evil!"


# Tags and deletes ------------------------------------------------------------------------------------------------

def test_tags_and_delete(tmp_path: Path, reg: oci.Registry) -> None:
    artifact, _ = make_artifact(tmp_path / "c1")
    assert reg.tags("rerank/never-pushed") == []
    ref = shared_store.push(artifact, "rerank/gc", "v1", registry=reg, scratch=tmp_path / "s")
    shared_store.push(artifact, "rerank/gc", "v2", registry=reg, scratch=tmp_path / "s")
    other, _ = make_artifact(tmp_path / "c2")
    kept = shared_store.push(other, "rerank/gc", "v3", registry=reg, scratch=tmp_path / "s")
    assert sorted(reg.tags("rerank/gc")) == ["v1", "v2", "v3"]

    digest = ref.split("@")[1]
    reg.delete_manifest("rerank/gc", digest)
    # distribution deletes every tag that names the manifest with it
    assert reg.tags("rerank/gc") == ["v3"]
    assert reg.resolve("rerank/gc", "v1") is None and reg.resolve("rerank/gc", "v3") == kept.split("@")[1]
    with pytest.raises(oci.RegistryError) as gone:
        reg.get_manifest("rerank/gc", digest)
    assert gone.value.status == 404 and "MANIFEST_UNKNOWN" in str(gone.value)
    reg.delete_manifest("rerank/gc", digest)  # already gone: fine


# The init container ----------------------------------------------------------------------------------------------

def test_main_fetches_and_says_what_it_fetched(tmp_path: Path, reg: oci.Registry,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    artifact, manifest_sha = make_artifact(tmp_path / "d1")
    ref = shared_store.push(artifact, "rerank/main", "d1", registry=reg, scratch=tmp_path / "s")
    into = tmp_path / "models" / "d1"
    log = tmp_path / "termination-log"
    code = shared_store.main(["--ref", ref, "--manifest-sha256", manifest_sha, "--part", "cpu-int8",
                              "--part", "original", "--into", str(into), "--insecure",
                              "--docker-config", str(tmp_path / "none.json"), "--termination-log", str(log)])
    assert code == 0 and not log.exists()
    said = json.loads(capsys.readouterr().out)
    assert said["ref"] == ref and said["bytes"] > 5000
    assert sorted(tree(into)) == ["cpu-int8/model.onnx", "cpu-int8/sub/config.json", "cpu-int8/tokenizer.json",
                                  "manifest.json", "original/model.safetensors"]


@pytest.mark.parametrize(("case", "code", "reason"), [("wrong sha", 20, "ChecksumMismatch"),
                                                      ("nothing listens", 21, "RegistryUnavailable"),
                                                      ("by tag", 22, "FetchFailed"),
                                                      ("unknown digest", 22, "FetchFailed")])
def test_main_fails_with_a_reason_and_an_exit_code(tmp_path: Path, reg: oci.Registry, case: str, code: int,
                                                   reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    artifact, manifest_sha = make_artifact(tmp_path / "d2")
    ref = shared_store.push(artifact, "rerank/main", "d2", registry=reg, scratch=tmp_path / "s")
    if case == "wrong sha":
        manifest_sha = "f" * 64
    elif case == "nothing listens":
        ref = ref.replace(reg.host, f"127.0.0.1:{free_port()}")
    elif case == "by tag":
        ref = f"{reg.host}/rerank/main:d2"
    else:
        ref = ref.split("@")[0] + "@sha256:" + "e" * 64
    log = tmp_path / "termination-log"
    into = tmp_path / "models" / "d2"
    assert shared_store.main(["--ref", ref, "--manifest-sha256", manifest_sha, "--part", "cpu-int8",
                              "--into", str(into), "--insecure", "--termination-log", str(log)]) == code
    message = json.loads(log.read_text())
    assert message["reason"] == reason and message["message"]
    assert log.read_text().count("\n") == 1 and json.loads(capsys.readouterr().err) == message
    assert not into.exists()


# Auth against stub registries ------------------------------------------------------------------------------------

class Stub:
    """A registry stand-in: ``routes`` maps a path to a function of the handler giving (status, headers, body)."""

    def __init__(self, routes: dict[str, Any]) -> None:
        self.seen: list[tuple[str, str, str | None]] = []  # method, path, Authorization
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                stub.seen.append((self.command, self.path, self.headers.get("Authorization")))
                status, headers, body = routes[self.path.split("?")[0]](self)
                self.send_response(status)
                for k, v in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stubs() -> Iterator[list[Stub]]:
    made: list[Stub] = []
    yield made
    for s in made:
        s.close()


BASIC = "Basic " + base64.b64encode(b"robot:s3cret").decode()
TAGS = (200, {"Content-Type": "application/json"}, b'{"name":"r","tags":["a"]}')


def test_basic_auth_is_sent_after_the_challenge_and_never_to_a_storage_redirect(stubs: list[Stub]) -> None:
    blob = b"layer bytes"
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    storage = Stub({"/bucket/data": lambda h: (200, {}, blob)})
    registry = Stub({
        "/v2/r/tags/list": lambda h: TAGS if h.headers.get("Authorization") == BASIC else (
            401, {"WWW-Authenticate": 'Basic realm="registry"'}, b'{"errors":[{"code":"UNAUTHORIZED"}]}'),
        f"/v2/r/blobs/{digest}": lambda h: (307, {"Location": f"http://{storage.host}/bucket/data?sig=1"}, b""),
        "/v2/r/blobs/sha256:" + "0" * 64: lambda h: (307, {"Location": f"http://{storage.host}/bucket/data"}, b"")})
    stubs += [storage, registry]

    with pytest.raises(oci.RegistryError, match=r"HTTP 401.*UNAUTHORIZED") as refused:
        oci.Registry(registry.host, insecure=True).tags("r")
    assert refused.value.status == 401 and not refused.value.unavailable

    client = oci.Registry(registry.host, insecure=True, credentials=("robot", "s3cret"))
    assert client.tags("r") == ["a"]
    assert [a for _, p, a in registry.seen if p == "/v2/r/tags/list"] == [None, None, BASIC]
    assert client.get_blob_bytes("r", digest) == blob
    assert storage.seen == [("GET", "/bucket/data?sig=1", None)]
    with pytest.raises(oci.DigestMismatch):
        client.get_blob_bytes("r", "sha256:" + "0" * 64)


def test_a_bearer_challenge_is_answered_with_a_token_from_the_realm(stubs: list[Stub]) -> None:
    manifest = b'{"schemaVersion":2}'
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()

    def guarded(answer: tuple[int, dict[str, str], bytes]) -> Any:
        return lambda h: answer if h.headers.get("Authorization") == "Bearer T0KEN" else (
            401, {"WWW-Authenticate": f'Bearer realm="http://{auth.host}/token",service="reg",'
                                      f'scope="repository:r:pull"'}, b"")

    auth = Stub({"/token": lambda h: (200, {}, b'{"token":"T0KEN"}') if h.headers.get("Authorization") == BASIC
                 else (401, {}, b"bad credentials")})
    page2 = (200, {}, b'{"tags":["b","c"]}')
    registry = Stub({
        "/v2/r/tags/list": lambda h: (page2 if "last=a" in h.path else (
            200, {"Link": '</v2/r/tags/list?n=1&last=a>; rel="next"'}, b'{"tags":["a"]}'))
        if h.headers.get("Authorization") == "Bearer T0KEN" else guarded(TAGS)(h),
        f"/v2/r/manifests/{digest}": guarded((200, {"Content-Type": shared_store.OCI_MANIFEST}, manifest)),
        "/v2/r/manifests/sha256:" + "0" * 64: guarded((200, {"Content-Type": shared_store.OCI_MANIFEST}, manifest))})
    stubs += [auth, registry]

    client = oci.Registry(registry.host, insecure=True, credentials=("robot", "s3cret"))
    assert client.tags("r") == ["a", "b", "c"]  # every page, following Link
    assert auth.seen == [("GET", "/token?service=reg&scope=repository%3Ar%3Apull", BASIC)]
    assert client.get_manifest("r", digest) == (manifest, digest, shared_store.OCI_MANIFEST)
    with pytest.raises(oci.DigestMismatch):
        client.get_manifest("r", "sha256:" + "0" * 64)
    with pytest.raises(oci.RegistryError, match=r"HTTP 401.*bad credentials"):
        oci.Registry(registry.host, insecure=True, credentials=("robot", "wrong")).tags("r")


def test_credentials_go_only_to_the_registry_as_configured_scheme_and_host() -> None:
    secure = oci.Registry("registry.example:5000", credentials=("robot", "s3cret"))
    assert secure.is_ours("https://registry.example:5000/v2/r/blobs/uploads/x")
    assert not secure.is_ours("http://registry.example:5000/v2/r/blobs/uploads/x")  # a Location that drops TLS
    assert not secure.is_ours("https://storage.example/bucket")
    assert not secure.is_ours("https://registry.example:5001/v2/")
    plain = oci.Registry("127.0.0.1:5000", insecure=True)
    assert plain.is_ours("http://127.0.0.1:5000/v2/") and not plain.is_ours("https://127.0.0.1:5000/v2/")


@pytest.mark.parametrize(("registry", "realm", "allowed"), [
    ("https://registry-1.docker.io/", "https://auth.docker.io/token", True),
    ("https://ghcr.io/", "https://ghcr.io/token", True),
    ("https://harbor.corp.example/", "https://harbor.corp.example/service/token", True),
    ("https://harbor.corp.example/", "http://harbor.corp.example/service/token", False),  # TLS dropped
    ("https://harbor.corp.example/", "https://collector.attacker.example/token", False),
    ("https://harbor.corp.example/", "https://user:pw@harbor.corp.example/token", False),
    ("http://127.0.0.1:5000/", "http://127.0.0.1:5001/token", True),  # an insecure dev registry's own host
    ("http://127.0.0.1:5000/", "http://10.0.0.9/token", False),
])
def test_registry_credentials_go_only_to_a_realm_of_the_registrys_own(registry: str, realm: str,
                                                                         allowed: bool) -> None:
    assert oci.realm_may_have_credentials(registry, realm) is allowed


def test_a_bearer_realm_elsewhere_gets_no_credentials(stubs: list[Stub]) -> None:
    """A registry whose challenge names a realm on another host: the token request goes out anonymously."""
    collector = Stub({"/token": lambda h: (401, {}, b"no")})
    collector.host = collector.host.replace("127.0.0.1", "localhost")  # the same listener, under another host name
    registry = Stub({"/v2/r/tags/list": lambda h: (
        401, {"WWW-Authenticate": f'Bearer realm="http://{collector.host}/token",service="reg"'}, b"")})
    stubs += [collector, registry]
    with pytest.raises(oci.RegistryError, match="HTTP 401"):
        oci.Registry(registry.host, insecure=True, credentials=("robot", "s3cret")).tags("r")
    assert collector.seen == [("GET", "/token?service=reg", None)]
