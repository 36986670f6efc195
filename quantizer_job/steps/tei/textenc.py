"""Tokenize query/text pairs the way TEI does: with the model's ``tokenizer.json`` (``tokenizers``, no transformers).

TEI's ONNX Runtime backend pads each batch to its longest sequence and feeds int64 ``input_ids``,
``attention_mask`` and, only if the graph declares them, ``token_type_ids`` and ``position_ids``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: ``tokenizers.Tokenizer`` (the library ships no type information).
Tokenizer = Any


def uses_token_types(config: Mapping[str, Any]) -> bool:
    """Whether the model distinguishes token types (a table of more than one row): then a user's transformers code,
    and the guard's FP32 reference, pass the tokenizer's type ids, as TEI does to a graph that declares them. A
    table of one row (RoBERTa, XLM-R) or none (DistilBERT, DeBERTa-v3, ModernBERT) takes none."""
    value = config.get("type_vocab_size", 0)
    return isinstance(value, int) and not isinstance(value, bool) and value > 1


def max_input_length(config: dict[str, Any], cap: int = 512) -> int:
    """The longest input the Job asks of the export child (its export, verification and timing):
    ``max_position_embeddings`` capped at ``cap``. The child lowers it to what the model's position table takes
    (``export.describe``: a RoBERTa-style table starts after its padding index); TEI's own limit, which has no such
    cap, is ``tei_max_input_length``."""
    mpe = int(config.get("max_position_embeddings") or config.get("n_positions") or cap)
    return max(8, min(cap, mpe))


#: The Sentence Transformers configs TEI reads ``max_seq_length`` from, in its order (TEI's core/src/download.rs).
ST_CONFIG_NAMES = ("sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
                   "sentence_camembert_config.json", "sentence_albert_config.json",
                   "sentence_xlm-roberta_config.json", "sentence_xlnet_config.json")
#: Model types whose position ids start after the padding index (TEI's position offset: pad_token_id + 1).
POSITION_OFFSET_TYPES = ("xlm-roberta", "camembert", "roberta")


def tei_max_input_length(model_dir: Path, config: Mapping[str, Any], max_batch_tokens: int | None = None) -> int:
    """Tokens per (query, text) pair that TEI's router accepts for this directory (its router/src/lib.rs): a Sentence
    Transformers config's ``max_seq_length``, else ``max_position_embeddings`` less the position offset, and with
    ``--auto-truncate`` no more than ``--max-batch-tokens``."""
    for name in ST_CONFIG_NAMES:
        path = model_dir / name
        if path.is_file():
            base = int(json.loads(path.read_text(encoding="utf-8"))["max_seq_length"])
            break
    else:
        offset = int(config.get("pad_token_id") or 0) + 1 if config.get("model_type") in POSITION_OFFSET_TYPES else 0
        base = int(config.get("max_position_embeddings", config.get("n_positions", 0))) - offset
    return min(base, max_batch_tokens) if max_batch_tokens else base


def load_tokenizer(path: str, max_length: int) -> Tokenizer:
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(path)
    tok.no_padding()
    tok.enable_truncation(max_length=max_length, strategy="longest_first")
    return tok


def encode_pairs(tok: Tokenizer, pairs: Sequence[tuple[str, str]], pad_id: int) -> dict[str, np.ndarray]:
    """One batch: int64 arrays [batch, longest] for input_ids, attention_mask, token_type_ids."""
    return pad_encodings(tok.encode_batch([(q, t) for q, t in pairs]), pad_id)


def pad_encodings(encs: Sequence[Any], pad_id: int) -> dict[str, np.ndarray]:
    """Encodings already made (``tokenizers.Encoding``) as one batch padded to its longest, as ``encode_pairs``.
    ``position_ids`` are what TEI feeds a graph that declares them: 0..n-1 on every row, padding included (its
    right-padding branch counts on through the pads), with no RoBERTa offset."""
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
    pos = np.broadcast_to(np.arange(n, dtype=np.int64), (b, n)).copy()
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt, "position_ids": pos}


def make_batches(tok: Tokenizer, pairs: Sequence[tuple[str, str]], pad_id: int,
                 batch_size: int = 8) -> list[dict[str, np.ndarray]]:
    return [encode_pairs(tok, pairs[i : i + batch_size], pad_id) for i in range(0, len(pairs), batch_size)]


def token_lengths(tok: Tokenizer, pairs: Sequence[tuple[str, str]]) -> list[int]:
    return [len(e.ids) for e in tok.encode_batch([(q, t) for q, t in pairs])]
