"""``rerank-activator``: the activator process (the chart runs it from the operator's image, templates/activator.yaml).

    rerank-activator [--port 8080] [--key-file /var/run/rerank-activator/key] [--hold-seconds 30]
                     [--remember-seconds 60] [--max-connections 256] [--max-body-bytes 4194304]
                     [--max-held-bytes 33554432] [--max-held-per-namespace 64]
                     [--log-format json|text] [--api-server URL --api-ca-file F --api-token-file F]

It refuses to start without a usable key (the file missing, empty or under 32 bytes): an activator that could
verify nothing would either hold every request a pod sends or none, and both fail silently. It reads its models'
Services' EndpointSlices (:mod:`.endpoints`) with its pod's ServiceAccount, or with the ``--api-*`` flags when run
outside a pod. On SIGTERM it drains
(:meth:`.server.Running.drain`) and exits 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from rerank_contracts import activator

from . import endpoints, logs, server


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its message
    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rerank-activator", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--port", type=int, default=activator.PORT, help="the one port: requests to hold, /pending, "
                        "/metrics, /healthz, /readyz (default %(default)s)")
    parser.add_argument("--key-file", default=activator.KEY_FILE,
                        help="the HMAC key shared with the operator (default %(default)s)")
    parser.add_argument("--hold-seconds", type=_positive(float), default=30.0,
                        help="how long a request waits for its model's pool before a 503 (default %(default)s)")
    parser.add_argument("--remember-seconds", type=_positive(float), default=60.0,
                        help="how long a model stays on /pending after its last request (default %(default)s)")
    parser.add_argument("--max-connections", type=_positive(int), default=256,
                        help="open connections at most; more are closed at accept (default %(default)s)")
    parser.add_argument("--max-body-bytes", type=_positive(int), default=4 * 1024 * 1024,
                        help="the largest request body taken (default %(default)s)")
    parser.add_argument("--max-held-bytes", type=_positive(int), default=32 * 1024 * 1024,
                        help="all held requests' bodies over 128 KiB together, at most; one namespace may hold a "
                        "quarter (default %(default)s)")
    parser.add_argument("--max-held-per-namespace", type=_positive(int), default=64,
                        help="requests held for one namespace's models at once, at most (default %(default)s)")
    parser.add_argument("--log-format", choices=["json", "text"], default="json")
    parser.add_argument("--api-server", help="the API server's URL, outside a pod (default: the pod's own)")
    parser.add_argument("--api-ca-file", help="the CA of the API server's certificate, with --api-server")
    parser.add_argument("--api-token-file", help="a bearer token for the API server, with --api-server")
    return parser.parse_args(argv)


def _api_access(args: argparse.Namespace) -> endpoints.ApiAccess:
    given = [args.api_server, args.api_ca_file, args.api_token_file]
    if any(given) and not all(given):
        raise ValueError("--api-server, --api-ca-file and --api-token-file go together")
    if args.api_server:
        return endpoints.ApiAccess(args.api_server, args.api_ca_file, args.api_token_file)
    return endpoints.ApiAccess.in_cluster()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logs.configure(args.log_format)
    try:
        keys = activator.read_keys(args.key_file)
    except (OSError, ValueError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        sys.exit(f"rerank-activator: no usable key in {args.key_file}: {detail} (the chart mounts the Secret "
                 f"named by activator.keySecret, or the one it makes, there)")
    try:
        api = _api_access(args)
    except ValueError as exc:
        sys.exit(f"rerank-activator: cannot reach the API server: {exc}")
    settings = server.Settings(key=keys[0], also_accepted=keys[1:], hold_seconds=args.hold_seconds,
                               remember_seconds=args.remember_seconds,
                               max_connections=int(args.max_connections), max_body_bytes=int(args.max_body_bytes),
                               max_held_bytes=int(args.max_held_bytes),
                               max_held_per_namespace=int(args.max_held_per_namespace))
    running = server.start(settings, "0.0.0.0", args.port, locate=endpoints.Endpoints(api).locate)
    logs.event("activator listening", port=args.port, hold_seconds=args.hold_seconds,
               remember_seconds=args.remember_seconds, max_connections=settings.max_connections)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # Python runs signal handlers in the main thread only, and the kernel may deliver SIGTERM to any thread: a main
    # thread blocked in an untimed wait would then never run the handler (the drain hung under load). Wake it often.
    while not stop.wait(0.5):
        pass
    logs.event("draining", waiting=running.holder.board.waiting())
    drained = running.drain()
    logs.event("stopped", drained=drained)
