"""Leader election for two (or more) operator replicas: one writes, the others keep their caches warm and wait.

``Elector.run`` is a blocking loop for its own daemon thread, following client-go's leaderelection: every retry
period it reads the Lease, asks ``core.leadership.step`` what to do and writes the Lease when it leads (a
compare-and-swap on the resourceVersion, adapters/lease.py). A standby takes over only after it has seen the same
record unchanged for the lease duration on its own clock (the safety argument is in core/leadership.py). A leader
that cannot renew within the renew deadline, or finds another holder in the Lease, stops leading at once and calls
``on_stopped``: the caller exits the process, as controller-runtime does, because half-done work of a deposed leader
is not worth untangling when a fresh start costs seconds. A graceful stop releases the Lease so a standby acquires at
its next try instead of waiting out the lease.

``term_left`` is what every write checks (``kube_api.Client.fence``: a write is not sent once it is 0, and takes at
most what is left). It runs out by itself when the renew deadline passes, even while the loop's thread is still
blocked in a request, so a hung Lease request can never stretch a leader's writes past the point where a standby
may take over. ``is_leader`` (the health probe's) is ``term_left() > 0``.
"""

from __future__ import annotations

import logging
import math
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Literal

from rerank_operator.adapters import operator_metrics as metrics
from rerank_operator.adapters.kube_api import ApiError, Client, TransientApiError
from rerank_operator.adapters.lease import LeaseRecord, LeaseStore
from rerank_operator.core.leadership import LeaderElectionSettings, Observation, released, step

log = logging.getLogger(__name__)
Clock = Callable[[], datetime]
Round = Literal["lead", "follow", "lost race", "error", "expired"]


def default_identity() -> str:
    """hostname (the pod's name in a pod) plus a short random suffix, so a restarted pod never mistakes the Lease
    its previous incarnation held for its own."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def monotonic_clock() -> Clock:
    """Wall time as of now, advanced by the monotonic clock: the timestamps written into the Lease read like wall
    time, while the durations the election measures with it never jump when NTP steps the wall clock (a forward
    step would otherwise look like an expired lease)."""
    wall, mono = datetime.now(UTC), time.monotonic()
    return lambda: wall + timedelta(seconds=time.monotonic() - mono)


class Elector:
    """One process's side of the election for ``settings.name`` in ``settings.namespace``.

    ``clock`` is what ``step`` measures observations with and what is written into the Lease; ``monotonic`` times
    the renew deadline and the waits. ``release_on_cancel`` (client-go's name): release the Lease on a graceful
    stop; the cluster tests turn it off to stand for a SIGKILL.
    """

    def __init__(self, client: Client, settings: LeaderElectionSettings, identity: str, clock: Clock | None = None,
                 *, release_on_cancel: bool = True, monotonic: Callable[[], float] = time.monotonic) -> None:
        if settings.enabled and not settings.namespace:
            raise ValueError("leader election needs the Lease's namespace (--leader-election-namespace or "
                             "$POD_NAMESPACE)")
        self.settings = settings
        self.identity = identity
        self.release_on_cancel = release_on_cancel
        self._clock = clock or monotonic_clock()
        self._monotonic = monotonic
        self.store = LeaseStore(client, settings.namespace or "", settings.name,
                                timeout_seconds=settings.retry_period_seconds)
        self._lock = threading.Lock()
        self._valid_until = -math.inf  # monotonic time until which we lead; -inf: we do not
        self._observed: Observation | None = None
        self._record: LeaseRecord | None = None  # the Lease as last read or written

    @property
    def is_leader(self) -> bool:
        return self.term_left() > 0

    def term_left(self) -> float:
        """Seconds until this process must stop writing: up to the renew deadline of its last successful renew
        (unbounded without election; -inf while it does not lead)."""
        with self._lock:
            return self._valid_until - self._monotonic()

    def run(self, stop: threading.Event, on_started: Callable[[], None], on_stopped: Callable[[], None]) -> None:
        """Block until ``stop`` is set or leadership is lost. ``on_started`` runs once we lead (at once without
        election); ``on_stopped`` runs only when leadership is lost while not stopping: not after a graceful stop,
        which the caller asked for and handles itself. Both run in this thread and must return promptly: while
        ``on_started`` blocks, nothing renews the Lease (``is_leader`` would still turn False at the deadline)."""
        if not self.settings.enabled:
            self._lead_until(math.inf)
            on_started()
            stop.wait()
            self._lead_until(-math.inf)
            return
        if not self._acquire(stop):
            return
        log.info("leader election: %s now leads (Lease %s/%s)", self.identity, self.settings.namespace,
                 self.settings.name, extra=self._extra("started"))
        on_started()
        if self._renew(stop):
            return
        log.warning("leader election: %s lost the Lease %s/%s; stopping", self.identity, self.settings.namespace,
                    self.settings.name, extra=self._extra("lost"))
        on_stopped()

    # --- the loop ------------------------------------------------------------------------------------------------

    def _acquire(self, stop: threading.Event) -> bool:
        """Try every retry period (with a little jitter, so replicas started together do not collide forever)
        until we lead; False if ``stop`` came first."""
        following = ""
        while not stop.is_set():
            started = self._monotonic()
            outcome = self._round()
            if outcome == "lead":
                self._lead_until(started + self.settings.renew_deadline_seconds)
                return True
            holder = str(self._observed.record.get("holderIdentity") or "") if self._observed else ""
            if outcome == "follow" and holder != following:
                following = holder
                log.info("leader election: %s follows %s", self.identity, holder, extra=self._extra("following"))
            stop.wait(self.settings.retry_period_seconds * random.uniform(1.0, 1.1))
        return False

    def _renew(self, stop: threading.Event) -> bool:
        """Renew every retry period. True: ``stop`` was set (released if asked); False: leadership lost, because
        another holder is in the Lease or the renew deadline passed without a successful renew."""
        while not stop.wait(self.settings.retry_period_seconds):
            started = self._monotonic()
            if started >= self._deadline():
                break
            outcome = self._round(renewing=True)
            if self._monotonic() >= self._deadline():
                break  # too late, even if this very write succeeded: a standby may already lead
            if outcome == "lead":
                self._lead_until(started + self.settings.renew_deadline_seconds)
            elif outcome == "follow":
                break
            else:
                log.warning("leader election: %s failed to renew (%s); %.1fs left", self.identity, outcome,
                            self._deadline() - self._monotonic(), extra=self._extra("renew-failed"))
        else:
            self._lead_until(-math.inf)
            if self.release_on_cancel:
                self._release()
            return True
        self._lead_until(-math.inf)
        return False

    def _round(self, *, renewing: bool = False) -> Round:
        """Read, decide, write once. A renewing leader continues only by renewing its own record: an empty or
        foreign holder means someone else moved (released it by hand, took it over), and it stops."""
        try:
            self._record = current = self.store.read()
            decision = step(current.spec if current else None, self.identity, self._clock(), self.settings,
                            self._observed)
            self._observed = decision.observed
            if not decision.leads or (renewing and decision.action != "renew"):
                return "follow"
            if renewing and self._monotonic() >= self._deadline():
                return "expired"  # the read outlived our term: renewing now would only delay the takeover
            written = self.store.write(decision.lease_spec, current)
        except (TransientApiError, ApiError) as exc:
            log.warning("leader election: Lease %s/%s: %s", self.settings.namespace, self.settings.name, exc,
                        extra=self._extra("error"))
            return "error"
        except Exception:  # anything else is a failed try too: the renew deadline, not a dead thread, decides
            log.exception("leader election: Lease %s/%s: unexpected error", self.settings.namespace,
                          self.settings.name, extra=self._extra("error"))
            return "error"
        if not isinstance(written, LeaseRecord):
            return "lost race"
        self._record = written
        self._observed = Observation(written.spec, self._clock())
        return "lead"

    def _release(self) -> None:
        """Hand the Lease over on a graceful stop: no holder, a one-second lease (only if it is still ours)."""
        current = self._record
        if current is None or current.spec.get("holderIdentity") != self.identity:
            return
        try:
            outcome = self.store.update(released(current.spec, self._clock()), current.resource_version)
        except (TransientApiError, ApiError) as exc:
            log.warning("leader election: could not release the Lease: %s", exc, extra=self._extra("error"))
            return
        if isinstance(outcome, LeaseRecord):
            log.info("leader election: %s released the Lease %s/%s", self.identity, self.settings.namespace,
                     self.settings.name, extra=self._extra("released"))

    # --- state ---------------------------------------------------------------------------------------------------

    def _deadline(self) -> float:
        with self._lock:
            return self._valid_until

    def _lead_until(self, until: float) -> None:
        with self._lock:
            self._valid_until = until
        metrics.LEADER.set(1 if until > -math.inf else 0)

    def _extra(self, event: str) -> dict[str, str]:
        return {"leader_election": event, "identity": self.identity, "lease": self.settings.name}
