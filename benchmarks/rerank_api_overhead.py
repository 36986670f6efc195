"""What the rerank API costs: the same documents from the same clients to TEI's own ``/rerank`` and, through the
pods' front, to TEI's route and to the Cohere route; pairs/s and latency; JSON.

    .venv/bin/python -m benchmarks.rerank_api_overhead --router /path/to/text-embeddings-router [--requests 300]
        [--concurrency 4] [--texts 16] [--rounds 3] [--threads 2] [--out FILE]

Opt-in (not in ./hack/test): TEI's router cannot be built in CI (``docs/tei-contract.md`` says how to build one; never
commit it). The model is the trained MiniLM-size cross-encoder (``benchmarks/trained_fixture.py``, minilm-ce) as the
quantization Job publishes it for the CPU pool (INT8 ONNX, ``benchmarks/tei_serving.py``); one real
``text-embeddings-router`` serves it with the CPU pool's token budget, and one ``rerank-sampler`` process (the pods'
front, unguarded, as every pool pod runs it) sits in front of it. Three targets, each given the same held-out queries
and passages (``--texts`` per request) by ``--concurrency`` client processes on kept-alive connections, alternating
for ``--rounds`` rounds after a warm-up:

- ``tei``: ``POST /rerank`` straight to the router (what no pod offers a client: the front owns the pod's port);
- ``front_tei``: ``POST /rerank`` through the front (TEI's shape, what a TEI client of the model gets);
- ``front_cohere``: ``POST /v2/rerank`` through the front (the Cohere shape, the same texts as ``documents``).

``ratio`` compares the medians over the rounds: Cohere's route against TEI's route through the front (the target: at
least 0.97) and against the router straight. ``max_score_difference``: on the FP32 export and on the INT8 artifact, the
largest difference between the Cohere route's ``relevance_score`` and TEI's own score for the same pairs, and between
two identical requests to TEI itself: TEI batches the texts of concurrent and consecutive requests as they reach its
queue, and a dynamically quantized INT8 model's activation scales depend on the batch, so on INT8 TEI does not give one
pair the same score twice; on FP32 it does, to the bit. The JSON names the CPU (``cpu``); the clients, the front and the
router share it, so the front's own CPU time is part of what a client waits for.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import tei_serving, trained_fixture
from benchmarks.sampler_overhead import FrontProcess, cpu_model

#: The CPU pool's default token budget per batch (TEI's --max-batch-tokens as the Job sets it for MiniLM-size models).
BATCH_TOKENS = 16384
TARGETS = ("tei", "front_tei", "front_cohere")


def bodies(fx: dict[str, Any], texts: int) -> list[tuple[str, list[str]]]:
    """Held-out queries, each with ``texts`` passages (its candidates, repeated to fill when fewer)."""
    groups = [json.loads(line) for line in Path(fx["eval_jsonl"]).read_text().splitlines()]
    out = []
    for g in groups:
        docs = list(g["texts"])
        while len(docs) < texts:
            docs += g["texts"]
        out.append((g["query"], docs[:texts]))
    return out


def client(base: str, target: str, groups: list[tuple[str, list[str]]], n: int, offset: int
           ) -> tuple[list[float], float, float, int, int]:
    """``n`` requests on one kept-alive connection: (latencies, first start, last end, pairs, answers not 200)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    headers = {"Content-Type": "application/json", "Authorization": "Bearer unused"}
    latencies, pairs, bad = [], 0, 0
    first = time.time()
    try:
        for k in range(n):
            query, texts = groups[(offset + k) % len(groups)]
            body: dict[str, Any]
            if target == "front_cohere":
                path, body = "/v2/rerank", {"model": "minilm", "query": query, "documents": texts}
            else:
                path, body = "/rerank", {"query": query, "texts": texts, "truncate": True}
            started = time.perf_counter()
            conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
            response = conn.getresponse()
            response.read()
            latencies.append(time.perf_counter() - started)
            pairs += len(texts)
            bad += response.status != 200
    finally:
        conn.close()
    return latencies, first, time.time(), pairs, bad


def load(pool: ProcessPoolExecutor, base: str, target: str, groups: list[tuple[str, list[str]]], requests: int,
         concurrency: int) -> dict[str, float]:
    share = requests // concurrency
    results = list(pool.map(client, [base] * concurrency, [target] * concurrency, [groups] * concurrency,
                            [share] * concurrency, [i * share for i in range(concurrency)]))
    latencies = sorted(x for r in results for x in r[0])
    wall = max(r[2] for r in results) - min(r[1] for r in results)

    def pct(p: float) -> float:
        return round(1000 * latencies[min(len(latencies) - 1, int(p * len(latencies)))], 2)

    return {"requests": len(latencies), "not_200": sum(r[4] for r in results),
            "pairs_per_s": round(sum(r[3] for r in results) / wall, 2), "p50_ms": pct(0.50), "p95_ms": pct(0.95)}


def scores_agree(front: str, router: str, groups: list[tuple[str, list[str]]]) -> float:
    """The largest difference between the Cohere route's relevance_score and TEI's own score for the same pairs."""
    worst = 0.0
    for query, texts in groups[:20]:
        tei = post(router, "/rerank", {"query": query, "texts": texts, "truncate": True})
        cohere = post(front, "/v2/rerank", {"query": query, "documents": texts})
        assert len(cohere["results"]) == len(texts), cohere
        own = {r["index"]: r["score"] for r in tei}
        worst = max(worst, *(abs(r["relevance_score"] - own[r["index"]]) for r in cohere["results"]))
    return worst


def tei_against_itself(router: str, groups: list[tuple[str, list[str]]]) -> float:
    """The largest difference between two identical ``/rerank`` requests to the same router, one after the other."""
    worst = 0.0
    for query, texts in groups[:20]:
        first, second = (post(router, "/rerank", {"query": query, "texts": texts, "truncate": True}) for _ in "ab")
        again = {r["index"]: r["score"] for r in second}
        worst = max(worst, *(abs(r["score"] - again[r["index"]]) for r in first))
    return worst


def agreement(binary: str, model_dir: Path, log: Path, groups: list[tuple[str, list[str]]]) -> dict[str, float]:
    """The Cohere route's scores against TEI's own for the same pairs on ``model_dir``, and TEI's against itself."""
    with contextlib.ExitStack() as stack:
        router = tei_serving.RouterServer(binary, model_dir, log, BATCH_TOKENS)
        stack.callback(router.close)
        front = FrontProcess(router.url)
        stack.callback(front.close)
        return {"cohere_vs_tei": scores_agree(front.url, router.url, groups),
                "tei_vs_itself": tei_against_itself(router.url, groups)}

def post(base: str, path: str, body: Any) -> Any:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    answer = json.loads(conn.getresponse().read())
    conn.close()
    return answer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--router", required=True, help="a text-embeddings-router built with the ORT backend")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--texts", type=int, default=16, help="passages per request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="the Job's threads while preparing the artifact")
    parser.add_argument("--recipe", default="fused-matmul-perchannel", help="the INT8 recipe (tei_serving.recipes)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    fx = trained_fixture.make_fixture("minilm-ce")
    work = Path(tempfile.mkdtemp(prefix="rerank-api-overhead-"))
    dirs, _ = tei_serving.prepare(fx, work, [args.recipe], threads=args.threads)
    groups = bodies(fx, args.texts)
    agreements = {name: agreement(args.router, dirs[key], work / f"router-{name}-agreement.log", groups)
                  for name, key in (("fp32", "fp32"), ("int8", args.recipe))}
    with contextlib.ExitStack() as stack:
        router = tei_serving.RouterServer(args.router, dirs[args.recipe], work / "router.log", BATCH_TOKENS)
        stack.callback(router.close)
        front = FrontProcess(router.url, "--model-name", "minilm")
        stack.callback(front.close)
        targets = {"tei": router.url, "front_tei": front.url, "front_cohere": front.url}
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
        with ProcessPoolExecutor(args.concurrency) as pool:
            for name, base in targets.items():  # warm-up: connections, the router's first batches
                load(pool, base, name, groups, 2 * args.concurrency, args.concurrency)
            for _ in range(args.rounds):
                for name, base in targets.items():
                    rounds[name].append(load(pool, base, name, groups, args.requests, args.concurrency))

    def median(name: str, key: str) -> float:
        return round(statistics.median(r[key] for r in rounds[name]), 2)

    summary = {name: {key: median(name, key) for key in ("pairs_per_s", "p50_ms", "p95_ms")} for name in targets}
    result = {
        "benchmark": "rerank_api_overhead", "cpu": cpu_model(), "cpus": os.cpu_count(), "router": args.router,
        "model": f"minilm-ce INT8 ONNX ({args.recipe})", "batch_tokens": BATCH_TOKENS,
        "requests": args.requests, "concurrency": args.concurrency, "texts": args.texts, "rounds": rounds,
        "median": summary, "max_score_difference": agreements,
        "ratio": {
            "cohere_vs_tei_route_through_front": round(summary["front_cohere"]["pairs_per_s"]
                                                       / summary["front_tei"]["pairs_per_s"], 3),
            "cohere_vs_router_straight": round(summary["front_cohere"]["pairs_per_s"]
                                               / summary["tei"]["pairs_per_s"], 3),
            "tei_route_through_front_vs_router_straight": round(summary["front_tei"]["pairs_per_s"]
                                                                / summary["tei"]["pairs_per_s"], 3),
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
