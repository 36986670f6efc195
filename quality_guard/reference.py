"""The guard's own FP32 reference: the artifact's original weights scored in the guard's process, for a model that
has no GPU pool to compare with.

Why here and not a TEI endpoint: a CPU-only tenant has nothing else that scores the original weights, and the guard
already runs from the quantizer image (PyTorch and transformers inside). The cost is bounded twice: the guard's
budget counts this reference as one call of every sampled request (``budget.py``, so at most
``callsPerSecond / (pools + 1)`` requests a second), and its one worker thread scores one request at a time, on the
threads its CPU limit gives it.

Scores are what TEI's ``/rerank`` answers for the same body, so that a difference is the pool's, never the
reference's: the single logit of each (query, text) pair, tokenized with the model's ``tokenizer.json`` the way
TEI's router does (``textenc.tei_max_input_length``: its max input length, not the Job's 512-token cap; longest-first
truncation in the request's ``truncation_direction`` when the request or the pool truncates, else a pair over the
limit is refused as TEI refuses it), in batches of at most 8 pairs, through a sigmoid unless the request asks for
``raw_scores``. torch and transformers are imported only by a guard configured with this reference
(``GuardConfig.reference == LOCAL_REFERENCE``), which loads the model as it starts; a guard with a TEI reference
never imports them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from quantizer_job.steps.common import isa
from quantizer_job.steps.evaluation import verify
from quantizer_job.steps.tei import layout, textenc

from .compare import sigmoid


class LocalReference:
    """FP32 scores of a transformers cross-encoder directory (config.json, *.safetensors, tokenizer.json).

    ``max_batch_tokens`` and ``auto_truncate``: the checked pool's TEI flags, which set its max input length and
    whether a request that does not say ``truncate`` is truncated."""

    def __init__(self, model_dir: str | Path, threads: int | None = None, *, max_batch_tokens: int | None = None,
                 auto_truncate: bool = True) -> None:
        self.model_dir = Path(model_dir)
        self.threads = threads
        self.max_batch_tokens = max_batch_tokens
        self.auto_truncate = auto_truncate
        self.max_length = 0
        self._lock = threading.Lock()
        self._model: Any = None
        self._tok: Any = None
        self._pad_id = 0
        self._token_types = True
        self._error: Exception | None = None

    def load(self) -> None:
        """Load the model once (the guard does it as it starts); a failure is kept and raised on every call, so
        each sampled request counts a ``reference_error`` instead of retrying a load that cannot succeed."""
        with self._lock:
            self._load_locked()

    def _load_locked(self) -> None:
        if self._model is not None:
            return
        if self._error is not None:
            raise self._error
        try:
            self._load()
        except Exception as exc:
            self._error = exc
            raise

    def _load(self) -> None:
        import tokenizers
        import torch
        from transformers import AutoModelForSequenceClassification

        cfg = json.loads((self.model_dir / "config.json").read_text(encoding="utf-8"))
        tok_json = self.model_dir / "tokenizer.json"
        torch.set_num_threads(self.threads or isa.cpu_budget())
        model = AutoModelForSequenceClassification.from_pretrained(str(self.model_dir), dtype=torch.float32)
        model.eval()
        if int(model.config.num_labels) != 1:
            raise ValueError(f"{self.model_dir}: {model.config.num_labels} labels; a reranker has exactly one")
        self._tok = tokenizers.Tokenizer.from_file(str(tok_json))
        self._tok.no_padding()
        self.max_length = textenc.tei_max_input_length(self.model_dir, cfg, self.max_batch_tokens)
        self._pad_id = layout.pad_token_id(cfg, tok_json)
        self._token_types = textenc.uses_token_types(cfg)  # as the model's own users call it
        self._model = model

    def _truncation(self, truncate: bool, direction: str) -> None:
        if truncate:
            self._tok.enable_truncation(max_length=self.max_length, strategy="longest_first",
                                        direction="left" if direction.lower() == "left" else "right")
        else:
            self._tok.no_truncation()

    def logits(self, query: str, texts: list[str], *, truncate: bool | None = None,
               direction: str = "right") -> np.ndarray:
        """The model's logit for each (query, text), in ``texts`` order. ``truncate``: the request's (None: the
        pool's ``--auto-truncate``); without it a pair over TEI's max input length is refused, as TEI does."""
        import torch

        with self._lock:
            self._load_locked()
            self._truncation(self.auto_truncate if truncate is None else truncate, direction)
            encs = self._tok.encode_batch([(query, t) for t in texts])  # once: checked, then batched
            longest = max(len(e.ids) for e in encs)
            if longest > self.max_length:
                raise ValueError(f"a pair has {longest} tokens, over TEI's max input length {self.max_length}: "
                                 "TEI refuses the request")
            names = ("input_ids", "attention_mask", "token_type_ids") if self._token_types else (
                "input_ids", "attention_mask")
            out: list[np.ndarray] = []
            for i in range(0, len(encs), verify.TEI_MAX_BATCH):
                feed = textenc.pad_encodings(encs[i : i + verify.TEI_MAX_BATCH], self._pad_id)
                with torch.inference_mode():
                    got = self._model(**{n: torch.from_numpy(feed[n]) for n in names}).logits
                out.append(got[:, 0].double().numpy())
        return np.concatenate(out)

    def __call__(self, body: Mapping[str, Any]) -> list[float]:
        """TEI's ``/rerank`` scores for ``body`` (``{query, texts, raw_scores, truncate, truncation_direction}``),
        in ``texts`` order."""
        truncate = body.get("truncate")
        logits = self.logits(str(body["query"]), [str(t) for t in body["texts"]],
                             truncate=None if truncate is None else bool(truncate),
                             direction=str(body.get("truncation_direction") or "right"))
        return [float(s) for s in (logits if body.get("raw_scores") else sigmoid(logits))]
