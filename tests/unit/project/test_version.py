"""One version: ``rerank_operator.__version__``. pyproject.toml reads it; the copies that must be literals (the
chart's Chart.yaml, the Dockerfile's label default, the CRDs' default quantizer image, the Argo CD example) are
checked against it here, so a release bumps one string and this test names every copy left behind."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from rerank_operator import __version__
from rerank_operator.controllers import handlers
from rerank_operator.core.spec import model as specs

ROOT = Path(__file__).resolve().parents[3]


def test_pyproject_takes_the_version_from_the_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "rerank_operator.__version__"}


def test_chart_versions_match() -> None:
    chart = yaml.safe_load((ROOT / "charts/rerank-operator/Chart.yaml").read_text())
    assert (str(chart["version"]), str(chart["appVersion"])) == (__version__, __version__)


def test_dockerfile_label_default_matches() -> None:
    found = re.findall(r"^ARG VERSION=(\S+)$", (ROOT / "operator/Dockerfile").read_text(), flags=re.M)
    assert found == [__version__]


def test_default_quantizer_image_tag_matches_everywhere() -> None:
    assert specs.QUANTIZER_IMAGE.endswith(f":{__version__}")
    for crd in ("crds/rerankclass.yaml", "crds/rerankmodel.yaml"):
        tags = set(re.findall(r"rerank-quantizer:([\w.\-]+?)\.?(?:\s|$)", (ROOT / crd).read_text()))
        assert tags == {__version__}, crd


def test_user_agent_and_examples_carry_it() -> None:
    assert handlers.USER_AGENT.endswith(f"/{__version__}")
    revisions = set(re.findall(r"targetRevision: v(\S+)", (ROOT / "examples/argocd-application.yaml").read_text()))
    assert revisions == {__version__}
