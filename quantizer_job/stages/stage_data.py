"""What the stages of the Job hand on: one run's :class:`Context`, and each stage's result as a small frozen dataclass.

    fetch_source -> Source, load_inputs -> Inputs, export_model -> Exported, reference -> Reference,
    search_recipes -> Choice

Separate from the stages themselves (:mod:`.preparation`, :mod:`.fp32_reference`, :mod:`.recipe_trials`,
:mod:`.artifact_assembly`) because every later stage reads what the earlier ones made: the types live below all of
them, so no stage imports another to learn its result's shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from quantizer_job.steps.evaluation import evaldata, serving, verify
from quantizer_job.steps.recipe_search import search
from quantizer_job.steps.storage.fetch import Fetched
from quantizer_job.steps.tei import textenc
from rerank_contracts.quantize_job import JobRequest


@dataclass
class Context:
    """One run: the request, its temp directory (renamed into place by publish) and the stage timings."""

    req: JobRequest
    tmp: Path
    threads: int
    elapsed: Callable[[], float]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def work(self) -> Path:
        return self.tmp / "work"


@dataclass(frozen=True)
class Source:
    """The fetched model: its directory, its config.json, the cap on the Job's max input length (the export child
    lowers it to what the model's positions take: ``Exported.info["max_length"]``, used for verification and
    timing) and TEI's (``tei_max_length``: the token budget the Job times with by default; the published CPU
    directory's own figure, ``max_input_tokens`` in the manifest, is what the pool gets)."""

    fetched: Fetched
    config: dict[str, Any]
    max_length: int
    tei_max_length: int

    @property
    def path(self) -> Path:
        return self.fetched.path

    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])


@dataclass(frozen=True)
class Inputs:
    """Evaluation pairs (the gate's) and calibration pairs (static quantization's; may be empty)."""

    eval_pairs: list[evaldata.Pair]
    calib_pairs: list[evaldata.Pair]


@dataclass(frozen=True)
class Exported:
    """The FP32 ONNX graph, the export child's report, and the tokenizer TEI will load.

    What the loaded model told the child (``export.describe``) replaces what the parent could only guess from
    config.json: the graph's inputs, the padding id, the tokens its position table takes and the sizes under TEI's
    names, whatever the family calls them."""

    onnx: Path
    info: dict[str, Any]
    tokenizer_json: Path
    tokenizer: textenc.Tokenizer
    pad_id: int
    #: Safetensors the export wrote for the GPU pool when the source had only .bin weights.
    original_weights: Path | None
    #: config.json with the sizes transformers resolved added under TEI's names (DistilBERT's ``dim`` as
    #: ``hidden_size``); every original key kept.
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def max_positions(self) -> int:
        """Tokens a pair may have: the position table less its offset (the child's ``max_positions``)."""
        return int(self.info["max_positions"])


@dataclass(frozen=True)
class Reference:
    """The FP32 scores every candidate is compared with, on batches shared by every measurement."""

    timed: verify.Timed
    batches: list[dict[str, np.ndarray]]
    #: Undoes the length sort of the batches: scores[inverse] is in evaluation-pair order.
    inverse: np.ndarray
    groups: list[str]
    calib_feeds: list[dict[str, np.ndarray]]
    #: One round of the served-like measurement: the evaluation requests in arrival order, as TEI batches them.
    served: list[serving.Batch] = field(default_factory=list)
    #: FP32's seconds per served round, measured here when the FP32 session is too large to keep loaded next to a
    #: candidate's (then candidates are not timed in turns with it); None: timed in turns.
    fp32_rounds: list[float] | None = None
    #: Rounds every model is timed for (``serving.rounds_for``).
    rounds: int = serving.ROUNDS


@dataclass(frozen=True)
class Choice:
    """The recipe search's winner, which passed the gate, with the recipe report for the manifest and result."""

    trial: search.Trial
    recipe_info: dict[str, Any]
