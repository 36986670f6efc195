"""``rerank-sampler``: the front of each serving pod, beside TEI: the rerank API and the quality guard's sample.

    rerank-sampler [--guard-url http://<model>-guard.<namespace>.svc:80 --fraction 0.05]
                   [--model-name NAME ...] [--long-documents truncate|chunk]
                   [--port 8082] [--metrics-port 9091] [--upstream http://127.0.0.1:8080]
                   [--token-env RERANK_GUARD_MIRROR_TOKEN] [--queue-size 64] [--queue-bytes 16777216]
                   [--max-body-bytes 2097152] [--max-connections 1024] [--upstream-timeout 60]
                   [--drain-seconds 10] [--seed N] [--log-format json|text]

Every model's pool pods run it (the front of each serving pod): it answers the rerank API in the Cohere and Jina
shapes (``--model-name``, ``--long-documents``; :mod:`.translation`) and, for a guarded model (``--guard-url``),
copies a sample to the quality guard. A guarded front refuses to start without the mirror token (the variable
``--token-env`` names unset or empty): every copy would be refused by the guard (``quality_guard/intake.py``), so
the guard would check nothing while the pod looked healthy.
On SIGTERM it drains (:meth:`.server.Running.drain`) and exits 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence

from rerank_contracts import guard, rerank_api

from . import logs, relay, sampling, server, translation

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its message
    return parse


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, not {text}")
    return value


def _http_url(text: str) -> str:
    try:
        relay.address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rerank-sampler", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--guard-url", type=_http_url, default=None,
                        help="the model's quality guard, http://host:port: where the copies go (unset: an unguarded "
                        "model, nothing is copied)")
    parser.add_argument("--fraction", type=_fraction, default=None,
                        help="the fraction of answered POST /rerank requests copied to the guard, 0 to 1 (with "
                        "--guard-url only, and required with it)")
    parser.add_argument("--model-name", action="append", default=[], dest="model_names",
                        help="a name the rerank API's `model` may carry (repeatable; the first is the one answered)")
    parser.add_argument("--long-documents", choices=rerank_api.LONG_DOCUMENTS, default="truncate",
                        help="documents longer than the model's input: truncate (TEI's cut) or chunk (overlapping "
                        "windows, the best one's score) (default %(default)s)")
    parser.add_argument("--port", type=int, default=guard.SAMPLER_PORT,
                        help="the serving port: every request goes to TEI, but GET "
                        f"{guard.SAMPLER_HEALTH_PATH} (default %(default)s)")
    parser.add_argument("--metrics-port", type=int, default=guard.SAMPLER_METRICS_PORT,
                        help="the sampler's own /metrics (default %(default)s)")
    parser.add_argument("--upstream", type=_http_url, default="http://127.0.0.1:8080",
                        help="TEI, http://host:port (default %(default)s)")
    parser.add_argument("--token-env", default=guard.MIRROR_TOKEN_ENV,
                        help="the environment variable holding the model's mirror token (default %(default)s)")
    parser.add_argument("--queue-size", type=_positive(int), default=sampling.QUEUE_SIZE,
                        help="copies waiting for the guard at most; more are dropped (default %(default)s)")
    parser.add_argument("--queue-bytes", type=_positive(int), default=sampling.QUEUE_BYTES,
                        help="their bodies' bytes at most; a copy past it is dropped (default %(default)s)")
    parser.add_argument("--max-body-bytes", type=_positive(int), default=server.MAX_BODY_BYTES,
                        help="the largest request body taken, as TEI's --payload-limit (default %(default)s)")
    parser.add_argument("--max-connections", type=_positive(int), default=server.MAX_CONNECTIONS,
                        help="client connections open at most; more are closed at accept (default %(default)s)")
    parser.add_argument("--upstream-timeout", type=_positive(float), default=relay.READ_TIMEOUT_SECONDS,
                        help="seconds TEI may take to answer (each read) before a 504 (default %(default)s)")
    parser.add_argument("--drain-seconds", type=_positive(float), default=server.DRAIN_SECONDS,
                        help="on SIGTERM, how long the requests in flight are given (default %(default)s)")
    parser.add_argument("--seed", type=int, default=None, help="seed the sampling's draws (tests, benchmarks)")
    parser.add_argument("--log-format", choices=["json", "text"], default="json")
    args = parser.parse_args(argv)
    if (args.guard_url is None) != (args.fraction is None):
        parser.error("--guard-url and --fraction go together: a guarded front copies a fraction to its guard, an "
                     "unguarded one copies nothing")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logs.configure(args.log_format)
    token = os.environ.get(args.token_env, "")
    if args.guard_url and not token:
        sys.exit(f"rerank-sampler: no mirror token: the environment variable {args.token_env} is unset or empty "
                 f"(the operator sets it to the model's mirror token; without it the guard refuses every copy)")
    api = translation.ApiSettings(models=tuple(args.model_names),
                                  served_model=args.model_names[0] if args.model_names else "",
                                  long_documents=args.long_documents)
    settings = server.Settings(guard_url=args.guard_url, token=token, fraction=args.fraction or 0.0, api=api,
                               upstream=args.upstream,
                               queue_size=int(args.queue_size), queue_bytes=int(args.queue_bytes),
                               max_body_bytes=int(args.max_body_bytes), max_connections=int(args.max_connections),
                               upstream_timeout=args.upstream_timeout, seed=args.seed)
    # SIGTERM and SIGINT are blocked here, before any thread starts (threads inherit the mask), and taken with
    # sigwait: a Python handler runs only in the main thread, and a signal the kernel hands to another thread would
    # leave a main thread blocked on an Event asleep for good (seen under load).
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    running = server.start(settings, "0.0.0.0", args.port, args.metrics_port)
    logs.event("sampler listening", port=args.port, metrics_port=args.metrics_port, upstream=args.upstream,
               guard=args.guard_url, fraction=args.fraction or 0.0, models=args.model_names,
               long_documents=args.long_documents)
    signal.sigwait(STOP_SIGNALS)
    logs.event("draining", in_flight=running.front.in_flight, queued=running.courier.queued())
    drained = running.drain(args.drain_seconds)
    logs.event("stopped", drained=drained, **running.metrics.copies())
