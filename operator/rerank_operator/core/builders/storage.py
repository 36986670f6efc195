"""The volume holding artifacts: the claim's name and, unless the user brings one, the PVC to create.

reclaimPolicy Delete is an owner reference (garbage collection removes the claim with the model); Retain is the
absence of one, so the claim and its expensive artifacts outlive the RerankModel and are adopted again if a model
of the same name comes back. Server-side apply removes the owner reference when Delete turns into Retain because
the operator's field manager owns it.
"""

from __future__ import annotations

from typing import Any

from rerank_operator.core import names
from rerank_operator.core.spec.model import RerankModelSpec


def claim_name(owner: names.Owner, spec: RerankModelSpec) -> str:
    return spec.storage.existing_claim or names.pvc_name(owner.name)


def build_pvc(owner: names.Owner, spec: RerankModelSpec) -> dict[str, Any] | None:
    """The PVC to apply, or None when storage.existingClaim names someone else's claim."""
    storage = spec.storage
    if storage.existing_claim:
        return None
    pvc_spec: dict[str, Any] = {
        "accessModes": list(storage.access_modes),
        "resources": {"requests": {"storage": storage.size}},
    }
    if storage.storage_class_name:
        pvc_spec["storageClassName"] = storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": names.child_metadata(
            owner, names.pvc_name(owner.name), "model-storage", owned=storage.reclaim_policy == "Delete"
        ),
        "spec": pvc_spec,
    }
