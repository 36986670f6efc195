"""Which sleeping models have requests waiting: the activator's ``GET /pending``, read by the autoscaler's loop.

One request for the whole fleet (the activator lists every model it holds requests for, or saw one for lately),
authenticated with the key the operator shares with it. A failure is logged and counted and reads as "nothing
waiting": the activator goes on holding requests, and the next poll, a second later, wakes their models.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from rerank_contracts.activator import PENDING_PATH, TOKEN_HEADER, pending_token
from rerank_operator.core.autoscale.signals import ActivatorDemand
from rerank_operator.core.names import ModelKey
from rerank_operator.core.platform import Activator

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 2.0
Fetch = Callable[[Activator], Mapping[ModelKey, ActivatorDemand] | None]


def parse(payload: Any) -> dict[ModelKey, ActivatorDemand]:
    """``{"models": {"<ns>/<name>": {"waiting": n, "first": t, "last": t}}}`` by model; malformed entries skipped."""
    models = payload.get("models") if isinstance(payload, Mapping) else None
    out: dict[ModelKey, ActivatorDemand] = {}
    for key, entry in (models or {}).items():
        namespace, sep, name = str(key).partition("/")
        if not sep or not isinstance(entry, Mapping):
            continue
        waiting, last = entry.get("waiting"), entry.get("last")
        out[(namespace, name)] = ActivatorDemand(
            waiting=waiting if isinstance(waiting, int) and not isinstance(waiting, bool) and waiting > 0 else 0,
            last=float(last) if isinstance(last, (int, float)) and not isinstance(last, bool) else None)
    return out


def fetch(activator: Activator) -> dict[ModelKey, ActivatorDemand] | None:
    """The activator's pending models, or None when it could not be read (logged)."""
    request = urllib.request.Request(activator.url + PENDING_PATH,
                                     headers={TOKEN_HEADER: pending_token(activator.key)})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            return parse(json.loads(response.read(1 << 22)))
    except (OSError, ValueError) as exc:  # URLError and timeouts are OSErrors; bad JSON a ValueError
        log.warning("activator %s%s unreadable: %s", activator.url, PENDING_PATH,
                    exc.reason if isinstance(exc, urllib.error.URLError) else exc)
        return None
