"""Long documents through the rerank API: what the chunked mode changes against truncation, in ranking and in cost;
JSON.

    .venv/bin/python -m benchmarks.long_documents --router /path/to/text-embeddings-router [--queries 60]
        [--candidates 8] [--seed 0] [--threads 2] [--out FILE]

Opt-in (not in ./hack/test): TEI's router cannot be built in CI (``docs/tei-contract.md``). The set is built from a
public corpus in a PyPI package: numpy's docstrings (BSD). A *page* is the bodies (the docstring without its summary
line) of consecutive functions of one numpy module, joined until it is 700 to 2700 words long (1.9 to 6.9 thousand
tokens with MiniLM's tokenizer: numpy's docstrings are dense in code); a *query* is the summary line of one function on
a page, taken only from the trained fixture's held-out queries (``benchmarks/trained_fixture.py``, ``is_heldout``), so
the model never trained on it; its candidates are its page and ``--candidates`` - 1 other pages. The relevant body lies
anywhere on its page, so most of the time beyond the model's 512 tokens.

The model is the trained MiniLM-size cross-encoder (minilm-ce): its INT8 artifact as the CPU pool serves it and its
FP32 export, each in a real ``text-embeddings-router``, each behind the pods' front (``rerank-sampler``) in the mode
measured. The reference is the FP32 model scoring each page by its best window (the chunked mode on FP32: the full
relevant window is in one of them). Per mode of the INT8 pool (``truncate``: TEI cuts each pair at the model's input;
``chunk``: windows, best one): the Spearman correlation of each query's page scores with the reference's (mean over
queries), how often the query's own page is ranked first, its mean reciprocal rank, and the cost: pages/s and the
texts TEI scored per second. The JSON names the CPU (``cpu``); the client, the fronts and the routers share it.
"""

from __future__ import annotations

import argparse
import http.client
import inspect
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import tei_serving, trained_fixture
from benchmarks.sampler_overhead import FrontProcess, cpu_model

BATCH_TOKENS = 16384
MODULES = ("numpy", "numpy.linalg", "numpy.random", "numpy.fft", "numpy.ma", "numpy.polynomial", "numpy.lib")


def bodies() -> list[tuple[str, str, str]]:
    """(module, summary line, body) of numpy's public callables with a docstring of some length."""
    import importlib

    seen: set[str] = set()
    out = []
    for name in MODULES:
        module = importlib.import_module(name)
        for attr in sorted(dir(module)):
            obj = getattr(module, attr, None)
            doc = inspect.getdoc(obj) if not attr.startswith("_") and callable(obj) else None
            if not doc or len(doc) < 300 or doc in seen:
                continue
            seen.add(doc)
            summary, _, body = doc.partition("\n\n")
            summary = " ".join(summary.split())
            if 15 <= len(summary) <= 200 and len(body.split()) >= 60:
                out.append((name, summary, body))
    return out


def pages(items: list[tuple[str, str, str]], rng: random.Random) -> list[tuple[str, list[str]]]:
    """Pages of 700 to 2700 words: (text, the summaries of the functions on it)."""
    out = []
    for module in MODULES:
        mine = [it for it in items if it[0] == module]
        rng.shuffle(mine)
        target, text, summaries = rng.randint(700, 2700), [], []
        for _, summary, body in mine:
            text.append(body)
            summaries.append(summary)
            if sum(len(t.split()) for t in text) >= target:
                out.append(("\n\n".join(text), summaries))
                target, text, summaries = rng.randint(700, 2700), [], []
    return out


def queries(book: list[tuple[str, list[str]]], count: int, candidates: int, rng: random.Random
            ) -> list[tuple[str, list[int], int]]:
    """(query, candidate page indexes, the position of its own page among them), held-out queries only."""
    held = [(s, p) for p, (_, summaries) in enumerate(book) for s in summaries if trained_fixture.is_heldout(s)]
    rng.shuffle(held)
    out = []
    for summary, own in held[:count]:
        others = rng.sample([p for p in range(len(book)) if p != own], candidates - 1)
        chosen = [own, *others]
        rng.shuffle(chosen)
        out.append((summary, chosen, chosen.index(own)))
    return out


def rerank(base: str, query: str, documents: list[str]) -> list[float]:
    """The front's scores in document order."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    conn.request("POST", "/v2/rerank", body=json.dumps({"query": query, "documents": documents}).encode(),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    answer = json.loads(response.read())
    conn.close()
    if response.status != 200:
        raise SystemExit(f"{base}: {response.status} {answer}")
    scores = [0.0] * len(documents)
    for r in answer["results"]:
        scores[r["index"]] = r["relevance_score"]
    return scores


def scored_texts(metrics: str) -> float:
    host, port = metrics.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("rerank_api_scored_texts_total{"))


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    if np.std(ra) == 0 or np.std(rb) == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def run_mode(front: FrontProcess, book: list[tuple[str, list[str]]], asked: list[tuple[str, list[int], int]]
             ) -> tuple[list[list[float]], dict[str, float]]:
    before = scored_texts(front.metrics_url)
    started = time.perf_counter()
    scores = [rerank(front.url, q, [book[p][0] for p in chosen]) for q, chosen, _ in asked]
    seconds = time.perf_counter() - started
    texts = scored_texts(front.metrics_url) - before
    pages_scored = sum(len(chosen) for _, chosen, _ in asked)
    return scores, {"seconds": round(seconds, 1), "pages_per_s": round(pages_scored / seconds, 2),
                    "texts_scored": int(texts), "texts_per_page": round(texts / pages_scored, 2),
                    "texts_per_s": round(texts / seconds, 2)}


def quality(scores: list[list[float]], reference: list[list[float]], asked: list[tuple[str, list[int], int]]
            ) -> dict[str, float]:
    ranks = [1 + sum(s > row[own] for s in row) for row, (_, _, own) in zip(scores, asked, strict=True)]
    return {"spearman_vs_fp32_best_window": round(statistics.mean(spearman(a, b) for a, b in
                                                                  zip(scores, reference, strict=True)), 4),
            "own_page_first": round(sum(r == 1 for r in ranks) / len(ranks), 4),
            "mrr": round(statistics.mean(1 / r for r in ranks), 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--router", required=True, help="a text-embeddings-router built with the ORT backend")
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recipe", default="fused-matmul-perchannel", help="the INT8 recipe (tei_serving.recipes)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    book = pages(bodies(), rng)
    asked = queries(book, args.queries, args.candidates, rng)
    fx = trained_fixture.make_fixture("minilm-ce")
    work = Path(tempfile.mkdtemp(prefix="long-documents-"))
    dirs, _ = tei_serving.prepare(fx, work, [args.recipe], threads=args.threads)
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(dirs["fp32"] / "tokenizer.json"))
    tok.no_truncation()
    lengths = sorted(len(tok.encode(text, add_special_tokens=False).ids) for text, _ in book)
    routers = {name: tei_serving.RouterServer(args.router, dirs[key], work / f"router-{name}.log", BATCH_TOKENS)
               for name, key in (("fp32", "fp32"), ("int8", args.recipe))}
    fronts: list[FrontProcess] = []
    results: dict[str, Any] = {}
    try:
        reference_front = FrontProcess(routers["fp32"].url, "--long-documents", "chunk")
        fronts.append(reference_front)
        reference, results["fp32_chunk_reference"] = run_mode(reference_front, book, asked)
        for mode in ("truncate", "chunk"):
            front = FrontProcess(routers["int8"].url, "--long-documents", mode)
            fronts.append(front)
            scores, cost = run_mode(front, book, asked)
            results[f"int8_{mode}"] = {**quality(scores, reference, asked), **cost}
        truncated_fp32 = FrontProcess(routers["fp32"].url, "--long-documents", "truncate")
        fronts.append(truncated_fp32)
        scores, cost = run_mode(truncated_fp32, book, asked)
        results["fp32_truncate"] = {**quality(scores, reference, asked), **cost}
        results["fp32_chunk_reference"] = {**quality(reference, reference, asked),
                                           **results["fp32_chunk_reference"]}
    finally:
        for front in fronts:
            front.close()
        for router in routers.values():
            router.close()
    out = {"benchmark": "long_documents", "cpu": cpu_model(), "cpus": os.cpu_count(), "router": args.router,
           "corpus": "numpy docstrings (numpy " + np.__version__ + "): pages of consecutive functions' bodies",
           "model": f"minilm-ce: FP32 export and INT8 ({args.recipe})", "max_input_tokens": 512,
           "pages": len(book), "page_tokens": {"min": lengths[0], "median": lengths[len(lengths) // 2],
                                              "max": lengths[-1]},
           "queries": len(asked), "candidates": args.candidates, "seed": args.seed, "modes": results}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
