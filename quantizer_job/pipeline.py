"""The quantization Job as a pipeline of stages, each a function returning a small dataclass (:mod:`.stage_data`):

    fetch -> export (child process, torch) -> reference (FP32, part of verify) -> recipe search (optimize, quantize,
    verify per candidate; :mod:`.search`) -> layout (the TEI directories and the manifest) -> publish (one rename)

Fetch and export are in :mod:`.preparation`, the reference in :mod:`.fp32_reference`, the recipe search in
:mod:`.recipe_trials`, the layout in :mod:`.artifact_assembly`; this module holds the run and publication.
:class:`Job` runs them under the artifact's lock in a temp directory that a failure removes, so a crash never
leaves half a model and a published artifact is never overwritten. Every stage logs one structured JSON line per
event on stderr (:mod:`.logs`); :func:`execute` turns the outcome into the
:class:`~rerank_contracts.quantize_job.JobResult` and the exit code the operator reads.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from quantizer_job.stages.artifact_assembly import lay_out
from quantizer_job.stages.fp32_reference import reference
from quantizer_job.stages.measurement import serve_batch_tokens
from quantizer_job.stages.preparation import export_model, fetch_source, load_inputs
from quantizer_job.stages.recipe_trials import search_recipes
from quantizer_job.stages.stage_data import Choice, Context
from quantizer_job.steps.common import isa
from quantizer_job.steps.common.errors import EXIT_CODES, JobError
from quantizer_job.steps.common.logs import log, peak_rss_bytes, stage
from quantizer_job.steps.common.results import rounded
from quantizer_job.steps.storage import publish
from quantizer_job.steps.tei import layout
from rerank_contracts import oci, shared_store
from rerank_contracts.artifact_layout import MANIFEST_FILE
from rerank_contracts.quantize_job import JobRequest, JobResult


class Terminated(BaseException):
    """SIGTERM (the Job's deadline or a deleted pod): unwinds the pipeline so the temp directory is removed."""


# -- publish: the result of a finished run, or of one published before ----------------------------------------------
def publish_artifact(ctx: Context, choice: Choice, manifest: dict[str, Any]) -> JobResult:
    """Rename the finished temp directory into place; a run that lost the race reports the winner's artifact."""
    req = ctx.req
    try:
        final = publish.commit(ctx.tmp, req.output_root, req.artifact_id)
    except FileExistsError:
        return already_published(req, publish.read_published(req.output_root, req.artifact_id) or {})
    best = choice.trial
    return JobResult(ok=True, reason="Published",
                     message=f"published {best.recipe.name}: spearman {best.quality['spearman']:.4f}, "
                             f"{best.speed['speedup']:.2f}x FP32",
                     artifact_id=req.artifact_id, path=str(final),
                     manifest_sha256=layout.sha256_file(final / MANIFEST_FILE),
                     size_bytes=int(json.loads((final / MANIFEST_FILE).read_text())["size_bytes"]),
                     quality=rounded(manifest.get("quality") or best.quality), speed=rounded(best.speed, 3),
                     recipe=_result_recipe(choice.recipe_info), max_input_tokens=int(manifest["max_input_tokens"]))


def already_published(req: JobRequest, manifest: dict[str, Any]) -> JobResult:
    """The result of a run whose artifact exists: the manifest's figures, no second quantization."""
    final = publish.final_path(req.output_root, req.artifact_id)
    log("publish", "already_published", path=str(final))
    return JobResult(ok=True, reason="AlreadyPublished", message=f"artifact {req.artifact_id} already published",
                     artifact_id=req.artifact_id, path=str(final),
                     manifest_sha256=layout.sha256_file(final / MANIFEST_FILE),
                     size_bytes=int(manifest.get("size_bytes", 0)),
                     quality=rounded(manifest.get("quality", {})), speed=rounded(manifest.get("speed", {})),
                     recipe=_result_recipe(manifest.get("recipe", {})),
                     max_input_tokens=int(manifest.get("max_input_tokens") or 0))


def push_shared(req: JobRequest, result: JobResult, timings: dict[str, float]) -> JobResult:
    """A shared artifact, once published on the Job's volume, goes to the class's store (``--push-repository``):
    the tag is pushed last, so the store only ever names complete artifacts. A push that fails fails the Job
    (PublishFailed): the operator serves nothing the store does not hold."""
    host = req.push_repository.split("/", 1)[0]
    config = Path(os.environ.get("DOCKER_CONFIG", "/nonexistent")) / "config.json"
    credentials = oci.docker_credentials(config, host) if config.is_file() else None
    registry = oci.Registry(host, insecure=req.push_insecure, credentials=credentials)
    with stage("push", timings) as rec:
        try:
            ref = shared_store.push(publish.final_path(req.output_root, req.artifact_id),
                             req.push_repository.split("/", 1)[1], req.artifact_id, registry=registry,
                             scratch=Path(tempfile.mkdtemp(prefix="push-")))
        except (oci.RegistryError, shared_store.StoreError, OSError) as exc:
            raise JobError("PublishFailed", f"pushing to {req.push_repository}: {exc}") from exc
        rec.update(ref=ref)
    return replace(result, ref=ref)


# -- the run --------------------------------------------------------------------------------------------------------
def validate(req: JobRequest) -> None:
    """Flags the command line's types cannot check: refused before any work."""
    if not publish.valid_artifact_id(req.artifact_id):
        raise JobError("InvalidInput", f"artifact id {req.artifact_id!r}: use letters, digits, '.', '_', '-'")
    if req.topk < 1 or not (0.0 <= req.min_spearman <= 1.0) or not (0.0 <= req.min_topk_agreement <= 1.0):
        raise JobError("InvalidInput", "--topk must be >= 1 and the gate thresholds within [0, 1]")
    if req.mode == "static" and not req.calibration_pairs:
        raise JobError("InvalidInput", "--mode static needs --calibration-pairs")


class Job:
    """One quantization run: validation, then the stages under the artifact's lock in a temp directory."""

    def __init__(self, req: JobRequest):
        self.req = req
        self.timings: dict[str, float] = {}
        self.t0 = time.monotonic()
        self.threads = isa.cpu_budget()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def run(self) -> JobResult:
        result = self._run()
        return push_shared(self.req, result, self.timings) if self.req.push_repository and result.ok else result

    def _run(self) -> JobResult:
        req = self.req
        validate(req)
        done = publish.read_published(req.output_root, req.artifact_id)
        if done is not None:
            return already_published(req, done)
        lock = publish.ArtifactLock(req.output_root, req.artifact_id)
        if not lock.acquire():
            raise JobError("PublishFailed", f"another run holds the lock of artifact {req.artifact_id}")
        try:
            done = publish.read_published(req.output_root, req.artifact_id)
            if done is not None:
                return already_published(req, done)
            stale = publish.clean_stale(req.output_root, req.artifact_id)
            if stale:
                log("publish", "cleaned_stale_temp_dirs", dirs=stale)
            tmp = publish.make_temp(req.output_root, req.artifact_id)
            try:
                return self._build(Context(req=req, tmp=tmp, threads=self.threads, elapsed=self.elapsed,
                                           timings=self.timings))
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            lock.release()

    def _build(self, ctx: Context) -> JobResult:
        ctx.work.mkdir()
        source = fetch_source(ctx)
        inputs = load_inputs(ctx.req)
        exported = export_model(ctx, source, inputs)
        ref = reference(ctx, exported, inputs, serve_batch_tokens(ctx, source))
        choice = search_recipes(ctx, source, exported, ref)
        with stage("publish", ctx.timings) as rec:
            manifest = lay_out(ctx, source, exported, choice, inputs.eval_pairs)
            result = publish_artifact(ctx, choice, manifest)
            if result.reason == "Published":
                rec.update(path=result.path, bytes=result.size_bytes)
        return result


def execute(req: JobRequest) -> tuple[JobResult, int]:
    """Run the Job and map every outcome to its result and exit code (0, or the failure reason's)."""
    job = Job(req)
    log("job", "start", request=dict(req.__dict__), threads=job.threads, target=isa.detect_local_target())
    code = 0
    try:
        res = job.run()
    except JobError as exc:
        d = exc.details
        res = JobResult(ok=False, reason=exc.reason, message=exc.message, artifact_id=req.artifact_id,
                        quality=rounded(d.get("quality", {})), speed=rounded(d.get("speed", {})),
                        recipe=_result_recipe(d.get("recipe", {})))
        code = EXIT_CODES[exc.reason]
    except Terminated as exc:
        res = JobResult(ok=False, reason="InternalError", message=f"terminated ({exc})", artifact_id=req.artifact_id)
        code = EXIT_CODES["InternalError"]
    except Exception as exc:  # a bug: still a result the operator can read, never a bare traceback
        res = JobResult(ok=False, reason="InternalError", message=f"{type(exc).__name__}: {exc}",
                        artifact_id=req.artifact_id)
        code = EXIT_CODES["InternalError"]
    log("job", "end", ok=res.ok, reason=res.reason, seconds=round(job.elapsed(), 3), peak_rss_bytes=peak_rss_bytes(),
        timings=job.timings)
    return res, code


# -- helpers --------------------------------------------------------------------------------------------------------
def _result_recipe(recipe_info: dict[str, Any]) -> dict[str, Any]:
    """The recipe as the Job result reports it: without ``extra`` (the termination message holds 4 KB)."""
    return {k: v for k, v in recipe_info.items() if k != "extra"}
