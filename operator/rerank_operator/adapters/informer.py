"""Watch-fed caches of the models and their children: one LIST, then one WATCH per kind, instead of reads per
reconcile.

This is what client-go's shared informers do for Go operators, in the few lines this operator needs:

- **One stream per kind, filtered by the API server.** Every child the operator creates carries
  ``app.kubernetes.io/name=rerankmodel`` and ``app.kubernetes.io/managed-by=rerank-operator``
  (``names.labels``), so each children's informer lists and watches only those (kopf's own watches cannot filter by
  label on the server, and caching every Pod of a cluster is how KServe's controller was OOM-killed, kserve #3467).
  The models' informer (``selector=""``) holds every RerankModel of the watched namespaces.
- **A reconcile or an autoscaler tick reads memory.** ``Store`` keeps the objects by namespace/name and indexes
  them by their controller's uid, so "the Jobs this model controls" is a dictionary lookup; a model whose children
  did not change costs no request at all.
- **Our own writes are seen at once.** The API server answers every apply, create and status patch with the object
  as stored; ``Store.record`` keeps it if it is newer than what the watch delivered (resourceVersion), so the next
  reconcile never plans against a copy older than its own last write.
- **Resilient streams.** A watch that ends is resumed from the last resourceVersion (bookmarks keep it fresh); a
  410 Gone relists; a kind whose API is absent (no Gateway API CRDs) reads as unavailable and is listed again
  every ``ABSENT_RETRY_SECONDS``.

Objects in a store are never mutated after they are stored (a change replaces the whole object): readers share
them without copying and must not modify them.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rerank_operator.adapters.kube_api import ApiError, Client, TransientApiError, WatchExpired
from rerank_operator.core import names
from rerank_operator.core.reconcile.observed import Obj

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
OnChange = Callable[[str, Obj], None]  # (ADDED | MODIFIED | DELETED, object)

#: The label selector of the children's informers: the children this operator manages.
CHILDREN_SELECTOR = f"{names.LABEL_NAME}={names.APP_NAME},{names.LABEL_MANAGED_BY}={names.OPERATOR_NAME}"
ABSENT_RETRY_SECONDS = 60.0
WATCH_SECONDS = (240, 420)  # one watch request lasts a random time in this range, as client-go spreads them
MAX_BACKOFF_SECONDS = 30.0


#: What the operator never reads of a kind it only observes (it applies Deployments, Services, claims, routes and
#: NetworkPolicies and compares their whole spec for drift, so those keep theirs): dropped before an object is
#: stored, as client-go's informer transforms do. ``managedFields`` goes from every kind: it is often the largest part
#: of an object and nothing here reads it.
_ONLY_SPEC_KEYS = {"Pod": ("hostNetwork", "nodeName"), "ReplicaSet": ("replicas", "selector")}
_DROP_SPEC_KEYS = {"Job": ("template",)}


def trim(obj: Obj) -> Obj:
    """``obj`` without what the operator never reads (a memory bound for a fleet's worth of children)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    spec = obj.get("spec")
    kind = str(obj.get("kind"))
    if isinstance(spec, dict):
        if kind in _ONLY_SPEC_KEYS:
            obj["spec"] = {k: spec[k] for k in _ONLY_SPEC_KEYS[kind] if k in spec}
        for key in _DROP_SPEC_KEYS.get(kind, ()):
            spec.pop(key, None)
    return obj


#: Strings up to this length are shared between stored objects (``compact``); longer ones are mostly unique.
SHARED_STRING_MAX = 64
#: Python 3.12.0-3.12.5 made interned strings immortal (cpython#113993): there, values (uids, versions, pod IPs)
#: would never be freed, so only keys (a bounded set) are shared.
_SHARE_VALUES = not ((3, 12, 0) <= sys.version_info[:3] < (3, 12, 6))


def compact(value: Any) -> Any:
    """A copy of a decoded object whose keys and short strings are shared with every other stored object.

    Why: each ``json.loads`` makes its own copy of every key ("metadata", "labels", "containers", ...) and of every
    repeated value (label values, namespaces, images, probe paths): at 1000 models the keys alone were a third of the
    stored models, Deployments, pods and Services (deep size 102 MB, 68 MB with shared keys, 47 MB with every string
    shared; strings over SHARED_STRING_MAX are mostly unique: messages, annotations, hashes)."""
    if isinstance(value, dict):
        return {sys.intern(k): compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if _SHARE_VALUES and type(value) is str and len(value) <= SHARED_STRING_MAX:
        return sys.intern(value)
    return value


def resource_version(obj: Obj) -> int | None:
    """The object's resourceVersion as a number (etcd's revision), None if it is not one. The API calls it opaque;
    every server in practice (etcd-backed) gives increasing integers, which is what comparing our own writes with
    the watch's copies needs."""
    try:
        return int(obj.get("metadata", {}).get("resourceVersion", ""))
    except ValueError:
        return None


def controller_uid(obj: Obj) -> str | None:
    for ref in obj.get("metadata", {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


IndexKey = TypeVar("IndexKey", str, Key)


def _drop(index: dict[IndexKey, set[Key]], value: IndexKey | None, key: Key) -> None:
    if value is not None and value in index:
        index[value].discard(key)
        if not index[value]:
            del index[value]


def _instance(key: Key, obj: Obj) -> Key | None:
    value = (obj["metadata"].get("labels") or {}).get(names.LABEL_INSTANCE)
    return (key[0], str(value)) if value else None


def _newer(new: Obj, old: Obj | None) -> bool:
    """``new`` is a later version than ``old`` (the same version is not: it is our own write's echo)."""
    if old is None:
        return True
    a, b = resource_version(new), resource_version(old)
    return a is None or b is None or a > b


class Store:
    """Objects of one kind by (namespace, name), with an index by controller uid (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[Key, Obj] = {}
        self._by_owner: dict[str, set[Key]] = {}
        self._by_instance: dict[Key, set[Key]] = {}  # (namespace, app.kubernetes.io/instance) -> objects

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._items.get((namespace, name))

    def controlled_by(self, uid: str) -> list[Obj]:
        """Objects whose controller reference points at ``uid``."""
        with self._lock:
            return [self._items[k] for k in self._by_owner.get(uid, ()) if k in self._items]

    def select(self, namespace: str, labels: dict[str, str]) -> list[Obj]:
        """Objects in ``namespace`` carrying every label in ``labels`` (by index when one is the model's
        ``app.kubernetes.io/instance``: the autoscaler asks this for every model every tick)."""
        with self._lock:
            if names.LABEL_INSTANCE in labels:
                keys = self._by_instance.get((namespace, labels[names.LABEL_INSTANCE]), set())
                found = [self._items[k] for k in keys]
            else:
                found = [o for (ns, _), o in self._items.items() if ns == namespace]
        return [o for o in found if all((o["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items())]

    def all_keys(self) -> list[Key]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def record(self, obj: Obj) -> bool:
        """Store ``obj`` (trimmed) unless the stored copy is as new; returns whether it was stored (False for the
        watch's echo of our own write, which ``Caches.record`` stored already)."""
        key = _key(obj)
        trim(obj)
        with self._lock:
            old = self._items.get(key)
            if not _newer(obj, old):  # the echo is not copied at all
                return False
            self._unindex(key, old)
            self._index(key, compact(obj))  # one object's copy: short enough to take under the lock
            return True

    def remove(self, obj: Obj) -> None:
        key = _key(obj)
        with self._lock:
            old = self._items.pop(key, None)
            self._unindex(key, old)

    def replace(self, items: Iterable[Obj], listed_at: int | None, namespace: str | None) -> None:
        """The result of a LIST at revision ``listed_at`` (for ``namespace``, or all): it replaces what was stored,
        except copies newer than the list (our own writes that landed after it)."""
        fresh = {_key(o): compact(trim(o)) for o in items}  # a whole LIST's copy: before taking the lock
        with self._lock:
            for key in [k for k in self._items if namespace is None or k[0] == namespace]:
                if key not in fresh:
                    kept = resource_version(self._items[key])
                    if listed_at is None or kept is None or kept <= listed_at:
                        self._unindex(key, self._items.pop(key))
            for key, obj in fresh.items():
                old = self._items.get(key)
                if _newer(obj, old):
                    self._unindex(key, old)
                    self._index(key, obj)

    def _index(self, key: Key, obj: Obj) -> None:
        self._items[key] = obj
        uid = controller_uid(obj)
        if uid:
            self._by_owner.setdefault(uid, set()).add(key)
        instance = _instance(key, obj)
        if instance:
            self._by_instance.setdefault(instance, set()).add(key)

    def _unindex(self, key: Key, old: Obj | None) -> None:
        if old is None:
            return
        _drop(self._by_owner, controller_uid(old), key)
        _drop(self._by_instance, _instance(key, old), key)


@dataclass(frozen=True)
class Kind:
    """What one informer lists and watches."""

    api_version: str
    kind: str
    optional: bool = False  # an API that may not be installed (the Gateway API)


class Informer:
    """LIST + WATCH of one kind (in each watched namespace, or cluster-wide), feeding a ``Store``."""

    def __init__(self, client: Client, kind: Kind, *, namespaces: Sequence[str] = (),
                 selector: str = CHILDREN_SELECTOR, on_change: OnChange | None = None) -> None:
        self.client = client
        self.kind = kind
        self.store = Store()
        self.namespaces: list[str | None] = list(namespaces) or [None]
        self.selector = selector
        self.on_change = on_change
        self._synced: dict[str | None, bool] = {ns: False for ns in self.namespaces}
        self._available: dict[str | None, bool] = {ns: True for ns in self.namespaces}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def synced(self) -> bool:
        with self._cond:
            return all(self._synced.values())

    @property
    def available(self) -> bool:
        """False while the kind's API is not installed (e.g. no Gateway API CRDs)."""
        with self._cond:
            return all(self._available.values())

    def start(self) -> None:
        for ns in self.namespaces:
            t = threading.Thread(target=self._run, args=(ns,), daemon=True,
                                 name=f"informer-{self.kind.kind}-{ns or 'all'}")
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not all(self._synced.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    # --- the stream ---------------------------------------------------------------------------------------------------

    def _run(self, namespace: str | None) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                revision = self._list(namespace)
                if revision is None:  # the API is absent: look again later
                    self._stop.wait(ABSENT_RETRY_SECONDS)
                    continue
                backoff = 1.0
                self._watch(namespace, revision)
            except WatchExpired:
                log.info("watch of %s (%s) expired: listing again", self.kind.kind, namespace or "all namespaces")
            except (TransientApiError, ApiError, OSError, ValueError) as exc:
                log.warning("watch of %s (%s) failed, retrying in %.0f s: %s", self.kind.kind,
                            namespace or "all namespaces", backoff, exc)
                self._stop.wait(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    def _list(self, namespace: str | None) -> str | None:
        """LIST into the store; returns the list's resourceVersion to watch from, or None if the API is absent."""
        try:
            items, revision = self.client.list_all(self.kind.api_version, self.kind.kind, namespace, self.selector)
        except ApiError as exc:
            if exc.status == 404 and self.kind.optional:
                self.store.replace((), None, namespace)
                self._mark(namespace, synced=True, available=False)
                return None
            raise
        try:
            listed_at: int | None = int(revision)
        except ValueError:
            listed_at = None
        before = {k for k in self.store.all_keys() if namespace is None or k[0] == namespace}
        self.store.replace(items, listed_at, namespace)
        self._mark(namespace, synced=True, available=True)
        for obj in items:  # a relist may hide changes the broken watch missed: report them
            self._changed("ADDED" if _key(obj) not in before else "MODIFIED", obj)
        return revision

    def _watch(self, namespace: str | None, revision: str) -> None:
        while not self._stop.is_set():
            seconds = random.randint(*WATCH_SECONDS)
            for event_type, obj in self.client.watch(self.kind.api_version, self.kind.kind, namespace, self.selector,
                                                     revision, seconds):
                if self._stop.is_set():
                    return
                revision = obj.get("metadata", {}).get("resourceVersion") or revision
                if event_type == "BOOKMARK":
                    continue
                if event_type == "DELETED":
                    self.store.remove(obj)
                elif not self.store.record(obj):
                    continue  # older than our own write already stored
                self._changed(event_type, obj)

    def _changed(self, event_type: str, obj: Obj) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(event_type, obj)
        except Exception:  # a handler's bug must not end the stream
            log.exception("handling a %s event of %s", event_type, self.kind.kind)

    def _mark(self, namespace: str | None, *, synced: bool, available: bool) -> None:
        with self._cond:
            self._synced[namespace] = synced
            self._available[namespace] = available
            self._cond.notify_all()
