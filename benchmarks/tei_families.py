"""Every family tenants bring, through the Job and a real TEI router: does TEI load what the Job publishes, and does
it score as PyTorch FP32 of the same weights does?

For each family of ``rerank_devcluster.devmodels.FAMILIES`` (BERT, XLM-RoBERTa, RoBERTa, CamemBERT, ELECTRA,
DeBERTa-v2, ModernBERT, DistilBERT): a tiny random one-label model with its own family's tokenizer files and config
keys (``devmodels.family_cross_encoder``, as its hub repositories ship them), then

- ``router_fp32``: the FP32 ONNX export in a directory laid out as the Job lays out its CPU directory, served by a
  real ``text-embeddings-router`` (ORT backend): its scores vs PyTorch FP32 (``transformers`` as a user runs it).
  This isolates TEI's reading and feeding of the directory (config keys, tokenizer, which inputs, positions) from
  quantization: Spearman ~1 and a small max abs diff say TEI feeds the graph as PyTorch does.
- ``job``: ``rerank-quantize --recipe auto`` with the gate lowered to 0 (random weights prove the path, not quality;
  the trained fixtures' figures are in docs/quantization.md), and whether it published.
- ``router_int8``: the Job's published CPU directory served by the router: loaded or not, Spearman and top-3
  agreement vs PyTorch FP32.

Prints one JSON object: per family those figures, and ``all_served`` (every published directory loaded and scored).

    python -m benchmarks.tei_families --router /path/to/text-embeddings-router [--families bert,deberta-v2]

Without a router it exits with an error: TEI's router is the thing under test (build one yourself with the ORT
backend from TEI's own sources, ``docs/tei-contract.md``; it is never part of CI).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import tei_serving
from quantizer_job.steps.evaluation import evaldata, metrics
from quantizer_job.steps.graph import export
from quantizer_job.steps.tei import layout, textenc
from rerank_devcluster import devmodels

REPO = Path(__file__).resolve().parents[1]
#: Far above any pair here: the router's budget is not what this measures.
BUDGET = 16384


def groups_of(pairs: list[evaldata.Pair]) -> list[tuple[str, list[str]]]:
    by_query: dict[str, list[str]] = {}
    for p in pairs:
        by_query.setdefault(p.query, []).append(p.text)
    return [(q, ts) for q, ts in by_query.items() if len(ts) >= 2]


def fp32_dir(model: Path, work: Path) -> Path:
    """The FP32 export in a TEI directory, as ``tei_serving.prepare`` builds its baseline (and the Job its CPU
    directory)."""
    cfg = layout.read_config(model)
    exp = export.run({"src_dir": str(model), "onnx_dir": str(work / "fp32"), "tokenizer_dir": str(work / "tok"),
                      "max_length": textenc.max_input_length(cfg), "pad_id": layout.declared_pad_token_id(cfg),
                      "threads": 2})
    return tei_serving.tei_dir(Path(exp["onnx_path"]), model, Path(exp["tokenizer_json"]), work / "serve-fp32", exp)


def job(model: Path, work: Path) -> tuple[Path | None, dict]:
    vol = work / "vol"
    cmd = [sys.executable, "-m", "quantizer_job", "--model", str(model), "--output", str(vol), "--artifact-id", "fam",
           "--recipe", "auto", "--min-spearman", "0", "--min-topk-agreement", "0", "--no-keep-original"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    (work / "job.stderr.log").write_text(proc.stderr)
    lines = proc.stdout.strip().splitlines()
    res = json.loads(lines[-1]) if lines else {"ok": False, "reason": f"exit {proc.returncode}", "message": ""}
    note = {"published": bool(res.get("ok")), "reason": res.get("reason"),
            "recipe": (res.get("recipe") or {}).get("name"), "job_quality": res.get("quality")}
    if not res.get("ok"):
        note["message"] = str(res.get("message"))[:300]
    return (vol / "artifacts" / "fam" / "cpu-int8" if res.get("ok") else None), note


def served(router: str, d: Path, log: Path, groups: list[tuple[str, list[str]]], ref: np.ndarray) -> dict:
    """Serve ``d`` with the router and compare its raw scores with ``ref`` (PyTorch FP32, same pairs in order)."""
    try:
        server = tei_serving.RouterServer(router, d, log, BUDGET)
    except SystemExit as exc:
        return {"loaded": False, "error": str(exc), "log_tail": log.read_text()[-600:] if log.exists() else ""}
    try:
        got = np.asarray([s for q, ts in groups for s in server.rerank(q, ts)], dtype=np.float64)
    finally:
        server.close()
    ids = [i for i, (_, ts) in enumerate(groups) for _ in ts]
    return {"loaded": True, "spearman_vs_torch_fp32": round(metrics.spearman(ref, got), 4),
            "top3_vs_torch_fp32": round(metrics.topk_agreement(ids, ref, got, 3), 4),
            "max_abs_diff": float(f"{metrics.max_abs_diff(ref, got):.3g}")}


def family(name: str, router: str, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    model = devmodels.family_cross_encoder(name, work / "model")
    groups = groups_of(evaldata.builtin_pairs())
    ref = tei_serving.torch_fp32(model, groups, threads=2)["scores"]
    row: dict = {"pairs": int(ref.size), "router_fp32": served(router, fp32_dir(model, work), work / "fp32.log",
                                                               groups, ref)}
    published, row["job"] = job(model, work)
    if published is not None:
        row["router_int8"] = served(router, published, work / "int8.log", groups, ref)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--router", required=True, help="path to a text-embeddings-router binary (ORT backend)")
    ap.add_argument("--families", default=",".join(devmodels.FAMILIES))
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    names = [f for f in a.families.split(",") if f]
    unknown = set(names) - set(devmodels.FAMILIES)
    if unknown:
        ap.error(f"unknown families {sorted(unknown)}; known: {', '.join(devmodels.FAMILIES)}")
    root = Path(a.workdir or tempfile.mkdtemp(prefix="tei-families-"))
    rows = {n: family(n, a.router, root / n) for n in names}
    all_served = all(r.get("router_int8", {}).get("loaded") for r in rows.values() if r["job"]["published"])
    print(json.dumps({"harness": "tei-router", "families": rows, "all_published": all(
        r["job"]["published"] for r in rows.values()), "all_served": all_served}, indent=1))


if __name__ == "__main__":
    main()
