"""docs/architecture.md's module maps are the newcomer's index: the operator's (operator/rerank_operator) and the
quantization Job's (quantizer_job) must name every module and folder, each under its folder, and nothing that does
not exist; the flat packages' maps (rerank_contracts, quality_guard, benchmarks, the sampler) name exactly their
modules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: The packages whose maps nest folders: the map section's name, the package's directory.
NESTED = {"operator/rerank_operator": ROOT / "operator" / "rerank_operator", "quantizer_job": ROOT / "quantizer_job"}


def mapped(section: str) -> set[str]:
    """The paths a map names: indentation (two spaces a level) says which folder a name is in."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split(f"## Module map ({section})", 1)[1].split("```", 2)[1]
    found: set[str] = set()
    folders: list[str] = []
    for line in block.splitlines():
        m = re.match(r"^( *)([\w]+(?:\.py|/))(?:\s|$)", line)
        if not m:
            continue
        depth = len(m.group(1)) // 2
        del folders[depth:]
        name = m.group(2)
        path = "".join(folders) + name
        if name.endswith("/"):
            folders.append(name)
        found.add(path)
    return found


def on_disk(package: Path) -> set[str]:
    """Every module and folder below ``package`` (its own ``__init__.py`` files aside), as paths relative to it."""
    modules = {str(p.relative_to(package)) for p in package.rglob("*.py") if p.name != "__init__.py"}
    folders = {str(p.relative_to(package)) + "/" for p in package.rglob("*") if (p / "__init__.py").is_file()}
    return modules | folders


def test_the_walk_sees_nested_modules() -> None:
    assert {"core/", "core/quality/", "core/quality/canary.py"} <= on_disk(NESTED["operator/rerank_operator"])
    assert {"stages/", "steps/graph/", "steps/graph/export.py", "cli.py"} <= on_disk(NESTED["quantizer_job"])


@pytest.mark.parametrize("section", sorted(NESTED))
def test_the_map_names_every_module_and_folder(section: str) -> None:
    missing = on_disk(NESTED[section]) - mapped(section)
    assert not missing, f"add to docs/architecture.md's {section} map: {sorted(missing)}"


@pytest.mark.parametrize("section", sorted(NESTED))
def test_the_map_names_nothing_that_is_gone(section: str) -> None:
    stale = mapped(section) - on_disk(NESTED[section])
    assert not stale, f"docs/architecture.md's {section} map names what does not exist: {sorted(stale)}"


def named_in(section: str) -> set[str]:
    """The module files a map section's code block names (a line may name several: ``fetch.py export.py ...``)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split(f"## Module map ({section})", 1)[1].split("```", 2)[1]
    return set(re.findall(r"(?<![\w/.])(\w+\.py)\b", block))


@pytest.mark.parametrize("package", ["rerank_contracts", "quality_guard", "benchmarks", "operator/rerank_sampler"])
def test_the_maps_of_the_contracts_guard_and_benchmarks_name_exactly_their_modules(package: str) -> None:
    modules = {p.name for p in (ROOT / package).glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    named = named_in(package)
    missing, stale = sorted(modules - named), sorted(named - modules)
    assert not missing, f"add to docs/architecture.md's {package} map: {missing}"
    assert not stale, f"docs/architecture.md's {package} map names what does not exist: {stale}"


#: A module a newcomer reads in one sitting; past this, it holds more than one concept (issue: the house, step 2).
MAX_MODULE_LINES = 400


@pytest.mark.parametrize("package", ["operator/rerank_operator", "rerank_contracts", "quantizer_job", "quality_guard",
                                     "operator/rerank_sampler"])
def test_no_module_is_over_the_size_one_concept_takes(package: str) -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / package).rglob("*.py")}
    large = {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not large, f"split by concept (at most {MAX_MODULE_LINES} lines a module): {large}"
