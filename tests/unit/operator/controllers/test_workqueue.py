"""The reconcile queue (controllers/workqueue.py): keys not events, one worker per key, backoff per key."""

from __future__ import annotations

import threading
from collections import Counter

from rerank_devcluster.waiting import eventually
from rerank_operator.controllers.workqueue import RetryAfter, WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_keys_added_before_start_wait_and_duplicates_collapse() -> None:
    seen: list[str] = []
    clock = Clock()
    waits: list[float] = []
    q: WorkQueue[str] = WorkQueue(lambda k: seen.append(k) or None, workers=2, clock=clock, waited=waits.append)
    for key in ["a", "b", "a", "a", "b"]:
        q.add(key)
    assert q.depth() == 2 and seen == []  # a standby queues, it does not work
    clock.now = 7.0  # the time it stood by is the keys' wait
    q.start()
    eventually(lambda: len(seen) == 2, 5, "both keys processed")
    q.stop()
    assert sorted(seen) == ["a", "b"] and waits == [7.0, 7.0]


def test_a_key_added_while_it_is_processed_runs_once_more_and_never_concurrently() -> None:
    inside = threading.Event()
    release = threading.Event()
    running: Counter[str] = Counter()
    overlaps: list[str] = []
    calls: list[str] = []

    def handle(key: str) -> None:
        running[key] += 1
        if running[key] > 1:
            overlaps.append(key)
        calls.append(key)
        if len(calls) == 1:
            inside.set()
            release.wait(5)
        running[key] -= 1

    q: WorkQueue[str] = WorkQueue(handle, workers=4)
    q.start()
    q.add("m")
    assert inside.wait(5)
    for _ in range(10):  # a burst of events for the model being reconciled
        q.add("m")
    release.set()
    eventually(lambda: len(calls) == 2 and q.processing() == 0, 5, "one more run")
    q.stop()
    assert overlaps == [] and calls == ["m", "m"]


def test_failures_back_off_per_key_and_success_resets() -> None:
    clock = Clock()
    outcomes = iter([RuntimeError("boom"), RetryAfter("later"), RetryAfter("quota", 30.0), None])
    calls: list[float] = []

    def handle(key: str) -> float | None:
        if key != "m":
            return None
        calls.append(clock.now)
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome
        return 600.0  # the resync

    q: WorkQueue[str] = WorkQueue(handle, workers=1, retry_base=1.0, clock=clock)
    q.start()
    q.add("m")
    # 1 s after the first failure, 2 s after the second, the handler's own 30 s after the third, then the resync.
    for runs, delay in ((1, 1.0), (2, 2.0), (3, 30.0), (4, 600.0)):
        eventually(lambda n=runs: len(calls) == n and q.processing() == 0, 5, f"run {runs}")  # type: ignore[misc]
        assert q.due("m") == clock.now + delay
        clock.now += delay
        q.add("poke")  # wakes the worker to look at the clock
    q.stop()
    assert calls == [0.0, 1.0, 3.0, 33.0]


def test_add_after_keeps_the_earliest_due_time_and_forget_drops_it() -> None:
    clock = Clock()
    seen: list[str] = []
    q: WorkQueue[str] = WorkQueue(lambda k: seen.append(k) or None, workers=1, clock=clock)
    q.add_after("a", 10)
    q.add_after("a", 5)
    q.add_after("a", 20)
    q.add_after("b", 5)
    q.forget("b")
    q.start()
    clock.now = 5.5
    q.add("tick")
    eventually(lambda: "a" in seen and "tick" in seen and q.processing() == 0, 5, "a due at 5 s")
    clock.now = 30
    q.add("tick")
    eventually(lambda: seen.count("tick") == 2, 5, "second tick")
    q.stop()
    assert seen.count("a") == 1 and "b" not in seen


def test_urgent_keys_go_ahead_of_the_background_work() -> None:
    """One worker, a backlog of background keys; urgent keys added later (and one moved up from the backlog) are
    taken first, in their own order, then the backlog in its order."""
    seen: list[str] = []
    q: WorkQueue[str] = WorkQueue(lambda k: seen.append(k) or None, workers=1)
    for key in ["bg-1", "bg-2", "bg-3", "bg-4"]:
        q.add(key)
    q.add("new-1", urgent=True)
    q.add("bg-3", urgent=True)         # a queued background key whose spec just changed moves up
    q.add("new-2", urgent=True)
    q.add("new-1", urgent=True)        # already urgent: nothing changes
    assert (q.depth(), q.urgent_pending()) == (6, 3)
    q.start()
    eventually(lambda: len(seen) == 6, 5, "all keys processed")
    q.stop()
    assert seen == ["new-1", "bg-3", "new-2", "bg-1", "bg-2", "bg-4"]
    assert q.urgent_pending() == 0


def test_urgent_keys_count_as_pending_while_they_are_processed() -> None:
    inside, release = threading.Event(), threading.Event()

    def handle(key: str) -> None:
        inside.set()
        release.wait(5)

    q: WorkQueue[str] = WorkQueue(handle, workers=1)
    q.start()
    q.add("new", urgent=True)
    assert inside.wait(5)
    q.add("bg")
    assert q.urgent_pending() == 1, "the urgent key being processed; the background key is not urgent"
    release.set()
    eventually(lambda: q.urgent_pending() == 0 and q.processing() == 0 and q.depth() == 0, 5, "both processed")
    q.stop()


def test_an_urgent_add_during_processing_runs_again_urgently() -> None:
    inside, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def handle(key: str) -> None:
        seen.append(key)
        if key == "m" and seen.count("m") == 1:
            inside.set()
            release.wait(5)

    q: WorkQueue[str] = WorkQueue(handle, workers=1)
    q.start()
    q.add("m")
    assert inside.wait(5)
    q.add("bg")                        # waits behind "m"
    q.add("m", urgent=True)            # "m" changed while being reconciled: again, ahead of "bg"
    release.set()
    eventually(lambda: len(seen) == 3, 5, "all processed")
    q.stop()
    assert seen == ["m", "m", "bg"]


def test_background_work_yields_to_urgent_work_without_starving() -> None:
    """Four workers, at most one on background keys while an urgent key is in flight: three background keys run
    one at a time beside it (never zero: nothing starves), then side by side once the urgent key is done."""
    release_urgent = threading.Event()
    lock = threading.Lock()
    running: set[str] = set()
    most_background: list[int] = []
    started: list[str] = []
    gates = {k: threading.Event() for k in ["bg-1", "bg-2", "bg-3"]}

    def handle(key: str) -> None:
        with lock:
            running.add(key)
            started.append(key)
            most_background.append(sum(1 for k in running if k.startswith("bg")))
        (release_urgent if key == "new" else gates[key]).wait(5)
        with lock:
            running.discard(key)

    q: WorkQueue[str] = WorkQueue(handle, workers=4, background_while_urgent=1)
    q.start()
    q.add("new", urgent=True)
    eventually(lambda: "new" in running, 5, "the urgent key is taken")
    for key in gates:
        q.add(key)
    eventually(lambda: "bg-1" in running, 5, "one background key runs beside the urgent one")
    gates["bg-1"].set()                 # done: the next background key takes its place, still one at a time
    eventually(lambda: "bg-2" in running, 5, "the second background key")
    assert "bg-3" not in running and max(most_background) == 1
    release_urgent.set()               # the urgent work is over: the rest runs side by side
    eventually(lambda: "bg-3" in running, 5, "the third background key beside the second")
    assert {"bg-2", "bg-3"} <= running
    gates["bg-2"].set()
    gates["bg-3"].set()
    eventually(lambda: not running, 5, "all done")
    q.stop()
    assert started == ["new", "bg-1", "bg-2", "bg-3"] and q.processing() == 0


def test_promoting_a_waiting_background_key_wakes_an_idle_worker() -> None:
    """Cap of one background worker, held by a long background key while an urgent key is in flight: a queued
    background key whose spec changes (urgent now) must start at once on an idle worker, not when one finishes."""
    release = threading.Event()
    running: set[str] = set()
    lock = threading.Lock()

    def handle(key: str) -> None:
        with lock:
            running.add(key)
        if key != "promoted":
            release.wait(5)
        with lock:
            running.discard(key)

    q: WorkQueue[str] = WorkQueue(handle, workers=4, background_while_urgent=1)
    q.start()
    q.add("new", urgent=True)
    eventually(lambda: "new" in running, 5, "the urgent key runs")
    q.add("bg-long")
    eventually(lambda: "bg-long" in running, 5, "the background place is taken")
    q.add("promoted")                  # waits behind the cap
    assert "promoted" not in running and q.depth() == 1
    q.add("promoted", urgent=True)     # its spec changed: an idle worker takes it now
    eventually(lambda: q.depth() == 0 and "promoted" not in running and "new" in running, 5,
               "the promoted key ran while the others still hold their workers")
    release.set()
    q.stop(wait_seconds=5)
