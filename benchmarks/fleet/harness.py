"""The operator under measurement and the benchmark's shared state: which operator source runs (the working tree or
a git ref), each operator replica read through its metrics port (leader, autoscaler rounds, activity), and the base
of the benchmark's phases (what the watches saw, the result so far, waiting, the current leader)."""

from __future__ import annotations

import argparse
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rerank_activator import server as activator_server
from rerank_devcluster import operator_process as op
from rerank_devcluster.cluster import Cluster
from rerank_devcluster.fake_tei import MetricsServer
from rerank_devcluster.registry import LocalRegistry

from .api import Api
from .prometheus import Prometheus
from .report import log
from .watches import Fleet, Key

REPO = Path(__file__).resolve().parents[2]
LEASE_NS, LEASE_NAME = op.OPERATOR_NS, "rerank-operator"


def git(*argv: str) -> str:
    try:
        return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def operator_source(ref: str, workdir: Path) -> Path:
    """``operator/`` as committed at ``ref`` (``git archive``: reads the repository, changes nothing)."""
    target = workdir / f"operator-{ref.replace('/', '_')}"
    with tempfile.TemporaryFile() as tar:
        subprocess.run(["git", "archive", "--format=tar", ref, "operator"], cwd=REPO, stdout=tar, check=True)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as archive:
            archive.extractall(target, filter="data")
    return target / "operator"


@dataclass
class Replica:
    process: op.OperatorProcess

    def metrics(self) -> dict[str, float]:
        try:
            return self.process.metrics()
        except OSError:
            return {}

    def leader(self) -> float | None:
        m = self.metrics()
        values = [v for k, v in m.items() if k.split("{")[0] == "rerank_operator_leader"]
        return max(values) if values else None

    def rounds(self) -> tuple[float, float, float]:
        """The autoscaler's rounds so far: (count, seconds in all, how many took 10 s or less)."""
        m = self.metrics()
        name = "rerank_operator_autoscaler_round_seconds"
        return (m.get(f"{name}_count", 0.0), m.get(f"{name}_sum", 0.0), m.get(f'{name}_bucket{{le="10.0"}}', 0.0))

    def activity(self) -> float:
        """Sum of the counters that move when the operator decides something (reconciles, autoscaler ticks)."""
        return sum(v for k, v in self.metrics().items()
                   if k.startswith("rerank_operator_") and (k.split("{")[0].endswith("_total")
                                                            or k.split("{")[0].endswith("_count"))
                   and any(w in k for w in ("reconcile", "autoscal", "tick", "scrape", "decision", "promql")))


class Harness:
    """The state every phase of the benchmark shares; the phases are its subclasses, the Benchmark all of them."""

    cluster: Cluster
    api: Api

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.fleet = Fleet()
        self.result: dict[str, Any] = {}
        self.replicas: list[Replica] = []
        self.prometheus: Prometheus | None = None
        self.tei_server: MetricsServer | None = None
        self.activator: activator_server.Running | None = None
        self.registry: LocalRegistry | None = None
        self.notes: list[str] = []
        self.keys: list[Key] = []
        self._last_progress = 0.0

    def _wait(self, check: Callable[[], bool], timeout: float, what: str, every: float = 0.5) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return True
            time.sleep(every)
        log(f"timed out after {timeout:.0f}s waiting for {what}")
        return False

    def leader(self) -> Replica:
        if len(self.replicas) == 1:
            return self.replicas[0]
        leaders = [r for r in self.replicas if (r.leader() or 0) >= 1]
        return leaders[0] if len(leaders) == 1 else self.replicas[0]
