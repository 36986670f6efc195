"""What changes for a model too large for the Job's memory budget, and the size limit that decides it.

ONNX Runtime's Python transformer optimizer holds several copies of the weights, so above a size the Job gives up
the offline fusions and what follows from them: unfused candidates, weights quantized a tensor at a time, FP32 timed
once and the search cut short (:func:`too_large_to_fuse` lists them). Separate because the FP32 reference and the
recipe search both ask the question (:mod:`.fp32_reference`, :mod:`.recipe_trials`), and the limit is read from the
environment in one place.
"""

from __future__ import annotations

import os
from pathlib import Path

from quantizer_job.steps.graph.onnx_files import model_bytes

#: Models whose FP32 ONNX is larger than this skip the offline transformer fusions (memory; see
#: :func:`.recipe_trials.candidates`), unless RERANK_QUANTIZE_FUSION_MAX_BYTES says otherwise (read when the Job
#: runs: :func:`fusion_max_bytes`).
DEFAULT_FUSION_MAX_BYTES = 1 << 30


def too_large_to_fuse(fp32: Path) -> bool:
    """A model above the fusion size limit: unfused candidates (``recipe_trials.candidates``), weights quantized a
    tensor at a time, FP32 timed once rather than kept loaded beside each candidate, and after a candidate passes
    the search skipping those that could not serve faster (``search.not_faster``)."""
    return model_bytes(fp32) > fusion_max_bytes()


def fusion_max_bytes() -> int:
    """The FP32 size above which the offline transformer fusions are skipped (see :func:`.recipe_trials.candidates`)."""
    return int(os.environ.get("RERANK_QUANTIZE_FUSION_MAX_BYTES", str(DEFAULT_FUSION_MAX_BYTES)))
