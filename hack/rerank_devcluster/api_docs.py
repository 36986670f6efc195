"""Generate docs/api-reference.md from the CRDs' openAPIV3Schema (crds/*.yaml are the single source).

    python hack/gen_api_docs.py           # (re)write docs/api-reference.md
    python hack/gen_api_docs.py --check   # exit 1 if the committed file is stale (tests/unit/project/test_api_docs.py)

``hack/gen_api_docs.py`` runs :func:`main` (as does ``python -m rerank_devcluster.api_docs``); the tests import this
module by name.

One section per object in the schema (DFS order), each with a table of its fields: type, whether required,
default, validation (enum, range, length, pattern, items, format) and description; CEL rules
(x-kubernetes-validations) are listed with the object or field they sit on.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CRDS_DIR = REPO_ROOT / "crds"
OUTPUT = REPO_ROOT / "docs" / "api-reference.md"

Schema = dict[str, Any]


@dataclass
class Section:
    """An object in the schema: its path, its own schema, and its fields."""

    path: str
    schema: Schema
    fields: list[tuple[str, Schema, bool]] = field(default_factory=list)  # (name, schema, required)


def flat(text: str) -> str:
    """One line, safe inside a markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def cell(text: str) -> str:
    """Prose for a table cell or list item: one line, no raw HTML (`<name>` stays visible)."""
    return flat(text).replace("<", "&lt;").replace(">", "&gt;")


def code(text: str) -> str:
    return f"`{flat(text)}`" if text != "" else ""


def type_name(s: Schema) -> str:
    if s.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    t = s.get("type", "")
    if t == "array":
        return "[]" + type_name(s.get("items", {}))
    if t == "object" and isinstance(s.get("additionalProperties"), dict) and not s.get("properties"):
        return f"map[string]{type_name(s['additionalProperties'])}"
    if t == "object" and s.get("x-kubernetes-preserve-unknown-fields") and not s.get("properties"):
        return "object (free-form)"
    return t or "any"


def child_object(s: Schema) -> Schema | None:
    """The object schema this field documents in a section of its own (an object, or array items that are one)."""
    target = s.get("items", {}) if s.get("type") == "array" else s
    return target if target.get("properties") else None


def validation(s: Schema) -> list[str]:
    out = []
    if "enum" in s:
        out.append("one of " + ", ".join(code(json.dumps(v) if not isinstance(v, str) else v) for v in s["enum"]))
    lo, hi = s.get("minimum"), s.get("maximum")
    lo_op = ">" if s.get("exclusiveMinimum") else ">="
    hi_op = "<" if s.get("exclusiveMaximum") else "<="
    if lo is not None and hi is not None:
        out.append(f"{lo_op} {lo}, {hi_op} {hi}" if (s.get("exclusiveMinimum") or s.get("exclusiveMaximum"))
                   else f"{lo}..{hi}")
    elif lo is not None:
        out.append(f"{lo_op} {lo}")
    elif hi is not None:
        out.append(f"{hi_op} {hi}")
    for key, label in (("minLength", "min length"), ("maxLength", "max length"),
                       ("minItems", "min items"), ("maxItems", "max items"),
                       ("minProperties", "min properties"), ("maxProperties", "max properties")):
        if key in s:
            out.append(f"{label} {s[key]}")
    if "pattern" in s:
        out.append("pattern " + code(s["pattern"]))
    if "format" in s:
        out.append("format " + code(s["format"]))
    items = s.get("items", {})
    if s.get("type") == "array" and "enum" in items:
        out.append("items one of " + ", ".join(code(str(v)) for v in items["enum"]))
    if s.get("x-kubernetes-list-type"):
        keys = s.get("x-kubernetes-list-map-keys")
        out.append(f"list type {s['x-kubernetes-list-type']}" + (f" (keys: {', '.join(keys)})" if keys else ""))
    for rule in s.get("x-kubernetes-validations", []):
        out.append(cel(rule))
    return out


def cel(rule: Schema) -> str:
    text = "CEL " + code(rule["rule"])
    if rule.get("message"):
        text += ": " + cell(rule["message"])
    return text


def join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def walk(path: str, s: Schema) -> Iterator[Section]:
    sec = Section(path, s)
    required = set(s.get("required", []))
    nested: list[tuple[str, Schema]] = []
    for name, sub in s.get("properties", {}).items():
        sec.fields.append((name, sub, name in required))
        obj = child_object(sub)
        if obj is not None:
            nested.append((join(path, name) + ("[]" if sub.get("type") == "array" else ""), obj))
    yield sec
    for sub_path, obj in nested:
        yield from walk(sub_path, obj)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, spaces to '-', other punctuation dropped."""
    return "".join(ch for ch in heading.lower().replace(" ", "-") if ch.isalnum() or ch in "-_")


def render_section(sec: Section, documented: set[str], kind: str) -> list[str]:
    s = sec.schema
    lines = [f"### {kind}: `{sec.path or '(root)'}`", ""]
    if s.get("description"):
        lines += [cell(s["description"]).replace("\\|", "|"), ""]
    rules = s.get("x-kubernetes-validations", [])
    if rules:
        lines += ["Rules (CEL, checked by the API server):", ""]
        lines += [f"- `{' '.join(r['rule'].split())}`" + (f": {cell(r['message'])}" if r.get("message") else "")
                  for r in rules]
        lines.append("")
    if not sec.fields:
        return lines
    lines += ["| Field | Type | Required | Default | Validation | Description |",
              "|---|---|---|---|---|---|"]
    for name, sub, req in sec.fields:
        sub_path = join(sec.path, name) + ("[]" if sub.get("type") == "array" else "")
        field_text = f"[`{name}`](#{anchor(f'{kind}-{sub_path}')})" if sub_path in documented else f"`{name}`"
        default = code(json.dumps(sub["default"], sort_keys=True)) if "default" in sub else ""
        # An object's own CEL rules are listed in its section; a leaf's go in its row.
        checks = validation({k: v for k, v in sub.items() if k != "x-kubernetes-validations"}
                            if sub_path in documented else sub)
        lines.append("| " + " | ".join([
            field_text, cell(type_name(sub)), "yes" if req else "", default, "; ".join(checks),
            cell(sub.get("description", "")),
        ]) + " |")
    lines.append("")
    return lines


def render_crd(crd: Schema, source: str) -> list[str]:
    names = crd["spec"]["names"]
    group, kind = crd["spec"]["group"], names["kind"]
    out = [
        f"## {kind}",
        "",
        f"From `{source}` (CRD `{crd['metadata']['name']}`). `kubectl explain {names['singular']}.spec` shows the same"
        " descriptions.",
        "",
        "| | |",
        "|---|---|",
        f"| Group | `{group}` |",
        f"| Kind | `{kind}` (list: `{names.get('listKind', kind + 'List')}`) |",
        f"| Scope | {crd['spec']['scope']} |",
        f"| Plural / singular | `{names['plural']}` / `{names.get('singular', '')}` |",
        f"| Short names | {', '.join(f'`{n}`' for n in names.get('shortNames', []))} |",
        f"| Categories | {', '.join(f'`{n}`' for n in names.get('categories', []))} |",
        "",
    ]
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        flags = [f for f in ("served", "storage") if version.get(f)]
        out += [f"Version `{group}/{version['name']}`: {', '.join(flags) or 'not served'}.", ""]
        columns = version.get("additionalPrinterColumns", [])
        if columns:
            out += ["`kubectl get` columns:", "", "| Column | Type | JSONPath | Description |", "|---|---|---|---|"]
            out += [f"| {cell(c['name'])} | {c['type']} | {code(c['jsonPath'])} | {cell(c.get('description', ''))} |"
                    for c in columns]
            out.append("")
        prefix = kind if len(crd["spec"]["versions"]) == 1 else f"{kind} {version['name']}"
        sections = list(walk("", schema))
        documented = {sec.path for sec in sections}
        out += ["Contents: " + ", ".join(f"[`{sec.path}`](#{anchor(f'{prefix}-{sec.path}')})"
                                         for sec in sections if sec.path), ""]
        for sec in sections:
            out += render_section(sec, documented, prefix)
    return out


def crd_files(crds_dir: Path = CRDS_DIR) -> list[Path]:
    """RerankModel first (the API users write), then the others by name."""
    return sorted(crds_dir.glob("*.yaml"), key=lambda p: (p.name != "rerankmodel.yaml", p.name))


def generate(crds_dir: Path = CRDS_DIR) -> str:
    files = crd_files(crds_dir)
    crds = [(f, d) for f in files for d in yaml.safe_load_all(f.read_text())
            if d and d.get("kind") == "CustomResourceDefinition"]
    out = [
        "<!-- GENERATED by hack/gen_api_docs.py from crds/*.yaml: do not edit by hand. -->",
        "# API reference",
        "",
        "Generated from the CRDs in `crds/`, the single source of the API: one section per object in each schema, with"
        " every field's type, default, validation (enum, range, pattern, CEL rules checked by the API server) and"
        " description.",
        "",
        "Kinds: " + ", ".join(f"[`{d['spec']['names']['kind']}`](#{anchor(d['spec']['names']['kind'])})"
                              for _, d in crds),
        "",
    ]
    for f, crd in crds:
        out += render_crd(crd, f"crds/{f.name}")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail if the committed reference is stale")
    p.add_argument("--output", type=Path, default=OUTPUT)
    args = p.parse_args(argv)
    text = generate()
    if args.check:
        if not args.output.is_file() or args.output.read_text() != text:
            print(f"{args.output} is stale: run python hack/gen_api_docs.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
