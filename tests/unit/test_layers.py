"""The layering the design relies on, checked: a pure core, one module talking to the API, kopf at the edge."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "rerank_operator"
SHELL = {"apply", "reconcile", "handlers", "main", "metrics", "autoscaler"}  # I/O, kopf and process wiring
PURE = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in SHELL | {"__init__", "tenancy"})


def imports(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ("." * node.level) + (node.module or "")
            found |= {base} | {f"{base}.{a.name}" if node.level and not node.module else base for a in node.names}
    return found


def test_only_apply_imports_the_kubernetes_client() -> None:
    users = {p.stem for p in PACKAGE.glob("*.py") if any(i.split(".")[0] == "kubernetes" for i in imports(p.stem))}
    assert users == {"apply"}


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_do_no_io(module: str) -> None:
    bad = {i for i in imports(module) if i.split(".")[0] in {"kopf", "kubernetes", "prometheus_client", "socket",
                                                               "urllib", "requests", "aiohttp"}
           or i.lstrip(".") in {"apply", "reconcile", "handlers", "metrics"}}
    assert not bad, f"{module} imports {bad}"


@pytest.mark.parametrize("module", sorted(p.stem for p in PACKAGE.glob("*.py")))
def test_the_operator_never_imports_the_ml_stack(module: str) -> None:
    heavy = {i for i in imports(module) if i.split(".")[0] in {"torch", "optimum", "transformers", "onnxruntime"}}
    assert not heavy
