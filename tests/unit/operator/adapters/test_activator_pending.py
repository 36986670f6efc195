"""The autoscaler's read of the activator's GET /pending (adapters/activator_pending.py), against a real HTTP server
that checks the token as the activator does."""

from __future__ import annotations

import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rerank_contracts import activator
from rerank_operator.adapters import activator_pending
from rerank_operator.core.autoscale.signals import ActivatorDemand
from rerank_operator.core.platform import Activator

KEY = b"p" * 48
BODY = {"models": {"team-a/m1": {"waiting": 2, "first": 100.0, "last": 105.5},
                   "team-b/m2": {"waiting": 0, "first": 90.0, "last": 91.0},
                   "no-slash": {"waiting": 1}, "team-c/m3": "garbage"}}


@pytest.fixture
def server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            good = hmac.compare_digest(self.headers.get(activator.TOKEN_HEADER, ""), activator.pending_token(KEY))
            if self.path != activator.PENDING_PATH or not good:
                self.send_response(401)
                self.end_headers()
                return
            data = json.dumps(BODY).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_the_pending_models_are_read_with_the_shared_key(server: str) -> None:
    got = activator_pending.fetch(Activator(server, "ns", "act", key=KEY))
    assert got == {("team-a", "m1"): ActivatorDemand(2, 105.5), ("team-b", "m2"): ActivatorDemand(0, 91.0)}


def test_a_wrong_key_or_no_activator_reads_as_nothing_known(server: str) -> None:
    assert activator_pending.fetch(Activator(server, "ns", "act", key=b"x" * 48)) is None
    assert activator_pending.fetch(Activator("http://127.0.0.1:9", "ns", "act", key=KEY)) is None
