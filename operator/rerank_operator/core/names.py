"""Every name, label and annotation key the operator writes, and the metadata of its children, in one place.

Child names derive from the RerankModel's name; the CRD caps that name at 50 characters (CEL rule on
metadata.name) so that ``<name>-models`` and the Services fit 63-character DNS labels. Job names carry an artifact
hash and an attempt number and are shortened here if needed, because the Job controller copies the Job name into a
63-character label value on its pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

#: A RerankModel by ``(namespace, name)``: the key of every per-model map the loops and the adapters keep.
ModelKey = tuple[str, str]

GROUP = "rerank.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RerankModel"
PLURAL = "rerankmodels"
#: kopf's finalizer, which older versions kept on every model; this one needs none and removes it (reconcile_loop.py).
LEGACY_FINALIZER = f"{GROUP}/finalizer"

FIELD_MANAGER = "rerank-operator"
OPERATOR_NAME = "rerank-operator"

# Ports: TEI listens on TEI_PORT in every pool pod (the scrape target and the NetworkPolicy's port); the Services
# (pool and model) expose SERVICE_PORT and forward to the pods' named port "http".
TEI_PORT = 8080
SERVICE_PORT = 80

# Standard labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/).
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
APP_NAME = "rerankmodel"
PART_OF = "rerank"

# Our own labels and annotations.
LABEL_ARTIFACT = f"{GROUP}/artifact"  # on quantization Jobs and their pods: which artifact they build
LABEL_POOL = f"{GROUP}/pool"  # on pool pods: cpu | gpu
LABEL_SERVING = f"{GROUP}/serving"  # on pool pods: "true"; the model Service selects it when both pools take traffic
ANNOTATION_ARTIFACT = f"{GROUP}/artifact"  # on pool pod templates: a new artifact rolls the pool
ANNOTATION_ATTEMPT = f"{GROUP}/attempt"  # on Jobs: 1, 2, ... per artifact
ANNOTATION_SPEC_GENERATION = f"{GROUP}/spec-generation"  # on Jobs: the RerankModel generation that started it
ANNOTATION_RECOVERS = f"{GROUP}/recovers-result"  # on Jobs: how many attempts in a row lost a finished result
ANNOTATION_TRANSIENT_RETRIES = f"{GROUP}/transient-retries"  # on Jobs: transient failures in a row before it
ANNOTATION_APPLIED_HASH = f"{GROUP}/applied-hash"  # on every applied child: hash of what the operator applied
#: On the Jobs that build a shared artifact in a store's namespace (core/artifacts/sharing.py): "true". They belong to
#: no model.
LABEL_SHARED = f"{GROUP}/shared"
#: On a shared Job: the namespace whose model started it (artifactStore.maxBuildsPerNamespace counts these).
LABEL_BUILT_FOR = f"{GROUP}/built-for"
ANNOTATION_SOURCE = f"{GROUP}/source"  # on a shared artifact's Job: the weights it builds from (for people)

Component = Literal["quantizer", "cpu-pool", "gpu-pool", "model-storage", "service", "route", "network-policy",
                    "quality-guard", "cpu-canary"]
COMPONENT_QUANTIZER: Component = "quantizer"
COMPONENT_GUARD: Component = "quality-guard"
COMPONENT_CANARY: Component = "cpu-canary"  # a new artifact's CPU Deployment beside the stable one (plan.py)
CANARY = "canary"  # the canary's name among the pools the quality guard checks
#: The quality guard's /rerank (mirrored copies) and /metrics: not TEI's port, so the model's one NetworkPolicy can
#: admit other peers to the guard than to the pools (tenancy/network.py).
GUARD_PORT = 8081
PoolName = Literal["cpu", "gpu"]
POOLS: tuple[PoolName, PoolName] = ("cpu", "gpu")
#: Scale to zero's phases (``status.autoscaling.lastDecision.scaleToZero``: core/autoscale/zero.py), and those in
#: which the model's HTTPRoute sends every request to the activator (core/builders/activator.py follows them).
ZeroPhase = Literal["awake", "draining", "asleep", "waking"]
ZERO_PHASES: tuple[ZeroPhase, ...] = ("awake", "draining", "asleep", "waking")
ROUTED_TO_ACTIVATOR: tuple[ZeroPhase, ...] = ("draining", "asleep", "waking")

_DNS_LABEL_MAX = 63


@dataclass(frozen=True)
class Owner:
    """Identity of the RerankModel a reconcile works on (what children point back to)."""

    name: str
    namespace: str
    uid: str
    generation: int


def pool_component(pool: PoolName) -> Component:
    return "cpu-pool" if pool == "cpu" else "gpu-pool"


def pvc_name(model: str) -> str:
    return f"{model}-models"


def deployment_name(model: str, pool: PoolName) -> str:
    return f"{model}-{pool}"


def wake_pool(cpu_enabled: bool) -> PoolName:
    """The pool a request wakes a model at zero on: the CPU INT8 pool (it starts in seconds), the GPU pool for a
    model without one. The one definition: the autoscaler's phases, the activator's upstream and the plan's floor
    all ask here."""
    return "cpu" if cpu_enabled else "gpu"


def pool_service_name(model: str, pool: PoolName) -> str:
    return f"{model}-{pool}"


def model_service_name(model: str) -> str:
    return model


def route_name(model: str) -> str:
    return model


def api_model_names(owner: Owner, hub_id: str | None) -> tuple[str, ...]:
    """What the rerank API's ``model`` may say for this model: its name (the one answered), ``namespace/name``, and
    the hub id it was made from (clients often send that)."""
    return tuple(dict.fromkeys([owner.name, f"{owner.namespace}/{owner.name}", *([hub_id] if hub_id else [])]))


def canary_name(model: str) -> str:
    """The canary CPU Deployment and its Service."""
    return f"{model}-canary"


def guard_name(model: str) -> str:
    """The quality guard's Deployment and Service (``builders/guard.py``)."""
    return f"{model}-guard"


def network_policy_name(model: str) -> str:
    """The NetworkPolicy isolating the model's TEI pods (tenancy.build_network_policy)."""
    return f"{model}-tei"


def job_name(model: str, artifact_id: str, attempt: int) -> str:
    """``<model>-q-<hash8>-<attempt>``, the model part shortened so the whole stays a valid 63-char label value."""
    suffix = f"-q-{artifact_id[:8]}-{attempt}"
    head = model[: _DNS_LABEL_MAX - len(suffix)].rstrip("-")
    return head + suffix


def shared_job_name(artifact_id: str, attempt: int) -> str:
    """``rerank-artifact-<id>-<attempt>``: one name per shared artifact and attempt, so models of any namespace that
    ask for the same artifact at once create the same Job (the second create is answered AlreadyExists)."""
    return f"rerank-artifact-{artifact_id}-{attempt}"


def shared_labels(artifact_id: str) -> dict[str, str]:
    """The labels of a shared artifact's Job and pods: what the operator finds them by in the store's namespace."""
    return {LABEL_NAME: APP_NAME, LABEL_COMPONENT: COMPONENT_QUANTIZER, LABEL_MANAGED_BY: OPERATOR_NAME,
            LABEL_PART_OF: PART_OF, LABEL_SHARED: "true", LABEL_ARTIFACT: artifact_id}


def selector_labels(model: str, component: Component) -> dict[str, str]:
    """The immutable selector of a pool Deployment: only labels that never change for the model's lifetime."""
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: model, LABEL_COMPONENT: component}


def labels(model: str, component: Component) -> dict[str, str]:
    return {
        **selector_labels(model, component),
        LABEL_MANAGED_BY: OPERATOR_NAME,
        LABEL_PART_OF: PART_OF,
    }


def owner_reference(owner: Owner) -> dict[str, Any]:
    """Controller reference so garbage collection deletes the child with its RerankModel."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(
    owner: Owner,
    name: str,
    component: Component,
    *,
    extra_labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owned: bool = True,
) -> dict[str, Any]:
    """metadata for a child; ``owned=False`` leaves out the owner reference (a retained volume outlives the model)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": owner.namespace,
        "labels": {**labels(owner.name, component), **(extra_labels or {})},
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    if owned:
        meta["ownerReferences"] = [owner_reference(owner)]
    return meta
