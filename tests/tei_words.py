"""A TEI stand-in that scores by words, for the rerank API's tests: TEI's routes, limits and errors, a scorer a test
can reason about.

No TEI image runs here, so the tests of what the pods' front makes of TEI's routes need a server that behaves like
TEI where the front depends on it: ``GET /info`` (``max_input_length``, ``max_client_batch_size``), ``POST /tokenize``
(each token's UTF-8 byte offsets, no special tokens unless asked), ``POST /rerank`` (``{"query", "texts",
"truncate", "raw_scores"}`` -> ``[{"index", "score"}]`` by descending score, a batch over ``max_client_batch_size``
refused with 413 as TEI does, a pair over the model's input cut from the document's end when ``truncate``, refused
otherwise; ``x-compute-tokens``), and TEI's API key (``Authorization: Bearer``, 401 without it).

Its tokens are whitespace-separated words; its score of a pair is the sigmoid of how many of the query's words the
(cut) document holds: a relevant sentence beyond the model's input does not count, as in a real cross-encoder.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WORD = re.compile(rb"\S+")
SPECIALS = 4


def offsets(text: str) -> list[tuple[int, int]]:
    """Each word's byte offsets in ``text``'s UTF-8."""
    return [(m.start(), m.end()) for m in WORD.finditer(text.encode("utf-8"))]


def words(text: str) -> set[str]:
    return {w.lower().strip(".,;:!?") for w in text.split()}


class WordTei:
    """The stand-in on a free local port (or ``host``:``port``); ``calls`` counts the requests by path."""

    def __init__(self, max_input: int = 64, max_batch: int = 4, api_key: str | None = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.max_input, self.max_batch, self.api_key = max_input, max_batch, api_key
        self.calls: Counter[str] = Counter()
        self.bodies: list[Any] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer((host, port), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def score(self, query: str, text: str, truncate: bool = True) -> float:
        """The score ``/rerank`` gives the pair (the document cut to what fits beside the query)."""
        room = self.max_input - len(offsets(query)) - SPECIALS
        spans = offsets(text)
        kept = text.encode("utf-8")[:spans[room - 1][1]].decode("utf-8") if len(spans) > room and truncate else text
        q = words(query)
        return 1.0 / (1.0 + math.exp(-(4.0 * len(q & words(kept)) / max(len(q), 1) - 2.0)))

    def rerank(self, body: Any) -> tuple[int, Any, int]:
        query, texts = body.get("query"), body.get("texts")
        if not isinstance(query, str) or not query or not isinstance(texts, list) or not texts:
            return 422, {"error": "`query` and `texts` are required", "error_type": "Validation"}, 0
        if len(texts) > self.max_batch:
            return 413, {"error": f"batch size {len(texts)} > maximum allowed batch size {self.max_batch}",
                         "error_type": "Validation"}, 0
        truncate = bool(body.get("truncate", False))
        tokens = 0
        for text in texts:
            pair = len(offsets(query)) + len(offsets(text)) + SPECIALS
            if pair > self.max_input and not truncate:
                return 413, {"error": f"Input validation error: `inputs` must have less than {self.max_input} "
                             f"tokens. Given: {pair}", "error_type": "Validation"}, 0
            tokens += min(pair, self.max_input)
        scores = [{"index": i, "score": self.score(query, t, truncate)} for i, t in enumerate(texts)]
        return 200, sorted(scores, key=lambda s: -float(s["score"])), tokens

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        tei = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, status: int, payload: Any, tokens: int | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if tokens is not None:
                    self.send_header("x-compute-tokens", str(tokens))
                self.end_headers()
                self.wfile.write(data)

            def _allowed(self) -> bool:
                if tei.api_key is None or self.headers.get("Authorization") == f"Bearer {tei.api_key}":
                    return True
                self._send(401, {"error": "Unauthorized", "error_type": "Unauthorized"})
                return False

            def do_GET(self) -> None:
                with tei._lock:
                    tei.calls[self.path] += 1
                if not self._allowed():
                    return
                if self.path == "/info":
                    self._send(200, {"model_id": "words", "model_type": {"reranker": {}},
                                     "max_input_length": tei.max_input, "max_client_batch_size": tei.max_batch})
                elif self.path == "/health":
                    self._send(200, {})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw)
                with tei._lock:
                    tei.calls[self.path] += 1
                    tei.bodies.append(body)
                if not self._allowed():
                    return
                if self.path == "/rerank":
                    self._send(*tei.rerank(body))
                elif self.path == "/tokenize":
                    inputs = body["inputs"] if isinstance(body["inputs"], list) else [body["inputs"]]
                    self._send(200, [[{"id": 0, "text": t[a:b].decode(), "special": False, "start": a, "stop": b}
                                      for a, b in offsets(text) for t in [text.encode()]] for text in inputs])
                else:
                    self._send(404, {"error": "not found"})

        return Handler
