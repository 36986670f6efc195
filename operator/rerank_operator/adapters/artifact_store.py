"""What the operator sees of the artifact stores (``core/artifacts/sharing.py``): the registry's tags and the Jobs
that build them, and the deletion of artifacts nobody uses.

Models waiting on a shared artifact look again when its Job changes (and every
``artifact_decision.SHARED_RECHECK_SECONDS`` at least); a thousand models share a few ids, so the answers are kept
per (store, id) for ``ttl`` seconds (a published artifact for ``published_ttl``: it
never changes, only the collector removes it, and it forgets it here when it does). A registry that does not answer
is said in the model's status (RegistryUnavailable) and asked again soon; nothing is served that the store was not
seen to hold, and no Job is started for an artifact the store may already have.

The registry is read with the platform's credentials (``--artifact-store-credentials``: a Docker config.json, e.g.
the chart's mounted ``dockerconfigjson`` Secret), the only ones the operator has; deleting needs them too.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rerank_contracts import oci, shared_store
from rerank_operator.adapters.kube_api import ApiError, Client, api_path
from rerank_operator.core import names, platform
from rerank_operator.core.artifacts import sharing

log = logging.getLogger(__name__)
Obj = Mapping[str, Any]
RegistryFactory = Callable[[platform.ArtifactStore], oci.Registry]
#: An artifact a reconcile looked up this recently is not collected, whatever the statuses say yet.
RECENTLY_ASKED_SECONDS = 30.0


class StoreUnavailable(RuntimeError):
    """The registry did not answer, or answered with an error: what the model's status says."""


class SharedArtifacts:
    """The process's view of every store (one per operator process, shared by the reconcile workers and the
    collector)."""

    def __init__(self, client: Client, credentials_file: str | None = None, *, ttl: float = 2.0,
                 published_ttl: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 registry: RegistryFactory | None = None) -> None:
        self.client = client
        self._credentials = Path(credentials_file) if credentials_file else None
        self._ttl, self._published_ttl, self._clock = ttl, published_ttl, clock
        self._registry = registry or self._connect
        self._seen: dict[tuple[str, str], tuple[float, sharing.SharedView]] = {}
        self._asked: dict[tuple[str, str], float] = {}  # (repository, id) -> when a reconcile last asked (monotonic)
        self._lock = threading.Lock()
        self.unused_since: dict[tuple[str, str], float] = {}  # (repository, tag) -> unix time (the collector's)

    def _connect(self, where: platform.ArtifactStore) -> oci.Registry:
        creds = None
        if self._credentials is not None and self._credentials.is_file():
            creds = oci.docker_credentials(self._credentials, where.host)
        return oci.Registry(where.host, insecure=where.insecure, credentials=creds)

    # --- looking up -------------------------------------------------------------------------------------------------

    def view(self, where: platform.ArtifactStore, artifact_id: str) -> sharing.SharedView:
        """The store's artifact ``artifact_id`` if published, else the Jobs building it in the store's namespace."""
        key = (where.repository, artifact_id)
        now = self._clock()
        with self._lock:
            cached = self._seen.get(key)
            self._asked[key] = now
        if cached is not None:
            at, seen = cached
            if now - at < (self._published_ttl if seen.published is not None else self._ttl):
                return seen
        try:
            seen = sharing.SharedView(artifact_id, self._published(where, artifact_id))
        except StoreUnavailable as exc:  # said in the model's status; asked again soon (not cached)
            return sharing.SharedView(artifact_id, unavailable=str(exc))
        if seen.published is None:
            jobs, pods, building = self._jobs(where, artifact_id)
            seen = sharing.SharedView(artifact_id, None, jobs, pods, building=building)
        with self._lock:
            self._seen[key] = (now, seen)
        return seen

    def forget(self, where: platform.ArtifactStore, artifact_id: str) -> None:
        with self._lock:
            self._seen.pop((where.repository, artifact_id), None)

    def changed(self, artifact_id: str) -> None:
        """A Job or pod building ``artifact_id`` changed: the next look goes to the store and the API again."""
        with self._lock:
            for key in [k for k in self._seen if k[1] == artifact_id]:
                del self._seen[key]

    def _published(self, where: platform.ArtifactStore, artifact_id: str) -> sharing.Published | None:
        registry = self._registry(where)
        try:
            digest = registry.resolve(where.path, artifact_id)
            if digest is None:
                return None
            body, digest, _ = registry.get_manifest(where.path, digest)
            manifest = json.loads(body)
            config = manifest.get("config") or {}
            config_digest = str(config.get("digest") or "")
            if config.get("mediaType") != shared_store.CONFIG_MEDIA_TYPE or not config_digest.startswith("sha256:"):
                log.warning("store %s: tag %s is not a rerank artifact; ignored", where.repository, artifact_id)
                return None
            content = json.loads(registry.get_blob_bytes(where.path, config_digest))
        except (oci.RegistryError, OSError, ValueError) as exc:
            raise StoreUnavailable(str(exc)[:500]) from exc
        if not isinstance(content, dict) or content.get("artifact_id") != artifact_id:
            # A tag's content must be the artifact its name says: whoever can write the registry could tag another
            # artifact (another model's, another recipe's) with this id, whose bytes would then verify file by file.
            # Read as unpublished: the shared Job builds the real one and pushes it over the tag.
            named = content.get("artifact_id") if isinstance(content, dict) else None
            log.warning("store %s: tag %s holds artifact %r; refused", where.repository, artifact_id, named)
            return None
        parts = tuple(str((layer.get("annotations") or {}).get("org.opencontainers.image.title") or "")
                      for layer in manifest.get("layers") or ())
        return sharing.Published(ref=f"{where.repository}@{digest}", manifest_sha256=config_digest.split(":", 1)[1],
                                 manifest=content, parts=tuple(p for p in parts if p))

    def _jobs(self, where: platform.ArtifactStore,
              artifact_id: str) -> tuple[tuple[Obj, ...], dict[str, tuple[Obj, ...]], dict[str, int]]:
        """The Jobs building ``artifact_id`` with their pods, and the store's unfinished shared Jobs counted by the
        namespace they were started for (``names.LABEL_BUILT_FOR``): one list of the store's shared Jobs."""
        shared = self.client.list_objects("batch/v1", "Job", where.namespace, f"{names.LABEL_SHARED}=true") or []
        jobs = [j for j in shared if ((j.get("metadata") or {}).get("labels") or {}).get(names.LABEL_ARTIFACT)
                == artifact_id]
        building: dict[str, int] = {}
        for j in shared:
            conditions = (j.get("status") or {}).get("conditions") or ()
            built_for = ((j.get("metadata") or {}).get("labels") or {}).get(names.LABEL_BUILT_FOR)
            if built_for and not any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                                     for c in conditions):
                building[built_for] = building.get(built_for, 0) + 1
        selector = f"{names.LABEL_SHARED}=true,{names.LABEL_ARTIFACT}={artifact_id}"
        pods = self.client.list_objects("v1", "Pod", where.namespace, selector) if jobs else []
        by_job: dict[str, list[Obj]] = {}
        for pod in pods or ():
            owner = (pod.get("metadata", {}).get("labels") or {}).get("job-name", "")
            by_job.setdefault(str(owner), []).append(pod)
        return tuple(jobs), {k: tuple(v) for k, v in by_job.items()}, building

    # --- collecting -------------------------------------------------------------------------------------------------

    def collect(self, stores: Iterable[platform.ArtifactStore], statuses: Iterable[Mapping[str, Any]],
                now: float, leading: Callable[[], bool] = lambda: True) -> list[str]:
        """Delete what no model has used for its store's grace period (``sharing.collect``): the manifest in the
        registry (its blobs go with the registry's own garbage collection) and the Jobs that built it. Returns the
        references deleted. ``leading`` is asked before each delete: a registry is no API server, so its deletes are
        not fenced by the Lease, and a pass that outlives this replica's term must stop before the new leader's
        reconciles (which may have just asked for that artifact) see it vanish."""
        used = sharing.in_use(statuses)
        deleted: list[str] = []
        for where in {s.repository: s for s in stores}.values():
            registry = self._registry(where)
            try:
                tags = registry.tags(where.path)
            except (oci.RegistryError, OSError) as exc:
                log.warning("artifact store %s: listing its artifacts: %s", where.repository, exc)
                continue
            since = {tag: at for (repo, tag), at in self.unused_since.items() if repo == where.repository}
            # Not what a reconcile asked for moments ago: its model may be about to serve it (status not yet written).
            asked = {tag for (repo, tag), at in self._asked.items()
                     if repo == where.repository and self._clock() - at < RECENTLY_ASKED_SECONDS}
            result = sharing.collect(tags, used | asked, since, now, where.unused_grace_seconds)
            for key in [k for k in self.unused_since if k[0] == where.repository]:
                del self.unused_since[key]
            self.unused_since.update({(where.repository, tag): at for tag, at in result.unused_since.items()})
            for tag in result.delete:
                if not leading():
                    log.warning("artifact store %s: no longer leading: %d deletes left to the leader",
                                where.repository, len(result.delete))
                    return deleted
                try:
                    digest = registry.resolve(where.path, tag)
                    if digest is not None:
                        registry.delete_manifest(where.path, digest)
                    self._delete_jobs(where, tag)
                except (oci.RegistryError, OSError, ApiError) as exc:
                    log.warning("artifact store %s: deleting %s: %s", where.repository, tag, exc)
                    continue
                self.forget(where, tag)
                deleted.append(f"{where.repository}:{tag}")
                log.info("deleted shared artifact %s:%s (no model used it for %d s)", where.repository, tag,
                         where.unused_grace_seconds)
        return deleted

    def _delete_jobs(self, where: platform.ArtifactStore, artifact_id: str) -> None:
        selector = f"{names.LABEL_SHARED}=true,{names.LABEL_ARTIFACT}={artifact_id}"
        for job in self.client.list_objects("batch/v1", "Job", where.namespace, selector) or ():
            try:
                self.client.request("DELETE", api_path("batch/v1", "Job", where.namespace, job["metadata"]["name"]),
                                    verb="delete", kind="Job", propagation_policy="Background")
            except ApiError as exc:
                if exc.status != 404:
                    raise
