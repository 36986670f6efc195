"""Tokenize query/text pairs the way TEI does: with the model's ``tokenizer.json`` (``tokenizers``, no transformers).

TEI's ONNX Runtime backend pads each batch to its longest sequence and feeds int64 ``input_ids``,
``attention_mask`` and, only if the graph declares it, ``token_type_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: ``tokenizers.Tokenizer`` (the library ships no type information).
Tokenizer = Any

ROBERTA_FAMILY = ("xlm-roberta", "roberta", "camembert", "xlm-roberta-xl")


def max_input_length(config: dict[str, Any], cap: int = 512) -> int:
    """TEI's max input length: ``max_position_embeddings``, minus ``pad_token_id + 1`` for RoBERTa-family models."""
    mpe = int(config.get("max_position_embeddings") or cap)
    if config.get("model_type") in ROBERTA_FAMILY:
        mpe -= int(config.get("pad_token_id") or 1) + 1
    return max(8, min(cap, mpe))


def load_tokenizer(path: str, max_length: int) -> Tokenizer:
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(path)
    tok.no_padding()
    tok.enable_truncation(max_length=max_length, strategy="longest_first")
    return tok


def encode_pairs(tok: Tokenizer, pairs: Sequence[tuple[str, str]], pad_id: int) -> dict[str, np.ndarray]:
    """One batch: int64 arrays [batch, longest] for input_ids, attention_mask, token_type_ids."""
    encs = tok.encode_batch([(q, t) for q, t in pairs])
    n = max(len(e.ids) for e in encs)
    b = len(encs)
    ids = np.full((b, n), pad_id, dtype=np.int64)
    mask = np.zeros((b, n), dtype=np.int64)
    tt = np.zeros((b, n), dtype=np.int64)
    for i, e in enumerate(encs):
        k = len(e.ids)
        ids[i, :k] = e.ids
        mask[i, :k] = 1
        tt[i, :k] = e.type_ids
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}


def make_batches(tok: Tokenizer, pairs: Sequence[tuple[str, str]], pad_id: int,
                 batch_size: int = 8) -> list[dict[str, np.ndarray]]:
    return [encode_pairs(tok, pairs[i : i + batch_size], pad_id) for i in range(0, len(pairs), batch_size)]


def token_lengths(tok: Tokenizer, pairs: Sequence[tuple[str, str]]) -> list[int]:
    return [len(e.ids) for e in tok.encode_batch([(q, t) for q, t in pairs])]
