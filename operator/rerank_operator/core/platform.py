"""What the platform gives a model's children beyond its own spec, as plain data the builders read: the quality
guard its RerankClass turns on (``spec.qualityGuard``), the store its class shares artifacts through
(``spec.artifactStore``) and the activator the operator's flags name (scale to zero).
Which models they apply to, and when, is decided elsewhere (``quality/guard_policy.py``, ``autoscale/zero.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rerank_contracts.activator import MIN_KEY_BYTES, POD_LABELS, PORT
from rerank_operator.core import names

#: The pool the guard checks and the one it checks against (the GPU pool serves the original weights in FP16).
CHECKED: names.PoolName = "cpu"
REFERENCE: names.PoolName = "gpu"
DEFAULT_FRACTION = 0.05
DEFAULT_CALLS_PER_SECOND = 1.0
DEFAULT_CANARY_PERCENT = 5
DEFAULT_CANARY_REQUESTS = 200
#: How a guarded model's live sample reaches its guard (``guard_policy.sample_source``): ``Auto`` mirrors where every
#: parent Gateway says it supports RequestMirror and samples in the pool pods otherwise; ``Mirror`` and ``Sampler``
#: force one (a platform whose gateway supports RequestMirror but publishes no feature list says ``Mirror``).
SAMPLING_MODES = ("Auto", "Mirror", "Sampler")
Sampling = Literal["Auto", "Mirror", "Sampler"]


@dataclass(frozen=True)
class GuardSettings:
    """A RerankClass's ``spec.qualityGuard`` when enabled: how much traffic is mirrored and what the guard may spend."""

    sample_fraction: float = DEFAULT_FRACTION
    calls_per_second: float = DEFAULT_CALLS_PER_SECOND
    image: str | None = None
    resources: Mapping[str, Any] = field(default_factory=dict)
    #: A new artifact first serves this share of the requests beside the stable one (0: no canary, roll at once),
    #: and is promoted once the guard compared this many requests on it within the floor (``plan.py``).
    canary_percent: int = DEFAULT_CANARY_PERCENT
    canary_requests: int = DEFAULT_CANARY_REQUESTS
    sampling: Sampling = "Auto"

    @classmethod
    def from_class(cls, class_spec: Mapping[str, Any] | None) -> GuardSettings | None:
        """None unless the class turns the guard on (the CRD's schema has validated the values)."""
        section = (class_spec or {}).get("qualityGuard") or {}
        if not section.get("enabled"):
            return None
        return cls(sample_fraction=float(section.get("sampleFraction", DEFAULT_FRACTION)),
                   calls_per_second=float(section.get("callsPerSecond", DEFAULT_CALLS_PER_SECOND)),
                   image=section.get("image") or None, resources=dict(section.get("resources") or {}),
                   canary_percent=int(section.get("canaryPercent", DEFAULT_CANARY_PERCENT)),
                   canary_requests=int(section.get("canaryRequests", DEFAULT_CANARY_REQUESTS)),
                   sampling=_sampling(section.get("sampling")))


def _sampling(value: object) -> Sampling:
    """The class's ``qualityGuard.sampling`` (the CRD's enum; anything else reads as the safe default)."""
    return "Mirror" if value == "Mirror" else "Sampler" if value == "Sampler" else "Auto"



@dataclass(frozen=True)
class Activator:
    """The platform's activator (``--activator-url``, ``--activator-service``, ``--activator-key-file``)."""

    url: str            # where the operator polls GET /pending
    namespace: str      # the Service's namespace (the operator's, as the chart deploys it)
    service: str
    port: int = PORT
    key: bytes = field(default=b"", repr=False)
    #: The activator's pods' labels (the chart's), which a sleeping model's NetworkPolicy lets into its pools.
    pod_labels: Mapping[str, str] = field(default_factory=lambda: dict(POD_LABELS))

    @classmethod
    def parse_service(cls, url: str, service: str, key: bytes) -> Activator:
        """From ``--activator-service`` ``<namespace>/<name>:<port>``; ValueError with what is wrong."""
        namespace, sep, rest = service.partition("/")
        name, colon, port = rest.partition(":")
        if not sep or not namespace or not name:
            raise ValueError(f"--activator-service {service!r} is not <namespace>/<name>[:<port>]")
        if colon and not port.isdigit():
            raise ValueError(f"--activator-service {service!r}: the port must be a number")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--activator-url {url!r} is not an http(s) URL")
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the activator key must be at least {MIN_KEY_BYTES} bytes")
        return cls(url.rstrip("/"), namespace, name, int(port) if colon else PORT, key)


DEFAULT_UNUSED_GRACE_SECONDS = 86400
#: The CRD's default of artifactStore.maxBuildsPerNamespace.
DEFAULT_MAX_BUILDS_PER_NAMESPACE = 2


def _class_cpu_placement(class_spec: Mapping[str, Any] | None) -> dict[str, Any]:
    cpu = (((class_spec or {}).get("pools") or {}).get("cpu")) or {}
    return {**({"nodeSelector": dict(cpu["nodeSelector"])} if cpu.get("nodeSelector") else {}),
            **({"tolerations": [dict(t) for t in cpu["tolerations"]]} if cpu.get("tolerations") else {})}


@dataclass(frozen=True)
class ArtifactStore:
    """A class's ``spec.artifactStore``. ``repository``: ``host[:port]/path`` (tags are artifact ids);
    ``namespace``: where shared Jobs run; ``push_secret``: a ``kubernetes.io/dockerconfigjson`` Secret there, the
    only credentials that may write the store; ``pull_secret``: one the platform keeps in every model namespace
    when the registry needs credentials to read (none: anonymous pull); ``insecure``: plain HTTP (a registry inside
    the cluster)."""

    repository: str
    namespace: str
    push_secret: str | None = None
    pull_secret: str | None = None
    insecure: bool = False
    unused_grace_seconds: int = DEFAULT_UNUSED_GRACE_SECONDS
    #: The shared Jobs' resources: the class's ``quantization.defaultResources``, never a tenant's (a tenant's tiny
    #: memory limit would fail the build every tenant of the artifact waits for).
    job_resources: Mapping[str, Any] = field(default_factory=dict)
    #: Shared Jobs the models of one namespace may have building at once (they run outside the tenants' quotas).
    max_builds_per_namespace: int = DEFAULT_MAX_BUILDS_PER_NAMESPACE
    #: Where shared Jobs run: the class's CPU pool placement (``pools.cpu.nodeSelector`` and ``tolerations``) as
    #: pod spec fields, never a tenant's (an unschedulable one would fail the build every tenant waits for).
    job_placement: Mapping[str, Any] = field(default_factory=dict)

    @property
    def host(self) -> str:
        return self.repository.split("/", 1)[0]

    @property
    def path(self) -> str:
        """The repository without its host, as the registry's API names it."""
        return self.repository.split("/", 1)[1] if "/" in self.repository else ""

    @classmethod
    def from_class(cls, class_spec: Mapping[str, Any] | None) -> ArtifactStore | None:
        """The class's store, or None when it has none (or turns sharing off with ``enabled: false``)."""
        raw = (class_spec or {}).get("artifactStore")
        if not isinstance(raw, Mapping) or raw.get("enabled") is False or not raw.get("repository"):
            return None
        return cls(repository=str(raw["repository"]).rstrip("/"), namespace=str(raw.get("namespace") or ""),
                   push_secret=raw.get("pushSecret") or None, pull_secret=raw.get("pullSecret") or None,
                   insecure=bool(raw.get("insecure", False)),
                   unused_grace_seconds=int(raw.get("unusedGraceSeconds", DEFAULT_UNUSED_GRACE_SECONDS)),
                   max_builds_per_namespace=int(raw.get("maxBuildsPerNamespace",
                                                        DEFAULT_MAX_BUILDS_PER_NAMESPACE)),
                   job_resources=dict(((class_spec or {}).get("quantization") or {}).get("defaultResources") or {}),
                   job_placement=_class_cpu_placement(class_spec))
