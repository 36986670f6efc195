"""A TEI-like ``/rerank`` server that really scores: ONNX Runtime on an exported cross-encoder, for the guard's
tests (its answers are computed, never canned). Same request and answer as TEI: ``{query, texts, raw_scores}`` in,
``[{"index", "score"}]`` by descending score out; scores are sigmoid probabilities unless ``raw_scores``."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from quality_guard.compare import sigmoid
from quantizer_job.steps.evaluation import verify
from quantizer_job.steps.tei import textenc


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


def tiny_pools(tmp: Path) -> dict[str, ScoringServer]:
    """Three pools over a tiny random cross-encoder made by the Job's own export and quantization: ``reference``
    (FP32, TEI's batches), ``cpu`` (the same FP32 graph, one pair per batch: float differences only) and
    ``truncated`` (its INT8 truncating at 12 tokens: a pool whose max input length is wrong). Close them after use.
    ``tmp / "original"`` gets the model as the Job publishes it for the GPU pool (weights, TEI's config.json, the
    tokenizer): what the guard's own FP32 reference loads."""
    from quantizer_job.steps.common import isa
    from quantizer_job.steps.graph import export
    from quantizer_job.steps.graph import quantize as Q
    from quantizer_job.steps.recipe_search.recipes import fixed_recipe
    from quantizer_job.steps.tei import layout
    from rerank_devcluster import devmodels

    src = devmodels.bert_cross_encoder(tmp / "model", seed=1)
    cfg = layout.read_config(src)
    max_len = textenc.max_input_length(cfg)
    info = export.run({"src_dir": str(src), "onnx_dir": str(tmp / "fp32"), "tokenizer_dir": str(tmp / "tok"),
                       "max_length": max_len, "pad_id": layout.pad_token_id(cfg), "threads": 1})
    fp32, tok = Path(info["onnx_path"]), Path(info["tokenizer_json"])
    target = isa.detect_local_target()
    recipe = fixed_recipe("dynamic", target, 1, True, isa.REDUCE_RANGE_REQUIRED[target], ("MatMul", "Attention"))
    int8 = Q.build_int8(fp32, tmp / "int8" / "model.onnx", recipe, tmp, int(cfg["num_attention_heads"]),
                        int(cfg["hidden_size"]))
    pad = layout.pad_token_id(cfg, tok)
    original = tmp / "original"
    original.mkdir()
    for name in layout.weight_files(src):
        shutil.copyfile(src / name, original / name)
    layout.write_json(original / "config.json", layout.tei_config(cfg, tok))
    layout.copy_tokenizer([tok.parent, src], original)
    return {"reference": ScoringServer(fp32, tok, pad, max_len),
            "cpu": ScoringServer(fp32, tok, pad, max_len, batch=1),
            "truncated": ScoringServer(int8, tok, pad, 12)}
