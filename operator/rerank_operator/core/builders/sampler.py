"""The front beside TEI in every pool pod (``rerank_sampler``): the rerank API, and the guard's sample where the
model's gateway cannot mirror.

The pod's port ``http`` (what the pool and model Services send to) is the front's. It answers the Cohere and Jina
shapes (``POST /v1/rerank``, ``/v2/rerank``) through TEI's own routes, and forwards every other request to TEI on the
pod's loopback as it came. For a guarded model on a gateway without the Extended RequestMirror filter
(``core/gateway.py``) it also copies, after the answer has gone back, ``sample_fraction`` of the ``/rerank`` requests
TEI answered to the model's quality guard, with the model's mirror token, off the request path (a guard that is down
or slow costs the client nothing). TEI keeps its own port (``tei``) for the kubelet's probes and the autoscaler's
scrapes of ``/metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rerank_contracts.guard import MIRROR_TOKEN_ENV, SAMPLER_HEALTH_PATH, SAMPLER_METRICS_PORT, SAMPLER_PORT
from rerank_contracts.rerank_api import LongDocuments
from rerank_operator.core import names
from rerank_operator.core.builders import pods

CONTAINER = "sampler"
#: A thread per connection and a bounded queue of copies: little CPU next to TEI's, little memory.
RESOURCES = {"requests": {"cpu": "50m", "memory": "48Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}


@dataclass(frozen=True)
class Sampling:
    """Where the model's guard listens, the share of requests to copy and the model's mirror token."""

    guard_url: str
    fraction: float
    token: str


@dataclass(frozen=True)
class Sidecar:
    """What a pool pod's front needs: its image (the operator's, which carries ``rerank-sampler``), the names the
    rerank API's ``model`` may carry (the first is the one answered), the long-document mode, and the guard's
    sampling when the model's copies come from its pods."""

    image: str
    model_names: tuple[str, ...]
    long_documents: LongDocuments = "truncate"
    sampling: Sampling | None = None


def container(sidecar: Sidecar) -> dict[str, Any]:
    """The front's container: it takes the pod's ``http`` port, TEI keeps ``tei``."""
    sampling = sidecar.sampling
    args = [*(["--guard-url", sampling.guard_url, "--fraction", repr(sampling.fraction)] if sampling else []),
            *(a for name in sidecar.model_names for a in ("--model-name", name)),
            "--long-documents", sidecar.long_documents,
            "--port", str(SAMPLER_PORT), "--metrics-port", str(SAMPLER_METRICS_PORT),
            "--upstream", f"http://127.0.0.1:{names.TEI_PORT}"]
    return {
        "name": CONTAINER,
        "image": sidecar.image,
        "command": ["rerank-sampler"],
        "args": args,
        **({"env": [{"name": MIRROR_TOKEN_ENV, "value": sampling.token}]} if sampling else {}),
        "ports": [{"name": "http", "containerPort": SAMPLER_PORT, "protocol": "TCP"},  # deployment.SERVING_PORT
                  {"name": "sampler-metrics", "containerPort": SAMPLER_METRICS_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": SAMPLER_HEALTH_PATH, "port": "http"}, "periodSeconds": 5,
                           "failureThreshold": 3, "timeoutSeconds": 2},
        "resources": RESOURCES,
        "securityContext": pods.container_security_context(),
    }
