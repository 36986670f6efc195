"""The layering the design relies on, checked module by module: the folders are the layers.

``core/`` is pure (no I/O, no kopf, never the shell), ``adapters/`` do the I/O (only ``adapters/kube_api.py`` talks
to the Kubernetes API) and never reach the loops, ``controllers/`` are the loops and kopf's handlers, ``main.py``
wires the process. pyproject.toml states the same layers as import-linter contracts (run by test_lint.py); this test
also catches a module placed outside the layer folders, and two modules sharing a name across folders."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "operator" / "rerank_operator"
MODULES = sorted(".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")
                 if p.name != "__init__.py")
LAYERS = ("core", "adapters", "controllers")  # lowest first; main.py sits above them all
#: What no pure module may import: the network, the environment, kopf, the API client, the metrics library.
IO = {"kopf", "kubernetes", "prometheus_client", "socket", "urllib", "requests", "aiohttp", "http", "os"}


def layer(module: str) -> str:
    return module.split(".")[0]


def imports(module: str) -> set[str]:
    """Absolute names of what ``module`` imports (relative imports resolved, ``from a import b`` gives ``a.b`` too,
    so importing a module by its package is seen)."""
    parts = module.split(".")
    tree = ast.parse((PACKAGE / Path(*parts)).with_suffix(".py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = ["rerank_operator", *parts[: len(parts) - node.level]]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def ours(module: str) -> set[str]:
    """The operator's own modules and packages that ``module`` imports, relative to the package."""
    return {i.removeprefix("rerank_operator.") for i in imports(module) if i.startswith("rerank_operator.")}


def test_the_walk_sees_every_layer_and_nested_module() -> None:
    assert {"core.autoscale.policy", "core.tenancy.violations", "core.builders.job", "adapters.kube_api",
            "controllers.handlers", "main"} <= set(MODULES)
    assert "core.spec.model" in ours("core.autoscale.config")
    assert "core.autoscale.config" in ours("core.autoscale.load")


def test_every_module_lives_in_a_layer_folder() -> None:
    assert {m for m in MODULES if layer(m) not in LAYERS} == {"main"}


def test_no_two_modules_share_a_name() -> None:
    """A name says where a thing lives: no ``routing.py`` in two folders, no ``autoscaler`` beside ``autoscale``."""
    stems = Counter(m.split(".")[-1] for m in MODULES)
    assert [s for s, n in stems.items() if n > 1] == []


@pytest.mark.parametrize("module", MODULES)
def test_imports_point_down_the_layers(module: str) -> None:
    if module == "main":
        return
    allowed = LAYERS[: LAYERS.index(layer(module)) + 1]
    upward = {i for i in ours(module) if layer(i) not in allowed and i.split(".")[0] in (*LAYERS, "main")}
    assert not upward, f"{module} imports {upward}"


@pytest.mark.parametrize("module", [m for m in MODULES if layer(m) == "core"])
def test_the_core_does_no_io(module: str) -> None:
    bad = {i for i in imports(module) if i.split(".")[0] in IO}
    assert not bad, f"{module} imports {bad}"


@pytest.mark.parametrize("module", [m for m in MODULES if layer(m) == "adapters"])
def test_kopf_stays_out_of_the_adapters(module: str) -> None:
    assert not {i for i in imports(module) if i.split(".")[0] == "kopf"}


def test_only_the_api_client_imports_the_kubernetes_client() -> None:
    users = {m for m in MODULES if any(i.split(".")[0] == "kubernetes" for i in imports(m))}
    assert users == {"adapters.kube_api"}


@pytest.mark.parametrize("module", MODULES)
def test_the_operator_never_imports_the_ml_stack(module: str) -> None:
    heavy = {i for i in imports(module) if i.split(".")[0] in {"torch", "optimum", "transformers", "onnxruntime"}}
    assert not heavy
