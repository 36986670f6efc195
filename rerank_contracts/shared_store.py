"""Artifacts in the shared store, an OCI registry: the quantization Job pushes one, a serving pod's init container
fetches the parts it serves (``rerank-fetch-artifact``). Standard library only, like :mod:`rerank_contracts.oci`.

One artifact is one OCI image manifest (``artifactType`` ARTIFACT_TYPE): its config blob is the artifact's
``manifest.json`` byte for byte, so the digest the operator recorded (``manifest_sha256``) names the config; each
top-level entry (``cpu-int8/``, ``original/``, ``evaluation.jsonl``) is one layer, an uncompressed deterministic
tar titled with the entry's name. A fetch trusts nothing it downloads: the manifest and every blob are checked
against their digests, the config against ``manifest_sha256``, and every extracted file against the size and
sha256 manifest.json lists, before one atomic rename makes the directory visible.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import stat
import sys
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from . import cpu_target, oci

ARTIFACT_TYPE = "application/vnd.rerank-operator.artifact.v1"
CONFIG_MEDIA_TYPE = "application/vnd.rerank-operator.artifact.manifest.v1+json"
PART_MEDIA_TYPE = "application/vnd.rerank-operator.artifact.part.v1.tar"
OCI_MANIFEST = oci.OCI_MANIFEST
TITLE = "org.opencontainers.image.title"
MANIFEST_FILE = "manifest.json"
MAX_CONFIG_BYTES = 64 << 20  # manifest.json is KBs; a config descriptor claiming more is not ours
#: The init container's exit codes (the pod's termination message says the reason too).
EXIT_CODES = {"ChecksumMismatch": 20, "RegistryUnavailable": 21, "FetchFailed": 22, "ArtifactTargetMismatch": 23}
TERMINATION_LOG = "/dev/termination-log"
DOCKER_CONFIG = "/etc/rerank/registry/config.json"


class StoreError(RuntimeError):
    """The artifact could not be pushed or fetched; the message says which step and why."""


class ChecksumMismatch(StoreError):
    """Bytes that are not the artifact the operator recorded: a wrong manifest_sha256, a tampered blob, a file whose
    size or sha256 differs from manifest.json's, a file manifest.json does not list or one it lists that is absent."""


# Push ------------------------------------------------------------------------------------------------------------

def push(artifact_dir: Path, repository: str, tag: str, *, registry: oci.Registry, scratch: Path) -> str:
    """Push ``artifact_dir`` as ``repository:tag``; returns ``host/repository@sha256:...``. The tag is written last,
    with the manifest, after every blob: a tag only ever names a complete artifact. Deterministic: the same
    directory gives the same digest."""
    config = (artifact_dir / MANIFEST_FILE).read_bytes()
    config_digest = registry.push_bytes(repository, config)
    layers = []
    scratch.mkdir(parents=True, exist_ok=True)
    for entry in sorted(artifact_dir.iterdir(), key=lambda p: p.name):
        if entry.name == MANIFEST_FILE:
            continue
        tar_path = scratch / f"{entry.name}.tar"
        try:
            write_part(entry, tar_path)
            digest = registry.push_blob(repository, tar_path)
            size = tar_path.stat().st_size
        finally:
            tar_path.unlink(missing_ok=True)  # layers are GBs: one on the scratch disk at a time
        layers.append({"mediaType": PART_MEDIA_TYPE, "digest": digest, "size": size,
                       "annotations": {TITLE: entry.name}})
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ARTIFACT_TYPE,
                "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config)},
                "layers": layers}
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = registry.put_manifest(repository, tag, body, OCI_MANIFEST)
    return f"{registry.host}/{repository}@{digest}"


def write_part(entry: Path, tar_path: Path) -> None:
    """An uncompressed tar of ``entry`` (a directory or one file), the same bytes for the same content: sorted
    members named from the entry (``cpu-int8/model.onnx``), mtime 0, owner 0, modes 0755/0644. Anything but regular
    files and directories (a symlink, a device) is refused: it would not mean the same on the serving node."""
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for path, name in _walk(entry, entry.name):
            st = path.lstat()
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if stat.S_ISDIR(st.st_mode):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.mode, info.size = 0o644, st.st_size
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                raise StoreError(f"{path}: only regular files and directories go into an artifact")


def _walk(path: Path, name: str) -> Iterator[tuple[Path, str]]:
    yield path, name
    if path.is_dir() and not path.is_symlink():
        for child in sorted(path.iterdir(), key=lambda p: p.name):
            yield from _walk(child, f"{name}/{child.name}")


# Fetch -----------------------------------------------------------------------------------------------------------

def fetch(ref: str, manifest_sha256: str, parts: Sequence[str], into: Path, *,
          registry: oci.Registry) -> dict[str, Any]:
    """Fetch the ``parts`` of the artifact ``ref`` (by digest) into ``into``, verified; returns its manifest.json.
    ``into`` appears whole or not at all; one that already holds this artifact's parts, verified, is kept as is
    (an init container restarted in the same emptyDir)."""
    return _fetch(ref, manifest_sha256, parts, into, registry=registry)[0]


def _fetch(ref: str, manifest_sha256: str, parts: Sequence[str], into: Path, *,
           registry: oci.Registry) -> tuple[dict[str, Any], int]:
    """:func:`fetch`, and the bytes downloaded (0 when ``into`` was already there)."""
    try:
        reference = oci.parse_reference(ref)
    except ValueError as exc:
        raise StoreError(str(exc)) from None
    if reference.digest is None:
        raise StoreError(f"{ref}: an artifact is fetched by digest (…@sha256:…), never by a tag that can move")
    if len(manifest_sha256) != 64 or any(c not in "0123456789abcdef" for c in manifest_sha256):
        raise StoreError(f"manifest sha256 {manifest_sha256!r} is not 64 lowercase hex digits")
    wanted = list(dict.fromkeys(parts))
    for part in wanted:
        if not part or "/" in part or part in (".", "..", MANIFEST_FILE) or part.startswith(".tmp-"):
            raise StoreError(f"{part!r} is not an artifact part (a top-level entry such as cpu-int8)")
    if into.exists():
        return _existing(into, manifest_sha256, wanted), 0
    into.parent.mkdir(parents=True, exist_ok=True)
    tmp = into.parent / f".tmp-{into.name}-{secrets.token_hex(6)}"
    tmp.mkdir()
    try:
        fetched = _download(reference, manifest_sha256, wanted, tmp, registry)
        try:
            os.rename(tmp, into)
        except OSError:
            if into.is_dir():  # another fetch of the same artifact won the race: keep its copy if it verifies
                return _existing(into, manifest_sha256, wanted), 0
            raise
        return fetched
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _download(reference: oci.Reference, manifest_sha256: str, parts: list[str], tmp: Path,
              registry: oci.Registry) -> tuple[dict[str, Any], int]:
    repo, digest = reference.repository, str(reference.digest)
    try:
        body, _, _ = registry.get_manifest(repo, digest)
        try:
            manifest = json.loads(body)
            config, layers = manifest["config"], manifest.get("layers") or []
            config_digest, config_size = str(config["digest"]), int(config.get("size", 0))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{reference}: not an OCI image manifest ({exc})") from None
        if config_digest != "sha256:" + manifest_sha256:
            raise ChecksumMismatch(f"{reference}: its manifest.json is {config_digest}, the operator recorded "
                                   f"sha256:{manifest_sha256}")
        if config_size > MAX_CONFIG_BYTES:
            raise StoreError(f"{reference}: a config of {config_size} bytes is not an artifact's manifest.json")
        config_bytes = registry.get_blob_bytes(repo, config_digest)
        files = _inventory(config_bytes, reference)
        titled = {str((layer.get("annotations") or {}).get(TITLE)): layer for layer in layers}
        fetched = len(config_bytes)
        for part in parts:
            layer = titled.get(part)
            if layer is None:
                raise StoreError(f"{reference} has no part {part!r} (it has {sorted(titled)})")
            tar_path = tmp / f".{part}.tar"
            with open(tar_path, "wb") as out:
                registry.get_blob(repo, str(layer["digest"]), out)
            fetched += tar_path.stat().st_size
            try:
                _extract(tar_path, part, tmp, files)
            finally:
                tar_path.unlink()
            _verify(tmp, part, files)
    except oci.DigestMismatch as exc:
        raise ChecksumMismatch(str(exc)) from None
    (tmp / MANIFEST_FILE).write_bytes(config_bytes)
    return json.loads(config_bytes), fetched


def _inventory(config_bytes: bytes, where: object) -> dict[str, dict[str, Any]]:
    """manifest.json's files by path (path, size, sha256, as quantizer_job.layout.file_inventory writes them)."""
    try:
        files = json.loads(config_bytes)["files"]
        return {str(f["path"]): {"size": int(f["size"]), "sha256": str(f["sha256"])} for f in files}
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{where}: manifest.json has no usable files list ({exc})") from None


def _extract(tar_path: Path, part: str, root: Path, files: dict[str, dict[str, Any]]) -> None:
    """Extract one part's tar under ``root``, refusing what could write outside ``root/part``: absolute names,
    ``..``, links, devices, fifos, names outside the part, a member twice; and, before a byte is written, a file
    manifest.json does not list, one whose size is not the listed one, or a sparse one (whose few stored bytes
    would expand to any size on disk)."""
    with tarfile.open(tar_path, "r:") as tar:
        for member in tar:
            name = member.name
            components = name.split("/")
            if (name.startswith("/") or "\\" in name or any(c in ("", ".", "..") for c in components)
                    or components[0] != part):
                raise ChecksumMismatch(f"part {part!r}: member {name!r} is outside the part")
            target = root.joinpath(*components)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif member.isreg():
                listed = files.get(name)
                if listed is None:
                    raise ChecksumMismatch(f"part {part!r}: member {name!r} is not in manifest.json")
                if member.issparse() or member.size != listed["size"]:
                    raise ChecksumMismatch(f"part {part!r}: member {name!r} is {member.size} bytes"
                                           f"{' (sparse)' if member.issparse() else ''}, manifest.json lists "
                                           f"{listed['size']}")
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                if source is None:
                    raise ChecksumMismatch(f"part {part!r}: member {name!r} has no data")
                try:
                    with source, open(target, "xb") as out:
                        shutil.copyfileobj(source, out, oci.CHUNK)
                except FileExistsError:
                    raise ChecksumMismatch(f"part {part!r}: member {name!r} appears twice") from None
            else:
                raise ChecksumMismatch(f"part {part!r}: member {name!r} is a link or device, not a file")


def _verify(root: Path, part: str, files: dict[str, dict[str, Any]]) -> None:
    """Every file of ``part`` under ``root`` is exactly what manifest.json lists for it: none missing, none extra,
    each of its size and sha256."""
    expected = {p: f for p, f in files.items() if p == part or p.startswith(part + "/")}
    top = root / part
    if top.is_file() and not top.is_symlink():
        found = {part: top}
    else:
        found = {p.relative_to(root).as_posix(): p for p in top.rglob("*") if not p.is_dir()} if top.is_dir() else {}
    missing, extra = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
    wrong = [p for p in sorted(expected.keys() & found.keys())
             if found[p].is_symlink() or found[p].stat().st_size != expected[p]["size"]
             or oci.sha256_file(found[p]) != expected[p]["sha256"]]
    if missing or extra or wrong:
        raise ChecksumMismatch(f"part {part!r} differs from manifest.json: missing {missing[:5]}, not listed "
                               f"{extra[:5]}, wrong size or sha256 {wrong[:5]}")


def _existing(into: Path, manifest_sha256: str, parts: list[str]) -> dict[str, Any]:
    """``into`` as it is, if it holds this artifact's manifest.json and the parts verify; else ChecksumMismatch
    (never removed: what is there is not ours to delete)."""
    path = into / MANIFEST_FILE
    try:
        actual = oci.sha256_file(path)
    except OSError as exc:
        raise ChecksumMismatch(f"{into} exists without a readable {MANIFEST_FILE} ({exc})") from None
    if actual != manifest_sha256:
        raise ChecksumMismatch(f"{into} holds manifest.json sha256:{actual}, not sha256:{manifest_sha256}")
    config_bytes = path.read_bytes()
    files = _inventory(config_bytes, into)
    for part in parts:
        _verify(into, part, files)
    result: dict[str, Any] = json.loads(config_bytes)
    return result


# The init container ----------------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """``rerank-fetch-artifact``: fetch an artifact's parts into a serving pod's volume, or (``--check-cpu``
    alone) only check that this node's CPU can serve an artifact built for a target. Exit 0, or 20
    (ChecksumMismatch), 21 (RegistryUnavailable: no answer, a 5xx), 22 (FetchFailed) or 23 (ArtifactTargetMismatch)
    with a one-line JSON reason in the termination log and on stderr."""
    parser = argparse.ArgumentParser(prog="rerank-fetch-artifact", description=main.__doc__)
    parser.add_argument("--ref", help="host/repository@sha256:... (by digest)")
    parser.add_argument("--manifest-sha256", help="sha256 of the artifact's manifest.json")
    parser.add_argument("--part", action="append", help="a part to fetch (cpu-int8, original, ...)")
    parser.add_argument("--into", type=Path, help="the directory to create")
    parser.add_argument("--check-cpu", choices=cpu_target.TARGETS,
                        help="first check this node's CPU against the artifact's target (recipe.target)")
    parser.add_argument("--reduce-range", action="store_true", help="the artifact's weights are 7-bit")
    parser.add_argument("--cpuinfo", default="/proc/cpuinfo", help=argparse.SUPPRESS)
    parser.add_argument("--machine", default=platform.machine(), help=argparse.SUPPRESS)
    parser.add_argument("--insecure", action="store_true", help="plain HTTP")
    parser.add_argument("--docker-config", type=Path, default=Path(DOCKER_CONFIG),
                        help="a Docker config.json with the registry's credentials (used when it exists)")
    parser.add_argument("--termination-log", default=TERMINATION_LOG)
    args = parser.parse_args(argv)
    fetching = [args.ref, args.manifest_sha256, args.part, args.into]
    if (any(fetching) and not all(fetching)) or (not any(fetching) and not args.check_cpu):
        parser.error("--ref, --manifest-sha256, --part and --into go together (or --check-cpu alone)")
    if args.check_cpu:
        why = cpu_target.mismatch(args.check_cpu, args.reduce_range, _read(args.cpuinfo), args.machine)
        if why is not None:
            node = os.environ.get("NODE_NAME", "")
            return _fail("ArtifactTargetMismatch", f"node {node}: {why}" if node else why, args.termination_log)
        if not any(fetching):
            print(json.dumps({"event": "cpu checked", "target": args.check_cpu}), flush=True)
            return 0
    try:
        host = oci.parse_reference(args.ref).host
        credentials = oci.docker_credentials(args.docker_config, host)
        registry = oci.Registry(host, insecure=args.insecure, credentials=credentials)
        manifest, fetched = _fetch(args.ref, args.manifest_sha256, args.part, args.into, registry=registry)
    except ChecksumMismatch as exc:
        return _fail("ChecksumMismatch", str(exc), args.termination_log)
    except oci.RegistryError as exc:
        return _fail("RegistryUnavailable" if exc.unavailable else "FetchFailed", str(exc), args.termination_log)
    except (StoreError, OSError, ValueError) as exc:
        return _fail("FetchFailed", f"{type(exc).__name__}: {exc}", args.termination_log)
    print(json.dumps({"event": "fetched", "ref": args.ref, "parts": args.part, "into": str(args.into),
                      "artifact_id": manifest.get("artifact_id", ""), "bytes": fetched}), flush=True)
    return 0


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _fail(reason: str, message: str, termination_log: str) -> int:
    line = json.dumps({"reason": reason, "message": message[:3000]})  # the kubelet keeps 4096 bytes
    try:
        with open(termination_log, "w", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError:
        pass  # not in a pod: stderr says it
    print(line, file=sys.stderr, flush=True)
    return EXIT_CODES[reason]


if __name__ == "__main__":
    sys.exit(main())
