"""``rerank-activator``: the activator process (the chart runs it from the operator's image, templates/activator.yaml).

    rerank-activator [--port 8080] [--key-file /var/run/rerank-activator/key] [--hold-seconds 30]
                     [--remember-seconds 60] [--max-connections 256] [--max-body-bytes 4194304]
                     [--log-format json|text]

It refuses to start without a usable key (the file missing, empty or under 32 bytes): an activator that could
verify nothing would either hold every request a pod sends or none, and both fail silently. On SIGTERM it drains
(:meth:`.server.Running.drain`) and exits 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from rerank_contracts import activator

from . import logs, server


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
    parser.add_argument("--log-format", choices=["json", "text"], default="json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logs.configure(args.log_format)
    try:
        key = activator.read_key(args.key_file)
    except (OSError, ValueError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        sys.exit(f"rerank-activator: no usable key in {args.key_file}: {detail} (the chart mounts the Secret "
                 f"named by activator.keySecret, or the one it makes, there)")
    settings = server.Settings(key=key, hold_seconds=args.hold_seconds, remember_seconds=args.remember_seconds,
                               max_connections=int(args.max_connections), max_body_bytes=int(args.max_body_bytes))
    running = server.start(settings, "0.0.0.0", args.port)
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
