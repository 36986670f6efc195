"""``rerank-operator``: the operator process (kopf, standalone, no peering).

Flags follow docs/design-notes.md: ``--namespace NS`` (repeatable) or ``--all-namespaces`` (default),
``--health-port`` (serves ``/healthz``), ``--metrics-port`` (Prometheus ``/metrics``), ``--log-format json|text``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Sequence

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
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["RERANK_RESYNC_SECONDS"] = str(args.resync_seconds)  # read when the handlers register
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
