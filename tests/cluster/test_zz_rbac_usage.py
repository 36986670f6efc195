"""The operator's RBAC equals what it uses: its rules (operator/rerank_operator/rbac_rules.yaml,
rbac_leader_election.yaml and rbac_activator.yaml, the only lists, which the chart renders) against the requests
the API server's audit log shows its identity making over this run of the cluster tier.

The file's name sorts last, so it runs after every other cluster test of the session, on one audit log (the
session's control plane logs every request of the operator's identity: rerank_devcluster.cluster.AUDIT_POLICY).
Two checks:
- nothing the operator asked for was refused by RBAC for want of a rule (the authorizer's decision in each audit
  event): a verb the code needs and the rules lack fails here even where the code swallowed the 403;
- every verb the rules grant was used, unless ``NOT_A_REQUEST`` says why no request of the operator's shows it.
  This half needs the whole tier's requests: with only some cluster tests selected it is not asserted (the first
  half still is), and the test says so in its output.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rerank_devcluster.cluster import OPERATOR_USER, Cluster

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = [ROOT / "operator/rerank_operator/rbac_rules.yaml",
              ROOT / "operator/rerank_operator/rbac_leader_election.yaml",
              ROOT / "operator/rerank_operator/rbac_activator.yaml"]
Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

#: Granted, and needed, but never a request of the operator's own: why each shows in no audit event of its identity.
_SSA_CREATE = ("server-side apply of an object not there yet is a patch request, which the API server authorizes as "
               "create too")
NOT_A_REQUEST: dict[Grant, str] = {
    ("rerank.io", "rerankmodels/finalizers", "update"):
        "checked by the API server when the operator creates a child whose ownerReference sets blockOwnerDeletion "
        "(OwnerReferencesPermissionEnforcement): an authorization check, not a request",
    ("apps", "deployments", "create"): _SSA_CREATE,
    ("", "services", "create"): _SSA_CREATE,
    ("", "persistentvolumeclaims", "create"): _SSA_CREATE,
    ("gateway.networking.k8s.io", "httproutes", "create"): _SSA_CREATE,
    ("gateway.networking.k8s.io", "referencegrants", "create"): _SSA_CREATE,
    ("networking.k8s.io", "networkpolicies", "create"): _SSA_CREATE,
    ("", "persistentvolumeclaims", "get"):
        "a model's own spec.storage.existingClaim (it carries none of the operator's labels, so no watch sees it): "
        "exercised on the real node (test_real_node.py), where the operator runs under its chart's ServiceAccount, "
        "whose reads the dev cluster's audit policy does not log",
}


def grants(files: Iterable[Path]) -> set[Grant]:
    found: set[Grant] = set()
    for f in files:
        for rule in yaml.safe_load(f.read_text()):
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        found.add((group, resource, verb))
    return found


def requests_of(events: Iterable[dict[str, Any]], user: str) -> list[dict[str, Any]]:
    return [e for e in events if (e.get("user") or {}).get("username") == user and e.get("objectRef")]


def grant_of(event: dict[str, Any]) -> Grant:
    ref = event["objectRef"]
    resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return ref.get("apiGroup", ""), resource, event["verb"]


def whole_tier_selected(session: pytest.Session) -> bool:
    """Every cluster test module of this folder is in the session's selection (and so ran before this one)."""
    here = Path(__file__).resolve().parent
    modules = {p.name for p in here.glob("test_*.py")} - {Path(__file__).name}
    selected = {Path(str(item.fspath)).name for item in session.items if Path(str(item.fspath)).parent == here}
    return modules <= selected


def test_the_operators_rbac_is_exactly_what_it_uses(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    granted = grants(RULE_FILES)
    calls = requests_of(cluster.audit_events(), OPERATOR_USER)
    # A refusal of something the rules grant is a binding not yet in the authorizer's cache (tests bind the rules
    # just before they start an operator); one of something they do not grant is a rule missing.
    refused = sorted({grant_of(e) for e in calls
                      if (e.get("annotations") or {}).get("authorization.k8s.io/decision") == "forbid"} - granted)
    assert not refused, f"the operator asked for what its rules do not grant: {refused}"
    used = {grant_of(e) for e in calls}
    assert used <= granted, sorted(used - granted)  # (non-resource URLs have no objectRef: requests_of skips them)
    if not whole_tier_selected(request.session):
        print(f"\nRBAC: {len(calls)} requests checked for refusals; unused grants not checked (only part of the "
              "cluster tier was selected)")
        return
    unused = sorted(granted - used - set(NOT_A_REQUEST))
    assert not unused, (f"granted but never used by the operator over the whole cluster tier: {unused}. Remove them "
                        "from the rules, or add to NOT_A_REQUEST why no request shows them")
    print(f"\nRBAC: {len(calls)} requests; {len(used)} (group, resource, verb) used = every grant but "
          f"{sorted(NOT_A_REQUEST)}")
