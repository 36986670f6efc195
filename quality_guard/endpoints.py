"""Asking a TEI endpoint (a pool, or a remote reference) for scores: ``POST /rerank`` with the mirrored body.

Each endpoint is a TEI base URL; one behind ``--api-key`` gets its key as a bearer token, read from the environment
variable the configuration names for it (a Secret in the guard's pod). Every call carries the model's mirror token:
on a gateway without RequestMirror the pools run a sampler in front of TEI (``rerank_sampler``), which copies a
share of the requests it serves to this guard, but never one carrying the token (the guard's own check).
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from rerank_contracts.guard import MIRROR_TOKEN_HEADER, GuardConfig

#: POST a /rerank body to a base URL, return the scores in ``texts`` order.
Post = Callable[[str, Mapping[str, Any]], list[float]]


def tei_scores(body: Any, n: int) -> list[float]:
    """Scores in ``texts`` order from TEI's ``/rerank`` answer: ``[{"index": i, "score": s}, ...]`` by score."""
    if not isinstance(body, list) or len(body) != n:
        raise ValueError(f"expected a list of {n} results, got {str(body)[:200]}")
    out = [float("nan")] * n
    for item in body:
        out[int(item["index"])] = float(item["score"]) if item["score"] is not None else float("nan")
    return out


def http_post(timeout: float, keys: Mapping[str, str] | None = None, token: str | None = None) -> Post:
    """POST to a TEI base URL; ``keys``: base URL -> API key sent as a bearer token (TEI's --api-key); ``token``:
    the model's mirror token, which the pools' samplers recognize (and strip) as the guard's own."""
    keys = dict(keys or {})

    def post(base: str, body: Mapping[str, Any]) -> list[float]:
        headers = {"Content-Type": "application/json", **({MIRROR_TOKEN_HEADER: token} if token else {})}
        if base in keys:
            headers["Authorization"] = f"Bearer {keys[base]}"
        req = urllib.request.Request(base.rstrip("/") + "/rerank", data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return tei_scores(json.loads(resp.read()), len(body["texts"]))

    return post


def api_keys(config: GuardConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Base URL -> API key, from the environment variables ``config.api_key_env`` names (Secrets in the pod)."""
    env = os.environ if environ is None else environ
    urls = {"reference": config.reference, **config.pools}
    return {urls[name]: env[var] for name, var in config.api_key_env.items() if name in urls and env.get(var)}
