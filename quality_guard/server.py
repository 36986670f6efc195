"""The guard's process: receives mirrored ``/rerank`` requests, asks the pools and the reference, exports figures.

It is never in the serving path: a gateway's ``RequestMirror`` filter (or, on a gateway without it, the sampler
beside TEI in each pool pod: ``rerank_sampler``) sends it copies of real requests after they were answered; only
copies carrying the model's mirror token count (:mod:`.intake`, which also bounds what HTTP may cost). Without a
gateway, a :class:`.replay.Replayer` offers it the artifact's evaluation pairs (``GuardConfig.replay``) at a set
pace. ``POST /rerank`` answers 202 at once and leaves the work to one worker thread through a bounded queue
(:mod:`.worker`); what a check does is :mod:`.checks`', and what ``GET /metrics`` shows is :mod:`.metrics`'.

One process serves one model (:class:`.config.Config`); the operator runs one per guarded model
(``rerank_operator/core/builders/guard.py``), passing the configuration in an environment variable:

    python -m quality_guard.server --config guard.json --port 8080
    python -m quality_guard.server --config-env RERANK_GUARD_CONFIG
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from rerank_contracts.guard import GuardConfig

from . import intake, reference, sample
from .checks import Guard
from .replay import Replayer, replay_bodies
from .worker import Worker


class SampleWriter:
    """Writes the live sample every ``every`` seconds (if it changed), and once more when it stops."""

    def __init__(self, guard: Guard, every: float = sample.WRITE_SECONDS) -> None:
        self.guard, self.every = guard, every
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="guard-sample", daemon=True)

    def start(self) -> SampleWriter:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stopped.wait(self.every):
            self.guard.write_sample()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self.guard.write_sample()  # what came in since the last write (LiveSample.write runs one at a time)


@dataclass
class Running:
    server: intake.BoundedServer
    worker: Worker
    thread: threading.Thread
    replayer: Replayer | None = None
    writer: SampleWriter | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        if self.replayer is not None:
            self.replayer.stop()
        self.server.shutdown()
        if self.writer is not None:
            self.writer.stop()
        self.server.server_close()
        self.worker.stop()
        self.thread.join(timeout=10)


def _load_reference(local: reference.LocalReference, exit_on_failure: bool) -> None:
    """Load the FP32 reference beside the HTTP server (a large model takes a while; /healthz answers meanwhile).
    ``exit_on_failure`` (the guard's process): a guard without its reference can judge nothing, so it exits and its
    pod shows CrashLoopBackOff, rather than stay Ready counting reference errors."""
    try:
        local.load()
        print(f"quality guard: FP32 reference loaded from {local.model_dir} (max input length "
              f"{local.max_length} tokens)", file=sys.stderr, flush=True)
    except Exception as exc:  # in-process (tests): every sampled request counts a reference_error
        print(f"quality guard: the FP32 reference could not be loaded from {local.model_dir}: {exc!r}",
              file=sys.stderr, flush=True)
        if exit_on_failure:
            os._exit(3)


def serve(guard: Guard, host: str = "127.0.0.1", port: int = 0, *, exit_on_reference_failure: bool = False,
          sample_every: float = sample.WRITE_SECONDS) -> Running:
    """Start the HTTP server and the worker (and, configured so, the replay, the live sample's writer and the FP32
    reference's load) in background threads."""
    writer = None
    if guard.sample is not None:
        try:
            guard.sample.load()
        except OSError as exc:
            print(f"quality guard: the live sample at {guard.sample.settings.path} could not be read: {exc}",
                  file=sys.stderr, flush=True)
        guard.write_sample()
        writer = SampleWriter(guard, sample_every).start()
    worker = Worker(guard).start()
    server = intake.BoundedServer((host, port), intake.handler(worker, guard.mirror_token))
    t = threading.Thread(target=server.serve_forever, name="guard-http", daemon=True)
    t.start()
    cfg = guard.config
    if guard.local is not None:
        threading.Thread(target=_load_reference, args=(guard.local, exit_on_reference_failure),
                         name="guard-reference", daemon=True).start()
    replayer = None
    if cfg.replay and cfg.replay_per_second > 0:
        try:
            bodies = replay_bodies(cfg.replay, cfg.seed)
        except (OSError, ValueError, KeyError) as exc:  # e.g. an artifact published before it kept its pairs
            print(f"quality guard: no replay ({cfg.replay}: {exc}); checking mirrored requests only",
                  file=sys.stderr, flush=True)
            bodies = []
        if bodies:
            replayer = Replayer(worker, bodies, cfg.replay_per_second, cfg.seed).start()
    return Running(server, worker, t, replayer, writer)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="JSON file: namespace, model, pools {name: url}, reference, ...")
    source.add_argument("--config-env", help="the environment variable holding that JSON (how the operator "
                                             "passes it: builders/guard.py)")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8080)
    a = ap.parse_args(argv)
    if a.config_env:
        raw = os.environ.get(a.config_env)
        if not raw:
            ap.error(f"the environment variable {a.config_env} is not set")
        config = GuardConfig.from_json(raw)
    else:
        with open(a.config, encoding="utf-8") as f:
            config = GuardConfig.from_dict(json.load(f))
    running = serve(Guard(config), a.host, a.port, exit_on_reference_failure=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        stop.wait()
    running.stop()


if __name__ == "__main__":
    main()
