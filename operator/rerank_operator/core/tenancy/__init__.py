"""Many tenants, one platform: RerankClass defaults and limits, per-model NetworkPolicy, quota detection.

A package of small modules, one per concern (selection, resolve, violations, network, quota, over
``fields`` and ``quantities``); this module re-exports what the rest of the operator uses.

Pure functions over plain dicts (the objects as the API returns them); no I/O and no kopf, so the reconcile loop
calls them and unit tests drive them with tables.

- ``select_class`` picks a model's RerankClass: the one named by ``spec.className``, else the default class
  (annotation ``rerank.io/is-default-class: "true"``; with several, the newest, as for StorageClasses).
- ``resolve`` gives the effective spec: the tenant's values kept, what it left out filled from the class.
- ``violations`` double-checks an effective spec against its class. The API server already refuses these
  (policies/rerankmodel-class-policy.yaml, same wording); the operator reports them in condition ``ClassCompliant``
  because a class may be tightened after a model was admitted.
- ``build_network_policy`` lets only the routing layer, allowed namespaces and the operator reach TEI pods.
- ``quota_blocked`` turns "exceeded quota" failures of ReplicaSets, Jobs and claims into one reason and message.
"""

from __future__ import annotations

from rerank_operator.core.spec.quantities import parse_quantity
from rerank_operator.core.tenancy.network import build_network_policy
from rerank_operator.core.tenancy.quota import QuotaBlock, is_quota_message, quota_blocked
from rerank_operator.core.tenancy.resolve import resolve
from rerank_operator.core.tenancy.selection import (
           CLASS_KIND,
           CLASS_PLURAL,
           DEFAULT_CLASS_ANNOTATION,
           class_not_found,
           is_default_class,
           select_class,
           uses_class,
)
from rerank_operator.core.tenancy.violations import hub_organization_allowed, image_allowed, violations

__all__ = ["CLASS_KIND", "CLASS_PLURAL", "DEFAULT_CLASS_ANNOTATION", "QuotaBlock", "build_network_policy",
           "class_not_found", "hub_organization_allowed", "image_allowed", "is_default_class", "is_quota_message",
           "parse_quantity", "quota_blocked", "resolve", "select_class", "uses_class", "violations"]
