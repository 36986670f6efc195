"""Shared artifacts: one verified artifact per distinct model, built once, served to every tenant of a store. Pure.

A RerankClass may name an **artifact store** (``spec.artifactStore``): an OCI registry repository where artifacts
live under their id as tag, and the namespace where the Jobs that build them run. A model of such a class whose
artifact depends on nothing private to its tenant is then served from the store: when the tag exists, the pools
fetch it (an init container verifies every byte against the manifest's checksum: ``builders/fetch.py``) and no Job
runs; when it does not, one Job in the store's namespace builds and pushes it, and every model asking for the same
id waits on that one Job.

What keeps tenants apart:
- the push credentials live only in the store's namespace (the Job's); tenants' pods only pull, by digest;
- a tenant reuses only what its class would have let it build: the shared id hashes everything the class checks on
  the spec (model, revision, images, recipe, gate), plus what the built id leaves out because it is the same for
  every model of one namespace (the hub endpoint and proxy, remote code, the threads and batch budget the speed is
  measured at, the store itself);
- an artifact that depends on a tenant's own data is never shared (``private_reason``): an evaluation or
  calibration set, the live sample of a re-quantization, weights on the tenant's volume, a hub token (gated
  weights must not reach a tenant without access).

Lifecycle: the operator counts the models that serve or wait for each artifact of a store; one nobody uses for the
class's ``unusedGraceSeconds`` is deleted (``collect``). An artifact is never edited: a different input is a
different id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rerank_operator.core import platform
from rerank_operator.core.artifacts import identity as artifact
from rerank_operator.core.builders import deployment
from rerank_operator.core.spec.model import RerankModelSpec

#: ``status.artifact.source``: built by a Job of the model's own (on its volume), or fetched from the store.
SOURCE_BUILT = "built"
SOURCE_SHARED = "shared"


def private_reason(spec: RerankModelSpec) -> str | None:
    """Why the spec's artifact must stay the tenant's own (None: it may be shared)."""
    q, model = spec.quantization, spec.model
    if not q.enabled:
        return "quantization is disabled"
    if model.path is not None:
        return "the weights come from the tenant's volume (spec.model.path)"
    if model.token_secret is not None:
        return "the weights are read with the tenant's hub token (spec.model.tokenSecret)"
    if model.trust_remote_code:
        # The export runs the model repository's own Python: never in the store's namespace, where the push
        # credentials are (it could rewrite any tag of the store).
        return "its export runs the model repository's code (spec.model.trustRemoteCode)"
    if q.evaluation_data is not None:
        return "it is judged on the tenant's evaluation data (spec.quantization.evaluationData)"
    if q.calibration_data is not None:
        return "it is calibrated on the tenant's data (spec.quantization.calibrationData)"
    if q.requantize_on_drift.enabled or q.live_round:
        return "it may be rebuilt from the tenant's live requests (spec.quantization.requantizeOnDrift)"
    return None


def shared_inputs(spec: RerankModelSpec, store: platform.ArtifactStore) -> dict[str, Any]:
    """The built id's inputs plus what changes the bytes across namespaces (see the module docstring)."""
    hub = spec.model.hub
    cpu = spec.cpu
    return {
        **artifact.inputs(spec),
        "shared": {
            "store": store.repository,
            "trustRemoteCode": spec.model.trust_remote_code,
            "hub": {"endpoint": hub.endpoint, "proxy": hub.proxy},
            # The auto recipe keeps the fastest candidate as the CPU pool will serve it, on the CPU it runs on: the
            # shared Job runs on the class's CPU node pool (store.job_placement), so two classes on different node
            # pools (an AVX2 one, an AMX one) get artifacts of their own.
            "servedAt": {"threads": deployment.pool_cpus(cpu) if cpu.enabled else 0,
                         "maxBatchTokens": (cpu.tei.max_batch_tokens or 0) if cpu.enabled else 0,
                         **({"placement": dict(store.job_placement)} if store.job_placement else {})},
        },
    }


def shared_id(spec: RerankModelSpec, store: platform.ArtifactStore) -> str:
    canonical = json.dumps(shared_inputs(spec, store), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:artifact.ID_LENGTH]


def store_for(spec: RerankModelSpec, store: platform.ArtifactStore | None) -> platform.ArtifactStore | None:
    """The store this spec's artifact comes from (None: the model builds its own)."""
    return store if store is not None and private_reason(spec) is None else None


@dataclass(frozen=True)
class Published:
    """A complete artifact in the store: its manifest's reference by digest, the checksum of its manifest.json (the
    OCI config blob) and that manifest.json, as the registry returned it (verified)."""

    ref: str
    manifest_sha256: str
    manifest: Mapping[str, Any]
    parts: tuple[str, ...]


@dataclass(frozen=True)
class SharedView:
    """What the operator saw of one shared id: the artifact if published, and the Jobs building it (oldest
    attempt first) with their pods."""

    artifact_id: str
    published: Published | None = None
    jobs: tuple[Mapping[str, Any], ...] = ()
    pods: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)
    #: Why the store could not be read ("": it was): nothing is decided on a store the operator cannot see.
    unavailable: str = ""
    #: Unfinished shared Jobs of the store by the namespace they were started for (``names.LABEL_BUILT_FOR``); read
    #: only when none builds this id yet.
    building: Mapping[str, int] = field(default_factory=dict)

    def pods_of(self, job: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
        return self.pods.get(str(job["metadata"]["name"]), ())


def record(published: Published, artifact_id: str, now: str, weights: str,
           store: platform.ArtifactStore | None = None) -> dict[str, Any]:
    """``status.artifact`` for a shared artifact: the figures of its manifest.json, where it lives (``ref``) and how
    its registry is read (``insecure``, ``pullSecret``: kept with the record, so pods that serve it keep fetching it
    the same way after the class changes or drops its store)."""
    manifest = published.manifest
    recipe = manifest.get("recipe") or {}
    return {
        "id": artifact_id,
        "source": SOURCE_SHARED,
        "ref": published.ref,
        "parts": list(published.parts),
        **({"insecure": store.insecure} if store is not None else {}),
        **({"pullSecret": store.pull_secret} if store is not None and store.pull_secret else {}),
        "sizeBytes": int(manifest.get("size_bytes") or 0),
        "manifestSha256": published.manifest_sha256,
        "quality": {k: float(v) for k, v in (manifest.get("quality") or {}).items() if _number(v)},
        "speed": {k: float(v) for k, v in (manifest.get("speed") or {}).items() if _number(v)},
        "recipe": {k: v for k, v in recipe.items() if isinstance(v, (str, int, float, bool))},
        **({"maxInputTokens": int(manifest["max_input_tokens"])} if manifest.get("max_input_tokens") else {}),
        "publishedAt": now,
        **({"weights": weights} if weights else {}),
    }


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_shared(record_: Mapping[str, Any] | None) -> bool:
    """Whether a ``status.artifact`` record is served from the store (its pods fetch it)."""
    return bool(record_) and (record_ or {}).get("source") == SOURCE_SHARED and bool((record_ or {}).get("ref"))


# --- lifecycle ----------------------------------------------------------------------------------------------------

def in_use(statuses: Iterable[Mapping[str, Any]]) -> set[str]:
    """Ids that models of any namespace serve, try as a canary, or wait for (from their ``status``)."""
    used: set[str] = set()
    for status in statuses:
        for key in ("artifact", "pendingArtifact"):
            found = (status.get(key) or {}).get("id")
            if found:
                used.add(str(found))
        canary = ((status.get("canary") or {}).get("artifact") or {}).get("id")
        if canary:
            used.add(str(canary))
    return used


@dataclass(frozen=True)
class Collection:
    """One pass of the collector: since when each unused tag has been unused, and those to delete now."""

    unused_since: Mapping[str, float]
    delete: tuple[str, ...]


def collect(tags: Iterable[str], used: set[str], unused_since: Mapping[str, float], now: float,
            grace_seconds: float) -> Collection:
    """Which of a store's artifacts to delete: those no model used over the whole grace period. ``unused_since``
    comes from the last pass (the operator's memory: a restart starts every clock again, so a deletion can come
    late, never early)."""
    since: dict[str, float] = {}
    delete: list[str] = []
    for tag in sorted(set(tags)):
        if tag in used:
            continue
        since[tag] = unused_since.get(tag, now)
        if now - since[tag] >= grace_seconds:
            delete.append(tag)
            del since[tag]
    return Collection(since, tuple(delete))
