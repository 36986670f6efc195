"""spec.parse, fed arbitrary JSON, fails only with its own SpecError (never a TypeError, KeyError, ... that would
crash a reconcile with an unhelpful traceback instead of an InvalidSpec condition naming the field)."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rerank_operator.core.spec import model as specs
from rerank_operator.core.spec import parse as spec_parse

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**63, max_value=2**63) | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=25,
)

VALID: dict[str, Any] = {
    "model": {"id": "BAAI/bge-reranker-v2-m3", "revision": "953dc6f6",
              "tokenSecretRef": {"name": "hf", "key": "token"}},
    "quantization": {"qualityGate": {"minSpearman": 0.99}, "resources": {"requests": {"cpu": "2"}}},
    "storage": {"size": "20Gi", "accessModes": ["ReadWriteOnce"]},
    "pools": {"cpu": {"minReplicas": 1, "maxReplicas": 4, "tei": {"extraArgs": ["--tokenization-workers=2"]},
                      "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "8Gi"}},
                      "nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "k", "operator": "Exists"}]},
              "gpu": {"resources": {"limits": {"nvidia.com/gpu": 1}}}},
    "routing": {"policy": "fixed", "weights": {"gpu": 50, "cpu": 50},
                "gateway": {"parentRefs": [{"name": "edge", "namespace": "gw"}], "hostnames": ["a.example.com"]}},
    "autoscaling": {"enabled": True, "intervalSeconds": 15, "replicaManagement": "operator", "idleSeconds": 900},
}


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _paths(v, (*prefix, i))
    return found


PATHS = _paths(VALID)


def _parses_or_refuses(spec: Any) -> None:
    with contextlib.suppress(specs.SpecError):
        spec_parse.parse(spec)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_arbitrary_json(value: Any) -> None:
    _parses_or_refuses(value)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), JSON)
def test_a_valid_spec_with_one_part_replaced_by_arbitrary_json(path: tuple[Any, ...], value: Any) -> None:
    """Deep fields are reached only from an otherwise valid spec: replace one node of it with anything."""
    spec = copy.deepcopy(VALID)
    node: Any = spec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    _parses_or_refuses(spec)


def test_the_valid_base_parses() -> None:
    parsed = spec_parse.parse(VALID)
    assert parsed.cpu.tei.extra_args == ("--tokenization-workers=2",) and parsed.gpu.enabled
    assert parsed.autoscaling.idle_seconds == 900 and not parsed.scales_to_zero


# Every enabled pool at minReplicas 0 is served only where the model can be woken (spec_parse.SCALE_TO_ZERO_NEEDS).
MIN_REPLICAS = st.sampled_from([None, 0, 1, 3])


@settings(max_examples=200, deadline=None)
@given(MIN_REPLICAS, MIN_REPLICAS, st.booleans(), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from(["operator", "external"]), st.integers(min_value=30, max_value=604800))
def test_scale_to_zero_is_refused_exactly_where_the_model_cannot_be_woken(
        cpu_min: int | None, gpu_min: int | None, cpu_on: bool, gpu_on: bool, autoscaling: bool, gateway: bool,
        management: str, idle: int) -> None:
    spec = copy.deepcopy(VALID)
    spec["routing"] = {"policy": "gpu-first"} | ({"gateway": VALID["routing"]["gateway"]} if gateway else {})
    spec["autoscaling"] = {"enabled": autoscaling, "replicaManagement": management, "idleSeconds": idle}
    for pool, low, on in (("cpu", cpu_min, cpu_on), ("gpu", gpu_min, gpu_on)):
        section = spec["pools"][pool]
        section["enabled"] = on
        section.pop("minReplicas", None)
        if low is not None:
            section["minReplicas"] = low
    enabled = [low for low, on in ((cpu_min, cpu_on), (gpu_min, gpu_on)) if on]
    zero = bool(enabled) and all(low == 0 for low in enabled)
    wakeable = autoscaling and management == "operator" and gateway
    try:
        parsed = spec_parse.parse(spec)
    except specs.SpecError as refused:
        assert not enabled or (zero and not wakeable and str(refused) == spec_parse.SCALE_TO_ZERO_NEEDS), refused
        return
    assert enabled and (not zero or wakeable)
    assert parsed.scales_to_zero is zero and parsed.autoscaling.idle_seconds == idle
