"""The command line: the flags, one run, and its JSON on stdout (the inputs, the result, the targets).
`python -m benchmarks.fleet --help` lists the flags; the package's docstring says what it measures."""

from __future__ import annotations

import argparse
import json
import os
import signal

from . import __doc__ as PACKAGE_DOC
from .benchmark import Benchmark
from .harness import git
from .report import targets


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=PACKAGE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=int, default=100)
    p.add_argument("--namespaces", type=int, default=0, help="default: models / 10 (at least 1)")
    p.add_argument("--metrics-source", choices=["direct", "prometheus"], default="direct")
    p.add_argument("--replicas", type=int, choices=[1, 2], default=1)
    p.add_argument("--interval", type=int, default=15, help="the models' autoscaling.intervalSeconds (min 5)")
    p.add_argument("--resync-seconds", type=float, default=None,
                   help="the operator's --resync-seconds (default: not passed, the operator's own default)")
    p.add_argument("--steady-window", type=float, default=60.0)
    p.add_argument("--settle-quiet", type=float, default=0.0,
                   help="seconds without an operator write = settled (default: two autoscaling intervals and 5 s, so "
                        "the quiet between a model's priming scrape and its first decision is not taken for rest)")
    p.add_argument("--settle-timeout", type=float, default=180.0)
    p.add_argument("--timeout", type=float, default=1200.0, help="for every model to become Ready")
    p.add_argument("--failover-timeout", type=float, default=90.0)
    p.add_argument("--apply-concurrency", type=int, default=8)
    p.add_argument("--finish-concurrency", type=int, default=8)
    p.add_argument("--operator-ref", default="",
                   help="run operator/ as committed at this git ref (git archive) instead of the working tree's")
    p.add_argument("--distinct-models", type=int, default=0,
                   help="shared artifacts: the models ask for this many distinct hub models, served from one store")
    p.add_argument("--late-models", type=int, default=50,
                   help="--distinct-models: tenants applied one at a time after the steady window "
                        "(ready_after_first_s)")
    p.add_argument("--late-interval", type=float, default=1.0, help="seconds between two late tenants")
    p.add_argument("--idle", action="store_true",
                   help="models that may go to zero and get no request: measure the fleet asleep (module docstring)")
    p.add_argument("--idle-seconds", type=int, default=30, help="--idle: autoscaling.idleSeconds (min 30)")
    p.add_argument("--idle-timeout", type=float, default=0.0,
                   help="--idle: for every model to be at zero (default: idleSeconds + drain + 2 intervals + 60 s + "
                        "the bring-up's time)")
    p.add_argument("--activator-hold", type=float, default=5.0,
                   help="--idle: the in-process activator's hold (kwok pods never answer: the held request's 503)")
    p.add_argument("--workdir", default="")
    p.add_argument("--keep-workdir", action="store_true")
    args = p.parse_args(argv)
    args.namespaces = args.namespaces or max(1, args.models // 10)
    args.settle_quiet = args.settle_quiet or 2 * args.interval + 5.0
    return args


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Ctrl-C and SIGTERM (also when started in the background, where SIGINT comes ignored) stop the cluster cleanly
    # and still print what was measured.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--", "operator"))
    bench = Benchmark(args)
    try:
        result = bench.run()
    except KeyboardInterrupt:
        result = bench.result
        result["interrupted"] = True
    inputs = {
        "models": args.models, "namespaces": args.namespaces, "metrics_source": args.metrics_source,
        "replicas": args.replicas, "autoscaling_interval_s": args.interval, "resync_seconds": args.resync_seconds,
        "steady_window_s": args.steady_window, "git_commit": commit,
        "idle": args.idle, "idle_seconds": args.idle_seconds if args.idle else None,
        "operator_commit": git("rev-parse", args.operator_ref) if args.operator_ref else commit,
        "operator": f"git archive {args.operator_ref}" if args.operator_ref
        else ("working tree, operator/ modified" if dirty else "working tree (clean)"),
        "cpus": os.cpu_count(),
    }
    out = {"inputs": inputs, **result, "targets": targets(result, args)}
    print(json.dumps(out, indent=2))
    return 0
