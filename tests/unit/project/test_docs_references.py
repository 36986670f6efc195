"""The docs (docs/*.md but the generated api-reference.md, and README.md) name only flags and CRD fields that exist.

Flags. A ``--flag`` counts only inside code (an inline code span or a fenced block). It is attributed to a command:

- in a fenced block, to the program its shell command runs (the first word after ``$``, ``VAR=value``, ``sudo``,
  ``exec``; ``python -m module`` and ``python script.py`` name the module or script; a line ending in ``\\`` goes on;
  ``|``, ``&&``, ``||`` and ``;`` start a new command);
- in an inline span, to the program the span starts with (``rerank-quantize --model ...``), else to the last
  command its paragraph (a list item; a table row, else its table's header) names before the span:
  ``rerank-operator``, ``rerank-quantize``, ``rerank-dev-cluster``, ``hack/demo``, a benchmark by its module
  (``benchmarks.tei_rerank``, as ``python -m benchmarks.tei_rerank`` runs it), its file (``benchmarks/tei_rerank.py``,
  ``tei_rerank.py``) or, for a package (``benchmarks.autoscale_sim``), its folder (``benchmarks/autoscale_sim``,
  ``autoscale_sim``), or the possessives "operator's" and "quantizer's"; naming another program (kubectl, helm, mypy,
  "TEI's", ...) ends the attribution, and so does a command line of an unknown program in a span.

A flag of one of our commands must be one its parser defines. The parsers are the real ones: each command's entry
point is run with ``ArgumentParser.parse_args`` stopped, which hands back the parser it built. Benchmarks are read,
not run (importing one loads the quantizer's ML stack or the dev cluster's harness): their flags are their
``add_argument`` calls.
A flag in an inline span that no command is named for must be a flag of one of ours (so name the program).

Fields. A dotted path in code starting with ``spec.`` or ``status.`` (optionally ``rerankmodel.``/``rerankclass.``
first, or ``{.`` as in a jsonpath) must exist in the RerankModel or the RerankClass CRD's openAPIV3Schema:
``<pool>`` stands for any key, ``[]``/``[...]`` for an array's items, ``{a, b | c}`` for each of a, b and c, ``*``
and a trailing ``...`` for anything below. Below an object that keeps unknown fields
(``x-kubernetes-preserve-unknown-fields``: ``status.artifact.recipe``, ``status.autoscaling.signals.gpu``) anything
goes. A path in an inline span without ``spec.`` whose first segment is a top-level field of the RerankModel's spec
(``autoscaling.scaleDown.stabilizationSeconds``) must exist below the spec or the status of either CRD. Not checked:
what reads as Python (a segment with ``_`` or a capital first letter, a call ``(``, a file such as ``spec.py``), so
write Python names as ``routing.split()`` or routing.py's ``split``; and another object's fields written with its
kind first (``Deployment.spec.replicas``). Fenced blocks are searched for fields only when they are shell (sh, bash,
console): jsonpaths such as ``{.status.artifact.id}``.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[3]
GENERATED = {"api-reference.md"}  # hack/gen_api_docs.py writes it from the CRDs themselves
DOCS = [p for p in sorted((REPO_ROOT / "docs").glob("*.md")) if p.name not in GENERATED] + [REPO_ROOT / "README.md"]
CRDS = {"rerankmodel": REPO_ROOT / "crds" / "rerankmodel.yaml", "rerankclass": REPO_ROOT / "crds" / "rerankclass.yaml"}
BENCHMARKS = REPO_ROOT / "benchmarks"
SHELL_BLOCKS = {"sh", "bash", "shell", "console"}

Schema = Mapping[str, Any]


# --- the commands and their flags -------------------------------------------------------------------------------

class _Built(BaseException):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


def built_parser(entry_point: Callable[[list[str]], object]) -> argparse.ArgumentParser:
    """The parser ``entry_point`` builds, taken at its ``parse_args`` call (nothing after it runs)."""

    def stop(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> argparse.Namespace:
        raise _Built(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", stop):
        try:
            entry_point([])
        except _Built as built:
            return built.parser
    raise AssertionError(f"{entry_point} returned without parsing a command line")


def parser_flags(parser: argparse.ArgumentParser) -> frozenset[str]:
    """Every long option of ``parser`` and of its subcommands (``--no-x`` of a BooleanOptionalAction included)."""
    found: set[str] = set()
    for action in parser._actions:
        found |= {o for o in action.option_strings if o.startswith("--")}
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= parser_flags(sub)
    return frozenset(found)


def entry_point_flags(module: str, function: str) -> Callable[[], frozenset[str]]:
    def load() -> frozenset[str]:
        return parser_flags(built_parser(getattr(importlib.import_module(module), function)))
    return load


def script_flags(path: Path) -> Callable[[], frozenset[str]]:
    """The flags of a benchmark script, or of a benchmark package (a folder with ``__main__.py``)."""

    def load() -> frozenset[str]:
        found = {"--help"}  # argparse's own
        sources = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for node in (n for source in sources for n in ast.walk(ast.parse(source.read_text()))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                options = {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
                found |= {o for o in options if o.startswith("--")}
                if any(isinstance(k.value, ast.Attribute) and k.value.attr == "BooleanOptionalAction"
                       for k in node.keywords if k.arg == "action"):
                    found |= {"--no-" + o[2:] for o in options if o.startswith("--")}
        return frozenset(found)
    return load


#: The benchmarks by module name (``python -m benchmarks.<name>``): a file's, or a package's (a folder with
#: ``__main__.py``).
BENCHMARK_SOURCES = {**{p.stem: p for p in sorted(BENCHMARKS.glob("*.py")) if p.name != "__init__.py"},
                     **{p.parent.name: p.parent for p in sorted(BENCHMARKS.glob("*/__main__.py"))}}
#: Our commands: what names them in a doc, and their flags.
COMMANDS: dict[str, Callable[[], frozenset[str]]] = {
    "rerank-operator": entry_point_flags("rerank_operator.main", "parse_args"),
    "rerank-quantize": entry_point_flags("quantizer_job.cli", "main"),
    "rerank-dev-cluster": entry_point_flags("rerank_devcluster.cli", "main"),
    "hack/demo": entry_point_flags("rerank_devcluster.demo", "main"),
    "hack/release": entry_point_flags("rerank_devcluster.release", "main"),
    "gen_api_docs.py": entry_point_flags("rerank_devcluster.api_docs", "main"),
    "rerank-activator": entry_point_flags("rerank_activator.main", "parse_args"),
    "rerank-sampler": entry_point_flags("rerank_sampler.main", "parse_args"),
    **{f"benchmarks.{name}": script_flags(path) for name, path in BENCHMARK_SOURCES.items()},
}
#: Other names of our commands: console-script modules, ``python -m`` modules, possessives in prose.
ALIASES = {
    "rerank_operator": "rerank-operator", "rerank_operator.main": "rerank-operator", "operator's": "rerank-operator",
    "quantizer_job": "rerank-quantize", "quantizer_job.cli": "rerank-quantize", "quantizer's": "rerank-quantize",
    "rerank_devcluster": "rerank-dev-cluster", "rerank_devcluster.cli": "rerank-dev-cluster",
    "rerank_devcluster.demo": "hack/demo", "hack/gen_api_docs.py": "gen_api_docs.py",
    "rerank_devcluster.api_docs": "gen_api_docs.py",
    "rerank_activator": "rerank-activator", "activator's": "rerank-activator",
    "rerank_sampler": "rerank-sampler", "sampler's": "rerank-sampler",
    # a benchmark by its file or folder (tei_rerank.py, autoscale_sim; a leading benchmarks/ is a folder: PROGRAM_DIRS)
    **{path.name: f"benchmarks.{name}" for name, path in BENCHMARK_SOURCES.items()},
}
#: Programs that are not ours: a flag attributed to one of them is not checked.
OTHER_PROGRAMS = ["kubectl", "helm", "git", "mypy", "ruff", "pytest", "lint-imports", "hack/test", "curl", "docker",
                  "text-embeddings-router", "TEI's", "kopf's"]


@functools.cache
def flags_of(command: str) -> frozenset[str]:
    return COMMANDS[command]()


#: Where our programs are run from: ./, benchmarks/, .venv/bin/.
PROGRAM_DIRS = re.compile(r"^(\./)?(benchmarks/|\S*/bin/)?")


def program(word: str) -> str | None:
    """The command a program word or a mention names: ours by its canonical name, another one's by its own name."""
    name = PROGRAM_DIRS.sub("", word)
    if name in COMMANDS or name in OTHER_PROGRAMS:
        return name
    return ALIASES.get(name)


_NAMES = "|".join(re.escape(n) for n in sorted([*COMMANDS, *ALIASES, *OTHER_PROGRAMS], key=len, reverse=True))
MENTION = re.compile(r"(?<![\w/.-])(?:\./)?(?:benchmarks/|\.venv/bin/)?(?:" + _NAMES + r")(?![\w/-]|\.\w)")


# --- reading the docs ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Code:
    """One piece of code in a doc: an inline span, or one line of a fenced block (``block`` is its language)."""

    line: int
    text: str
    block: str | None = None
    before: str = ""  # inline spans: the paragraph's text before the span (what attributes its flags)


INLINE = re.compile(r"(`+)(.+?)\1", re.S)
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")


def paragraphs(lines: list[str]) -> Iterator[tuple[int, str, str]]:
    """(first line number, context, text) of each paragraph outside fences. List items, headings and table rows stand
    alone; a table row's context is its table's header row (a row names its command, else the header does)."""
    start, body, header = 0, list[str](), None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        alone = stripped.startswith(("|", "#", "- ", "* ", "> ")) or re.match(r"\d+\. ", stripped) is not None
        if body and (not stripped or alone):
            yield start, "", "\n".join(body)
            body = []
        if stripped.startswith("|"):
            header = stripped if header is None else header
            yield number, header if header != stripped else "", line
        elif stripped:
            header = None
            if not body:
                start = number
            body.append(line)
            if stripped.startswith("#"):
                yield start, "", "\n".join(body)
                body = []
        else:
            header = None
    if body:
        yield start, "", "\n".join(body)


def code_in(text: str) -> Iterator[Code]:
    """Every piece of code in ``text``, in the order of its lines."""
    prose: list[str] = []
    blocks: list[Code] = []
    block: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence and block is None:
            block = fence.group(2).lower()
            prose.append("")
        elif fence:
            block = None
            prose.append("")
        elif block is not None:
            blocks.append(Code(number, line, block))
            prose.append("")
        else:
            prose.append(line)
    spans = [Code(first + para.count("\n", 0, span.start(2)), span.group(2), None, f"{context}\n{para[:span.start()]}")
             for first, context, para in paragraphs(prose) for span in INLINE.finditer(para)]
    yield from sorted([*blocks, *spans], key=lambda c: c.line)


# --- flags ---------------------------------------------------------------------------------------------------------

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
SHELL_SPLIT = re.compile(r"\|\||&&|[|;]|\$\(")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


def shell_commands(text: str) -> Iterator[tuple[str | None, str]]:
    """(the program it runs, or None if it names none, the text) of each command in one shell line."""
    for segment in SHELL_SPLIT.split(re.sub(r"(^|\s)#.*", "", text)):
        words = segment.split()
        while words and (words[0] in ("$", "sudo", "exec", "time", "env") or ENV_ASSIGNMENT.match(words[0])):
            words.pop(0)
        if words and re.fullmatch(r"(\S*/)?python3?(\.\d+)?", words[0]):
            words.pop(0)
            if words and words[0] == "-m":
                words.pop(0)
        yield (program(words[0]) if words else None), segment


def attributed_flags(code: Code, continued: str | None) -> Iterator[tuple[str | None, str]]:
    """(command or None, flag) of each flag in ``code``; ``continued`` is the program of a line a ``\\`` continues."""
    if code.block is not None:
        for i, (prog, segment) in enumerate(shell_commands(code.text)):
            prog = continued if i == 0 and continued is not None else prog
            for flag in FLAG.findall(segment):
                yield prog or "(some other program)", flag
        return
    found = FLAG.findall(code.text)
    if not found:
        return
    if not code.text.lstrip().startswith("-"):  # a command line: the flags are its program's
        prog = next(iter(shell_commands(code.text)))[0]
        yield from ((prog or "(some other program)", f) for f in found)
        return
    prog = next((m for m in reversed(mentions(code.before)) if m is not None), None)
    yield from ((prog, f) for f in found)


def mentions(text: str) -> list[str | None]:
    """The commands ``text`` names, in order; a command line in a code span names only its program."""
    found: list[str | None] = []
    for i, part in enumerate(INLINE.split(text)):
        if i % 3 == 1:  # the backticks of a span
            continue
        if i % 3 == 2 and FLAG.search(part) and not part.lstrip().startswith("-"):
            found.append(next(iter(shell_commands(part)))[0] or "(some other program)")
        else:
            found += [program(m.group(0)) for m in MENTION.finditer(part)]
    return found


def flag_problems(path: Path, text: str) -> list[str]:
    problems: list[str] = []
    continued: str | None = None  # the program of the previous block line when it ended with a backslash
    for code in code_in(text):
        for prog, flag in attributed_flags(code, continued):
            where = f"{path.name}:{code.line}: {flag}"
            if prog is None:
                if not any(flag in flags_of(c) for c in COMMANDS):
                    problems.append(f"{where} is no flag of {', '.join(COMMANDS)}; name the command it belongs to")
            elif prog in COMMANDS and flag not in flags_of(prog):
                problems.append(f"{where} is not a flag of {prog} (it has {', '.join(sorted(flags_of(prog)))})")
        if code.block is not None:
            progs = [p for p, _ in shell_commands(code.text)]
            continued = (progs[-1] or continued) if code.text.rstrip().endswith("\\") else None
    return problems


# --- CRD fields ------------------------------------------------------------------------------------------------------

@functools.cache
def schemas() -> dict[str, Schema]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out: dict[str, Schema] = {}
    for kind, path in CRDS.items():
        (version,) = yaml.load(path.read_text(), Loader=loader)["spec"]["versions"]
        out[kind] = version["schema"]["openAPIV3Schema"]
    return out


def top_level_spec_fields() -> set[str]:
    """What starts a path written without ``spec.``: the RerankModel's own (the chart's values share none)."""
    return set(schemas()["rerankmodel"]["properties"]["spec"]["properties"])


PATH_START = re.compile(r"(?<![\w$/.-])(?:(rerankmodels?|rrm|rerankclass(?:es)?|rrc)\.|\{?\.)?(?=[A-Za-z])")
KINDS = {"rerankmodel": "rerankmodel", "rerankmodels": "rerankmodel", "rrm": "rerankmodel",
         "rerankclass": "rerankclass", "rerankclasses": "rerankclass", "rrc": "rerankclass"}
OPEN = {"<": ">", "[": "]", "{": "}"}
#: File names, not fields: spec.py, model.onnx, model.safetensors.
NOT_FIELDS = re.compile(r"\.(py|pyi|sh|yaml|yml|json|jsonl|toml|md|txt|csv|log|lua|onnx|safetensors|bin|pt|gz)$")


def dotted_path(text: str, start: int) -> str:
    """The path written at ``start``: names, dots, ``*``, and balanced ``<...>``, ``[...]``, ``{...}``."""
    closing: list[str] = []
    opened_at = i = start
    while i < len(text):
        c = text[i]
        if closing and c == closing[-1]:
            closing.pop()
        elif c in OPEN:
            opened_at = i if not closing else opened_at
            closing.append(OPEN[c])
        elif not closing and not (c.isalnum() or c in "_.*"):
            break
        i += 1
    return text[start:opened_at if closing else i].rstrip(".")


def split_top(text: str, separators: str) -> list[str]:
    """``text`` split at ``separators`` outside brackets."""
    parts, depth, current = [], 0, ""
    for c in text:
        if c in separators and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += (c in OPEN) - (c in OPEN.values())
        current += c
    return [*parts, current]


def _bracketed(path: str) -> tuple[str, str]:
    """(inside, after) of the bracket ``path`` starts with."""
    depth = 0
    for i, c in enumerate(path):
        depth += (c in OPEN) - (c in OPEN.values())
        if depth == 0:
            return path[1:i], path[i + 1:]
    return path[1:], ""


def resolves(schema: Schema, path: str) -> bool:
    """Whether ``path`` exists below ``schema`` (in the notation of this module's docstring)."""
    path = path.strip().lstrip(".")
    if path.strip("*") == "":
        return True
    if path.startswith("{"):
        inside, rest = _bracketed(path)
        return all(resolves(schema, alt.strip() + rest) for alt in split_top(inside, ",|") if alt.strip())
    if path.startswith("["):
        rest = _bracketed(path)[1]
        return schema.get("type") == "array" and resolves(schema.get("items", {}), rest)
    head = re.match(r"<[^>]*>|[A-Za-z0-9_]+", path)
    if head is None:
        return False
    name, rest = head.group(0), path[head.end():]
    if schema.get("type") == "array":
        schema = schema.get("items", {})  # a list's fields written without []
    props: Schema = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    if name.startswith("<"):
        children = [*props.values(), *([extra] if isinstance(extra, Mapping) else [])]
    elif name in props:
        children = [props[name]]
    elif isinstance(extra, Mapping):
        children = [extra]
    else:
        children = []
    open_ended = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or extra is True
    return any(resolves(child, rest) for child in children) or (open_ended and name not in props)


def field_candidates(code: Code) -> Iterator[tuple[str | None, str]]:
    """(the CRD it names or None, path) of each field path in ``code``."""
    if code.block is not None and code.block not in SHELL_BLOCKS:
        return
    top = top_level_spec_fields()
    for m in PATH_START.finditer(code.text):
        path = dotted_path(code.text, m.end())
        first = re.match(r"[A-Za-z0-9_]+", path)
        if first is None or path == first.group(0) or NOT_FIELDS.search(path):
            continue
        python = code.text[m.end() + len(path):].startswith("(") or any(
            "_" in n or n[0].isupper() for n in re.findall(r"(?<![<\w])[A-Za-z0-9_]+", path))
        rooted = first.group(0) in ("spec", "status")
        relative = first.group(0) in top and not m.group(0) and code.block is None
        if not python and (rooted or relative):
            yield KINDS.get(m.group(1) or ""), path


def field_problems(path: Path, text: str) -> list[str]:
    problems: list[str] = []
    for code in code_in(text):
        for kind, field in field_candidates(code):
            kinds = [kind] if kind in schemas() else list(schemas())
            roots = [schemas()[k] for k in kinds]
            if re.match(r"(spec|status)\b", field) is None:  # relative: below spec or status
                roots = [r["properties"][part] for r in roots for part in ("spec", "status") if part in r["properties"]]
            ok = any(resolves(root, field) for root in roots)
            if not ok:
                written = f"{kind}.{field}" if kind else field
                problems.append(f"{path.name}:{code.line}: `{written}` is no field of {' or '.join(kinds)} "
                                f"({', '.join(str(CRDS[k].relative_to(REPO_ROOT)) for k in kinds)})")
    return problems


# --- the tests -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_flags_in_docs_exist(doc: Path) -> None:
    problems = flag_problems(doc, doc.read_text())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_crd_fields_in_docs_exist(doc: Path) -> None:
    problems = field_problems(doc, doc.read_text())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_flags(command: str) -> None:
    """The parsers were really built (a broken import or entry point shows here, not as every flag missing)."""
    assert flags_of(command), f"no flags found for {command}"


EXAMPLE = """\
The `rerank-operator` flag `--metrics-port` exists, `--no-such-flag` does not.

```sh
rerank-quantize --model m --output /models --artifact-id x --no-reduce-range --quantum-leap
kubectl apply --anything-goes -f crds/   # --not-ours-either
rerank-operator --namespace a \\
  --bogus
```

Unattributed `--made-up`. The operator's `--prometheus-url`; `tei_rerank.py --router x --turbo`; `helm --set x`.

Fields: `spec.autoscaling.intervalSeconds`, `spec.autoscaling.intervalSecond`, `status.pools.<pool>.readyReplicas`,
`spec.pools.gpu.{dtype, minReplicas}`, `spec.pools.<pool>.{dtype}`, `spec.pools.cpu.{minReplicas, dtype}`,
`autoscaling.scaleDown.window`, `routing.split()`, `spec.py`, `Deployment.spec.replicas`, `status.artifact...`,
`status.conditions[].reason`, `status.artifact.quality.spearman`, `rerankclass.spec.network.enabled`,
`rerankmodel.spec.network`, `metrics.serviceMonitor.enabled=true`, `status.autoscaling.lastDecision.held`.

```sh
kubectl get rrm x -o jsonpath='{.status.artifact.id}{.status.artifact.size}'
```

| `rerank-operator` flag | note |
|---|---|
| `--verbose` | exists |
| `--loud` | does not; `helm --loud` is helm's |
"""


def test_a_wrong_flag_or_field_is_reported() -> None:
    flags = flag_problems(Path("example.md"), EXAMPLE)
    assert [p.split(" is ")[0] for p in flags] == [
        "example.md:1: --no-such-flag", "example.md:4: --quantum-leap", "example.md:7: --bogus",
        "example.md:10: --made-up", "example.md:10: --turbo", "example.md:25: --loud"], flags
    assert "name the command" in flags[3]
    fields = field_problems(Path("example.md"), EXAMPLE)
    assert [p.split(" is no field")[0] for p in fields] == [
        "example.md:12: `spec.autoscaling.intervalSecond`", "example.md:13: `spec.pools.cpu.{minReplicas, dtype}`",
        "example.md:14: `autoscaling.scaleDown.window`", "example.md:16: `rerankmodel.spec.network`",
        "example.md:19: `status.artifact.size`"], fields
