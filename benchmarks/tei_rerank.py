"""FP32 vs INT8 model directories served the way TEI serves them, driven through ``/rerank`` by concurrent clients.
Prints JSON: pairs/s, request p50/p95, Spearman and top-3 agreement vs FP32 PyTorch, size vs the FP32 ONNX, and
PyTorch FP32 throughput on the same pairs with the same threads.

    python benchmarks/tei_rerank.py --fixture minilm-ce [--router /path/to/text-embeddings-router]
        [--variants auto,seed-plain-pertensor,...] [--clients 4] [--rounds 3] [--chunk 8] [--queries 80]

Fixtures are the trained cross-encoders of ``benchmarks/trained_fixture.py`` (built and cached on first use); every
query of the fixture's held-out ``eval.jsonl`` is one ``/rerank`` request with its 15 texts.

Harness (``"harness"`` in the output):
- ``tei-router``: ``--router`` given: each directory is served by a real ``text-embeddings-router`` (ORT backend)
  on a local port, one after the other, and the clients POST ``/rerank`` with ``raw_scores``.
- ``ort-fallback``: no router: an in-process stand-in built as TEI's ORT backend is: one ONNX Runtime 1.22 session,
  ``ORT_ENABLE_ALL``, intra-op threads = CPUs, one inference at a time, FIFO queue of pairs, batches of at most 8
  pairs padded to their longest, tokenization in the client threads.

Variants: ``fp32`` (the optimum-style FP32 export, the baseline) is always served; ``auto`` is the artifact
``rerank-quantize --recipe auto`` publishes (given the fixture's eval and calibration pairs); any other name is a
recipe of :data:`RECIPES` quantized in-process. All variants are served at once (one router each) and take turns
``--chunk`` queries at a time (the order rotating), over all queries, ``--rounds`` times: every variant sees the same
minutes of the machine, so load from other processes slows all of them alike (whole-run turns gave per-round ratios
from 0.8x to 5x on a shared machine). Throughput is total pairs over total time; per-round figures are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import trained_fixture

from quantizer_job import evaldata, export, isa, layout, metrics, textenc, verify
from quantizer_job import quantize as Q

TEI_MAX_BATCH = verify.TEI_MAX_BATCH


def _recipes() -> dict[str, Q.Recipe]:
    out = {r.name: r for r in Q.benchmark_recipes("avx512_vnni")}
    return out


# --- model directories ----------------------------------------------------------------------------------------------
def tei_dir(onnx_path: Path, src: Path, tok_json: Path, dst: Path) -> Path:
    """A directory TEI can serve: the graph (+ external data), config.json fixed for TEI, the tokenizer files."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(onnx_path, dst / layout.MODEL_FILE)
    data = onnx_path.with_name(onnx_path.name + "_data")
    if data.exists():
        shutil.copyfile(data, dst / layout.DATA_FILE)
    cfg = layout.read_config(src)
    layout.write_json(dst / "config.json", layout.tei_config(cfg, tok_json))
    layout.copy_tokenizer([tok_json.parent, src] if tok_json.parent != src else [src], dst)
    return dst


def prepare(fx: dict, work: Path, variants: list[str], threads: int) -> tuple[dict[str, Path], dict]:
    src = Path(fx["model_dir"])
    cfg = layout.read_config(src)
    exp = export.run({"src_dir": str(src), "onnx_dir": str(work / "fp32"), "tokenizer_dir": str(work / "tok"),
                      "max_length": textenc.max_input_length(cfg), "pad_id": layout.pad_token_id(cfg),
                      "threads": threads})
    fp32, tok_json = Path(exp["onnx_path"]), Path(exp["tokenizer_json"])
    dirs = {"fp32": tei_dir(fp32, src, tok_json, work / "serve" / "fp32")}
    notes: dict = {}
    recipes = _recipes()
    cache: dict = {}
    heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    for v in variants:
        if v == "auto":
            vol = work / "vol"
            cmd = [sys.executable, "-m", "quantizer_job", "--model", str(src), "--output", str(vol),
                   "--artifact-id", "bench", "--recipe", "auto", "--eval-pairs", fx["eval_jsonl"],
                   "--calibration-pairs", fx["calib_jsonl"], "--no-keep-original"]
            t0 = time.monotonic()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            notes["auto"] = {"job_seconds": round(time.monotonic() - t0, 1), "job_reason": res.get("reason"),
                             "chosen": res["recipe"].get("name"), "job_quality": res.get("quality"),
                             "tried": res["recipe"].get("tried")}
            if res.get("ok"):
                dirs["auto"] = vol / "artifacts" / "bench" / "cpu-int8"
            continue
        r = recipes[v]
        out = work / "q" / v / "model.onnx"
        t0 = time.monotonic()
        Q.build_int8(fp32, out, r, work / "opt", heads, hidden, calib_feeds=calib_feeds(fx, tok_json, cfg),
                     input_names=exp["input_names"], cache=cache)
        notes[v] = {"build_seconds": round(time.monotonic() - t0, 1)}
        dirs[v] = tei_dir(out, src, tok_json, work / "serve" / v)
    return dirs, notes


def calib_feeds(fx: dict, tok_json: Path, cfg: dict) -> list[dict]:
    """The Job's calibration batches: up to 256 of the fixture's training pairs, balanced across lengths."""
    tok = textenc.load_tokenizer(str(tok_json), textenc.max_input_length(cfg))
    pairs = [(p.query, p.text) for p in evaldata.load_jsonl(fx["calib_jsonl"])]
    chosen = evaldata.balance_by_length(textenc.token_lengths(tok, pairs), n=min(len(pairs), 256))
    return textenc.make_batches(tok, [pairs[i] for i in chosen], layout.pad_token_id(cfg, tok_json), batch_size=8)


# --- servers ----------------------------------------------------------------------------------------------------------
class FallbackServer:
    """TEI's ORT backend in-process: FIFO queue of pairs, one worker running batches of <= 8 pairs."""

    harness = "ort-fallback"

    def __init__(self, model_dir: Path, threads: int):
        cfg = layout.read_config(model_dir)
        self.tok = textenc.load_tokenizer(str(model_dir / "tokenizer.json"), textenc.max_input_length(cfg))
        self.pad = layout.pad_token_id(cfg, model_dir / "tokenizer.json")
        self.sess = verify.make_session(model_dir / layout.MODEL_FILE, threads)
        self.names = [i.name for i in self.sess.get_inputs()]
        self.q: queue.Queue = queue.Queue()
        self.worker = threading.Thread(target=self._loop, daemon=True)
        self.worker.start()

    def _loop(self) -> None:
        while True:
            first = self.q.get()
            if first is None:
                return
            items = [first]
            while len(items) < TEI_MAX_BATCH:
                try:
                    nxt = self.q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self.q.put(None)
                    break
                items.append(nxt)
            n = max(len(e.ids) for e, _ in items)
            feed = {k: np.zeros((len(items), n), np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
            feed["input_ids"][:] = self.pad
            for i, (e, _) in enumerate(items):
                k = len(e.ids)
                feed["input_ids"][i, :k], feed["attention_mask"][i, :k], feed["token_type_ids"][i, :k] = \
                    e.ids, 1, e.type_ids
            try:
                out = self.sess.run(["logits"], {k: feed[k] for k in self.names})[0][:, 0]
                for (_, fut), s in zip(items, out, strict=True):
                    fut.set_result(float(s))
            except Exception as exc:
                for _, fut in items:
                    fut.set_exception(exc)

    def rerank(self, query: str, texts: list[str]) -> list[float]:
        encs = self.tok.encode_batch([(query, t) for t in texts])
        futs = []
        for e in encs:
            f: Future = Future()
            self.q.put((e, f))
            futs.append(f)
        return [f.result() for f in futs]

    def close(self) -> None:
        self.q.put(None)
        self.worker.join()


class RouterServer:
    """A real ``text-embeddings-router`` serving ``model_dir`` on a free local port."""

    harness = "tei-router"

    def __init__(self, binary: str, model_dir: Path, log: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.logf = open(log, "w")  # noqa: SIM115 - the router writes to it until close()
        self.proc = subprocess.Popen([binary, "--model-id", str(model_dir), "--hostname", "127.0.0.1", "--port",
                                      str(self.port), "--dtype", "float32", "--max-client-batch-size", "64"],
                                     stdout=self.logf, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, HOSTNAME="127.0.0.1"))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"router exited {self.proc.returncode}; see {log}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2).read()
                return
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"router did not become healthy; see {log}")

    def rerank(self, query: str, texts: list[str]) -> list[float]:
        body = json.dumps({"query": query, "texts": texts, "raw_scores": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/rerank", data=body,
                                     headers={"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=600).read())
        scores = [0.0] * len(texts)
        for r in out:
            scores[r["index"]] = float(r["score"])
        return scores

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.logf.close()


def drive(server, groups: list[tuple[str, list[str]]], clients: int) -> dict:
    """Every query of ``groups`` once, ``clients`` requests in flight: scores in input order, wall time, latencies."""
    lat: list[float] = [0.0] * len(groups)
    scores: list[list[float]] = [[] for _ in groups]

    def one(i: int) -> None:
        t = time.perf_counter()
        scores[i] = server.rerank(*groups[i])
        lat[i] = time.perf_counter() - t

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        list(ex.map(one, range(len(groups))))
    return {"scores": scores, "seconds": time.perf_counter() - t0, "latencies": lat,
            "pairs": sum(len(ts) for _, ts in groups)}


def interleaved(servers: dict, groups: list[tuple[str, list[str]]], clients: int, rounds: int,
                chunk: int) -> dict[str, dict]:
    """Serve ``groups`` through every server, ``chunk`` queries at a time, taking turns (the order rotates each
    chunk), ``rounds`` times. Every variant sees the same minutes of the machine, so load from other processes
    changes all of them alike and the ratios between them stay meaningful: per-round throughput is kept too."""
    names = list(servers)
    for s in servers.values():  # warm-up (allocation, prepacking)
        s.rerank(groups[0][0], groups[0][1][:2])
    acc = {v: {"seconds": 0.0, "pairs": 0, "latencies": [], "rounds": [], "scores": None} for v in names}
    turn = 0
    for _ in range(rounds):
        per_round = {v: [0.0, 0] for v in names}
        scores: dict[str, list[list[float]]] = {v: [] for v in names}
        for i in range(0, len(groups), chunk):
            part = groups[i:i + chunk]
            order = names[turn % len(names):] + names[:turn % len(names)]
            turn += 1
            for v in order:
                r = drive(servers[v], part, clients)
                per_round[v][0] += r["seconds"]
                per_round[v][1] += r["pairs"]
                acc[v]["latencies"] += r["latencies"]
                scores[v] += r["scores"]
        for v in names:
            acc[v]["seconds"] += per_round[v][0]
            acc[v]["pairs"] += per_round[v][1]
            acc[v]["rounds"].append(per_round[v][1] / per_round[v][0])
            if acc[v]["scores"] is None:
                acc[v]["scores"] = np.concatenate([np.asarray(x) for x in scores[v]])
    return {v: {"scores": a["scores"], "pairs_per_s": a["pairs"] / a["seconds"], "rounds": a["rounds"],
                "p50_ms": metrics.percentile(a["latencies"], 50) * 1e3,
                "p95_ms": metrics.percentile(a["latencies"], 95) * 1e3} for v, a in acc.items()}


def torch_fp32(model_dir: Path, groups, threads: int) -> dict:
    """transformers cross-encoder in PyTorch FP32: the same pairs in batches of 8, same threads."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    pairs = [(q, t) for q, ts in groups for t in ts]
    out = []
    with torch.inference_mode():
        b = tok([pairs[0][0]], [pairs[0][1]], return_tensors="pt")
        if model.config.type_vocab_size <= 1:
            b.pop("token_type_ids", None)
        model(**b)
        t0 = time.perf_counter()
        for i in range(0, len(pairs), TEI_MAX_BATCH):
            chunk = pairs[i:i + TEI_MAX_BATCH]
            b = tok([p[0] for p in chunk], [p[1] for p in chunk], padding=True, truncation="longest_first",
                    max_length=512, return_tensors="pt")
            if model.config.type_vocab_size <= 1:  # XLM-R family: no segment embeddings
                b.pop("token_type_ids", None)
            out.append(model(**b).logits[:, 0].numpy())
        total = time.perf_counter() - t0
    return {"scores": np.concatenate(out).astype(np.float64), "pairs_per_s": len(pairs) / total}


def dir_bytes(d: Path) -> int:
    return sum((d / n).stat().st_size for n in (layout.MODEL_FILE, layout.DATA_FILE) if (d / n).exists())


def run(fixture: str, variants: list[str], router: str | None, clients: int, rounds: int, queries: int,
        threads: int, work: Path, chunk: int = 8) -> dict:
    fx = trained_fixture.make_fixture(fixture, threads=threads)
    groups = [(p["query"], p["texts"]) for p in map(json.loads, Path(fx["eval_jsonl"]).read_text().splitlines())]
    groups = groups[:queries]
    dirs, notes = prepare(fx, work, variants, threads)
    keys = [q for q, ts in groups for _ in ts]
    tref = torch_fp32(Path(fx["model_dir"]), groups, threads)
    servers: dict = {}
    try:
        for v, d in dirs.items():
            servers[v] = RouterServer(router, d, work / f"router-{v}.log") if router else FallbackServer(d, threads)
        runs = interleaved(servers, groups, clients, rounds, chunk)
    finally:
        for srv in servers.values():
            srv.close()
    torch_again = torch_fp32(Path(fx["model_dir"]), groups, threads)
    torch_pps = statistics.median([tref["pairs_per_s"], torch_again["pairs_per_s"]])
    fp32 = runs["fp32"]
    fp32_bytes = dir_bytes(dirs["fp32"])
    rows = {}
    for v, r in runs.items():
        s = r["scores"]
        per_round = [x / f for x, f in zip(r["rounds"], fp32["rounds"], strict=True)]
        rows[v] = {"pairs_per_s": round(r["pairs_per_s"], 2),
                   "x_fp32_ort": round(r["pairs_per_s"] / fp32["pairs_per_s"], 2),
                   "x_fp32_ort_per_round": [round(x, 2) for x in per_round],
                   "x_torch_fp32": round(r["pairs_per_s"] / torch_pps, 2),
                   "p50_ms": round(r["p50_ms"], 1), "p95_ms": round(r["p95_ms"], 1),
                   "spearman_vs_torch": round(metrics.spearman(tref["scores"], s), 5),
                   "top3_vs_torch": round(metrics.topk_agreement(keys, tref["scores"], s, 3), 4),
                   "spearman_vs_fp32_ort": round(metrics.spearman(fp32["scores"], s), 5),
                   "top3_vs_fp32_ort": round(metrics.topk_agreement(keys, fp32["scores"], s, 3), 4),
                   "model_bytes": dir_bytes(dirs[v]), "size_vs_fp32": round(dir_bytes(dirs[v]) / fp32_bytes, 3),
                   "rounds_pairs_per_s": [round(x, 2) for x in r["rounds"]], **notes.get(v, {})}
    enc_lens = textenc.token_lengths(textenc.load_tokenizer(str(dirs["fp32"] / "tokenizer.json"), 512),
                                     [(q, t) for q, ts in groups for t in ts])
    for v, n in notes.items():
        if v not in rows:
            rows[v] = {"not_served": "the Job published nothing", **n}
    return {"fixture": fixture, "harness": RouterServer.harness if router else FallbackServer.harness,
            "router": router, "clients": clients, "rounds": rounds,
            "chunk_queries": chunk, "threads": threads, "queries": len(groups),
            "pairs": len(keys), "median_tokens": int(np.median(enc_lens)),
            "torch_fp32_pairs_per_s": round(torch_pps, 2), "fixture_training": fx.get("heldout_vs_teacher"),
            "variants": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", default="minilm-ce")
    ap.add_argument("--variants", default="auto")
    ap.add_argument("--router", default=None, help="path to a text-embeddings-router binary (ORT backend)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=8, help="queries each variant serves before the next one's turn")
    ap.add_argument("--queries", type=int, default=80)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    import onnxruntime

    threads = isa.cpu_budget()
    variants = [v for v in a.variants.split(",") if v and v != "fp32"]
    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        out = run(a.fixture, variants, a.router, a.clients, a.rounds, a.queries, threads, Path(tmp), a.chunk)
    out.update(onnxruntime=onnxruntime.__version__, target=isa.detect_local_target(),
               loadavg_after=os.getloadavg()[0])
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
