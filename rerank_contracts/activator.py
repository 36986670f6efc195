"""The contract between the operator and the activator, in one place (stdlib only: the operator imports it).

While a RerankModel is scaled to zero, its HTTPRoute sends its traffic to the one shared activator, setting three
request headers with a ``RequestHeaderModifier`` (``set``, so whatever a client sent under those names is replaced):
the model (:data:`MODEL_HEADER`), where the model is served once it wakes (:data:`UPSTREAM_HEADER`, the base URL of
its CPU pool's Service) and :func:`token` over both (:data:`TOKEN_HEADER`). The token is why a pod that can reach the
activator still cannot make it hold requests for a model, or forward to an address, the operator did not route: only
the operator and the activator hold the key (a Secret the chart makes, mounted at :data:`KEY_FILE` in both).
:func:`upstream_allowed` is the second fence: even a signed upstream must be a Service in the model's own namespace.

The operator polls ``GET`` :data:`PENDING_PATH` with :func:`pending_token` in :data:`TOKEN_HEADER` to learn which
models have requests waiting, and scales their pools up. The chart labels the activator's pods with
:data:`POD_LABELS`, which the operator's NetworkPolicies name as the peer allowed into a sleeping model's pool.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path

#: ``<namespace>/<name>`` of the RerankModel a held request is for.
MODEL_HEADER = "X-Rerank-Activate-Model"
#: The base URL to forward to, no path: ``http://<service>.<namespace>.svc:<port>``.
UPSTREAM_HEADER = "X-Rerank-Activate-Upstream"
#: :func:`token` on a held request; :func:`pending_token` on ``GET /pending``.
TOKEN_HEADER = "X-Rerank-Activate-Token"
#: The activator's one port (requests to hold, /pending, /metrics, /healthz, /readyz).
PORT = 8080
PENDING_PATH = "/pending"
#: The labels the chart puts on the activator's pods.
POD_LABELS = {"app.kubernetes.io/component": "rerank-activator"}
#: Where the shared HMAC key is mounted (a Secret) in the activator's and the operator's pods.
KEY_FILE = "/var/run/rerank-activator/key"
#: The shortest key accepted: 256 bits, whatever alphabet the bytes come from.
MIN_KEY_BYTES = 32

# Kubernetes' name rules: a namespace is a DNS-1123 label, a Service a DNS-1035 label (it starts with a letter), a
# RerankModel's name a DNS-1123 subdomain. A port is 1..65535 written without a leading zero.
_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_SERVICE = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_SUBDOMAIN = r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
_MODEL = re.compile(rf"(?P<namespace>{_LABEL})/(?P<name>{_SUBDOMAIN})")
_UPSTREAM = re.compile(
    rf"http://(?P<host>(?P<service>{_SERVICE})\.(?P<namespace>{_LABEL})\.svc(?:\.cluster\.local)?)"
    r":(?P<port>[1-9][0-9]{0,4})")


def _hmac_hex(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def token(key: bytes, model: str, upstream: str) -> str:
    """What the route sets in :data:`TOKEN_HEADER`: hex HMAC-SHA256 of ``"<model>\\n<upstream>"``. A newline can
    appear in neither valid value, so no other pair signs the same message."""
    return _hmac_hex(key, f"{model}\n{upstream}")


def pending_token(key: bytes) -> str:
    """What the operator sends in :data:`TOKEN_HEADER` on ``GET /pending`` (who waits is the tenants' business)."""
    return _hmac_hex(key, "pending")


def upstream_allowed(model: str, upstream: str) -> bool:
    """Whether ``upstream`` is a base URL the activator may forward ``model``'s requests to: plain
    ``http://<service>.<namespace>.svc[.cluster.local]:<port>`` where ``<namespace>`` is the model's own, with
    valid names and nothing else (no path, query, fragment or user info), so a signed header still cannot point
    the activator at another tenant, the API server or a node."""
    m, u = _MODEL.fullmatch(model), _UPSTREAM.fullmatch(upstream)
    if m is None or u is None or len(m["name"]) > 253:
        return False
    return m["namespace"] == u["namespace"] and int(u["port"]) <= 65535


def upstream_address(upstream: str) -> tuple[str, int]:
    """``(host, port)`` of an upstream :func:`upstream_allowed` accepted (ValueError for any other string)."""
    u = _UPSTREAM.fullmatch(upstream)
    if u is None:
        raise ValueError(f"not an activator upstream: {upstream!r}")
    return u["host"], int(u["port"])


def upstream_service(upstream: str) -> tuple[str, str, int]:
    """``(namespace, service, port)`` of an upstream :func:`upstream_allowed` accepted (ValueError otherwise): the
    Service whose ready endpoints the activator forwards to."""
    u = _UPSTREAM.fullmatch(upstream)
    if u is None:
        raise ValueError(f"not an activator upstream: {upstream!r}")
    return u["namespace"], u["service"], int(u["port"])


def read_keys(path: str) -> tuple[bytes, ...]:
    """The shared keys, one a line, white space around each ignored (a Secret written by hand often ends in a
    newline): the first signs, every one verifies. Rotation without a 401: put the new key on a line before the old
    one, let the activator's and the operator's pods restart (the activator then takes both; the operator signs with
    the new), then remove the old line. ValueError when there is none or one is shorter than :data:`MIN_KEY_BYTES`;
    OSError when the file cannot be read."""
    keys = tuple(line.strip() for line in Path(path).read_bytes().splitlines() if line.strip())
    if not keys:
        raise ValueError(f"the activator key file {path} is empty")
    for i, key in enumerate(keys, 1):
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the activator key in {path}{f' (line {i})' if len(keys) > 1 else ''} is {len(key)} "
                             f"bytes; at least {MIN_KEY_BYTES} are needed")
    return keys


def read_key(path: str) -> bytes:
    """The key that signs (:func:`read_keys`' first)."""
    return read_keys(path)[0]
