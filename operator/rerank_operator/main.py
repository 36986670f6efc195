"""``rerank-operator``: the operator process (kopf, standalone: no kopf peering; leader election is our own Lease).

Flags (docs/operations.md, "The operator process"): ``--namespace NS`` (repeatable) or ``--all-namespaces`` (default),
``--health-port`` (serves ``/healthz``), ``--metrics-port`` (Prometheus ``/metrics``), ``--log-format json|text``,
``--leader-election`` and its ``--leader-election-*`` timing (docs/operations.md, "High availability").
The flags become one typed ``settings.Settings``, handed to ``handlers.install``: nothing travels through the
environment.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from collections.abc import Mapping, Sequence

import kopf
from prometheus_client import start_http_server

from rerank_contracts import activator
from rerank_operator.core.artifacts.job_outcome import RetryBackoff
from rerank_operator.core.autoscale.config import PrometheusSettings
from rerank_operator.core.leadership import DEFAULT_LEASE_NAME, LeaderElectionSettings
from rerank_operator.core.platform import Activator
from rerank_operator.core.settings import DEFAULT_RESYNC_SECONDS, Settings


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rerank-operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], dest="namespaces",
                       help="watch this namespace (repeatable); default: all namespaces")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch all namespaces (default)")
    parser.add_argument("--health-port", type=int, default=8080, help="port of the /healthz probe (0: none)")
    parser.add_argument("--metrics-port", type=int, default=9090, help="port of Prometheus /metrics (0: none)")
    parser.add_argument("--log-format", choices=["json", "text"], default="json")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.add_argument("--resync-seconds", type=float, default=DEFAULT_RESYNC_SECONDS,
                        help="how often every RerankModel is reconciled even without a change")
    parser.add_argument("--watch-server-timeout", type=int, default=None,
                        help="seconds one watch request of kopf's (RerankClasses) lasts before kopf renews it "
                             "(default: kopf's; the informers' last 240-420 s)")
    parser.add_argument("--hub-retry-seconds", type=float, default=RetryBackoff().base_seconds,
                        help="after a quantization Job failed because the hub (or the class's mirror or proxy) did "
                             "not answer, start the next attempt this long after it, doubling per failure in a row")
    parser.add_argument("--hub-retry-max-seconds", type=float, default=RetryBackoff().max_seconds,
                        help="the longest wait between such attempts (they go on until the hub answers)")
    workloads = parser.add_argument_group("workloads", "what the platform gives every model's Job, guard and pools")
    workloads.add_argument("--quantizer-image", default="",
                           help="the quantization Job's and the quality guard's image for models without a RerankClass "
                                "that name none (a class decides for its models: quantization.images; default: the "
                                "built-in release image)")
    workloads.add_argument("--image-pull-secret", action="append", default=[], dest="image_pull_secrets",
                           metavar="NAME", help="an image pull Secret for the models' pods (repeatable); the platform "
                                                "keeps a Secret of that name in each model namespace")
    stores = parser.add_argument_group(
        "shared artifacts", "artifact stores named by RerankClasses (spec.artifactStore): one artifact per distinct "
                            "model, quantized once, fetched by every tenant's pods")
    stores.add_argument("--artifact-fetcher-image", default="",
                        help="the image of the pools' helpers: the init container that fetches a shared artifact, "
                             "and the quality guard's sampler beside TEI (the chart passes the operator's own; "
                             "default: the model's quantizer image, which carries both)")
    stores.add_argument("--artifact-store-credentials", default="",
                        help="a Docker config.json with credentials to read and delete in the stores' registries")
    stores.add_argument("--artifact-gc-seconds", type=float, default=60.0,
                        help="how often the leader deletes shared artifacts no model used for their class's grace")
    zero = parser.add_argument_group(
        "scale to zero", "the activator that holds a sleeping model's requests and wakes it (all three, or none: "
                         "without them no model goes to zero)")
    zero.add_argument("--activator-url", default="", help="base URL the operator polls for waiting requests "
                                                          "(GET /pending), e.g. http://rerank-activator.ns.svc:8080")
    zero.add_argument("--activator-service", default="",
                      help="<namespace>/<name>:<port> of the activator's Service: a sleeping model's HTTPRoute backend")
    zero.add_argument("--activator-key-file", default="",
                      help="the key shared with the activator (a mounted Secret): the routes' tokens are made with it")
    prom = parser.add_argument_group("metrics sources", "the Prometheus server the autoscaler queries for models "
                                     "with autoscaling.metrics.source prometheus whose RerankClass names none")
    prom.add_argument("--prometheus-url", default="", help="base URL of the Prometheus HTTP API")
    prom.add_argument("--prometheus-gpu-memory-used-query", default="",
                      help="PromQL giving GPU memory used (bytes) per GPU pool pod")
    prom.add_argument("--prometheus-gpu-memory-total-query", default="",
                      help="PromQL giving GPU memory total (bytes) per GPU pool pod")
    election = parser.add_argument_group(
        "leader election", "run several replicas: one leads (writes), the others keep their caches warm and take "
        "over through a coordination.k8s.io Lease (docs/operations.md, High availability)")
    election.add_argument("--leader-election", action="store_true",
                          help="elect one leader through a Lease (off: this process always writes)")
    election.add_argument("--leader-election-namespace", default=None,
                          help="namespace of the Lease (default: $POD_NAMESPACE, the operator's own)")
    election.add_argument("--leader-election-id", default=DEFAULT_LEASE_NAME, help="name of the Lease")
    election.add_argument("--leader-election-lease-seconds", type=float, default=10.0,
                          help="how long a standby waits after the Lease last changed before it takes over")
    election.add_argument("--leader-election-renew-seconds", type=float, default=7.0,
                          help="how long the leader keeps leading without a successful renew")
    election.add_argument("--leader-election-retry-seconds", type=float, default=2.0,
                          help="how often the leader renews and a standby tries to acquire")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    """The typed settings the handlers get: the flags, and the pod's own identity from its environment."""
    prometheus = PrometheusSettings(url=args.prometheus_url or None,
                                    gpu_memory_used_query=args.prometheus_gpu_memory_used_query or None,
                                    gpu_memory_total_query=args.prometheus_gpu_memory_total_query or None)
    try:
        election = LeaderElectionSettings(
            enabled=args.leader_election, namespace=args.leader_election_namespace or None,
            name=args.leader_election_id, lease_duration_seconds=args.leader_election_lease_seconds,
            renew_deadline_seconds=args.leader_election_renew_seconds,
            retry_period_seconds=args.leader_election_retry_seconds)
        return Settings.from_env(env, prometheus=prometheus, resync_seconds=args.resync_seconds,
                                 watch_server_timeout=args.watch_server_timeout, leader_election=election,
                                 hub_retry=RetryBackoff(args.hub_retry_seconds, args.hub_retry_max_seconds),
                                 quantizer_image=args.quantizer_image or None,
                                 image_pull_secrets=tuple(args.image_pull_secrets),
                                 activator=activator_from(args),
                                 fetcher_image=args.artifact_fetcher_image or None,
                                 artifact_store_credentials=args.artifact_store_credentials or None,
                                 artifact_gc_seconds=args.artifact_gc_seconds)
    except ValueError as exc:  # inconsistent flags: refuse to start, saying which, as argparse would
        raise SystemExit(f"rerank-operator: error: {exc}") from exc


def activator_from(args: argparse.Namespace) -> Activator | None:
    """The activator from its three flags (ValueError when only some are given, or one is wrong)."""
    given = [args.activator_url, args.activator_service, args.activator_key_file]
    if not any(given):
        return None
    if not all(given):
        raise ValueError("--activator-url, --activator-service and --activator-key-file go together")
    try:
        key = activator.read_key(args.activator_key_file)
    except OSError as exc:
        raise ValueError(f"--activator-key-file {args.activator_key_file}: {exc.strerror or exc}") from exc
    return Activator.parse_service(args.activator_url, args.activator_service, key)


def peer_identity(env: Mapping[str, str], hostname: str, pid: int) -> str:
    """Who this process is among operators: the pod's name, else host and pid. Never the user name: kopf's own
    guess asks the password database, which has no entry for the uid a pod runs as (65532 here, a random uid on
    OpenShift), and crashed the operator at start-up in a real container."""
    return env.get("POD_NAME") or f"{hostname}/{pid}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args, os.environ)
    kopf.configure(verbose=args.verbose,
                   log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL)
    if args.metrics_port:
        start_http_server(args.metrics_port)
    from rerank_operator.controllers import handlers  # kopf and the API client load only when the operator starts

    liveness = f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
    # kopf's documented way to name this process (POD_ID); without it kopf asks the password database.
    os.environ.setdefault("POD_ID", peer_identity(os.environ, socket.gethostname(), os.getpid()))
    asyncio.run(kopf.operator(
        registry=handlers.install(settings, args.namespaces),
        standalone=True,
        clusterwide=not args.namespaces,
        namespaces=args.namespaces,
        liveness_endpoint=liveness,
    ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
