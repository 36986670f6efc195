"""A real OCI registry for the dev cluster: the distribution registry (Debian's ``docker-registry``, 2.8), plain
HTTP on the node's loopback, its storage under the real node's root.

Images reach the real node the way every cluster gets them: pushed here, then pulled by the kubelet's containerd
(``certs.d/<host>/hosts.toml`` says the registry speaks plain HTTP), named by digest in the pods. The chart is an
OCI artifact here too (``helm push``, ``helm install oci://``). Plain HTTP on 127.0.0.1 only: the registry is
reachable from this machine's processes (containerd, helm), never from a pod or another machine.

``Client.push_archive`` speaks the distribution API (blob uploads and a manifest put) to copy an OCI layout archive
(what buildah and :mod:`rerank_devcluster.ociimage` write) without a container engine; blobs the registry already
has are skipped, so pushing an image twice costs one HEAD a blob. ``hack/release`` pushes a release with the same
client to any registry (HTTPS, basic or token auth).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import shutil
import tarfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rerank_devcluster.processes import Processes, free_port

BINARY = "docker-registry"  # Debian's name for distribution's registry (hack/setup.sh installs it)
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json")


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


@dataclass
class Client:
    """The distribution API of one registry: plain HTTP (``insecure``, the dev cluster's) or HTTPS, anonymous or
    with a user and password (basic auth, or the bearer token a registry's ``WWW-Authenticate`` challenge names, as
    Docker Hub, GHCR, Harbor and distribution's token auth ask)."""

    host: str
    insecure: bool = False
    username: str | None = None
    password: str | None = None
    _token: str | None = None

    def request(self, method: str, path: str, body: IO[bytes] | bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        answer = self._once(method, path, body, headers)
        if answer[0] == 401 and self._authenticate(answer[1].get("www-authenticate", "")):
            if hasattr(body, "seek"):
                body.seek(0)  # type: ignore[union-attr]
            answer = self._once(method, path, body, headers)
        return answer

    def _once(self, method: str, path: str, body: IO[bytes] | bytes | None,
              headers: dict[str, str] | None) -> tuple[int, dict[str, str], bytes]:
        conn_type = http.client.HTTPConnection if self.insecure else http.client.HTTPSConnection
        conn = conn_type(self.host, timeout=600, blocksize=1 << 20)  # layers of GBs: 1 MiB writes, not 8 KiB
        sent = dict(headers or {})
        if self._token:
            sent["Authorization"] = f"Bearer {self._token}"
        elif self.username is not None:
            sent["Authorization"] = "Basic " + _basic(self.username, self.password or "")
        try:
            conn.request(method, path, body=body, headers=sent)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def _authenticate(self, challenge: str) -> bool:
        """Answer a ``Bearer realm=...,service=...,scope=...`` challenge with a token (sent with our credentials
        when we have them); False when there is nothing to answer with (the 401 stands)."""
        if not challenge.lower().startswith("bearer "):
            return False
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", "")
        if not realm:
            return False
        url = realm + "?" + urllib.parse.urlencode(params)
        request = urllib.request.Request(url)
        if self.username is not None:
            request.add_header("Authorization", "Basic " + _basic(self.username, self.password or ""))
        with urllib.request.urlopen(request, timeout=60) as resp:
            answer = json.loads(resp.read())
        self._token = answer.get("token") or answer.get("access_token")
        return bool(self._token)

    def push_archive(self, archive: Path, repository: str, tag: str) -> str:
        """Copy the image in OCI layout ``archive`` to ``repository:tag``; returns its reference by digest
        (``host/repository@sha256:...``), what pods name."""
        with tarfile.open(archive) as tar:
            index = json.loads(_member(tar, "index.json").read())
            descriptor = index["manifests"][0]
            manifest = _member(tar, _blob_path(descriptor["digest"])).read()
            parsed = json.loads(manifest)
            for blob in (parsed["config"], *parsed["layers"]):
                self._push_blob(tar, repository, blob["digest"], int(blob["size"]))
            media_type = parsed.get("mediaType") or descriptor.get("mediaType") or MANIFEST_TYPES[0]
            status, headers, text = self.request("PUT", f"/v2/{repository}/manifests/{tag}", manifest,
                                                 {"Content-Type": media_type})
            if status != 201:
                raise RegistryError(f"manifest {repository}:{tag}: HTTP {status}: {text[:500]!r}")
        digest = headers.get("docker-content-digest") or descriptor["digest"]
        return f"{self.host}/{repository}@{digest}"

    def _push_blob(self, tar: tarfile.TarFile, repository: str, digest: str, size: int) -> None:
        if self.request("HEAD", f"/v2/{repository}/blobs/{digest}")[0] == 200:
            return
        status, headers, text = self.request("POST", f"/v2/{repository}/blobs/uploads/")
        if status != 202 or "location" not in headers:
            raise RegistryError(f"blob upload of {digest} to {repository}: HTTP {status}: {text[:500]!r}")
        location = urllib.parse.urlsplit(headers["location"])
        query = "&".join(q for q in (location.query, f"digest={urllib.parse.quote(digest)}") if q)
        status, _, text = self.request("PUT", f"{location.path}?{query}", _member(tar, _blob_path(digest)),
                                       {"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        if status != 201:
            raise RegistryError(f"blob {digest} to {repository}: HTTP {status}: {text[:500]!r}")

    def tags(self, repository: str) -> list[str]:
        status, _, text = self.request("GET", f"/v2/{repository}/tags/list")
        return list(json.loads(text).get("tags") or ()) if status == 200 else []


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
        try:
            return self.client.request("GET", "/v2/")[0] == 200
        except OSError:
            return False

    def push_archive(self, archive: Path, repository: str, tag: str) -> str:
        return self.client.push_archive(archive, repository, tag)

    def tags(self, repository: str) -> list[str]:
        return self.client.tags(repository)


def _basic(username: str, password: str) -> str:
    return base64.b64encode(f"{username}:{password}".encode()).decode()


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
