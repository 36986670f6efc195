"""A real OCI registry for the dev cluster: the distribution registry (Debian's ``docker-registry``, 2.8), plain
HTTP on the node's loopback, its storage under the real node's root.

Images reach the real node the way every cluster gets them: pushed here, then pulled by the kubelet's containerd
(``certs.d/<host>/hosts.toml`` says the registry speaks plain HTTP), named by digest in the pods. The chart is an
OCI artifact here too (``helm push``, ``helm install oci://``). Plain HTTP on 127.0.0.1 only: the registry is
reachable from this machine's processes (containerd, helm), never from a pod or another machine.

``Client.push_archive`` copies an OCI layout archive (what buildah and :mod:`rerank_devcluster.ociimage` write) with
the artifact store's distribution client (:mod:`rerank_contracts.oci`: blob uploads and a manifest put), without a
container engine; blobs the registry already has are skipped, so pushing an image twice costs one HEAD a blob.
``hack/release`` pushes a release with the same client to any registry (HTTPS, basic or token auth).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, cast

from rerank_contracts import oci
from rerank_devcluster.processes import Processes, free_port

BINARY = "docker-registry"  # Debian's name for distribution's registry (hack/setup.sh installs it)
PUSH_TIMEOUT_S = 600.0


class RegistryError(RuntimeError):
    """The registry did not start, or refused a push; the message has its answer."""


def config(storage: Path, port: int, delete: bool = False, listen: str = "127.0.0.1") -> str:
    """The registry's configuration: filesystem storage, plain HTTP on loopback, deletes refused (artifacts are
    immutable) unless ``delete`` (a store whose old artifacts are cleaned up), no auth (only this machine's
    processes reach it)."""
    return f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: {"true" if delete else "false"}
http:
  addr: {listen}:{port}
  headers:
    X-Content-Type-Options: [nosniff]
"""


def hosts_toml(host: str) -> str:
    """containerd's registry host configuration (``config_path``): pull and resolve over plain HTTP."""
    return f"""server = "http://{host}"

[host."http://{host}"]
  capabilities = ["pull", "resolve"]
"""


class Client:
    """Pushes OCI layout archives to one registry. The distribution API itself (HTTPS or plain HTTP with
    ``insecure``; basic auth, or the bearer token a ``WWW-Authenticate`` challenge names, as Docker Hub, GHCR,
    Harbor and distribution's token auth ask; digests checked) is the artifact store's client,
    :class:`rerank_contracts.oci.Registry`: one implementation for images, charts' registries and artifacts.
    Credentials are sent once the registry asks for them (a 401 challenge), never before."""

    def __init__(self, host: str, insecure: bool = False, username: str | None = None,
                 password: str | None = None) -> None:
        self.host, self.insecure, self.username, self.password = host, insecure, username, password
        credentials = None if username is None else (username, password or "")
        # A layer of GBs streams under a socket timeout of its silence; a remote registry may pause longer.
        self.registry = oci.Registry(host, insecure=insecure, credentials=credentials, timeout=PUSH_TIMEOUT_S)

    def push_archive(self, archive: Path, repository: str, tag: str) -> str:
        """Copy the image in OCI layout ``archive`` to ``repository:tag``; returns its reference by digest
        (``host/repository@sha256:...``), what pods name. Blobs the registry has are skipped."""
        try:
            with tarfile.open(archive) as tar:
                index = json.loads(_member(tar, "index.json").read())
                descriptor = index["manifests"][0]
                manifest = _member(tar, _blob_path(descriptor["digest"])).read()
                parsed = json.loads(manifest)
                for blob in (parsed["config"], *parsed["layers"]):
                    layer = cast(BinaryIO, _member(tar, _blob_path(blob["digest"])))
                    self.registry.push_stream(repository, blob["digest"], layer, int(blob["size"]))
                media_type = parsed.get("mediaType") or descriptor.get("mediaType") or oci.OCI_MANIFEST
                digest = self.registry.put_manifest(repository, tag, manifest, media_type)
        except oci.RegistryError as exc:
            raise RegistryError(f"{archive.name} -> {self.host}/{repository}:{tag}: {exc}") from exc
        return f"{self.host}/{repository}@{digest}"

    def tags(self, repository: str) -> list[str]:
        """The repository's tags ([] for one the registry does not know); ``oci.RegistryError`` if it refuses."""
        return self.registry.tags(repository)


@dataclass
class LocalRegistry:
    """One registry process of the dev cluster, named ``registry`` among its processes."""

    processes: Processes
    root: Path
    port: int = 0
    delete: bool = False  # allow manifest deletes (storage.delete.enabled)
    #: The address it listens on: loopback, or every address (0.0.0.0) for an artifact store the real node's pods fetch
    #: from at the node's bridge address (``Cluster.pod_api_endpoint``'s host).
    listen: str = "127.0.0.1"

    @property
    def host(self) -> str:
        return f"{'127.0.0.1' if self.listen == '0.0.0.0' else self.listen}:{self.port}"

    @property
    def client(self) -> Client:
        return Client(self.host, insecure=True)

    def start(self, deadline: float) -> LocalRegistry:
        binary = shutil.which(BINARY)
        if binary is None:
            raise RegistryError(f"{BINARY} not found (Debian: apt-get install docker-registry)")
        self.port = self.port or free_port()
        storage = self.root / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        path = self.root / "config.yml"
        path.write_text(config(storage, self.port, self.delete, self.listen))
        self.processes.spawn("registry", [binary, "serve", str(path)])
        self.processes.wait_for(self._answers, deadline, f"the registry on {self.host}")
        return self

    def _answers(self) -> bool:
        return self.client.registry.answers()

    def push_archive(self, archive: Path, repository: str, tag: str) -> str:
        return self.client.push_archive(archive, repository, tag)

    def tags(self, repository: str) -> list[str]:
        return self.client.tags(repository)


def _blob_path(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"blobs/{algorithm}/{hexdigest}"


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    for candidate in (name, f"./{name}"):
        try:
            found = tar.extractfile(candidate)
        except KeyError:
            continue
        if found is not None:
            return found
    raise RegistryError(f"{tar.name!r}: no {name} (not an OCI layout archive)")


@contextlib.contextmanager
def standalone(root: Path, delete: bool = False, timeout: float = 30,
               listen: str = "127.0.0.1") -> Iterator[LocalRegistry]:
    """A registry of its own under ``root`` (an artifact store for the tests and the fleet benchmark), stopped on
    exit; ``delete``: manifests may be deleted (a store's collector does); ``listen``: its address."""
    processes = Processes(logs_dir=root, cwd=root)
    try:
        yield LocalRegistry(processes, root, delete=delete, listen=listen).start(time.monotonic() + timeout)
    finally:
        processes.stop_all()
