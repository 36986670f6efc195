"""Model directories served the way TEI serves them, and the clients that drive them: what the benchmarks share.

- model directories: :func:`tei_dir` lays out an ONNX graph as TEI reads it (the Job's CPU layout); :func:`prepare`
  makes the FP32 baseline and the variants (``auto``: the Job itself, :func:`run_job`; any other name a recipe of
  :func:`recipes`, quantized in-process with the Job's calibration batches, :func:`calib_feeds`);
- servers: :class:`RouterServer`, a real ``text-embeddings-router`` (ORT backend) on a local port, and
  :class:`FallbackServer`, an in-process stand-in built as TEI's ORT backend is (one session, a FIFO queue of pairs,
  batches within TEI's token budget); both answer ``rerank(query, texts)``;
- clients: :func:`drive` (concurrent ``/rerank`` requests), :func:`interleaved` (variants taking turns so that they
  share the machine's minutes alike), a router's CPU split by thread (:func:`process_cpu`, :func:`cpu_split`), and
  CPU placement (:func:`placement`, :func:`taskset`, :func:`on_cpus`);
- the reference: :func:`torch_fp32`, the transformers cross-encoder in PyTorch FP32 on the same pairs.

Used by ``benchmarks.tei_rerank`` (whose docstring describes the harness), ``tei_families``, ``ort_profile`` and
``guard_detection``.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from quantizer_job.steps.common import isa
from quantizer_job.steps.evaluation import evaldata, metrics, serving, verify
from quantizer_job.steps.graph import export
from quantizer_job.steps.graph import quantize as Q
from quantizer_job.steps.recipe_search.recipes import Recipe, benchmark_recipes, candidate_recipes
from quantizer_job.steps.tei import layout, textenc

REPO = Path(__file__).resolve().parents[1]
TEI_MAX_BATCH = serving.MAX_BATCH_ENTRIES


def recipes() -> dict[str, Recipe]:
    """Recipes by name: the benchmark recipes, and the Job's ``auto`` candidates for this machine (same names as
    its ``recipe.tried``; a candidate's definition wins where the names coincide)."""
    target = isa.detect_local_target()
    out = {r.name: r for r in benchmark_recipes(target)}
    out.update({r.name: r for r in candidate_recipes(target, "dynamic", has_calibration=True)})
    return out


# --- placement ------------------------------------------------------------------------------------------------------
def placement(pin: bool) -> tuple[list[int], list[int]]:
    """(serving CPUs, client CPUs): pinned, the first CPU serves and the others are the clients'; else all share."""
    cpus = sorted(os.sched_getaffinity(0))
    if pin and len(cpus) >= 2:
        return cpus[:1], cpus[1:]
    return cpus, cpus


def taskset(cpus: list[int], pin: bool) -> list[str]:
    """The command prefix that runs a process on ``cpus`` (nothing when unpinned)."""
    return ["taskset", "-c", ",".join(map(str, cpus))] if pin else []


@contextlib.contextmanager
def on_cpus(cpus: list[int]) -> Iterator[None]:
    """Run the calling thread (and the threads it starts) on ``cpus``; the previous affinity is restored after."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# --- model directories ----------------------------------------------------------------------------------------------
def tei_dir(onnx_path: Path, src: Path, tok_json: Path, dst: Path, exported: dict) -> Path:
    """A directory TEI can serve: the graph (+ external data), config.json fixed for TEI (with the sizes and padding
    id the export child resolved, as the Job publishes it), the tokenizer files, TEI's input length capped."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(onnx_path, dst / layout.MODEL_FILE)
    data = onnx_path.with_name(onnx_path.name + "_data")
    if data.exists():
        shutil.copyfile(data, dst / layout.DATA_FILE)
    cfg = layout.read_config(src)
    fixed = layout.tei_config(cfg, tok_json, resolved=exported.get("resolved_config"), pad_default=exported["pad_id"])
    layout.write_tei_metadata(dst, fixed, [tok_json.parent, src] if tok_json.parent != src else [src],
                              int(exported["max_positions"]))
    return dst


def run_job(fx: dict, work: Path, eval_jsonl: Path, prefix: list[str],
            serve_batch_tokens: int = 0) -> tuple[Path | None, dict]:
    """``rerank-quantize --recipe auto`` on the profiled pairs, under ``prefix`` (taskset): its artifact and figures.
    ``serve_batch_tokens``: the routers' --max-batch-tokens when set by hand (0: the Job's default, the pool's)."""
    src, vol = Path(fx["model_dir"]), work / "vol"
    cmd = [*prefix, sys.executable, "-m", "quantizer_job", "--model", str(src), "--output", str(vol),
           "--artifact-id", "bench", "--recipe", "auto", "--eval-pairs", str(eval_jsonl),
           "--calibration-pairs", fx["calib_jsonl"], "--no-keep-original",
           *(["--serve-batch-tokens", str(serve_batch_tokens)] if serve_batch_tokens else [])]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    (work / "job.stderr.log").write_text(proc.stderr)
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise SystemExit(f"the Job printed no result (exit {proc.returncode}): {proc.stderr[-2000:]}")
    res = json.loads(lines[-1])
    speed = res.get("speed") or {}
    keep = ("speedup", "speedup_low", "speedup_high", "kernel_speedup", "fp32_pairs_per_s", "int8_pairs_per_s",
            "kernel_fp32_pairs_per_s", "kernel_int8_pairs_per_s", "served_in_turns")
    note = {"job_seconds": round(time.monotonic() - t0, 1), "job_command_prefix": " ".join(prefix),
            "job_reason": res.get("reason"), "chosen": res["recipe"].get("name"), "job_quality": res.get("quality"),
            "job_speed": {k: speed[k] for k in keep if k in speed}, "tried": res["recipe"].get("tried")}
    return (vol / "artifacts" / "bench" / "cpu-int8" if res.get("ok") else None), note


def prepare(fx: dict, work: Path, variants: list[str], threads: int, eval_jsonl: Path | None = None,
            job_prefix: list[str] | None = None, serve_batch_tokens: int = 0) -> tuple[dict[str, Path], dict]:
    """The FP32 baseline's directory and each variant's, by name, and notes on how each was made. ``auto`` runs the
    Job (under ``job_prefix``) on ``eval_jsonl``, the pairs it gates and times on; other variants need neither."""
    src = Path(fx["model_dir"])
    cfg = layout.read_config(src)
    exp = export.run({"src_dir": str(src), "onnx_dir": str(work / "fp32"), "tokenizer_dir": str(work / "tok"),
                      "max_length": textenc.max_input_length(cfg), "pad_id": layout.declared_pad_token_id(cfg),
                      "threads": threads})
    fp32, tok_json = Path(exp["onnx_path"]), Path(exp["tokenizer_json"])
    dirs = {"fp32": tei_dir(fp32, src, tok_json, work / "serve" / "fp32", exp)}
    notes: dict = {}
    known = recipes()
    cache: dict = {}
    sizes = {**cfg, **exp.get("resolved_config", {})}
    heads, hidden = int(sizes["num_attention_heads"]), int(sizes["hidden_size"])
    for v in variants:
        if v == "auto":
            if eval_jsonl is None:
                raise SystemExit("the auto variant runs the Job, which needs the evaluation pairs (eval_jsonl)")
            d, notes["auto"] = run_job(fx, work, eval_jsonl, job_prefix or [], serve_batch_tokens)
            if d is not None:
                dirs["auto"] = d
            continue
        if v not in known:
            raise SystemExit(f"unknown variant {v!r}; recipes: {', '.join(sorted(known))}")
        r = known[v]
        out = work / "q" / v / "model.onnx"
        t0 = time.monotonic()
        Q.build_int8(fp32, out, r, work / "opt", heads, hidden, calib_feeds=calib_feeds(fx, tok_json, cfg),
                     input_names=exp["input_names"], cache=cache)
        notes[v] = {"build_seconds": round(time.monotonic() - t0, 1)}
        dirs[v] = tei_dir(out, src, tok_json, work / "serve" / v, exp)
    return dirs, notes


def calib_feeds(fx: dict, tok_json: Path, cfg: dict) -> list[dict]:
    """The Job's calibration batches: up to 256 of the fixture's training pairs, balanced across lengths."""
    tok = textenc.load_tokenizer(str(tok_json), textenc.max_input_length(cfg))
    pairs = [(p.query, p.text) for p in evaldata.load_jsonl(fx["calib_jsonl"])]
    chosen = evaldata.balance_by_length(textenc.token_lengths(tok, pairs), n=min(len(pairs), 256))
    return textenc.make_batches(tok, [pairs[i] for i in chosen], layout.pad_token_id(cfg, tok_json), batch_size=8)


# --- servers ----------------------------------------------------------------------------------------------------------
class FallbackServer:
    """TEI's ORT backend in-process: FIFO queue of pairs, one worker running batches of <= 8 pairs whose padded size
    stays within ``budget`` (--max-batch-tokens; TEI's queue rule, ``serving.batch_spans``).

    Not :func:`quantizer_job.steps.evaluation.serving.serve_pass`: that serves a fixed list of batches formed up
    front, with no requests, so it has no per-request latency and no interleaving of concurrent clients' pairs, which
    this server exists to show (``job_harness`` runs serve_pass itself). Its batch encoder tokenizes a whole batch,
    where TEI (and this queue) tokenize per request and batch the tokenized pairs."""

    harness = "ort-fallback"

    def __init__(self, model_dir: Path, threads: int, budget: int):
        cfg = layout.read_config(model_dir)
        self.budget = budget
        self.held: tuple | None = None  # a pair that did not fit the last batch: the next one's first
        self.tok = textenc.load_tokenizer(str(model_dir / "tokenizer.json"), textenc.max_input_length(cfg))
        self.pad = layout.pad_token_id(cfg, model_dir / "tokenizer.json")
        self.sess = verify.make_session(model_dir / layout.MODEL_FILE, threads)
        self.names = [i.name for i in self.sess.get_inputs()]
        self.q: queue.Queue = queue.Queue()
        self.worker = threading.Thread(target=self._loop, daemon=True)
        self.worker.start()

    def _loop(self) -> None:
        while True:
            first, self.held = (self.held or self.q.get()), None
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
                if max(len(nxt[0].ids), *(len(e.ids) for e, _ in items)) * (len(items) + 1) > self.budget:
                    self.held = nxt
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
    """A real ``text-embeddings-router`` serving ``model_dir`` on a free local port (under ``prefix``: taskset)."""

    harness = "tei-router"

    def __init__(self, binary: str, model_dir: Path, log: Path, budget: int, prefix: list[str] | None = None,
                 hostname: str = "127.0.0.1", port: int | None = None):
        """``hostname``/``port``: where it listens (default a free local port; a pod's address in gateway_e2e)."""
        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        self.hostname, self.port = hostname, port or ports[0]
        self.logf = open(log, "w")  # noqa: SIM115 - the router writes to it until close()
        self.proc = subprocess.Popen([*(prefix or []), binary, "--model-id", str(model_dir), "--hostname", hostname,
                                      "--port", str(self.port), "--prometheus-port", str(ports[1]),
                                      "--dtype", "float32", "--max-client-batch-size", "64",
                                      "--max-batch-tokens", str(budget)],
                                     stdout=self.logf, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, HOSTNAME=hostname))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"router exited {self.proc.returncode}; see {log}")
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=2).read()
                return
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"router did not become healthy; see {log}")

    @property
    def url(self) -> str:
        return f"http://{self.hostname}:{self.port}"

    def rerank(self, query: str, texts: list[str]) -> list[float]:
        body = json.dumps({"query": query, "texts": texts, "raw_scores": True}).encode()
        req = urllib.request.Request(f"{self.url}/rerank", data=body,
                                     headers={"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=600).read())
        scores = [0.0] * len(texts)
        for r in out:
            scores[r["index"]] = float(r["score"])
        return scores

    def cpu(self) -> dict:
        """The router's CPU seconds so far: in all (exited threads included) and per live thread (tid: name, s)."""
        return process_cpu(self.proc.pid)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.logf.close()


def _cpu_seconds(stat: Path) -> float:
    """utime + stime of a /proc stat file, in seconds (fields 14 and 15; the name before them may hold spaces)."""
    text = stat.read_text()
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> dict:
    threads = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            threads[t.name] = ((t / "comm").read_text().strip(), _cpu_seconds(t / "stat"))
    return {"total": _cpu_seconds(Path(f"/proc/{pid}/stat")), "threads": threads}


def cpu_split(before: dict, after: dict, pairs: int, seconds: float) -> dict:
    """Where a router's CPU went between two ``process_cpu`` readings: the busiest thread that is not tokio's is the
    backend's (TEI runs inference on one thread of its own: ONNX Runtime's intra-op work runs on it with one CPU);
    tokio's workers do HTTP, JSON and the rerank response; the rest is the tokenization workers, the queue and
    threads that exited. Per pair, and the share of the router's serving time it was on a CPU."""
    delta = {tid: (name, cpu - before["threads"].get(tid, (name, 0.0))[1])
             for tid, (name, cpu) in after["threads"].items()}
    tokio = sum(c for name, c in delta.values() if name.startswith("tokio"))
    inference = max((c for name, c in delta.values() if not name.startswith("tokio")), default=0.0)
    total = after["total"] - before["total"]
    per = lambda x: round(1e3 * x / pairs, 3)  # noqa: E731
    return {"cpu_s": round(total, 2), "busy_share": round(total / seconds, 3),
            "inference_ms_per_pair": per(inference), "tokio_ms_per_pair": per(tokio),
            "other_ms_per_pair": per(total - inference - tokio), "all_ms_per_pair": per(total)}



# --- clients --------------------------------------------------------------------------------------------------------
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
    cpu0 = {v: s.cpu() for v, s in servers.items() if hasattr(s, "cpu")}
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
    cpu = {v: cpu_split(c, servers[v].cpu(), acc[v]["pairs"], acc[v]["seconds"]) for v, c in cpu0.items()}
    return {v: {"scores": a["scores"], "pairs_per_s": a["pairs"] / a["seconds"], "rounds": a["rounds"],
                "p50_ms": metrics.percentile(a["latencies"], 50) * 1e3,
                "p95_ms": metrics.percentile(a["latencies"], 95) * 1e3,
                **({"router_cpu": cpu[v]} if v in cpu else {})} for v, a in acc.items()}


# --- the reference --------------------------------------------------------------------------------------------------
#: CPU flags with native BF16 matrix math (AMX tiles, or AVX-512 BF16 dot products): where a user's PyTorch BF16
#: autocast is a fair anchor. Without them PyTorch emulates BF16 and runs slower than FP32: no anchor at all.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def bf16_hardware(cpuinfo_text: str | None = None) -> str | None:
    """The BF16 flag this CPU has (``BF16_FLAGS``), or None."""
    text = cpuinfo_text if cpuinfo_text is not None else Path("/proc/cpuinfo").read_text()
    flags = isa.parse_cpu_flags(text)
    return next((f for f in BF16_FLAGS if f in flags), None)


def sorted_spans(lengths: list[int], size: int) -> tuple[list[int], list[tuple[int, int]]]:
    """What a user with an offline batch does: the pairs in order of length, in batches of ``size`` (little
    padding). Returns the order (indices into the pairs) and the spans over it."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return order, [(i, min(i + size, len(order))) for i in range(0, len(order), size)]


def torch_fp32(model_dir: Path, groups, threads: int, spans: list[tuple[int, int]] | None = None,
               order: list[int] | None = None, bf16: bool = False) -> dict:
    """transformers cross-encoder in PyTorch FP32: the same pairs in batches of 8, same threads; ``spans``: other
    batches ([start, end) pairs, e.g. within the routers' token budget, ``serving.batch_spans``), over the pairs in
    ``order`` (indices; scores come back in the pairs' own order). ``bf16``: under ``torch.autocast`` to BF16, what a
    user on an AMX or AVX-512 BF16 CPU would run (:func:`bf16_hardware`)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    pairs = [(q, t) for q, ts in groups for t in ts]
    idx = order if order is not None else list(range(len(pairs)))
    out = []
    token_types = textenc.uses_token_types(model.config.to_dict())
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with torch.inference_mode(), cast:
        b = tok([pairs[0][0]], [pairs[0][1]], return_tensors="pt")
        if not token_types:
            b.pop("token_type_ids", None)
        model(**b)
        t0 = time.perf_counter()
        for a, b in spans or [(i, i + TEI_MAX_BATCH) for i in range(0, len(pairs), TEI_MAX_BATCH)]:
            chunk = [pairs[i] for i in idx[a:b]]
            b = tok([p[0] for p in chunk], [p[1] for p in chunk], padding=True, truncation="longest_first",
                    max_length=512, return_tensors="pt")
            if not token_types:  # XLM-R, DistilBERT, DeBERTa-v3, ModernBERT: no segment embeddings
                b.pop("token_type_ids", None)
            out.append(model(**b).logits[:, 0].float().numpy())
        total = time.perf_counter() - t0
    scores = np.empty(len(pairs), dtype=np.float64)
    scores[idx] = np.concatenate(out).astype(np.float64)
    return {"scores": scores, "pairs_per_s": len(pairs) / total}


def dir_bytes(d: Path) -> int:
    return sum((d / n).stat().st_size for n in (layout.MODEL_FILE, layout.DATA_FILE) if (d / n).exists())

