"""A TEI-like ``/rerank`` server that really scores: ONNX Runtime on an exported cross-encoder, for the guard's
tests (its answers are computed, never canned). Same request and answer as TEI: ``{query, texts, raw_scores}`` in,
``[{"index", "score"}]`` by descending score out; scores are sigmoid probabilities unless ``raw_scores``."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from quality_guard.compare import sigmoid
from quantizer_job import textenc, verify


class ScoringServer:
    def __init__(self, model: Path, tokenizer_json: Path, pad_id: int, max_length: int,
                 batch: int = verify.TEI_MAX_BATCH) -> None:
        self.batch = batch
        self.session = verify.make_session(model, 1)
        self.names = [i.name for i in self.session.get_inputs()]
        self.tok = textenc.load_tokenizer(str(tokenizer_json), max_length)
        self.pad_id = pad_id
        self.calls = 0
        self._lock = threading.Lock()  # one inference at a time, as TEI's backend
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                scores = outer.rerank(body["query"], body["texts"], bool(body.get("raw_scores", False)))
                ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
                data = json.dumps([{"index": i, "score": scores[i]} for i in ranked]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def rerank(self, query: str, texts: list[str], raw: bool) -> list[float]:
        out: list[float] = []
        with self._lock:
            self.calls += 1
            for i in range(0, len(texts), self.batch):  # TEI's batches: at most 8 pairs
                feed = textenc.encode_pairs(self.tok, [(query, t) for t in texts[i : i + self.batch]], self.pad_id)
                logits = self.session.run(["logits"], {n: feed[n] for n in self.names})[0][:, 0]
                out += [float(x) for x in (logits if raw else sigmoid(logits))]
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
