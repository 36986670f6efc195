"""The contract between the operator and the quantization Job: its command line and its result.

The operator builds the Job's command line with :func:`build_args` and reads the Job's outcome back from the
container's termination message with :func:`parse_result`; the quantizer parses that same command line with
:func:`add_arguments` and writes its outcome with :meth:`JobResult.to_message`. Neither side spells a flag or a
result key anywhere else. Where the Job publishes (the volume's layout) is :mod:`.artifact_layout`.

This module must stay importable without torch, optimum or transformers: the operator imports it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

#: Kubernetes keeps at most 4096 bytes of a termination message.
MAX_MESSAGE_BYTES = 4096
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
RESULT_VERSION = 1
#: The quality gate's defaults, for the Job and for a RerankModel that leaves them out: the INT8 model's scores must
#: rank the evaluation pairs as FP32's do (Spearman) and keep this share of FP32's top-k.
DEFAULT_MIN_SPEARMAN = 0.99
DEFAULT_MIN_TOPK_AGREEMENT = 0.9

Mode = Literal["dynamic", "static"]
Target = Literal["auto", "avx512_vnni", "avx2", "arm64"]
RecipeChoice = Literal["auto", "fixed"]

#: Reasons a Job can fail with; the operator copies them into the ModelReady condition as they are.
FAILURE_REASONS = (
    "ModelNotFound",  # missing repo, gated without token, bad revision, path absent
    "UnsupportedModel",  # not a single-logit sequence classifier
    "ExportFailed",
    "QuantizationFailed",
    "QualityGateFailed",  # INT8 ranks too differently from FP32; nothing published
    "InvalidInput",  # bad eval/calibration pairs, bad flags
    "PublishFailed",
    "InternalError",
    # The hub (or the class's mirror or proxy) did not answer, or answered 429/5xx: transient. Appended last so the
    # exit codes of the reasons above keep their values.
    "HubUnavailable",
)

#: Exit status per failure reason (0 is success; 1 is left to the interpreter's own crashes).
EXIT_CODES = {reason: 10 + i for i, reason in enumerate(FAILURE_REASONS)}
#: Failures that another attempt of the same Job cannot fix: the operator's Job fails at once on these exit
#: codes (podFailurePolicy) instead of retrying with backoff. A fixed spec makes a new Job.
PERMANENT_FAILURES = ("ModelNotFound", "UnsupportedModel", "QualityGateFailed", "InvalidInput")
#: Failures the operator retries with a new Job after a backoff, with no spec edit (the Job fails at once on them:
#: its own attempts already retried within seconds; the operator's backoff spans minutes).
TRANSIENT_FAILURES = ("HubUnavailable",)


@dataclass(frozen=True)
class JobRequest:
    """Everything the quantizer needs; the operator fills it from the RerankModel spec."""

    model: str  # hub id ("org/name") or an absolute local directory
    output_root: str  # the volume's mount point; the artifact goes to <root>/artifacts/<artifact_id>
    artifact_id: str
    revision: str | None = None
    mode: Mode = "dynamic"
    target: Target = "auto"
    recipe: RecipeChoice = "auto"
    per_channel: bool = True
    reduce_range: bool = False
    operators: tuple[str, ...] = ("MatMul",)
    optimization_level: int = 1  # ORT transformer optimizer level before quantization; 0 disables
    eval_pairs: str | None = None  # JSONL of {"query", "text", ["label"]}
    calibration_pairs: str | None = None  # JSONL, static mode only
    min_spearman: float = DEFAULT_MIN_SPEARMAN
    min_topk_agreement: float = DEFAULT_MIN_TOPK_AGREEMENT
    topk: int = 3
    time_budget_seconds: int = 900
    keep_original: bool = True  # also publish original/ (model.safetensors) for the GPU pool
    #: Keep the evaluation pairs beside the artifact (evaluation.jsonl, what a guard without a Gateway replays). Not
    #: for a re-quantization on live traffic: the tenant's queries expire from their sample, not in an artifact.
    keep_eval_pairs: bool = True
    #: CPUs of the pool that will serve the artifact: speed is measured with that many ONNX Runtime threads (as TEI
    #: sizes them), at most the Job's own; 0: the Job's own CPUs. Measurement only: not part of the artifact's id.
    serve_threads: int = 0
    #: The CPU pool's ``--max-batch-tokens`` when its spec sets one: served batches are timed within that token budget
    #: (TEI's queue rule); 0: the pool's default, the model's maximum input length. Measurement only, like
    #: ``serve_threads``.
    serve_batch_tokens: int = 0
    #: Run the Python code a model repository ships (config.json's ``auto_map``) when exporting it: only when the
    #: model asks for it and its RerankClass allows it (``modelSources.allowRemoteCode``). Without it such a model is
    #: refused (UnsupportedModel) naming its architecture.
    trust_remote_code: bool = False
    #: A shared artifact (the class's ``artifactStore``): once published, push it to this OCI repository
    #: (``host/path``) under its id as tag, with the credentials of the Docker config in ``$DOCKER_CONFIG``.
    push_repository: str = ""
    #: The store's registry speaks plain HTTP (a registry inside the cluster).
    push_insecure: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the command line that :func:`build_args` produces."""
    parser.add_argument("--model", required=True, help="hub id (org/name) or a local directory")
    parser.add_argument("--revision", default=None, help="hub revision (commit, tag or branch)")
    parser.add_argument("--output", required=True, dest="output_root",
                        help="volume root; publishes to <output>/artifacts/<artifact-id>")
    parser.add_argument("--artifact-id", required=True, help="content hash naming the artifact directory")
    parser.add_argument("--mode", choices=["dynamic", "static"], default="dynamic")
    parser.add_argument("--target", choices=["auto", "avx512_vnni", "avx2", "arm64"], default="auto")
    parser.add_argument("--recipe", choices=["auto", "fixed"], default="auto",
                        help="auto tries a few recipes within --time-budget and keeps the fastest that passes the gate")
    parser.add_argument("--per-channel", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--reduce-range", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--operators", default="MatMul", help="comma-separated ONNX op types to quantize")
    parser.add_argument("--optimization-level", type=int, choices=[0, 1, 2, 99], default=1)
    parser.add_argument("--eval-pairs", default=None, help="JSONL of query/text pairs used by the quality gate")
    parser.add_argument("--calibration-pairs", default=None, help="JSONL of query/text pairs for static quantization")
    parser.add_argument("--min-spearman", type=float, default=DEFAULT_MIN_SPEARMAN)
    parser.add_argument("--min-topk-agreement", type=float, default=DEFAULT_MIN_TOPK_AGREEMENT)
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--time-budget-seconds", type=int, default=900)
    parser.add_argument("--keep-original", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--keep-eval-pairs", action=argparse.BooleanOptionalAction, default=True,
                        help="write the evaluation pairs beside the artifact (evaluation.jsonl)")
    parser.add_argument("--serve-threads", type=int, default=0,
                        help="CPUs of the serving CPU pool: speed is measured with that many threads (0: the Job's)")
    parser.add_argument("--serve-batch-tokens", type=int, default=0,
                        help="the CPU pool's --max-batch-tokens: served batches are timed within it "
                             "(0: the model's maximum input length, the pool's default)")
    parser.add_argument("--trust-remote-code", action="store_true", default=False,
                        help="run the code a model repository ships (config.json auto_map) to export it")
    parser.add_argument("--push-repository", default="",
                        help="an OCI repository (host/path) to push the published artifact to, tagged with its id")
    parser.add_argument("--push-insecure", action="store_true", default=False,
                        help="the repository's registry speaks plain HTTP")


def build_args(req: JobRequest) -> list[str]:
    """The Job container's args for ``req`` (the entry point is ``rerank-quantize``)."""
    args = ["--model", req.model, "--output", req.output_root, "--artifact-id", req.artifact_id]
    if req.revision:
        args += ["--revision", req.revision]
    args += [
        "--mode", req.mode,
        "--target", req.target,
        "--recipe", req.recipe,
        "--per-channel" if req.per_channel else "--no-per-channel",
        "--reduce-range" if req.reduce_range else "--no-reduce-range",
        "--operators", ",".join(req.operators),
        "--optimization-level", str(req.optimization_level),
        "--min-spearman", repr(req.min_spearman),
        "--min-topk-agreement", repr(req.min_topk_agreement),
        "--topk", str(req.topk),
        "--time-budget-seconds", str(req.time_budget_seconds),
        "--keep-original" if req.keep_original else "--no-keep-original",
    ]
    if not req.keep_eval_pairs:
        args.append("--no-keep-eval-pairs")
    if req.eval_pairs:
        args += ["--eval-pairs", req.eval_pairs]
    if req.calibration_pairs:
        args += ["--calibration-pairs", req.calibration_pairs]
    if req.serve_threads:
        args += ["--serve-threads", str(req.serve_threads)]
    if req.serve_batch_tokens:
        args += ["--serve-batch-tokens", str(req.serve_batch_tokens)]
    if req.trust_remote_code:
        args.append("--trust-remote-code")
    if req.push_repository:
        args += ["--push-repository", req.push_repository]
        if req.push_insecure:
            args.append("--push-insecure")
    return args


def parse_args(argv: Sequence[str]) -> JobRequest:
    """Inverse of :func:`build_args`."""
    parser = argparse.ArgumentParser(prog="rerank-quantize")
    add_arguments(parser)
    ns = parser.parse_args(list(argv))
    return request_from_namespace(ns)


def request_from_namespace(ns: argparse.Namespace) -> JobRequest:
    values = vars(ns).copy()
    values["operators"] = tuple(o for o in values["operators"].split(",") if o)
    known = {f for f in JobRequest.__dataclass_fields__}
    return JobRequest(**{k: v for k, v in values.items() if k in known})


#: The largest finite float16: the GPU pool serves the original weights in float16, where any intermediate beyond it
#: overflows to inf and the scores become meaningless.
FP16_MAX = 65504.0


def fp16_refusal(quality: Mapping[str, float]) -> str | None:
    """Why the GPU pool must not serve a model whose Job measured ``quality`` (None: it may, or the Job did not
    measure): its largest activation on the evaluation pairs (``fp16_peak_activation``, FP32) overflows float16."""
    peak = float(quality.get("fp16_peak_activation") or 0.0)
    if peak <= FP16_MAX:
        return None
    return (f"the original weights overflow in float16 (an activation of {peak:.3g} on the evaluation pairs, above "
            f"{FP16_MAX:g}): the GPU pool would serve inf/NaN scores, so it gets no traffic; serve the CPU pool, "
            "or disable the GPU pool")


@dataclass
class JobResult:
    """The Job's outcome, written as compact JSON to the termination message (< 4 KB)."""

    ok: bool
    reason: str  # "Published", "AlreadyPublished", or one of FAILURE_REASONS
    message: str
    artifact_id: str = ""
    path: str = ""  # the artifact directory on the volume
    manifest_sha256: str = ""
    size_bytes: int = 0
    quality: dict[str, float] = field(default_factory=dict)  # spearman, topk_agreement, max_abs_diff
    speed: dict[str, float] = field(default_factory=dict)  # fp32_pairs_per_s, int8_pairs_per_s, speedup
    recipe: dict[str, Any] = field(default_factory=dict)
    #: TEI's maximum input length for the CPU directory (tokens per pair): the CPU pool's default
    #: ``--max-batch-tokens`` (0: not reported, from a Job before it was).
    max_input_tokens: int = 0
    #: Where a shared artifact was pushed: ``host/path@sha256:<digest>`` ("" when the Job pushes nothing).
    ref: str = ""
    version: int = RESULT_VERSION

    def to_message(self) -> str:
        """Compact JSON, truncating the free-text message so the whole stays under the kubelet's limit."""
        data = asdict(self)
        text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        if len(text.encode()) <= MAX_MESSAGE_BYTES:
            return text
        # Escaped characters (non-ASCII, quotes) take several bytes each: search the longest prefix that fits.
        msg = data["message"]
        lo, hi = 0, len(msg)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            data["message"] = msg[:mid]
            if len(json.dumps(data, separators=(",", ":"), sort_keys=True).encode()) <= MAX_MESSAGE_BYTES:
                lo = mid
            else:
                hi = mid - 1
        data["message"] = msg[:lo]
        return json.dumps(data, separators=(",", ":"), sort_keys=True)


class ResultParseError(ValueError):
    """The termination message is not a result this version understands."""


def parse_result(message: str) -> JobResult:
    """Read a :class:`JobResult` back from a termination message."""
    try:
        data = json.loads(message)
    except json.JSONDecodeError as exc:
        raise ResultParseError(f"termination message is not JSON: {exc}") from exc
    if not isinstance(data, dict) or "ok" not in data or "reason" not in data:
        raise ResultParseError("termination message lacks 'ok'/'reason'")
    known = set(JobResult.__dataclass_fields__)
    return JobResult(**{k: v for k, v in data.items() if k in known})
