"""The Python side of the shared class-limits table (tests/class_policy_cases.py): ``tenancy.violations`` on the
effective spec must refuse exactly what the admission policy refuses, with the same words.

The cluster side (tests/cluster/test_class_policy_cases.py) runs the same table against the policy on the API server.
Both sides see the objects as stored: the class and the model with their CRDs' defaults applied.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import yaml

from rerank_operator.core import tenancy
from tests.class_policy_cases import CASES, CLASSES, Case
from tests.unit.operator.core.tenancy.tenancy_helpers import REPO, apply_defaults, rclass

MODEL_CRD = REPO / "crds" / "rerankmodel.yaml"


@functools.cache
def model_spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(MODEL_CRD.read_text())
    return dict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])


def stored_model_spec(spec: dict[str, Any]) -> dict[str, Any]:
    return dict(apply_defaults(model_spec_schema(), copy.deepcopy(spec)))


def operator_violations(case: Case) -> list[str]:
    class_spec = rclass(lambda spec: spec.update(copy.deepcopy(CLASSES[case.class_key])), name=case.class_key)["spec"]
    return tenancy.violations(tenancy.resolve(stored_model_spec(case.model_spec()), class_spec), class_spec,
                              case.class_key)


def test_the_table_covers_refusals_and_admissions_for_every_class() -> None:
    assert len({c.name for c in CASES}) == len(CASES)
    assert {c.class_key for c in CASES} == set(CLASSES)
    assert sum(c.refused is None for c in CASES) >= 10 and sum(c.refused is not None for c in CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_operator_refuses_what_the_table_says(case: Case) -> None:
    found = operator_violations(case)
    if case.refused is None:
        assert found == [], found
        return
    assert len(found) == 1, found
    assert case.fragment(case.class_key) in found[0], found
