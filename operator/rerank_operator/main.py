"""``rerank-operator``: the operator process (kopf, standalone, no peering).

Flags follow docs/design-notes.md: ``--namespace NS`` (repeatable) or ``--all-namespaces`` (default),
``--health-port`` (serves ``/healthz``), ``--metrics-port`` (Prometheus ``/metrics``), ``--log-format json|text``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

import kopf
from prometheus_client import start_http_server


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
    parser.add_argument("--resync-seconds", type=float, default=30.0,
                        help="how often every RerankModel is reconciled even without a change")
    prom = parser.add_argument_group("metrics sources", "the Prometheus server the autoscaler queries for models "
                                     "with autoscaling.metrics.source prometheus whose RerankClass names none")
    prom.add_argument("--prometheus-url", default="", help="base URL of the Prometheus HTTP API")
    prom.add_argument("--prometheus-gpu-memory-used-query", default="",
                      help="PromQL giving GPU memory used (bytes) per GPU pool pod")
    prom.add_argument("--prometheus-gpu-memory-total-query", default="",
                      help="PromQL giving GPU memory total (bytes) per GPU pool pod")
    return parser.parse_args(argv)


def export_metrics_sources(args: argparse.Namespace, env: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Hand the platform's Prometheus settings to the autoscaler (autoscale/endpoints.py reads them)."""
    from .autoscale import endpoints

    for name, value in ((endpoints.URL_ENV, args.prometheus_url),
                        (endpoints.USED_QUERY_ENV, args.prometheus_gpu_memory_used_query),
                        (endpoints.TOTAL_QUERY_ENV, args.prometheus_gpu_memory_total_query)):
        if value:
            env[name] = value


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["RERANK_RESYNC_SECONDS"] = str(args.resync_seconds)  # read when the handlers register
    export_metrics_sources(args)
    kopf.configure(verbose=args.verbose,
                   log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL)
    if args.metrics_port:
        start_http_server(args.metrics_port)
    from . import handlers  # noqa: F401  (registers the handlers with kopf)

    liveness = f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
    asyncio.run(kopf.operator(
        standalone=True,
        clusterwide=not args.namespaces,
        namespaces=args.namespaces,
        liveness_endpoint=liveness,
    ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
