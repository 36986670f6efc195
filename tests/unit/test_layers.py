"""The layering the design relies on, checked module by module (``autoscale/`` and ``tenancy`` included): a pure
core, one module talking to the API, kopf at the edge. pyproject.toml states the same layers as import-linter
contracts (run by test_lint.py); this test also catches a new module that no contract lists yet."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "rerank_operator"
#: I/O, kopf and process wiring, and the two metrics sources that make HTTP requests.
SHELL = {"client", "apply", "reconcile", "handlers", "main", "metrics", "autoscaler", "autoscale.prometheus",
         "autoscale.direct"}
MODULES = sorted(".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")
                 if p.name != "__init__.py")
PURE = sorted(set(MODULES) - SHELL)
#: No pure module talks to the network or reads the environment (settings.py's Settings is built by the shell).
IO = {"kopf", "kubernetes", "prometheus_client", "socket", "urllib", "requests", "aiohttp", "http", "os"}
SHELL_ONLY = {"client", "apply", "reconcile", "handlers", "metrics", "main", "autoscaler"}


def imports(module: str) -> set[str]:
    """What ``module`` imports: absolute names for third-party modules, package-relative names for our own."""
    parts = module.split(".")
    tree = ast.parse((PACKAGE / Path(*parts)).with_suffix(".py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module or "")
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level] + (node.module.split(".") if node.module else [])
            if node.module:
                found.add("." + ".".join(base))
            # `from . import x` may name a module: record it, so `from .. import apply` is seen as `apply`.
            found |= {"." + ".".join([*base, a.name]) for a in node.names}
    return found


def test_the_walk_sees_nested_modules() -> None:
    assert {"autoscale.policy", "autoscale.config", "tenancy.violations", "tenancy.quota"} <= set(PURE)
    assert ".spec" in imports("autoscale.config")
    assert ".autoscale.config" in imports("autoscale.load")


def test_only_the_client_imports_the_kubernetes_client() -> None:
    users = {m for m in MODULES if any(i.split(".")[0] == "kubernetes" for i in imports(m))}
    assert users == {"client"}


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_do_no_io(module: str) -> None:
    bad = {i for i in imports(module) if i.split(".")[0] in IO or i.lstrip(".") in SHELL_ONLY}
    assert not bad, f"{module} imports {bad}"


@pytest.mark.parametrize("module", MODULES)
def test_the_operator_never_imports_the_ml_stack(module: str) -> None:
    heavy = {i for i in imports(module) if i.split(".")[0] in {"torch", "optimum", "transformers", "onnxruntime"}}
    assert not heavy
