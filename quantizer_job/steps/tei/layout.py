"""The directories TEI loads (see docs/tei-contract.md): config.json fixes, tokenizer files, checks, manifest."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.graph import external_data
from quantizer_job.steps.tei.textenc import ST_CONFIG_NAMES, tei_max_input_length

MODEL_FILE = "model.onnx"  # the only name TEI's ORT backend tries (besides onnx/model.onnx)
DATA_FILE = "model.onnx_data"
#: Tokenizer-side files copied next to the model when the source has them (tokenizer.json is required).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                   "sentencepiece.bpe.model", "spiece.model", "vocab.json", "merges.txt", "added_tokens.json",
                   *ST_CONFIG_NAMES)  # TEI reads its max input length from the first of these it finds
#: config.json keys TEI parses, each with the aliases its serde structs accept (router/src/lib.rs ``ModelConfig``,
#: backends/ort/src/lib.rs ``Config``): without one of them TEI does not start.
#: The sizes among them (integers), which a family may spell otherwise (DistilBERT's ``dim``): the export child
#: resolves them through transformers under these names (``export.describe``).
SIZE_KEYS: dict[str, tuple[str, ...]] = {
    "max_position_embeddings": ("n_positions",), "hidden_size": ("n_embd",), "num_hidden_layers": ("n_layer",)}
REQUIRED_CONFIG_KEYS: dict[str, tuple[str, ...]] = {"architectures": (), "model_type": (), **SIZE_KEYS}
#: Graph inputs TEI's ORT backend feeds (always the first two; the others only when the graph declares them).
TEI_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
#: tokenizer_config.json's ``padding_side`` values TEI's ORT backend parses.
PADDING_SIDES = ("left", "right")


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


#: config.json ``auto_map`` keys under which a repository ships the model's own code (the Job loads the model with
#: AutoModelForSequenceClassification, which resolves through these).
REMOTE_MODEL_CLASSES = ("AutoModelForSequenceClassification", "AutoModel", "AutoConfig")
#: What TEI's /rerank serves, said in every refusal: the user learns what to bring instead.
TEI_SERVES = ("TEI's /rerank serves a cross-encoder: a *ForSequenceClassification with exactly one label, "
              "exported to ONNX")


def missing_config_keys(cfg: dict[str, Any]) -> list[str]:
    """TEI's required config.json keys that are absent under every name TEI accepts for them."""
    return [k for k, aliases in REQUIRED_CONFIG_KEYS.items() if all(n not in cfg for n in (k, *aliases))]


def validate_source_config(cfg: dict[str, Any], trust_remote_code: bool = False) -> None:
    """A single-logit sequence classifier transformers can load without running the repository's own code (unless
    the class allows it), or UnsupportedModel saying what the model is and what TEI serves instead. The sizes TEI
    reads are checked after the export, under the names transformers resolves (DistilBERT's ``dim``)."""
    archs = [str(a) for a in cfg.get("architectures") or []]
    found = cfg.get("auto_map")
    amap: dict[str, Any] = found if isinstance(found, dict) else {}
    # Only the model's own classes need its code: an auto_map naming just a tokenizer loads with tokenizer.json.
    named = next((amap[k] for k in REMOTE_MODEL_CLASSES if k in amap), None)
    if named and not trust_remote_code:
        raise JobError("UnsupportedModel", f"{'/'.join(archs) or 'this model'} needs the repository's own Python "
                                           f"code (config.json auto_map: {named}); the Job runs it only for a model "
                                           "with spec.model.trustRemoteCode under a RerankClass with "
                                           "modelSources.allowRemoteCode")
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        decoder = [a for a in archs if a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))]
        what = (f"{decoder[0]} is a decoder reranker (scored by a token's logit); " if decoder
                else f"architectures {archs} has no *ForSequenceClassification; ")
        raise JobError("UnsupportedModel", what + TEI_SERVES)
    n = num_labels(cfg)
    if n != 1:
        raise JobError("UnsupportedModel", f"the classifier has {n} labels; {TEI_SERVES} (TEI answers /rerank "
                                           "with 424 for more labels)")
    if "model_type" not in cfg:
        raise JobError("UnsupportedModel", "config.json lacks model_type")


def declared_pad_token_id(cfg: dict[str, Any], tokenizer_json: Path | None = None) -> int | None:
    """The padding id config.json or tokenizer.json names (its padding, else a [PAD]/<pad> token); None if neither
    does (then the loaded model's config knows: ``export.describe``)."""
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
    return None


def pad_token_id(cfg: dict[str, Any], tokenizer_json: Path | None = None, default: int | None = None) -> int:
    """``declared_pad_token_id``, else ``default`` (the loaded model's), else 0 (TEI's own fallback)."""
    found = declared_pad_token_id(cfg, tokenizer_json)
    if found is not None:
        return found
    return default if default is not None else 0


def tei_config(cfg: dict[str, Any], tokenizer_json: Path | None = None,
               resolved: dict[str, Any] | None = None, pad_default: int | None = None) -> dict[str, Any]:
    """config.json as TEI needs it: one label in id2label/label2id and every field the router/ORT backend reads.
    ``resolved``: sizes the export child read from the loaded model under TEI's names (``export.describe``), added
    where the family spells them otherwise; every original key is kept."""
    out = dict(cfg)
    for key, value in (resolved or {}).items():
        out.setdefault(key, value)
    archs = [a for a in out.get("architectures") or [] if str(a).endswith("ForSequenceClassification")]
    out["architectures"] = archs[:1]
    label = next(iter((cfg.get("id2label") or {}).values()), "LABEL_0")
    out["id2label"] = {"0": label}
    out["label2id"] = {label: 0}
    out.pop("num_labels", None)
    out["pad_token_id"] = pad_token_id(cfg, tokenizer_json, pad_default)
    out.setdefault("torch_dtype", "float32")
    missing = missing_config_keys(out)
    if missing:
        raise JobError("UnsupportedModel", f"config.json lacks {missing} and transformers resolves no value for them")
    return out


def cap_input_length(d: Path, cfg: dict[str, Any], max_positions: int) -> int | None:
    """Keep TEI within the tokens the model's position table takes: TEI computes its maximum input length from a
    list of model types (``textenc.tei_max_input_length``); where that exceeds ``max_positions`` (a RoBERTa-style
    type TEI does not list, or a Sentence Transformers config asking for more), write the Sentence Transformers
    config TEI reads first with ``max_seq_length`` = ``max_positions``. Returns the cap written, or None."""
    if tei_max_input_length(d, cfg) <= max_positions:
        return None
    name = next((n for n in ST_CONFIG_NAMES if (d / n).is_file()), ST_CONFIG_NAMES[0])
    st = json.loads((d / name).read_text(encoding="utf-8")) if (d / name).is_file() else {"do_lower_case": False}
    st["max_seq_length"] = int(max_positions)
    write_json(d / name, st)
    return int(max_positions)


def write_tei_metadata(d: Path, cfg: dict[str, Any], tok_dirs: Iterable[Path], max_positions: int) -> int | None:
    """What TEI reads beside the weights: ``cfg`` (``tei_config``'s) as config.json, the tokenizer files, and the
    input-length cap where TEI's own rule would exceed the positions (``cap_input_length``: returns it, or None)."""
    write_json(d / "config.json", cfg)
    copy_tokenizer(tok_dirs, d)
    return cap_input_length(d, cfg, max_positions)


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


def check_tei_dir(d: Path, expect_inputs: Iterable[str] | None = None, max_positions: int | None = None,
                  position_offset: int = 0) -> list[str]:
    """Problems that would stop TEI's CPU image from serving ``d`` with ONNX Runtime (empty: fine), read as TEI reads
    the directory (docs/tei-contract.md). ``expect_inputs``: the FP32 export's inputs, which the Job proved against
    PyTorch fed as TEI feeds them: the published graph must take exactly those. ``max_positions``: the tokens the
    model takes; TEI's maximum input length must not exceed it. ``position_offset``: where the model's positions start
    (a RoBERTa-style table: after its padding index); TEI feeds a declared ``position_ids`` as 0..n, so a graph with
    an offset must not declare it."""
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
        problems += config_problems(json.loads((d / "config.json").read_text(encoding="utf-8")), d, max_positions)
    problems += tokenizer_problems(d)
    m = onnx.load(str(d / MODEL_FILE), load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    inputs = {i.name: i for i in m.graph.input if i.name not in init}
    for name, i in inputs.items():
        if name not in TEI_INPUTS:
            problems.append(f"graph input {name} is not one TEI feeds ({', '.join(TEI_INPUTS)})")
        if i.type.tensor_type.elem_type != onnx.TensorProto.INT64:
            problems.append(f"graph input {name} is not int64")
    for name in TEI_INPUTS[:2]:
        if name not in inputs:
            problems.append(f"graph input {name} missing")
    if "position_ids" in inputs and position_offset:
        problems.append(f"graph input position_ids declared, but the model's positions start at {position_offset}: "
                        "TEI feeds 0..n")
    if expect_inputs is not None and set(inputs) != set(expect_inputs):
        problems.append(f"graph inputs {sorted(inputs)} differ from the verified export's {sorted(expect_inputs)}")
    outs = {o.name: o for o in m.graph.output}
    if "logits" not in outs:
        problems.append("graph output 'logits' missing")
    elif outs["logits"].type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        problems.append("logits is not float32")
    for loc in {loc for _, loc in external_data.external_tensors(m)}:
        if "/" in loc or not (d / loc).is_file():
            problems.append(f"external data {loc} is not a file next to {MODEL_FILE}")
    return problems


def config_problems(cfg: dict[str, Any], d: Path, max_positions: int | None = None) -> list[str]:
    """config.json against what TEI's router and ORT backend parse: required keys (under their aliases), types, one
    label, a classifier architecture, a maximum input length the model takes."""
    problems = [f"config.json lacks {k}" for k in missing_config_keys(cfg)]
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not any(str(a).endswith("Classification") for a in archs):
        problems.append(f"config.json architectures {archs!r} has no *Classification entry (TEI's classifier test)")
    if len(cfg.get("id2label") or {}) != 1 or len(cfg.get("label2id") or {}) != 1:
        problems.append("config.json must have exactly one label in id2label and label2id")
    for key, aliases in SIZE_KEYS.items():
        value = next((cfg[n] for n in (key, *aliases) if n in cfg), 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            problems.append(f"config.json {key} is {value!r}, TEI parses a non-negative integer")
    pad = cfg.get("pad_token_id")
    if pad is not None and (not isinstance(pad, int) or isinstance(pad, bool) or pad < 0):
        problems.append(f"config.json pad_token_id is {pad!r}, TEI parses a non-negative integer or null")
    if max_positions is not None and not missing_config_keys(cfg):
        tei = tei_max_input_length(d, cfg)
        if tei > max_positions:
            problems.append(f"TEI would accept {tei} tokens a pair; the model's positions take {max_positions}")
    return problems


def tokenizer_problems(d: Path) -> list[str]:
    """tokenizer.json must load in ``tokenizers`` (TEI's router loads it with the same Rust library) and
    tokenizer_config.json's ``padding_side``, if set, must be one TEI parses."""
    problems = []
    if (d / "tokenizer.json").is_file():
        import tokenizers

        try:
            tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
        except Exception as exc:  # the library raises a bare Exception on parse errors
            problems.append(f"tokenizer.json does not load: {exc}")
    if (d / "tokenizer_config.json").is_file():
        try:
            side = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8")).get("padding_side", "right")
        except ValueError as exc:
            problems.append(f"tokenizer_config.json is not JSON: {exc}")
        else:
            if side not in PADDING_SIDES:
                problems.append(f"tokenizer_config.json padding_side {side!r} is not left or right")
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
