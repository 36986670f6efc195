"""The directories TEI loads (see shared/tei-contract.md): config.json fixes, tokenizer files, checks, manifest."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import external_data
from .errors import JobError
from .textenc import ROBERTA_FAMILY, ST_CONFIG_NAMES

MODEL_FILE = "model.onnx"  # the only name TEI's ORT backend tries (besides onnx/model.onnx)
DATA_FILE = "model.onnx_data"
#: Tokenizer-side files copied next to the model when the source has them (tokenizer.json is required).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                   "sentencepiece.bpe.model", "spiece.model", "vocab.json", "merges.txt", "added_tokens.json",
                   *ST_CONFIG_NAMES)  # TEI reads its max input length from the first of these it finds
#: Types whose ONNX graph has no token_type_ids input (TEI feeds it only if declared).
NO_TOKEN_TYPES = (*ROBERTA_FAMILY, "distilbert")
REQUIRED_CONFIG_KEYS = ("architectures", "model_type", "max_position_embeddings", "hidden_size", "num_hidden_layers")


def read_config(model_dir: Path) -> dict[str, Any]:
    p = model_dir / "config.json"
    try:
        config: dict[str, Any] = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise JobError("UnsupportedModel", f"{p} is missing: not a transformers model directory") from None
    except (OSError, ValueError) as exc:
        raise JobError("UnsupportedModel", f"{p} is unreadable: {exc}") from None
    return config


def num_labels(cfg: dict[str, Any]) -> int:
    if isinstance(cfg.get("id2label"), dict) and cfg["id2label"]:
        return len(cfg["id2label"])
    if "num_labels" in cfg:
        return int(cfg["num_labels"])
    return 2  # transformers' default for a config without labels


def validate_source_config(cfg: dict[str, Any]) -> None:
    """A single-logit sequence classifier, or UnsupportedModel with what is wrong."""
    archs = cfg.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        raise JobError("UnsupportedModel", f"architectures {archs} has no *ForSequenceClassification: "
                                           "a reranker is a cross-encoder with a classification head")
    n = num_labels(cfg)
    if n != 1:
        raise JobError("UnsupportedModel", f"the classifier has {n} labels; a reranker has exactly one "
                                           "(TEI answers /rerank with 424 otherwise)")
    for key in ("model_type", "hidden_size", "num_hidden_layers", "max_position_embeddings"):
        if key not in cfg:
            raise JobError("UnsupportedModel", f"config.json lacks {key}")


def pad_token_id(cfg: dict[str, Any], tokenizer_json: Path | None = None) -> int:
    if cfg.get("pad_token_id") is not None:
        return int(cfg["pad_token_id"])
    if tokenizer_json and tokenizer_json.is_file():
        tj = json.loads(tokenizer_json.read_text(encoding="utf-8"))
        pad = (tj.get("padding") or {}).get("pad_id")
        if pad is not None:
            return int(pad)
        for tok in tj.get("added_tokens", []):
            if tok.get("content") in ("[PAD]", "<pad>"):
                return int(tok["id"])
    return 1 if cfg.get("model_type") in ROBERTA_FAMILY else 0


def tei_config(cfg: dict[str, Any], tokenizer_json: Path | None = None) -> dict[str, Any]:
    """config.json as TEI needs it: one label in id2label/label2id and every field the router/ORT backend reads."""
    out = dict(cfg)
    archs = [a for a in out.get("architectures") or [] if str(a).endswith("ForSequenceClassification")]
    out["architectures"] = archs[:1]
    label = next(iter((cfg.get("id2label") or {}).values()), "LABEL_0")
    out["id2label"] = {"0": label}
    out["label2id"] = {label: 0}
    out.pop("num_labels", None)
    out["pad_token_id"] = pad_token_id(cfg, tokenizer_json)
    out.setdefault("torch_dtype", "float32")
    missing = [k for k in REQUIRED_CONFIG_KEYS if k not in out]
    if missing:
        raise JobError("UnsupportedModel", f"config.json lacks {missing}")
    return out


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def copy_tokenizer(src_dirs: Iterable[Path], dst: Path) -> list[str]:
    """Copy tokenizer files; earlier dirs win (the converted tokenizer dir is passed first)."""
    copied = []
    for name in TOKENIZER_FILES:
        for d in src_dirs:
            if d is not None and (d / name).is_file():
                shutil.copyfile(d / name, dst / name)
                copied.append(name)
                break
    if "tokenizer.json" not in copied:
        raise JobError("UnsupportedModel",
                       "no tokenizer.json (TEI only supports fast tokenizers) and none was converted")
    return copied


def weight_files(src: Path) -> list[str]:
    """The weights for the GPU pool: safetensors (single or sharded with its index), else nothing."""
    names = sorted(p.name for p in src.glob("*.safetensors"))
    if (src / "model.safetensors.index.json").is_file():
        names.append("model.safetensors.index.json")
    return names


def check_tei_dir(d: Path, expect_token_type_ids: bool | None = None) -> list[str]:
    """Problems that would stop TEI's CPU image from serving ``d`` with ONNX Runtime (empty: fine)."""
    import onnx

    problems = []
    if not (d / MODEL_FILE).is_file():
        problems.append(f"{MODEL_FILE} missing")
        return problems
    for bad in ("model_quantized.onnx", "model_optimized.onnx"):
        if (d / bad).exists():
            problems.append(f"stray {bad}")
    for req in ("config.json", "tokenizer.json"):
        if not (d / req).is_file():
            problems.append(f"{req} missing")
    if (d / "config.json").is_file():
        cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
        for k in REQUIRED_CONFIG_KEYS:
            if k not in cfg:
                problems.append(f"config.json lacks {k}")
        if len(cfg.get("id2label") or {}) != 1 or len(cfg.get("label2id") or {}) != 1:
            problems.append("config.json must have exactly one label in id2label and label2id")
        if expect_token_type_ids is None:
            expect_token_type_ids = cfg.get("model_type") not in NO_TOKEN_TYPES
    m = onnx.load(str(d / MODEL_FILE), load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    inputs = {i.name: i for i in m.graph.input if i.name not in init}
    for name, i in inputs.items():
        if name not in ("input_ids", "attention_mask", "token_type_ids"):
            problems.append(f"graph input {name} is not one TEI feeds")
        if i.type.tensor_type.elem_type != onnx.TensorProto.INT64:
            problems.append(f"graph input {name} is not int64")
    if "token_type_ids" in inputs and expect_token_type_ids is False:
        problems.append("token_type_ids declared for a RoBERTa-family model")
    if "token_type_ids" not in inputs and expect_token_type_ids:
        problems.append("token_type_ids missing for a BERT-family model")
    outs = {o.name: o for o in m.graph.output}
    if "logits" not in outs:
        problems.append("graph output 'logits' missing")
    elif outs["logits"].type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        problems.append("logits is not float32")
    for loc in {loc for _, loc in external_data.external_tensors(m)}:
        if "/" in loc or not (d / loc).is_file():
            problems.append(f"external data {loc} is not a file next to {MODEL_FILE}")
    return problems


def sha256_file(path: Path, chunk: int = 8 * 1024 * 1024) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def file_inventory(root: Path) -> list[dict[str, Any]]:
    """Every file under ``root`` (relative path, size, sha256), sorted by path."""
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "manifest.json":
            out.append({"path": p.relative_to(root).as_posix(), "size": p.stat().st_size, "sha256": sha256_file(p)})
    return out
