"""The guard's calls to the pools (quality_guard/endpoints.py) carry the model's mirror token, so that a pool's
sampler (rerank_sampler, on a gateway without RequestMirror) knows them for the guard's own and never copies them
back; the API key of a pool behind --api-key goes as a bearer token."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from quality_guard import endpoints
from rerank_contracts.guard import MIRROR_TOKEN_HEADER


class Recorder(ThreadingHTTPServer):
    headers_seen: list[dict[str, str]]


@pytest.fixture
def tei() -> Iterator[Recorder]:
    class Handler(BaseHTTPRequestHandler):
        server: Recorder

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.server.headers_seen.append(dict(self.headers.items()))
            answer = json.dumps([{"index": i, "score": 1.0 / (i + 1)} for i in range(len(body["texts"]))]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = Recorder(("127.0.0.1", 0), Handler)
    server.headers_seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_guards_calls_carry_the_mirror_token_and_the_pools_key(tei: Recorder) -> None:
    base = f"http://127.0.0.1:{tei.server_address[1]}"
    post = endpoints.http_post(5.0, {base: "key-1"}, token="t0ken")
    assert post(base, {"query": "q", "texts": ["a", "b"]}) == [1.0, 0.5]
    [seen] = tei.headers_seen
    assert seen[MIRROR_TOKEN_HEADER] == "t0ken" and seen["Authorization"] == "Bearer key-1"
    endpoints.http_post(5.0)(base, {"query": "q", "texts": ["a"]})  # a guard run by hand has no token to send
    assert MIRROR_TOKEN_HEADER not in tei.headers_seen[1] and "Authorization" not in tei.headers_seen[1]
