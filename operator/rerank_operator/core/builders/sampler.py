"""The sampler beside TEI in a guarded model's pool pods (``rerank_sampler``), where the model's gateway cannot mirror.

A gateway without the Extended RequestMirror filter (``core/gateway.py``) still routes every request to the pools:
there, each pool pod runs the sampler in front of TEI. The pod's port ``http`` (what the pool and model Services
send to) becomes the sampler's; it forwards every request to TEI on the pod's loopback and, after the answer has gone
back, copies ``sample_fraction`` of the ``/rerank`` requests TEI answered to the model's quality guard, with the
model's mirror token, off the request path (a guard that is down or slow costs the client nothing). TEI keeps its
own port (``tei``) for the kubelet's probes and the autoscaler's scrapes of ``/metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rerank_contracts.guard import MIRROR_TOKEN_ENV, SAMPLER_HEALTH_PATH, SAMPLER_METRICS_PORT, SAMPLER_PORT
from rerank_operator.core import names
from rerank_operator.core.builders import pods

CONTAINER = "sampler"
#: A thread per connection and a bounded queue of copies: little CPU next to TEI's, little memory.
RESOURCES = {"requests": {"cpu": "50m", "memory": "48Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}


@dataclass(frozen=True)
class Sidecar:
    """What a pool pod's sampler needs: its image (the operator's, which carries ``rerank-sampler``), where the
    model's guard listens, the share of requests to copy and the model's mirror token."""

    image: str
    guard_url: str
    fraction: float
    token: str


def container(sidecar: Sidecar) -> dict[str, Any]:
    """The sampler's container: it takes the pod's ``http`` port, TEI keeps ``tei``."""
    return {
        "name": CONTAINER,
        "image": sidecar.image,
        "command": ["rerank-sampler"],
        "args": ["--guard-url", sidecar.guard_url, "--fraction", repr(sidecar.fraction),
                 "--port", str(SAMPLER_PORT), "--metrics-port", str(SAMPLER_METRICS_PORT),
                 "--upstream", f"http://127.0.0.1:{names.TEI_PORT}"],
        "env": [{"name": MIRROR_TOKEN_ENV, "value": sidecar.token}],
        "ports": [{"name": "http", "containerPort": SAMPLER_PORT, "protocol": "TCP"},  # deployment.SERVING_PORT
                  {"name": "sampler-metrics", "containerPort": SAMPLER_METRICS_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": SAMPLER_HEALTH_PATH, "port": "http"}, "periodSeconds": 5,
                           "failureThreshold": 3, "timeoutSeconds": 2},
        "resources": RESOURCES,
        "securityContext": pods.container_security_context(),
    }
