"""FP32 vs INT8 model directories served the way TEI serves them, driven through ``/rerank`` by concurrent clients,
next to what the quantization Job reports for the same model and pairs.
Prints JSON: pairs/s, request p50/p95, Spearman and top-3 agreement vs FP32 PyTorch, size vs the FP32 ONNX, and
PyTorch FP32 throughput on the same pairs with the same threads; for ``auto`` the Job's own speed figures and
``job_vs_router`` (the Job's speedup over the router's for the same artifact). ``user_anchors``: what a user would
run instead, on the same pairs and threads: PyTorch FP32 with length-sorted batches of 32 and, on CPUs with AMX-BF16
or AVX-512 BF16, BF16 autocast within the pool's budget and length-sorted (each variant's ``x_<anchor>``).

    python -m benchmarks.tei_rerank --fixture minilm-ce [--router /path/to/text-embeddings-router]
        [--profile fixture|short|longtail] [--variants auto,fused-matmul-perchannel-emb8,...] [--clients 4]
        [--rounds 3] [--chunk 8] [--queries 80] [--pin | --no-pin] [--job-harness | --no-job-harness]

Fixtures are the trained cross-encoders of ``benchmarks/trained_fixture.py`` (built and cached on first use); every
query of the fixture's held-out ``eval.jsonl`` is one ``/rerank`` request.

Length profiles (``--profile``), built from the fixture's held-out queries with a fixed seed; the profiled pairs are
written as a JSONL file that is both the Job's ``--eval-pairs`` and what the clients send (same model, same pairs):
- ``fixture``: the fixture's queries as they are (15 texts each, up to 700 characters).
- ``short``: 8 texts a query (the issue's workload), each cut to at most 300 characters at a word boundary.
- ``longtail``: 8 texts a query, lengths drawn from a lognormal with median 200 and p90 1,000 characters, capped at
  1,500. A text longer than its drawn length is cut there (at a word boundary); a shorter one is extended with the
  texts of its own query's candidate pool (the 7 of the 15 not sent first) until it reaches the length, then cut:
  the fixture's texts stop at 700 characters, so leaving them short would lose the tail the profile is about.

Harness (``"harness"`` in the output):
- ``tei-router``: ``--router`` given: each directory is served by a real ``text-embeddings-router`` (ORT backend)
  on a local port, and the clients POST ``/rerank`` with ``raw_scores``. ``router_cpu`` splits each router's CPU
  time over the timed rounds (``/proc``: the backend's inference thread, tokio's HTTP workers, the rest:
  tokenization and the queue) per pair; ``inference_only_x_fp32`` is the speedup of the inference thread alone,
  i.e. what the served ratio would be if the router's own work cost nothing.
- ``ort-fallback``: no router: an in-process stand-in built as TEI's ORT backend is: one ONNX Runtime 1.22 session,
  ``ORT_ENABLE_ALL``, intra-op threads = the serving CPUs, one inference at a time, FIFO queue of pairs, batches of
  at most 8 pairs padded to their longest, tokenization in the client threads (pinned, on the clients' CPUs: the
  fallback's pod does not pay for tokenization as TEI's does).
- ``job_harness`` (every harness, ``--job-harness``): the Job's own served measurement
  (``quantizer_job.steps.evaluation.serving``: arrival-order batches of 8, tokenization workers, models in turns) run
  here on every variant, over all profiled pairs and over the prefix the Job times, on the serving CPUs: it separates
  the Job's harness from its sample.

Placement (``--pin``, default when there are >= 2 CPUs): the routers run under ``taskset -c <first CPU>`` (each sees
one CPU, as a pod with a 1-CPU limit: TEI sizes its intra-op threads and tokenization workers from it), the Job runs
under the same ``taskset`` (it sizes its threads from its affinity, so it measures the same 1-CPU pod), PyTorch FP32
and the Job harness run on that CPU with one thread, and the clients on the other CPUs. Unpinned (``--no-pin``)
clients share every CPU with the routers, which compresses the INT8/FP32 ratio (the faster model pays more client
overhead per second).

Variants: ``fp32`` (the optimum-style FP32 export, the baseline) is always served; ``auto`` is the artifact
``rerank-quantize --recipe auto`` publishes (given the profiled eval pairs and the fixture's calibration pairs); any
other name is a recipe of :func:`benchmarks.tei_serving.recipes` (the benchmark recipes and the Job's ``auto``
candidates, by the names ``recipe.tried`` reports) quantized in-process. All variants are served at once (one
router each) and take turns ``--chunk`` queries at a time (the order rotating), over all queries, ``--rounds`` times:
every variant sees the same minutes of the machine, so load from other processes slows all of them alike (whole-run
turns gave per-round ratios from 0.8x to 5x on a shared machine). Throughput is total pairs over total time;
per-round figures are kept.

The model directories, servers, clients and the PyTorch reference are :mod:`benchmarks.tei_serving`'s (shared with
the other benchmarks); the length profiles, the Job's harness and the report are this module's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import trained_fixture
from benchmarks.tei_serving import (
    BF16_FLAGS,
    FallbackServer,
    RouterServer,
    bf16_hardware,
    dir_bytes,
    interleaved,
    on_cpus,
    placement,
    prepare,
    sorted_spans,
    taskset,
    torch_fp32,
)
from quantizer_job.steps.common import isa
from quantizer_job.steps.evaluation import evaldata, metrics, serving, verify
from quantizer_job.steps.tei import layout, textenc

#: Texts a query for the ``short`` and ``longtail`` profiles (the issue's workload).
PROFILE_TEXTS = 8
SHORT_MAX_CHARS = 300
LONGTAIL_MEDIAN, LONGTAIL_P90, LONGTAIL_MAX, LONGTAIL_MIN = 200, 1000, 1500, 16
PROFILE_SEED = 25
PROFILES = ("fixture", "short", "longtail")
USER_BATCH = 32  # the length-sorted batch of the user anchors (issue 43's PyTorch figures)


# --- length profiles ------------------------------------------------------------------------------------------------
def cut(text: str, n: int) -> str:
    """``text`` cut to at most ``n`` characters at a word boundary (a hard cut if the last space is too early)."""
    if len(text) <= n:
        return text
    j = text.rfind(" ", 0, n + 1)
    return (text[:j] if j >= n // 2 else text[:n]).rstrip()


def longtail_lengths(n: int, seed: int = PROFILE_SEED) -> list[int]:
    """``n`` character lengths from a lognormal with median LONGTAIL_MEDIAN and p90 LONGTAIL_P90, capped at
    LONGTAIL_MAX: stratified (the normal quantiles of (i + 0.5) / n, in a fixed-seed random order), so the sample's
    median and p90 are the profile's rather than off by sampling noise (about +-10 % at 640 draws)."""
    nd = statistics.NormalDist()
    sigma = math.log(LONGTAIL_P90 / LONGTAIL_MEDIAN) / nd.inv_cdf(0.9)
    z = np.random.default_rng(seed).permutation([nd.inv_cdf((i + 0.5) / n) for i in range(n)])
    x = np.round(LONGTAIL_MEDIAN * np.exp(sigma * z))
    return [int(v) for v in np.clip(x, LONGTAIL_MIN, LONGTAIL_MAX)]


def profile_groups(groups: list[tuple[str, list[str]]], profile: str) -> list[tuple[str, list[str]]]:
    """The fixture's queries shaped to ``profile`` (see the module docstring)."""
    if profile == "fixture":
        return groups
    if profile == "short":
        return [(q, [cut(t, SHORT_MAX_CHARS) for t in ts[:PROFILE_TEXTS]]) for q, ts in groups]
    if profile != "longtail":
        raise SystemExit(f"unknown profile {profile!r}")
    lengths = iter(longtail_lengths(len(groups) * PROFILE_TEXTS))
    out = []
    for q, pool in groups:
        texts = []
        for i in range(PROFILE_TEXTS):
            want, text = next(lengths), pool[i]
            extra = pool[PROFILE_TEXTS:] + pool[:i] + pool[i + 1:PROFILE_TEXTS]  # the unsent texts first
            k = 0
            while len(text) < want and k < len(extra):
                text, k = text + " " + extra[k], k + 1
            texts.append(cut(text, want))
        out.append((q, texts))
    return out


def profile_stats(groups: list[tuple[str, list[str]]], tok) -> dict:
    chars = [len(t) for _, ts in groups for t in ts]
    toks = textenc.token_lengths(tok, [(q, t) for q, ts in groups for t in ts])

    def q(xs: list[int]) -> dict:
        return {"p50": int(np.percentile(xs, 50)), "p90": int(np.percentile(xs, 90)), "max": int(max(xs))}

    return {"chars": q(chars), "tokens": q(toks)}


def write_groups(path: Path, groups: list[tuple[str, list[str]]]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for q, ts in groups:
            f.write(json.dumps({"query": q, "texts": ts}, ensure_ascii=False) + "\n")
    return path


def job_harness(dirs: dict[str, Path], pairs: list[evaldata.Pair], threads: int, rounds: int,
                timed_pairs: int | None, budget: int) -> dict[str, dict]:
    """The Job's served measurement (quantizer_job.steps.evaluation.serving) on every variant: all variants in turns,
    over all the profiled pairs, and over the prefix of ``timed_pairs`` pairs the Job timed (when known); batches
    within ``budget`` tokens, as the routers'."""
    d0 = dirs["fp32"]
    cfg = layout.read_config(d0)
    tok = textenc.load_tokenizer(str(d0 / "tokenizer.json"), textenc.max_input_length(cfg))
    encode = serving.encoder(tok, layout.pad_token_id(cfg, d0 / "tokenizer.json"))
    every = serving.served_batches(pairs, textenc.token_lengths(tok, [(p.query, p.text) for p in pairs]), budget)
    sets = {"all": every}
    if timed_pairs:
        ends = list(itertools.accumulate(len(b) for b in every))
        sets["job_prefix"] = every[:1 + next((i for i, n in enumerate(ends) if n >= timed_pairs), len(every) - 1)]
    servers = {v: serving.Server(verify.make_session(d / layout.MODEL_FILE, threads), encode, every,
                                 serving.tokenization_workers(threads)) for v, d in dirs.items()}
    for s in servers.values():
        s.warm()
    out: dict[str, dict] = {v: {} for v in dirs}
    for label, batches in sets.items():
        for s in servers.values():
            s.batches = batches
        seconds = serving.in_turns({v: s.timed for v, s in servers.items()}, rounds)
        n = sum(len(b) for b in batches)
        out["fp32"][label] = {"pairs": n, "pairs_per_s": round(n / statistics.median(seconds["fp32"]), 2)}
        for v, sp in serving.speedups(seconds).items():
            out[v][label] = {"pairs": n, "pairs_per_s": round(n / statistics.median(seconds[v]), 2),
                             "speedup": round(sp.median, 3), "speedup_low": round(sp.low, 3),
                             "speedup_high": round(sp.high, 3)}
    return out


def job_timed_pairs(groups: list[tuple[str, list[str]]], kernel_fp32_pairs_per_s: float | None,
                    lengths: list[int], budget: int) -> int | None:
    """How many pairs the Job timed a round: ``serving.round_batches``, the Job's own rule
    (RERANK_QUANTIZE_TIMING_SECONDS is 2 s unless set), at its kernel FP32 speed
    (quantizer_job/stages/measurement.py), on batches within ``budget`` tokens (the pairs' token ``lengths``)."""
    if not kernel_fp32_pairs_per_s:
        return None
    pairs = [evaldata.Pair(q, t, None) for q, ts in groups for t in ts]
    secs = float(os.environ.get("RERANK_QUANTIZE_TIMING_SECONDS", "2.0"))
    return sum(len(b) for b in serving.round_batches(pairs, kernel_fp32_pairs_per_s, secs, lengths, budget=budget))


def compare_job(rows: dict, notes: dict) -> dict | None:
    """The Job's figures for ``auto`` next to the router's for the same artifact, and auto's pick vs the best."""
    auto = notes.get("auto")
    if not auto or "auto" not in rows or "x_fp32_ort" not in rows["auto"]:
        return None
    js, r = auto["job_speed"], rows["auto"]
    out = {"chosen": auto["chosen"], "job_speedup": js.get("speedup"),
           "job_speedup_range": [js.get("speedup_low"), js.get("speedup_high")],
           "job_kernel_speedup": js.get("kernel_speedup"), "router_speedup": r["x_fp32_ort"],
           "router_speedup_per_round": r["x_fp32_ort_per_round"]}
    if js.get("speedup"):
        out["job_vs_router"] = round(js["speedup"] / r["x_fp32_ort"], 3)
    tried = {t["name"]: t for t in auto.get("tried") or []}
    for v, row in rows.items():  # the Job's own figure for every served recipe it tried too
        if v in tried and "speedup" in tried[v]:
            row["job_tried_speedup"] = tried[v]["speedup"]
            row["job_tried_spread"] = tried[v].get("spread")
            row["job_vs_router"] = round(tried[v]["speedup"] / row["x_fp32_ort"], 3)
    cands = {v: row for v, row in rows.items() if v != "fp32" and "pairs_per_s" in row}
    best = max(cands, key=lambda v: cands[v]["pairs_per_s"])
    ratio = r["pairs_per_s"] / cands[best]["pairs_per_s"]
    lo, hi = min(r["x_fp32_ort_per_round"]), max(r["x_fp32_ort_per_round"])
    blo, bhi = min(cands[best]["x_fp32_ort_per_round"]), max(cands[best]["x_fp32_ort_per_round"])
    tie_for_quality = (lo <= bhi and blo <= hi) and r["spearman_vs_fp32_ort"] >= cands[best]["spearman_vs_fp32_ort"]
    out.update(best_router_variant=best, auto_vs_best=round(ratio, 3), auto_within_5pct=ratio >= 0.95,
               auto_tie_for_quality=bool(tie_for_quality))
    return out


def run(fixture: str, variants: list[str], router: str | None, clients: int, rounds: int, queries: int,
        work: Path, chunk: int = 8, profile: str = "fixture", pin: bool = True, with_job_harness: bool = True,
        max_batch_tokens: int = 0) -> dict:
    """``max_batch_tokens``: the routers' --max-batch-tokens (0: the operator's default for the CPU pool, TEI's
    maximum input length of the model; 16384 is TEI's own default)."""
    serve_cpus, client_cpus = placement(pin)
    pinned = serve_cpus != client_cpus
    threads = len(serve_cpus)  # what TEI and the Job size their threads from, on the serving CPUs
    fx = trained_fixture.make_fixture(fixture, threads=isa.cpu_budget())
    groups = [(p["query"], p["texts"]) for p in map(json.loads, Path(fx["eval_jsonl"]).read_text().splitlines())]
    groups = profile_groups(groups[:queries], profile)
    eval_jsonl = write_groups(work / f"eval-{profile}.jsonl", groups)
    prefix = taskset(serve_cpus, pinned)
    dirs, notes = prepare(fx, work, variants, isa.cpu_budget(), eval_jsonl, prefix, max_batch_tokens)
    budget = max_batch_tokens or textenc.tei_max_input_length(dirs["fp32"], layout.read_config(dirs["fp32"]))
    keys = [q for q, ts in groups for _ in ts]
    with on_cpus(serve_cpus):
        tref = torch_fp32(Path(fx["model_dir"]), groups, threads)
    servers: dict = {}
    try:
        with on_cpus(serve_cpus):  # routers (taskset) or the fallback's worker threads start on the serving CPUs
            for v, d in dirs.items():
                servers[v] = (RouterServer(router, d, work / f"router-{v}.log", budget, prefix) if router
                              else FallbackServer(d, threads, budget))
        with on_cpus(client_cpus):  # the clients' threads are started (and stay) on the other CPUs
            runs = interleaved(servers, groups, clients, rounds, chunk)
    finally:
        for srv in servers.values():
            srv.close()
    tok = textenc.load_tokenizer(str(dirs["fp32"] / "tokenizer.json"), 512)
    lengths = textenc.token_lengths(tok, [(q, t) for q, ts in groups for t in ts])
    timed = job_timed_pairs(groups, notes.get("auto", {}).get("job_speed", {}).get("kernel_fp32_pairs_per_s"),
                            lengths, budget)
    jh = {}
    with on_cpus(serve_cpus):
        torch_again = torch_fp32(Path(fx["model_dir"]), groups, threads)
        in_budget = serving.batch_spans(len(lengths), lengths, budget)
        torch_budget = torch_fp32(Path(fx["model_dir"]), groups, threads, in_budget)
        anchors = user_anchors(Path(fx["model_dir"]), groups, threads, lengths, in_budget, tref["scores"])
        if with_job_harness:
            pairs = [evaldata.Pair(q, t, None) for q, ts in groups for t in ts]
            jh = job_harness(dirs, pairs, threads, rounds, timed, budget)
    torch_pps = statistics.median([tref["pairs_per_s"], torch_again["pairs_per_s"]])
    fp32 = runs["fp32"]
    fp32_bytes = dir_bytes(dirs["fp32"])
    rows = {}
    for v, r in runs.items():
        s = r["scores"]
        per_round = [x / f for x, f in zip(r["rounds"], fp32["rounds"], strict=True)]
        rows[v] = {"pairs_per_s": round(r["pairs_per_s"], 2),
                   "x_fp32_ort": round(r["pairs_per_s"] / fp32["pairs_per_s"], 3),
                   "x_fp32_ort_per_round": [round(x, 3) for x in per_round],
                   "x_torch_fp32": round(r["pairs_per_s"] / torch_pps, 2),
                   "x_torch_fp32_within_budget": round(r["pairs_per_s"] / torch_budget["pairs_per_s"], 2),
                   **{f"x_{name}": round(r["pairs_per_s"] / a["pairs_per_s"], 2)
                      for name, a in anchors.items() if "pairs_per_s" in a},
                   "p50_ms": round(r["p50_ms"], 1), "p95_ms": round(r["p95_ms"], 1),
                   "spearman_vs_torch": round(metrics.spearman(tref["scores"], s), 5),
                   "top3_vs_torch": round(metrics.topk_agreement(keys, tref["scores"], s, 3), 4),
                   "spearman_vs_fp32_ort": round(metrics.spearman(fp32["scores"], s), 5),
                   "top3_vs_fp32_ort": round(metrics.topk_agreement(keys, fp32["scores"], s, 3), 4),
                   "model_bytes": dir_bytes(dirs[v]), "size_vs_fp32": round(dir_bytes(dirs[v]) / fp32_bytes, 3),
                   "rounds_pairs_per_s": [round(x, 2) for x in r["rounds"]],
                   **({"router_cpu": r["router_cpu"],
                       "inference_only_x_fp32": round(fp32["router_cpu"]["inference_ms_per_pair"]
                                                      / r["router_cpu"]["inference_ms_per_pair"], 3)}
                      if "router_cpu" in r else {}),
                   **({"job_harness": jh[v]} if v in jh else {}), **notes.get(v, {})}
    for v, n in notes.items():
        if v not in rows:
            rows[v] = {"not_served": "the Job published nothing", **n}
    return {"fixture": fixture, "profile": profile, "profile_lengths": profile_stats(groups, tok),
            "eval_jsonl": str(eval_jsonl), "harness": RouterServer.harness if router else FallbackServer.harness,
            "router": router, "pinned": pinned, "serve_cpus": serve_cpus, "client_cpus": client_cpus,
            "clients": clients, "rounds": rounds, "max_batch_tokens": budget,
            "chunk_queries": chunk, "threads": threads, "queries": len(groups),
            "pairs": len(keys), "job_timed_pairs": timed, "torch_fp32_pairs_per_s": round(torch_pps, 2),
            "torch_fp32_within_budget_pairs_per_s": round(torch_budget["pairs_per_s"], 2),
            "user_anchors": anchors,
            "fixture_training": fx.get("heldout_vs_teacher"), "job_vs_router": compare_job(rows, notes),
            "variants": rows}


def user_anchors(model_dir: Path, groups, threads: int, lengths: list[int], in_budget: list[tuple[int, int]],
                 ref_scores) -> dict[str, dict]:
    """What a user would run instead of the pool, on the same pairs and threads: PyTorch FP32 with length-sorted
    batches of 32 (an offline batch, little padding) and, on a CPU with native BF16 (``bf16_hardware``), BF16
    autocast both within the pool's token budget and length-sorted. Each with its rankings against PyTorch FP32;
    BF16 is left out, and says why, where PyTorch would only emulate it."""
    order, by_length = sorted_spans(lengths, USER_BATCH)
    runs: dict[str, tuple[list[tuple[int, int]], list[int] | None, bool]] = {
        "torch_fp32_sorted32": (by_length, order, False)}
    flag = bf16_hardware()
    if flag:
        runs["torch_bf16_within_budget"] = (in_budget, None, True)
        runs["torch_bf16_sorted32"] = (by_length, order, True)
    out: dict[str, dict] = {}
    for name, (spans, idx, bf16) in runs.items():
        r = torch_fp32(model_dir, groups, threads, spans, idx, bf16=bf16)
        out[name] = {"pairs_per_s": round(r["pairs_per_s"], 2),
                     "spearman_vs_torch": round(metrics.spearman(ref_scores, r["scores"]), 5)}
    if not flag:
        out["torch_bf16"] = {"not_run": f"no {' or '.join(BF16_FLAGS)} on this CPU: PyTorch would emulate BF16"}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", default="minilm-ce")
    ap.add_argument("--profile", choices=PROFILES, default="fixture",
                    help="text lengths: the fixture's, short (<= 300 characters) or longtail (median 200, p90 1,000)")
    ap.add_argument("--variants", default="auto")
    ap.add_argument("--router", default=None, help="path to a text-embeddings-router binary (ORT backend)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=8, help="queries each variant serves before the next one's turn")
    ap.add_argument("--queries", type=int, default=80)
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=len(os.sched_getaffinity(0)) >= 2,
                    help="routers and the Job on the first CPU (taskset), clients on the others")
    ap.add_argument("--job-harness", action=argparse.BooleanOptionalAction, default=True,
                    help="also time every variant with the Job's own served harness "
                         "(quantizer_job.steps.evaluation.serving)")
    ap.add_argument("--max-batch-tokens", type=int, default=0,
                    help="the routers' --max-batch-tokens (0: the CPU pool's default, the model's maximum input "
                         "length; 16384: TEI's own default)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (under --workdir) after the run")
    a = ap.parse_args()
    import onnxruntime

    variants = [v for v in a.variants.split(",") if v and v != "fp32"]
    tmp = tempfile.mkdtemp(dir=a.workdir, prefix="tei-rerank-")
    try:
        out = run(a.fixture, variants, a.router, a.clients, a.rounds, a.queries, Path(tmp), a.chunk, a.profile,
                  a.pin, a.job_harness, a.max_batch_tokens)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    out.update(onnxruntime=onnxruntime.__version__, target=isa.detect_local_target(),
               loadavg_after=os.getloadavg()[0], **({"workdir": tmp} if a.keep else {}))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
