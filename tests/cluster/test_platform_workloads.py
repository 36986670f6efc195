"""What the platform gives every model's pods, set once on the operator (the chart's ``workloads`` values): the
quantizer image when neither the model nor its class names one, and the image pull Secrets of the Job's and the
pools' pods. Against the real API server: the Job and the Deployments the operator writes carry them."""

from __future__ import annotations

from typing import Any

from rerank_operator.core import names
from tests.cluster.rrm_harness import Env, eventually

IMAGE = "registry.example.com/platform/rerank-quantizer@sha256:" + "ab" * 32


def test_the_platforms_quantizer_image_and_pull_secrets_reach_the_job_and_the_pools(rrm_env: Env) -> None:
    env, ns = rrm_env, rrm_env.namespace
    env.operator.stop()
    env.operator.extra_args = [*env.operator.extra_args, "--quantizer-image", IMAGE,
                               "--image-pull-secret", "regcred", "--image-pull-secret", "mirror-cred"]
    env.operator.start()
    env.kube.create_model(env.model())  # names no quantizer image (nor does a class: there is none)
    pod = env.running_quantizer()
    wanted = [{"name": "regcred"}, {"name": "mirror-cred"}]
    job = env.kube.jobs(ns)[0]
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == wanted
    assert pod["spec"]["imagePullSecrets"] == wanted  # the Job controller carried them to the pod

    env.finish_quantizer(ok=True)

    def pools() -> Any:
        found = [env.kube.deployment(ns, names.deployment_name("bge-m3", pool)) for pool in names.POOLS]
        return found if all(found) else None

    for deployment in eventually(pools, 60, "both pools' Deployments"):
        assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == wanted, deployment["metadata"]["name"]


def test_a_model_that_names_its_quantizer_image_keeps_it(rrm_env: Env) -> None:
    env = rrm_env
    env.operator.stop()
    env.operator.extra_args = [*env.operator.extra_args, "--quantizer-image", IMAGE]
    env.operator.start()
    own = "registry.example.com/tenant/quantizer:1.0"
    env.kube.create_model(env.model(quantization={"image": own}))
    env.running_quantizer()
    job = env.kube.jobs(env.namespace)[0]
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == own
    assert "imagePullSecrets" not in job["spec"]["template"]["spec"]  # none configured: none written
