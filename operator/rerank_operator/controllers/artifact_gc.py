"""The collector of shared artifacts: every ``--artifact-gc-seconds`` the leader deletes, from each store a
RerankClass names, the artifacts no model has used for the class's ``unusedGraceSeconds`` (``sharing.collect``).

It counts the users from the statuses of every model the operator watches, so it runs only when the operator
watches every namespace: an operator confined to some namespaces cannot tell that nobody else uses an artifact.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rerank_operator.adapters.artifact_store import SharedArtifacts
from rerank_operator.core import platform

log = logging.getLogger(__name__)


def stores_of(classes: Iterable[Mapping[str, Any]]) -> list[platform.ArtifactStore]:
    """The distinct stores the classes name (the first class's grace wins for a store two classes share)."""
    found: dict[str, platform.ArtifactStore] = {}
    for rclass in classes:
        where = platform.ArtifactStore.from_class(rclass.get("spec"))
        if where is not None:
            found.setdefault(where.repository, where)
    return list(found.values())


def collect_once(shared: SharedArtifacts, classes: Iterable[Mapping[str, Any]],
                 statuses: Iterable[Mapping[str, Any]], now: float,
                 leading: Callable[[], bool] = lambda: True) -> list[str]:
    return shared.collect(stores_of(classes), statuses, now, leading)


def run(stop: threading.Event, shared: SharedArtifacts, list_classes: Callable[[], list[Mapping[str, Any]]],
        statuses: Callable[[], list[Mapping[str, Any]]], period: float,
        clock: Callable[[], float] = time.time, leading: Callable[[], bool] = lambda: True) -> None:
    """The collector's thread (started when leading; ``leading`` asked before each registry delete); an error is
    logged and tried again next period."""
    while not stop.wait(period):
        try:
            collect_once(shared, list_classes(), statuses(), clock(), leading)
        except Exception:  # the next pass tries again; the collector must not die with one bad answer
            log.exception("collecting unused shared artifacts")
