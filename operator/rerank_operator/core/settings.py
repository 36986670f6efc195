"""What the operator process was started with, read once by the shell and passed down.

main.py builds one ``Settings`` from its flags and the pod's environment (the chart sets ``POD_NAMESPACE`` and may
set ``RERANK_OPERATOR_POD_LABELS``) and hands it to ``handlers.install``, so no other module reads flags or the
environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from rerank_operator.core.artifacts.job_outcome import RetryBackoff
from rerank_operator.core.autoscale.config import PrometheusSettings
from rerank_operator.core.leadership import LeaderElectionSettings
from rerank_operator.core.platform import Activator
from rerank_operator.core.spec import shapes

#: Labels of the operator's own pods (the chart's, whatever the release is called): the NetworkPolicy admits them
#: so the autoscaler can scrape TEI. ``RERANK_OPERATOR_POD_LABELS=k=v,k=v`` overrides them.
DEFAULT_OPERATOR_POD_LABELS: Mapping[str, str] = {"app.kubernetes.io/part-of": "rerank",
                                                  "app.kubernetes.io/component": "operator"}
POD_LABELS_ENV = "RERANK_OPERATOR_POD_LABELS"
POD_NAMESPACE_ENV = "POD_NAMESPACE"
DEFAULT_RESYNC_SECONDS = 300.0  # a safety net: the watches see every change


@dataclass(frozen=True)
class Settings:
    """The operator's own namespace and pod labels (the NetworkPolicy's operator peer; no namespace outside a pod,
    and then no peer), the Prometheus server the platform configured (``--prometheus-url``), how often every model
    is reconciled without a change (``--resync-seconds``) and, when set, how long one watch request of kopf's lasts
    (``--watch-server-timeout``; kopf's default otherwise; the informers' own last 240-420 s), and whether replicas
    elect one writer through a Lease (``--leader-election*``; its namespace defaults to the operator's own), and
    when a quantization Job that failed transiently is tried again (``--hub-retry-seconds``,
    ``--hub-retry-max-seconds``), and what the platform gives every model's workloads: the quantizer image when
    neither the model nor its class names one (``--quantizer-image``; else the built-in one) and the image pull
    Secrets of their pods (``--image-pull-secret``: Secrets the platform keeps in each model namespace), and the
    activator that holds a sleeping model's requests (``--activator-*``; without one no model goes to zero)."""

    operator_namespace: str | None = None
    operator_pod_labels: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_OPERATOR_POD_LABELS))
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    resync_seconds: float = DEFAULT_RESYNC_SECONDS
    watch_server_timeout: int | None = None
    leader_election: LeaderElectionSettings = field(default_factory=LeaderElectionSettings)
    hub_retry: RetryBackoff = field(default_factory=RetryBackoff)
    quantizer_image: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    activator: Activator | None = None
    #: The image of the init container that fetches a shared artifact into a pod (``--artifact-fetcher-image``; the
    #: chart's: the operator's own); None: the model's quantizer image, which has the same command.
    fetcher_image: str | None = None
    #: A Docker config.json with the credentials the operator reads and deletes shared artifacts with
    #: (``--artifact-store-credentials``); None: anonymous.
    artifact_store_credentials: str | None = None
    #: How often the leader deletes shared artifacts nobody used for their class's grace (``--artifact-gc-seconds``).
    artifact_gc_seconds: float = 60.0

    @classmethod
    def from_env(cls, env: Mapping[str, str], prometheus: PrometheusSettings | None = None,
                 resync_seconds: float = DEFAULT_RESYNC_SECONDS, watch_server_timeout: int | None = None,
                 leader_election: LeaderElectionSettings | None = None,
                 hub_retry: RetryBackoff | None = None, quantizer_image: str | None = None,
                 image_pull_secrets: tuple[str, ...] = (), activator: Activator | None = None,
                 fetcher_image: str | None = None, artifact_store_credentials: str | None = None,
                 artifact_gc_seconds: float = 60.0) -> Settings:
        """The pod's own identity from ``env``; the rest as main.py parsed it from the flags. An enabled election
        without a namespace of its own takes the pod's; with neither (not in a pod, no flag) it cannot name its
        Lease, which is refused here, at start-up, rather than at the first election."""
        namespace = env.get(POD_NAMESPACE_ENV) or None
        for flag, image in (("--quantizer-image", quantizer_image), ("--artifact-fetcher-image", fetcher_image)):
            if image and not shapes.image(image):
                raise ValueError(f"{flag} {image!r} is not an image reference")
        if artifact_gc_seconds <= 0:
            raise ValueError("--artifact-gc-seconds must be positive")
        for secret in image_pull_secrets:
            if not shapes.dns_subdomain(secret):
                raise ValueError(f"--image-pull-secret {secret!r} is not a Secret name")
        election = leader_election or LeaderElectionSettings()
        if election.enabled and not election.namespace:
            if not namespace:
                raise ValueError("--leader-election needs the Lease's namespace: pass --leader-election-namespace, "
                                 f"or run in a pod with ${POD_NAMESPACE_ENV} set")
            election = replace(election, namespace=namespace)
        return cls(operator_namespace=namespace,
                   operator_pod_labels=operator_pod_labels(env),
                   prometheus=prometheus or PrometheusSettings(),
                   resync_seconds=resync_seconds, watch_server_timeout=watch_server_timeout,
                   leader_election=election, hub_retry=hub_retry or RetryBackoff(),
                   quantizer_image=quantizer_image or None, image_pull_secrets=tuple(image_pull_secrets),
                   activator=activator, fetcher_image=fetcher_image or None,
                   artifact_store_credentials=artifact_store_credentials or None,
                   artifact_gc_seconds=artifact_gc_seconds)


def operator_pod_labels(env: Mapping[str, str]) -> dict[str, str]:
    raw = env.get(POD_LABELS_ENV, "").strip()
    if not raw:
        return dict(DEFAULT_OPERATOR_POD_LABELS)
    pairs = (item.split("=", 1) for item in raw.split(",") if "=" in item)
    return {k.strip(): v.strip() for k, v in pairs if k.strip()}
