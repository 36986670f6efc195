"""Status conditions, the Kubernetes way (metav1.Condition), through one pure helper.

``lastTransitionTime`` changes only when ``status`` changes (a new reason or message is not a transition), and
every condition carries the generation it was computed for, so kstatus, ``helm --wait`` style tools and Argo CD can
tell a stale True from a current one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["True", "False", "Unknown"]

# -- condition types ---------------------------------------------------------------------------------------------
READY = "Ready"
MODEL_READY = "ModelReady"
POOLS_AVAILABLE = "PoolsAvailable"
DEGRADED = "Degraded"
CLASS_COMPLIANT = "ClassCompliant"  # the model's RerankClass: Compliant | ClassViolation | ClassNotFound (tenant.py)
METRICS_AVAILABLE = "MetricsAvailable"  # the autoscaler's
TRAFFIC_ENFORCED = "TrafficEnforced"  # the autoscaler's
QUALITY_VERIFIED = "QualityVerified"  # the autoscaler's, from the quality guard (core/quality/assessment.py)
#: With routing.gateway only (core/gateway.py): whether every parent Gateway accepted the model's HTTPRoute, and
#: whether the route uses only what the gateways support (else what the operator did instead).
ROUTE_ACCEPTED = "RouteAccepted"
GATEWAY_FEATURES = "GatewayFeatures"
GATEWAY_OWNED = (ROUTE_ACCEPTED, GATEWAY_FEATURES)
#: Conditions the reconcile loop owns; the others (MetricsAvailable, TrafficEnforced) belong to the autoscaler.
OWNED = (READY, MODEL_READY, POOLS_AVAILABLE, DEGRADED, CLASS_COMPLIANT, *GATEWAY_OWNED)
AUTOSCALER_OWNED = (METRICS_AVAILABLE, TRAFFIC_ENFORCED, QUALITY_VERIFIED)

# -- reasons ----------------------------------------------------------------------------------------------------
# Every reason the operator itself sets, in one place: docs/operations.md explains each one (a test reads the
# ``REASON_*`` names below). The quantizer's failure reasons are ``rerank_contracts.quantize_job.FAILURE_REASONS``; a
# Job's or a container's own reason (BackoffLimitExceeded, OOMKilled, ...) is passed through as Kubernetes set it.
# Ready (its False reasons are also those of the first failing check, readiness.py)
REASON_SERVING = "Serving"
# Ready while the model is going to, at or waking from zero: the activator holds its requests (autoscale/zero.py).
REASON_SCALED_TO_ZERO = "ScaledToZero"
REASON_APPLY_FAILED = "ApplyFailed"
REASON_CLAIM_NOT_FOUND = "ClaimNotFound"
REASON_CLAIM_LOST = "ClaimLost"
REASON_ROLLING_OUT = "RollingOut"
REASON_REPLICAS_UNAVAILABLE = "ReplicasUnavailable"
#: A pool's pods could not get their shared artifact from the store (the fetcher's reason, when it is one of these).
REASON_CHECKSUM_MISMATCH = "ChecksumMismatch"
REASON_REGISTRY_UNAVAILABLE = "RegistryUnavailable"
REASON_ARTIFACT_FETCH_FAILED = "ArtifactFetchFailed"
#: A CPU pool's node cannot serve the artifact's INT8 target (core/builders/cpu_check.py).
REASON_ARTIFACT_TARGET_MISMATCH = "ArtifactTargetMismatch"
REASON_INVALID_SPEC = "InvalidSpec"  # also MetricsAvailable's, when the autoscaler cannot read the spec
# ModelReady, and the pending artifact's (plan.py, job.py)
REASON_QUANTIZATION_DISABLED = "QuantizationDisabled"
REASON_ARTIFACT_PUBLISHED = "ArtifactPublished"
REASON_QUANTIZING = "Quantizing"
#: A shared artifact waits: its namespace has artifactStore.maxBuildsPerNamespace shared Jobs building already.
REASON_SHARED_BUILDS_LIMITED = "SharedBuildsLimited"
REASON_RECOVERING_RESULT = "RecoveringResult"
REASON_RETRYING = "Retrying"
REASON_JOB_POD_WAITING = "JobPodWaiting"
REASON_RESULT_LOST = "ResultLost"
REASON_QUANTIZER_CRASHED = "QuantizerCrashed"
REASON_JOB_FAILED = "JobFailed"
REASON_OOM_KILLED = "OOMKilled"  # the kubelet's, kept whatever the quantizer reported (the fix is the limit)
# PoolsAvailable
REASON_AWAITING_ARTIFACT = "AwaitingArtifact"
REASON_NO_READY_REPLICAS = "NoReadyReplicas"
REASON_AVAILABLE = "Available"
# Degraded
REASON_AS_EXPECTED = "AsExpected"
REASON_ROLLOUT_STUCK = "RolloutStuck"
# ClassCompliant (and Ready/Degraded when the class does not exist), QuotaExceeded (Ready and the blocked child's)
REASON_COMPLIANT = "Compliant"
REASON_CLASS_VIOLATION = "ClassViolation"
REASON_CLASS_NOT_FOUND = "ClassNotFound"
REASON_QUOTA_EXCEEDED = "QuotaExceeded"
# MetricsAvailable
REASON_METRICS_FRESH = "MetricsFresh"
REASON_METRICS_STALE = "MetricsStale"
# TrafficEnforced
REASON_SINGLE_POOL = "SinglePool"
REASON_NO_GATEWAY = "NoGateway"
REASON_GATEWAY_API_MISSING = "GatewayAPIMissing"
REASON_ROUTE_PENDING = "RoutePending"
REASON_HTTP_ROUTE = "HTTPRoute"
# RouteAccepted (RoutePending too: no parent Gateway has reported on the route yet) and GatewayFeatures
REASON_ROUTE_ACCEPTED = "Accepted"
REASON_NOT_ACCEPTED = "NotAccepted"  # also Ready's: a parent Gateway refused the route
REASON_REFS_NOT_RESOLVED = "RefsNotResolved"  # also Ready's
REASON_FEATURES_SUPPORTED = "Supported"
REASON_FEATURE_UNSUPPORTED = "FeatureUnsupported"
# QualityVerified (and the BelowFloor / QualityRestored Events)
REASON_WITHIN_FLOOR = "WithinFloor"
REASON_BELOW_FLOOR = "BelowFloor"
REASON_GUARD_PENDING = "GuardPending"
REASON_GUARD_NOT_APPLICABLE = "GuardNotApplicable"
REASON_QUALITY_RESTORED = "QualityRestored"
REASON_REQUANTIZING = "RequantizingOnDrift"  # an Event: re-quantizing on live traffic began (quality/requantize.py)
# Ready / ModelReady (and Degraded after a rollback) while a new artifact is a canary
REASON_CANARY = "Canary"
REASON_CANARY_ROLLED_BACK = "CanaryRolledBack"


def reasons() -> frozenset[str]:
    """Every reason constant above (what docs/operations.md must explain)."""
    return frozenset(v for k, v in globals().items() if k.startswith("REASON_") and isinstance(v, str))


@dataclass(frozen=True)
class Condition:
    type: str
    status: Status
    reason: str
    message: str


def set_condition(
    existing: Sequence[Mapping[str, Any]], new: Condition, *, generation: int, now: str
) -> list[dict[str, Any]]:
    """Return ``existing`` with ``new`` set; keeps lastTransitionTime when the status did not change."""
    result: list[dict[str, Any]] = []
    found = False
    for cond in existing:
        if cond.get("type") != new.type:
            result.append(dict(cond))
            continue
        found = True
        unchanged = cond.get("status") == new.status and cond.get("lastTransitionTime")
        result.append(_render(new, generation, str(cond["lastTransitionTime"]) if unchanged else now))
    if not found:
        result.append(_render(new, generation, now))
    return result


def set_conditions(
    existing: Sequence[Mapping[str, Any]], new: Sequence[Condition], *, generation: int, now: str
) -> list[dict[str, Any]]:
    conditions = [dict(c) for c in existing]
    for cond in new:
        conditions = set_condition(conditions, cond, generation=generation, now=now)
    return conditions


def find(conditions: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    for cond in conditions:
        if cond.get("type") == kind:
            return cond
    return None


def _render(cond: Condition, generation: int, transition: str) -> dict[str, Any]:
    return {
        "type": cond.type,
        "status": cond.status,
        "observedGeneration": generation,
        "lastTransitionTime": transition,
        "reason": cond.reason,
        "message": cond.message,
    }
