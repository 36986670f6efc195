"""A small client of the OCI distribution API (the shared artifact store is an OCI registry), standard library only:
it runs in the slim init container that fetches an artifact, and the operator imports it.

Every byte read from the registry is checked against the digest that named it: a manifest asked for by digest, a
blob while it streams. The registry is trusted to store and to answer, never to hand back the right bytes.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST))
TIMEOUT_S = 30.0  # a socket's silence, not a transfer's length: a blob of GBs streams under it
CHUNK = 1 << 20
MAX_REDIRECTS = 5
#: Redirects a blob GET may answer with (to the storage backend: S3, GCS, a CDN).
REDIRECTS = (301, 302, 303, 307, 308)
#: Docker Hub's names for itself: a config.json entry under one serves the others.
DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HOST = re.compile(r"[A-Za-z0-9.-]+(:[0-9]+)?|\[[0-9A-Fa-f:.]+\](:[0-9]+)?")
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"\w[\w.-]{0,127}")


class RegistryError(RuntimeError):
    """The registry refused or did not answer. ``status`` is its HTTP status (None: no answer at all)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def unavailable(self) -> bool:
        """No answer, a 5xx or a 429: another try later may succeed, the request itself is not wrong."""
        return self.status is None or self.status >= 500 or self.status == 429


class DigestMismatch(RegistryError):
    """The registry's bytes do not hash to the digest that named them: corrupt or tampered storage."""


@dataclass(frozen=True)
class Reference:
    """``host[:port]/path/name[:tag][@sha256:...]``; the host is always explicit (no Docker Hub default)."""

    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        text = f"{self.host}/{self.repository}"
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text


def parse_reference(text: str) -> Reference:
    """Parse a fully qualified reference, or ValueError saying which part is wrong."""
    rest, _, digest = text.partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        raise ValueError(f"{text!r}: the digest must be sha256:<64 lowercase hex>")
    host, slash, path = rest.partition("/")
    if not slash or not _HOST.fullmatch(host) or not ("." in host or ":" in host or host == "localhost"):
        raise ValueError(f"{text!r}: expected host[:port]/repository[:tag|@sha256:...] with an explicit host")
    name, colon, tag = path.rpartition(":") if ":" in path.rsplit("/", 1)[-1] else (path, "", "")
    if colon and not _TAG.fullmatch(tag):
        raise ValueError(f"{text!r}: bad tag {tag!r}")
    if not name or not all(_COMPONENT.fullmatch(c) for c in name.split("/")):
        raise ValueError(f"{text!r}: bad repository {name!r} (lowercase components separated by /)")
    if not colon and not digest:
        raise ValueError(f"{text!r}: no tag and no digest")
    return Reference(host, name, tag if colon else None, digest or None)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (layers are GBs). Not layout.sha256_file: layout imports numpy."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def docker_credentials(config_path: Path, host: str) -> tuple[str, str] | None:
    """User and password for ``host`` from a Docker ``config.json`` (a ``.dockerconfigjson`` Secret); None when the
    file or an entry for the host is missing. Keys may carry a scheme and a path (``https://host/v1/``)."""
    try:
        auths = json.loads(config_path.read_text(encoding="utf-8")).get("auths") or {}
    except FileNotFoundError:
        return None
    wanted = set(DOCKER_HUB) if host in DOCKER_HUB else {host}
    for key, entry in auths.items():
        name = urllib.parse.urlsplit(key if "://" in key else f"//{key}").netloc
        if name not in wanted or not isinstance(entry, dict):
            continue
        if entry.get("auth"):
            user, sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
            if not sep:
                raise ValueError(f"{config_path}: the auth of {key!r} is not base64 of user:password")
            return user, password
        if entry.get("username") is not None:
            return str(entry["username"]), str(entry.get("password") or "")
    return None


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class _Answer:
    status: int
    headers: dict[str, str]  # lowercased names
    body: bytes


class Registry:
    """One registry: HTTPS, or plain HTTP when ``insecure``; anonymous, or ``credentials`` sent as basic auth or
    traded for the bearer token a ``WWW-Authenticate`` challenge names (Docker Hub, GHCR, Harbor)."""

    def __init__(self, host: str, insecure: bool = False, credentials: tuple[str, str] | None = None,
                 timeout: float = TIMEOUT_S) -> None:
        self.host = host
        self.insecure = insecure
        self.credentials = credentials
        self.timeout = timeout
        self._authorization: str | None = None  # what the last challenge was answered with

    # The distribution API -----------------------------------------------------------------------------------

    def blob_exists(self, repo: str, digest: str) -> bool:
        answer = self._call("HEAD", f"/v2/{repo}/blobs/{digest}", ok=(200, 404), follow=True)
        return answer.status == 200

    def push_blob(self, repo: str, path: Path) -> str:
        """Upload a file (monolithic, streamed); skipped when the registry has it. Returns its digest."""
        digest = "sha256:" + sha256_file(path)
        with open(path, "rb") as f:
            self.push_stream(repo, digest, f, path.stat().st_size)
        return digest

    def push_stream(self, repo: str, digest: str, body: BinaryIO | bytes, size: int) -> None:
        """Upload ``size`` bytes of ``body`` as ``digest`` (a file, an image layer read out of an archive, bytes);
        skipped when the registry has it. The registry checks the digest as it stores it."""
        if not self.blob_exists(repo, digest):
            self._upload(repo, digest, body, size)

    def push_bytes(self, repo: str, data: bytes) -> str:
        digest = digest_of(data)
        self.push_stream(repo, digest, data, len(data))
        return digest

    def put_manifest(self, repo: str, tag: str, body: bytes, media_type: str) -> str:
        """Store ``body`` under ``tag`` (or a digest); returns its digest, checked against what the registry says."""
        answer = self._call("PUT", f"/v2/{repo}/manifests/{tag}", body=body, headers={"Content-Type": media_type},
                            ok=(201,))
        digest = digest_of(body)
        said = answer.headers.get("docker-content-digest")
        if said and said != digest:
            raise DigestMismatch(f"manifest {repo}:{tag}: the registry stored {said}, the body is {digest}")
        return digest

    def get_manifest(self, repo: str, reference: str) -> tuple[bytes, str, str]:
        """Body, digest and media type of a manifest; by digest, the body is checked against it."""
        answer = self._call("GET", f"/v2/{repo}/manifests/{reference}", headers={"Accept": MANIFEST_ACCEPT},
                            ok=(200,))
        digest = digest_of(answer.body)
        if reference.startswith("sha256:") and digest != reference:
            raise DigestMismatch(f"manifest {repo}@{reference}: the registry's body hashes to {digest}")
        media_type = answer.headers.get("content-type", "").split(";")[0].strip()
        if not media_type or media_type == "application/json":
            try:
                media_type = str(json.loads(answer.body).get("mediaType") or OCI_MANIFEST)
            except (ValueError, AttributeError):
                media_type = OCI_MANIFEST
        return answer.body, digest, media_type

    def resolve(self, repo: str, tag: str) -> str | None:
        """The digest ``tag`` names now, or None when there is no such tag (or repository)."""
        answer = self._call("HEAD", f"/v2/{repo}/manifests/{tag}", headers={"Accept": MANIFEST_ACCEPT},
                            ok=(200, 404))
        if answer.status == 404:
            return None
        said = answer.headers.get("docker-content-digest")
        if said and _DIGEST.fullmatch(said):
            return said
        return self.get_manifest(repo, tag)[1]  # a registry that does not say: hash the body

    def get_blob(self, repo: str, digest: str, out: BinaryIO) -> None:
        """Stream a blob into ``out``, hashing as it goes; DigestMismatch after the last byte if it is not ``digest``
        (``out`` then holds the wrong bytes: the caller throws them away)."""
        if not _DIGEST.fullmatch(digest):
            raise RegistryError(f"blob {repo}@{digest}: only sha256 digests are supported", status=400)
        conn, resp = self._exchange("GET", f"/v2/{repo}/blobs/{digest}", follow=True)
        try:
            if resp.status != 200:
                raise self._refusal("GET", f"/v2/{repo}/blobs/{digest}", resp.status, self._read(resp))
            h = hashlib.sha256()
            while chunk := self._read(resp, CHUNK):
                h.update(chunk)
                out.write(chunk)
        finally:
            conn.close()
        if "sha256:" + h.hexdigest() != digest:
            raise DigestMismatch(f"blob {repo}@{digest}: the registry's bytes hash to sha256:{h.hexdigest()}")

    def get_blob_bytes(self, repo: str, digest: str) -> bytes:
        """A small blob (a config) in memory, verified like :meth:`get_blob`."""
        sink = io.BytesIO()
        self.get_blob(repo, digest, sink)
        return sink.getvalue()

    def tags(self, repo: str) -> list[str]:
        """Every tag of ``repo`` (all pages, following ``Link``); [] for a repository the registry does not know."""
        found: list[str] = []
        target: str | None = f"/v2/{repo}/tags/list"
        while target:
            answer = self._call("GET", target, ok=(200, 404))
            if answer.status == 404:
                return found
            found.extend(json.loads(answer.body).get("tags") or ())
            link = re.search(r'<([^>]+)>\s*;\s*rel="?next"?', answer.headers.get("link", ""))
            target = link.group(1) if link else None
        return found

    def answers(self) -> bool:
        """Whether a distribution registry answers ``GET /v2/`` with 200 here (after one challenge answered, if
        it asks): a started registry is ready. A registry that refuses our credentials reads as not answering."""
        try:
            self._call("GET", "/v2/", ok=(200,))
        except RegistryError:
            return False
        return True

    def delete_manifest(self, repo: str, digest: str) -> None:
        """Delete a manifest by digest; one already gone is fine. The registry must allow deletes."""
        self._call("DELETE", f"/v2/{repo}/manifests/{digest}", ok=(200, 202, 404))

    # HTTP ----------------------------------------------------------------------------------------------------

    def _upload(self, repo: str, digest: str, body: BinaryIO | bytes, size: int) -> None:
        start = self._call("POST", f"/v2/{repo}/blobs/uploads/", headers={"Content-Length": "0"}, ok=(202,))
        if "location" not in start.headers:
            raise RegistryError(f"blob upload to {repo}: HTTP 202 without a Location", status=202)
        location = urllib.parse.urljoin(self._url(f"/v2/{repo}/blobs/uploads/"), start.headers["location"])
        parts = urllib.parse.urlsplit(location)
        query = "&".join(q for q in (parts.query, "digest=" + urllib.parse.quote(digest)) if q)
        target = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))
        done = self._call("PUT", target, body=body, ok=(201,),
                          headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        said = done.headers.get("docker-content-digest")
        if said and said != digest:
            raise DigestMismatch(f"blob upload to {repo}: sent {digest}, the registry stored {said}")

    def _call(self, method: str, target: str, *, body: BinaryIO | bytes | None = None,
              headers: dict[str, str] | None = None, ok: tuple[int, ...], follow: bool = False) -> _Answer:
        conn, resp = self._exchange(method, target, body=body, headers=headers, follow=follow)
        try:
            answer = _Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, self._read(resp))
        finally:
            conn.close()
        if answer.status not in ok:
            raise self._refusal(method, target, answer.status, answer.body)
        return answer

    def _exchange(self, method: str, target: str, *, body: BinaryIO | bytes | None = None,
                  headers: dict[str, str] | None = None,
                  follow: bool = False) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send once; answer one auth challenge, follow redirects when asked. The caller reads and closes."""
        url, challenged = self._url(target), False
        for _ in range(MAX_REDIRECTS + 2):
            ours = self.is_ours(url)
            conn, resp = self._send(method, url, body, headers, ours)
            if resp.status == 401 and ours and not challenged:
                challenge, text = resp.getheader("WWW-Authenticate", ""), self._read(resp)
                conn.close()
                challenged = True
                if not self._authenticate(challenge):
                    raise self._refusal(method, target, 401, text)
                if hasattr(body, "seek"):
                    body.seek(0)  # type: ignore[union-attr]
                continue
            if follow and resp.status in REDIRECTS and resp.getheader("Location"):
                url = urllib.parse.urljoin(url, resp.getheader("Location", ""))
                self._read(resp)
                conn.close()
                continue
            return conn, resp
        raise RegistryError(f"{method} {target}: more than {MAX_REDIRECTS} redirects", status=310)

    def _send(self, method: str, url: str, body: BinaryIO | bytes | None, headers: dict[str, str] | None,
              authorize: bool) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        parts = urllib.parse.urlsplit(url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(parts.netloc, timeout=self.timeout, blocksize=CHUNK)
        sent = {"User-Agent": "rerank-operator-oci", **(headers or {})}
        if authorize and self._authorization:
            sent["Authorization"] = self._authorization
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        try:
            conn.request(method, path, body=body, headers=sent)
            return conn, conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise RegistryError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc

    def _authenticate(self, challenge: str) -> bool:
        """Answer a ``Basic`` challenge with our credentials, a ``Bearer realm=,service=,scope=`` one with a token
        from the realm (asked with our credentials when we have them, anonymously otherwise)."""
        scheme, _, rest = challenge.partition(" ")
        if scheme.lower() == "basic":
            if self.credentials is None:
                return False
            self._authorization = "Basic " + _basic(*self.credentials)
            return True
        if scheme.lower() != "bearer":
            return False
        params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        realm = params.pop("realm", "")
        params.pop("error", None)  # insufficient_scope: the scope itself is what the token asks for
        if not realm.startswith(("https://", "http://")):
            return False
        url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(params)
        parts = urllib.parse.urlsplit(url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(parts.netloc, timeout=self.timeout)
        trusted = self.credentials is not None and realm_may_have_credentials(self._url("/"), realm)
        sent = {"Authorization": "Basic " + _basic(*self.credentials)} if trusted and self.credentials else {}
        try:
            conn.request("GET", urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, "")), headers=sent)
            resp = conn.getresponse()
            text = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise RegistryError(f"token from {realm}: {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()
        if resp.status != 200:
            raise self._refusal("GET", realm, resp.status, text)
        answer = json.loads(text)
        token = answer.get("token") or answer.get("access_token")
        if not token:
            return False
        self._authorization = f"Bearer {token}"
        return True

    def is_ours(self, url: str) -> bool:
        """Whether ``url`` is this registry as configured, scheme and host: only there are credentials sent. Never
        to a storage backend a blob redirects to, nor over plain HTTP to an HTTPS registry's own host (a Location
        that drops TLS)."""
        return urllib.parse.urlsplit(url)[:2] == urllib.parse.urlsplit(self._url("/"))[:2]

    def _url(self, target: str) -> str:
        if target.startswith(("http://", "https://")):
            return target
        return f"{'http' if self.insecure else 'https'}://{self.host}{target}"

    @staticmethod
    def _read(resp: http.client.HTTPResponse, size: int = -1) -> bytes:
        try:
            return resp.read(size) if size >= 0 else resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise RegistryError(f"reading the registry's answer: {type(exc).__name__}: {exc}") from exc

    def _refusal(self, method: str, target: str, status: int, body: bytes) -> RegistryError:
        head = body[:300].decode("utf-8", "replace").strip()
        return RegistryError(f"{method} {self.host} {target.split('?')[0]}: HTTP {status}: {head}", status=status)


def realm_may_have_credentials(registry_url: str, realm: str) -> bool:
    """Whether credentials may go to the token ``realm`` a challenge names: over HTTPS to the registry's host or its
    domain (registry-1.docker.io names auth.docker.io); for a plain-HTTP dev registry, its own host. Elsewhere the
    token is asked for anonymously: whoever answers for the registry cannot collect the password."""
    registry, target = urllib.parse.urlsplit(registry_url), urllib.parse.urlsplit(realm)
    if target.username or target.password or not target.hostname or not registry.hostname:
        return False
    if registry.scheme == "http" or target.scheme != "https":
        return registry.scheme == "http" and target.hostname == registry.hostname
    domain = ".".join(registry.hostname.split(".")[-2:])
    return target.hostname in (registry.hostname, domain) or target.hostname.endswith("." + domain)


def _basic(username: str, password: str) -> str:
    return base64.b64encode(f"{username}:{password}".encode()).decode()
