"""TEI's HTTP front over a published artifact, for the demo where no TEI image can run (the dev cluster's pools are
kwok pods; container registries cannot be reached here).

It answers ``POST /rerank``, ``POST /tokenize``, ``GET /health`` and ``GET /info`` in TEI's shapes, scoring with the
artifact's own CPU directory (the INT8 ``model.onnx`` and ``tokenizer.json`` the CPU pool's TEI would load) through ONNX
Runtime, as TEI's ORT backend does: the same graph, the same tokenizer, pairs truncated to the artifact's maximum input
length, a sigmoid on the logit unless ``raw_scores``, results sorted by score, the tokens computed in
``x-compute-tokens``; ``/tokenize`` gives each token's UTF-8 byte offsets, as TEI's does. The demo serves it on the CPU
pool pods' addresses (the pod CIDR made local to this machine, as tests/cluster/test_gateway.py does), so that a request
sent to the real gateway, routed by the operator's HTTPRoute to the pool's Service and its EndpointSlice, reaches the
real artifact. It is not TEI: no batching queue, no metrics; a stand-in for the last hop only.
"""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rerank_contracts import artifact_layout

TEI_PORT = 8080


class Scorer:
    """An artifact's CPU directory, loaded once: ``score(query, texts)`` gives one logit per text."""

    def __init__(self, artifact: Path) -> None:
        from quantizer_job.steps.evaluation import verify
        from quantizer_job.steps.tei import layout, textenc

        cpu = artifact / artifact_layout.CPU_SUBDIR
        manifest = json.loads((artifact / artifact_layout.MANIFEST_FILE).read_text())
        config = json.loads((cpu / "config.json").read_text())
        self.max_length = int(manifest.get("max_input_tokens") or textenc.tei_max_input_length(cpu, config))
        self.pad_id = int(config.get("pad_token_id") or 0)
        self.tokenizer = textenc.load_tokenizer(str(cpu / "tokenizer.json"), self.max_length)
        self.whole = textenc.load_tokenizer(str(cpu / "tokenizer.json"), 1 << 30)  # /tokenize: TEI never cuts
        self.session = verify.make_session(cpu / layout.MODEL_FILE, threads=1)
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.encode = textenc.encode_pairs
        self.lock = threading.Lock()

    def score(self, query: str, texts: list[str]) -> tuple[list[float], int]:
        """One logit per text, and the tokens computed (the batch's attention mask)."""
        feed = {k: v for k, v in self.encode(self.tokenizer, [(query, t) for t in texts], self.pad_id).items()
                if k in self.inputs}
        with self.lock:
            (logits,) = self.session.run(None, feed)[:1]
        return [float(x) for x in logits.reshape(len(texts), -1)[:, 0]], int(feed["attention_mask"].sum())

    def tokenize(self, text: str) -> list[dict[str, Any]]:
        """TEI's ``/tokenize`` of one text without special tokens: character offsets made byte offsets."""
        encoding = self.whole.encode(text, add_special_tokens=False)
        starts = [0]
        for ch in text:
            starts.append(starts[-1] + len(ch.encode("utf-8")))
        return [{"id": i, "text": t, "special": False, "start": starts[a], "stop": starts[b]}
                for i, t, (a, b) in zip(encoding.ids, encoding.tokens, encoding.offsets, strict=True)]


def answer(scorer: Scorer, body: Any) -> tuple[int, Any, int]:
    """TEI's ``/rerank``: ``{"query", "texts"[, "raw_scores", "return_text"]}`` -> ``[{"index", "score"}]``, and the
    tokens computed."""
    if not isinstance(body, dict) or not isinstance(body.get("query"), str) or not isinstance(body.get("texts"), list) \
            or not body["texts"] or not all(isinstance(t, str) for t in body["texts"]):
        return 422, {"error": "expected {\"query\": string, \"texts\": [string, ...]}", "error_type": "Validation"}, 0
    logits, tokens = scorer.score(body["query"], body["texts"])
    raw = bool(body.get("raw_scores"))
    results = [{"index": i, "score": s if raw else 1.0 / (1.0 + math.exp(-s)),
                **({"text": body["texts"][i]} if body.get("return_text") else {})} for i, s in enumerate(logits)]
    return 200, sorted(results, key=lambda r: -float(r["score"])), tokens


def tokenized(scorer: Scorer, body: Any) -> tuple[int, Any]:
    """TEI's ``/tokenize``: ``{"inputs": str | [str]}`` -> one list of tokens per input."""
    inputs = body.get("inputs") if isinstance(body, dict) else None
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        return 422, {"error": "expected {\"inputs\": string or [string, ...]}", "error_type": "Validation"}
    return 200, [scorer.tokenize(t) for t in texts]


def serve(scorer: Scorer, address: str, model_id: str, port: int = TEI_PORT) -> ThreadingHTTPServer:
    """Serve ``scorer`` on ``address:port`` in a background thread; the server (``shutdown`` stops it)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, code: int, payload: Any, tokens: int | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            if tokens is not None:
                self.send_header("x-compute-tokens", str(tokens))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/info":
                self._send(200, {"model_id": model_id, "model_type": {"reranker": {}},
                                 "max_input_length": scorer.max_length, "stand_in": "rerank_devcluster"})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                body = None
            if self.path == "/rerank":
                self._send(*answer(scorer, body))
            elif self.path == "/tokenize":
                self._send(*tokenized(scorer, body))
            else:
                self._send(404, {"error": "not found"})

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=f"artifact-server-{address}", daemon=True).start()
    return server
