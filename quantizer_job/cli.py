"""``rerank-quantize``: the quantization Job's entry point.

download -> export (child process, torch) -> optimize -> quantize -> verify -> publish, with one structured JSON log
line per stage event on stderr and the :class:`~quantizer_job.contract.JobResult` as the termination message and as
the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from . import contract, evaldata, isa, layout, publish, textenc
from .contract import CPU_SUBDIR, MANIFEST_FILE, ORIGINAL_SUBDIR, JobRequest, JobResult
from .errors import EXIT_CODES, JobError
from .logs import log, peak_rss_bytes, stage, trim_memory

MANIFEST_VERSION = 1
#: Pairs whose PyTorch logits the export child computes, to prove the ONNX graph matches the model.
EXPORT_CHECK_PAIRS = 6
#: Models whose FP32 ONNX is larger than this skip the offline transformer fusions (memory; see _build).
#: Share of the time budget the default evaluation set may take for the FP32 reference (see _default_eval_size).
EVAL_BUDGET_SHARE = 0.04
MIN_DEFAULT_EVAL_PAIRS = 74
FUSION_MAX_BYTES = int(os.environ.get("RERANK_QUANTIZE_FUSION_MAX_BYTES", str(1 << 30)))


class _Terminated(BaseException):
    pass


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise _Terminated(f"signal {signum}")


def _finite(d: dict) -> dict:
    return {k: float(v) for k, v in d.items() if isinstance(v, (int, float)) and np.isfinite(v)}


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("onnxruntime", "onnx", "numpy", "tokenizers", "optimum", "transformers", "torch"):
        try:
            from importlib.metadata import version

            out[mod] = version(mod)
        except Exception:  # noqa: BLE001
            pass
    return out


def write_termination_message(text: str) -> None:
    path = os.environ.get("TERMINATION_MESSAGE_PATH", contract.TERMINATION_MESSAGE_PATH)
    d = os.path.dirname(path) or "."
    if not (os.path.isdir(d) and (os.path.exists(path) and os.access(path, os.W_OK) or os.access(d, os.W_OK))):
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        pass


def _run_export(spec: dict, work: Path, timeout: float) -> dict:
    spec_path, result_path = work / "export-spec.json", work / "export-result.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "quantizer_job.export", str(spec_path), str(result_path)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    try:
        proc = subprocess.run(cmd, env=env, timeout=max(60.0, timeout), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    except subprocess.TimeoutExpired:
        raise JobError("ExportFailed", f"export did not finish within {int(timeout)} s") from None
    res = json.loads(result_path.read_text()) if result_path.is_file() else None
    if proc.returncode != 0 or res is None or "error" in res:
        if res and "error" in res:
            raise JobError(res["error"]["reason"], res["error"]["message"])
        tail = (proc.stdout or "")[-1500:]
        sig = -proc.returncode if proc.returncode < 0 else None
        what = f"killed by signal {sig} (out of memory?)" if sig else f"exit {proc.returncode}"
        raise JobError("ExportFailed", f"export child {what}: {tail}")
    return res


class Job:
    def __init__(self, req: JobRequest):
        self.req = req
        self.timings: dict[str, float] = {}
        self.t0 = time.monotonic()
        self.threads = isa.cpu_budget()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    # -- the pipeline ------------------------------------------------------------------------------------------------
    def run(self) -> JobResult:
        req = self.req
        if not publish.valid_artifact_id(req.artifact_id):
            raise JobError("InvalidInput", f"artifact id {req.artifact_id!r}: use letters, digits, '.', '_', '-'")
        if req.topk < 1 or not (0.0 <= req.min_spearman <= 1.0) or not (0.0 <= req.min_topk_agreement <= 1.0):
            raise JobError("InvalidInput", "--topk must be >= 1 and the gate thresholds within [0, 1]")
        if req.mode == "static" and not req.calibration_pairs:
            raise JobError("InvalidInput", "--mode static needs --calibration-pairs")
        done = publish.read_published(req.output_root, req.artifact_id)
        if done is not None:
            return self._already(done)
        lock = publish.ArtifactLock(req.output_root, req.artifact_id)
        if not lock.acquire():
            raise JobError("PublishFailed", f"another run holds the lock of artifact {req.artifact_id}")
        try:
            done = publish.read_published(req.output_root, req.artifact_id)
            if done is not None:
                return self._already(done)
            stale = publish.clean_stale(req.output_root, req.artifact_id)
            if stale:
                log("publish", "cleaned_stale_temp_dirs", dirs=stale)
            self.tmp = publish.make_temp(req.output_root, req.artifact_id)
            try:
                return self._build()
            except BaseException:
                shutil.rmtree(self.tmp, ignore_errors=True)
                raise
        finally:
            lock.release()

    def _already(self, manifest: dict) -> JobResult:
        final = publish.final_path(self.req.output_root, self.req.artifact_id)
        log("publish", "already_published", path=str(final))
        return JobResult(ok=True, reason="AlreadyPublished", message=f"artifact {self.req.artifact_id} already published",
                         artifact_id=self.req.artifact_id, path=str(final),
                         manifest_sha256=layout.sha256_file(final / MANIFEST_FILE),
                         size_bytes=int(manifest.get("size_bytes", 0)),
                         quality=verify_rounded(manifest.get("quality", {})),
                         speed=verify_rounded(manifest.get("speed", {})),
                         recipe={k: v for k, v in manifest.get("recipe", {}).items() if k != "extra"})

    def _build(self) -> JobResult:
        req, tmp = self.req, self.tmp
        work = tmp / "work"
        work.mkdir()

        # -- download ---------------------------------------------------------------------------------------------
        from .fetch import fetch

        with stage("download", self.timings, model=req.model, revision=req.revision) as rec:
            fetched = fetch(req.model, req.revision, work / "src")
            src = fetched.path
            cfg = layout.read_config(src)
            layout.validate_source_config(cfg)
            rec.update(source=fetched.source, resolved_revision=fetched.revision, files=len(fetched.files),
                       bytes=sum(p.stat().st_size for p in src.iterdir() if p.is_file()), model_type=cfg["model_type"])
        model_type = cfg["model_type"]
        max_len = textenc.max_input_length(cfg)

        # Evaluation (and calibration) pairs: bad input fails before any heavy work.
        try:
            eval_pairs = evaldata.load_jsonl(req.eval_pairs) if req.eval_pairs else evaldata.default_pairs()
            calib_pairs = evaldata.load_jsonl(req.calibration_pairs, min_pairs=1) if req.calibration_pairs else []
        except evaldata.EvalDataError as exc:
            raise JobError("InvalidInput", str(exc)) from None

        # -- export (child process; the only one that imports torch) -----------------------------------------------
        has_st = bool(layout.weight_files(src))
        orig_tmp = work / "original-weights" if (req.keep_original and not has_st) else None
        spec = {"src_dir": str(src), "onnx_dir": str(work / "fp32"), "tokenizer_dir": str(work / "tokenizer"),
                "original_dir": str(orig_tmp) if orig_tmp else None, "max_length": max_len,
                "pad_id": layout.pad_token_id(cfg, src / "tokenizer.json"), "threads": self.threads,
                "ref_pairs": [[p.query, p.text] for p in eval_pairs[:EXPORT_CHECK_PAIRS]], "parent_pid": os.getpid()}
        with stage("export", self.timings) as rec:
            exp = _run_export(spec, work, timeout=req.time_budget_seconds)
            fp32 = Path(exp["onnx_path"])
            rec.update(bytes=_model_bytes(fp32), inputs=exp["input_names"], outputs=exp["output_names"],
                       opset=exp["opset"], tokenizer_converted=exp["tokenizer_converted"], child=exp["timings"])
        tok_json = Path(exp["tokenizer_json"])
        pad_id = layout.pad_token_id(cfg, tok_json)
        tok = textenc.load_tokenizer(str(tok_json), max_len)
        from . import verify

        fp32_sess = verify.make_session(fp32, self.threads)
        if not req.eval_pairs:
            n = self._default_eval_size(fp32_sess, tok, pad_id, eval_pairs)
            if n < len(eval_pairs):
                log("verify", "eval_set_capped", pairs=n, of=len(eval_pairs), reason="time budget")
            eval_pairs = eval_pairs[:n]
        pairs = [(p.query, p.text) for p in eval_pairs]
        groups = [p.query for p in eval_pairs]
        # Batches of pairs of similar length (TEI batches whatever arrives; sorting only removes padding waste from
        # the measurement, which matters for 24-layer models on 2 cores). Scores are mapped back to input order.
        order = np.argsort(textenc.token_lengths(tok, pairs), kind="stable")
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        batches = textenc.make_batches(tok, [pairs[i] for i in order], pad_id, batch_size=8)

        # -- FP32 reference (part of verify) -----------------------------------------------------------------------
        with stage("verify", self.timings, model="fp32", pairs=len(pairs)) as rec:
            ref = self._score(fp32, batches, inverse, failure_reason="ExportFailed", sess=fp32_sess)
            del fp32_sess
            if not np.all(np.isfinite(ref.scores)):
                raise JobError("ExportFailed", "the FP32 ONNX model gives non-finite scores")
            torch_ref = np.asarray(exp.get("torch_ref_logits", []), dtype=np.float64)
            export_diff = float(np.max(np.abs(torch_ref - ref.scores[: len(torch_ref)]))) if len(torch_ref) else 0.0
            scale = max(1.0, float(np.max(np.abs(torch_ref)))) if len(torch_ref) else 1.0
            if export_diff > 1e-3 * scale:
                raise JobError("ExportFailed", f"ONNX FP32 differs from PyTorch by {export_diff:.3g}")
            rec.update(fp32=ref.speed(), export_max_abs_diff=export_diff)

        calib_feeds = []
        if calib_pairs and (req.mode == "static" or req.recipe == "auto"):
            lengths = textenc.token_lengths(tok, [(p.query, p.text) for p in calib_pairs])
            chosen = evaldata.balance_by_length(lengths, n=min(len(calib_pairs), 256))
            chosen_pairs = [(calib_pairs[i].query, calib_pairs[i].text) for i in chosen]
            calib_feeds = textenc.make_batches(tok, chosen_pairs, pad_id, batch_size=8)

        # -- optimize / quantize / verify, per recipe --------------------------------------------------------------
        from . import quantize as Q

        target = isa.detect_local_target() if req.target == "auto" else req.target
        fixed = Q.fixed_recipe(req.mode, target, req.optimization_level, req.per_channel, req.reduce_range,
                               req.operators)
        candidates = (Q.candidate_recipes(target, req.mode, has_calibration=bool(calib_feeds))
                      if req.recipe == "auto" else [fixed])
        if _model_bytes(fp32) > FUSION_MAX_BYTES:
            # ORT's Python transformer optimizer holds several copies of the weights (10.5 GiB peak on a 2.2 GB
            # XLM-R large); above this size the serving session's own ORT_ENABLE_ALL fusions have to do.
            unfused = []
            for r in candidates:
                ops = tuple(o for o in r.operators if o != "Attention") or ("MatMul",)  # no fused Attention nodes
                r2 = Q.replace(r, optimization_level=0, operators=ops, fast_gelu=False,
                               name=r.name if r.optimization_level == 0 else r.name + "-unfused")
                if all(Q.replace(u, name="") != Q.replace(r2, name="") for u in unfused):
                    unfused.append(r2)
            if unfused != candidates:
                log("optimize", "skipped", reason="model too large for the offline fusion pass within the memory budget",
                    fp32_bytes=_model_bytes(fp32), limit_bytes=FUSION_MAX_BYTES)
            candidates = unfused
        heads = int(cfg.get("num_attention_heads") or 0)
        hidden = int(cfg["hidden_size"])
        optimized: dict = {}
        fp32_bytes = _model_bytes(fp32)
        tried: list[dict] = []
        entries: list[dict] = []
        budget = float(req.time_budget_seconds)
        per_candidate = None
        for i, recipe in enumerate(candidates):
            if i > 0 and per_candidate is not None and self.elapsed() + per_candidate * 1.2 > budget * 0.85:
                log("quantize", "skipped", recipe=recipe.name, reason="time budget")
                break
            t_c = time.monotonic()
            try:
                with stage("optimize", self.timings, level=recipe.optimization_level, recipe=recipe.name) as rec:
                    opt_path = Q.optimized_for(recipe, fp32, work, heads, hidden, optimized)
                    rec.update(bytes=_model_bytes(opt_path),
                               fusions=getattr(Q.optimize, "last_stats", {}) if recipe.optimization_level else {})
                    trim_memory()
                cand_path = work / f"int8-{i}" / "model.onnx"
                with stage("quantize", self.timings, recipe=recipe.to_dict()) as rec:
                    Q.build_int8(fp32, cand_path, recipe, work, heads, hidden, calib_feeds, exp["input_names"],
                                 cache=optimized)
                    rec.update(bytes=_model_bytes(cand_path))
                    trim_memory()
                with stage("verify", self.timings, model="int8", recipe=recipe.name) as rec:
                    got = self._score(cand_path, batches, inverse, failure_reason="QuantizationFailed")
                    q = verify.quality(groups, ref.scores, got.scores, req.topk)
                    why = verify.gate(q, req.min_spearman, req.min_topk_agreement)
                    speed = {"fp32_pairs_per_s": ref.pairs_per_s, "int8_pairs_per_s": got.pairs_per_s,
                             "speedup": got.pairs_per_s / ref.pairs_per_s,
                             "size_ratio": _model_bytes(cand_path) / fp32_bytes, "fp32_p50_ms": ref.p50_ms,
                             "fp32_p95_ms": ref.p95_ms, "int8_p50_ms": got.p50_ms, "int8_p95_ms": got.p95_ms}
                    rec.update(quality=verify.rounded(q), speed=verify.rounded(speed, 3), passed=not why, why=why)
                entries.append({"recipe": recipe, "path": cand_path, "quality": q, "speed": speed, "why": why})
                tried.append(_tried_entry(recipe.name, q, speed, why))
            except JobError as exc:
                if req.recipe != "auto":
                    raise
                log("quantize", "recipe_failed", recipe=recipe.name, reason=exc.reason, error=exc.message[:500])
                tried.append({"name": recipe.name, "passed": False, "error": exc.reason})
            per_candidate = max(per_candidate or 0.0, time.monotonic() - t_c)

        best = _choose(entries)
        if best is None:
            raise JobError("QuantizationFailed", f"no recipe produced a model: {tried}")
        recipe_info = {**best["recipe"].to_dict(), "tried": tried}
        if best["why"]:
            raise JobError("QualityGateFailed", f"INT8 ranks too differently from FP32 ({best['recipe'].name}): "
                                                + "; ".join(best["why"]),
                           quality=_finite(best["quality"]), speed=_finite(best["speed"]), recipe=recipe_info)

        # -- publish --------------------------------------------------------------------------------------------
        with stage("publish", self.timings) as rec:
            final = self._assemble(src, cfg, tok_json, best, orig_tmp, exp, fetched, recipe_info, model_type)
            if final is None:
                done = publish.read_published(req.output_root, req.artifact_id)
                return self._already(done or {})
            manifest_sha = layout.sha256_file(final / MANIFEST_FILE)
            manifest = json.loads((final / MANIFEST_FILE).read_text())
            rec.update(path=str(final), bytes=manifest["size_bytes"])
        return JobResult(ok=True, reason="Published",
                         message=f"published {best['recipe'].name}: spearman {best['quality']['spearman']:.4f}, "
                                 f"{best['speed']['speedup']:.2f}x FP32",
                         artifact_id=req.artifact_id, path=str(final), manifest_sha256=manifest_sha,
                         size_bytes=manifest["size_bytes"], quality=verify.rounded(_finite(best["quality"])),
                         speed=verify.rounded(_finite(best["speed"]), 3),
                         recipe={k: v for k, v in recipe_info.items() if k != "extra"})

    def _default_eval_size(self, sess, tok, pad_id: int, eval_pairs) -> int:
        """How many of the default pairs to score: all of them (840) when the FP32 model is fast enough to score
        them in EVAL_BUDGET_SHARE of the time budget, else fewer (never fewer than the built-in 74): a 568M model
        on 2 cores scores about one pair a second, and the gate has to leave time for quantizing."""
        probe = textenc.make_batches(tok, [(p.query, p.text) for p in eval_pairs[:24]], pad_id, batch_size=8)
        names = [i.name for i in sess.get_inputs()]
        sess.run(["logits"], {k: probe[0][k] for k in names})
        t0 = time.perf_counter()
        for b in probe:
            sess.run(["logits"], {k: b[k] for k in names})
        pps = 24 / max(1e-6, time.perf_counter() - t0)
        n = int(pps * EVAL_BUDGET_SHARE * self.req.time_budget_seconds)
        return max(min(len(eval_pairs), MIN_DEFAULT_EVAL_PAIRS), min(len(eval_pairs), n))

    def _score(self, model: Path, batches, inverse, *, failure_reason: str, sess=None):
        """Score ``batches`` with ``model`` in a session built as TEI builds it, timed; scores come back in input
        order (``inverse`` undoes the length sort). A graph TEI could not serve raises ``failure_reason``."""
        from . import verify

        sess = sess if sess is not None else verify.make_session(model, self.threads)
        problems = verify.check_output(sess)
        if problems:
            raise JobError(failure_reason, "; ".join(problems))
        timed = verify.score_timed(sess, batches, min_seconds=self._timing_seconds())
        timed.scores = timed.scores[inverse]
        del sess
        trim_memory()
        return timed

    def _timing_seconds(self) -> float:
        """How long to time each model (at least one pass over the eval batches is always made)."""
        return float(os.environ.get("RERANK_QUANTIZE_TIMING_SECONDS", "2.0"))

    def _assemble(self, src, cfg, tok_json, best, orig_tmp, exp, fetched, recipe_info, model_type):
        req, tmp = self.req, self.tmp
        tok_dirs = [tok_json.parent, src] if tok_json.parent != src else [src]
        cpu = tmp / CPU_SUBDIR
        cpu.mkdir()
        chosen = best["path"]
        os.replace(chosen, cpu / layout.MODEL_FILE)
        data = chosen.with_name(chosen.name + "_data")
        if data.exists():
            os.replace(data, cpu / layout.DATA_FILE)
        fixed_cfg = layout.tei_config(cfg, tok_json)
        layout.write_json(cpu / "config.json", fixed_cfg)
        layout.copy_tokenizer(tok_dirs, cpu)
        problems = layout.check_tei_dir(cpu, expect_token_type_ids=model_type not in layout.NO_TOKEN_TYPES)
        if problems:
            raise JobError("PublishFailed", "CPU directory is not TEI-loadable: " + "; ".join(problems))
        if req.keep_original:
            orig = tmp / ORIGINAL_SUBDIR
            orig.mkdir()
            wsrc = orig_tmp if orig_tmp is not None else src
            names = layout.weight_files(wsrc)
            if not names:
                raise JobError("PublishFailed", "no safetensors weights for the GPU pool")
            inside = tmp in wsrc.resolve().parents
            for name in names:
                if inside:  # written or downloaded by this run: move, do not copy gigabytes
                    os.replace(wsrc / name, orig / name)
                else:  # the user's directory: copy (a hard link would change with it)
                    shutil.copyfile(wsrc / name, orig / name)
            layout.write_json(orig / "config.json", fixed_cfg)
            layout.copy_tokenizer(tok_dirs, orig)
        shutil.rmtree(tmp / "work", ignore_errors=True)
        files = layout.file_inventory(tmp)
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "artifact_id": req.artifact_id,
            "model": req.model,
            "revision": fetched.revision or req.revision,
            "source": fetched.source,
            "model_type": model_type,
            "files": files,
            "size_bytes": sum(f["size"] for f in files),
            "recipe": recipe_info,
            "quality": _finite(best["quality"]),
            "gate": {"min_spearman": req.min_spearman, "min_topk_agreement": req.min_topk_agreement, "topk": req.topk},
            "speed": _finite(best["speed"]),
            "speed_settings": {"batch_size": 8, "intra_op_threads": self.threads,
                               "graph_optimization_level": "ORT_ENABLE_ALL"},
            "export": {"opset": exp["opset"], "inputs": exp["input_names"], "outputs": exp["output_names"],
                       "tokenizer_converted": exp["tokenizer_converted"]},
            "versions": {**_versions()},
            "timings": dict(self.timings),
            "created_unix": int(time.time()),
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False))
        try:
            return publish.commit(tmp, req.output_root, req.artifact_id)
        except FileExistsError:
            return None


def _tried_entry(name: str, q: dict, speed: dict, why: list[str]) -> dict:
    """One line of the recipe search for the manifest, the Job result and ``status.artifact.recipe.tried``
    (compact: the termination message holds at most 4 KB)."""
    def r(v, nd):
        return round(float(v), nd) if np.isfinite(v) else None

    return {"name": name, "passed": not why, "spearman": r(q["spearman"], 5), "topk": r(q["topk_agreement"], 4),
            "int8_pairs_per_s": r(speed["int8_pairs_per_s"], 2), "speedup": r(speed["speedup"], 3),
            "size_ratio": r(speed["size_ratio"], 3)}


def _choose(entries: list[dict]) -> dict | None:
    """The fastest candidate that passes the gate; else the best-ranking failure (for the report)."""
    passing = [e for e in entries if not e["why"]]
    if passing:
        return max(passing, key=lambda e: e["speed"]["int8_pairs_per_s"])
    if not entries:
        return None
    return max(entries, key=lambda e: e["quality"]["spearman"] if np.isfinite(e["quality"]["spearman"]) else -2.0)


def _model_bytes(p: Path) -> int:
    total = p.stat().st_size
    d = p.with_name(p.name + "_data")
    return total + (d.stat().st_size if d.exists() else 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="rerank-quantize", description=__doc__.splitlines()[0])
    contract.add_arguments(parser)
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        res = JobResult(ok=False, reason="InvalidInput", message="bad command line (see stderr)")
        text = res.to_message()
        write_termination_message(text)
        print(text, flush=True)
        return EXIT_CODES["InvalidInput"]
    req = contract.request_from_namespace(ns)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import logging

    logging.getLogger().setLevel(logging.ERROR)  # ORT's quantizer warns on the root logger; our logs are JSON
    signal.signal(signal.SIGTERM, _on_sigterm)
    job = Job(req)
    log("job", "start", request={k: v for k, v in req.__dict__.items()}, threads=job.threads,
        target=isa.detect_local_target())
    code = 0
    try:
        res = job.run()
    except JobError as exc:
        d = exc.details
        res = JobResult(ok=False, reason=exc.reason, message=exc.message, artifact_id=req.artifact_id,
                        quality=verify_rounded(d.get("quality", {})), speed=verify_rounded(d.get("speed", {})),
                        recipe={k: v for k, v in d.get("recipe", {}).items() if k != "extra"})
        code = EXIT_CODES[exc.reason]
    except _Terminated as exc:
        res = JobResult(ok=False, reason="InternalError", message=f"terminated ({exc})", artifact_id=req.artifact_id)
        code = EXIT_CODES["InternalError"]
    except Exception as exc:  # noqa: BLE001
        res = JobResult(ok=False, reason="InternalError", message=f"{type(exc).__name__}: {exc}",
                        artifact_id=req.artifact_id)
        code = EXIT_CODES["InternalError"]
    log("job", "end", ok=res.ok, reason=res.reason, seconds=round(job.elapsed(), 3), peak_rss_bytes=peak_rss_bytes(),
        timings=job.timings)
    text = res.to_message()
    write_termination_message(text)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return code


def verify_rounded(d: dict) -> dict:
    return {k: round(float(v), 5) for k, v in _finite(d).items()}


if __name__ == "__main__":
    sys.exit(main())
