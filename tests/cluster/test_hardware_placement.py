"""Artifacts true to the hardware that serves them (issue 61): the quantization Job runs where the CPU pool runs.

With ``target: auto`` the Job chooses its INT8 recipe for the CPU of the node it runs on and reports the speedup it
measured there; the CPU pool's nodes may be another CPU generation, or vendor, than the rest of the cluster. Here two
kwok node pools with a ``cpu-pool`` label (as a platform labels its node groups), and a class whose CPU pool selects
one of them: the model's own Job and its CPU pool land on the same pool, never the other.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rerank_devcluster.cluster import Cluster
from rerank_devcluster.waiting import eventually
from tests.cluster.rrm_harness import GROUP, VERSION, Env

pytestmark = pytest.mark.cluster

NODE_POOLS = {"kwok-avx2-0": {"labels": {"cpu-pool": "avx2"}, "allocatable": {}},
              "kwok-avx2-1": {"labels": {"cpu-pool": "avx2"}, "allocatable": {}},
              "kwok-amx-0": {"labels": {"cpu-pool": "amx"}, "allocatable": {}}}


@pytest.fixture(scope="module")
def cpu_node_pools(cluster: Cluster) -> dict[str, str]:
    cluster.add_nodes(NODE_POOLS)
    return {name: spec["labels"]["cpu-pool"] for name, spec in NODE_POOLS.items()}


@contextlib.contextmanager
def avx2_class(kube: client.ApiClient) -> Iterator[str]:
    custom = client.CustomObjectsApi(kube)
    name = f"avx2-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankClass", "metadata": {"name": name},
        "spec": {"pools": {"cpu": {"nodeSelector": {"cpu-pool": "avx2"}}}}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, "rerankclasses", name)


def test_the_job_runs_on_the_cpu_pools_nodes(rrm_env: Env, kube: client.ApiClient,
                                             cpu_node_pools: dict[str, str]) -> None:
    env = rrm_env
    with avx2_class(kube) as class_name:
        env.kube.create_model(env.model(className=class_name))
        quantizer = env.running_quantizer()
        assert quantizer["spec"].get("nodeSelector") == {"cpu-pool": "avx2"}
        assert cpu_node_pools.get(quantizer["spec"]["nodeName"]) == "avx2", quantizer["spec"]["nodeName"]
        env.finish_quantizer(ok=True)

        def cpu_pods() -> list[dict[str, object]] | None:
            pods = [p for p in env.kube.pods(env.namespace, "app.kubernetes.io/instance=bge-m3,rerank.io/pool=cpu")
                    if p["spec"].get("nodeName")]
            return pods or None

        pods = eventually(cpu_pods, 60, f"a scheduled CPU pool pod\n{env.describe()}")
        assert {cpu_node_pools.get(str(p["spec"]["nodeName"])) for p in pods} == {"avx2"}  # type: ignore[index]
