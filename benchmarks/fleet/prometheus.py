"""--metrics-source prometheus: a real Prometheus server scraping every pool pod, and the PromQL queries it has
answered (what the steady state counts per signal and tick when the operator has no counter of its own)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from rerank_devcluster import operator_process as op
from rerank_devcluster.cluster import free_port

from .watches import Fleet

#: The autoscaler's per-pool signals read from Prometheus (rerank_operator.adapters.prometheus_api.queries).
PROMQL_SIGNALS = 9


class Prometheus:
    """Debian's ``prometheus`` scraping every pool pod (file_sd: the shared fake endpoint, with namespace and pod
    labels as a Kubernetes scrape config would set them)."""

    def __init__(self, workdir: Path, fleet: Fleet, target: str, scrape_interval: int) -> None:
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not Path(binary).exists():
            raise SystemExit("--metrics-source prometheus needs Debian's prometheus (hack/setup.sh installs it)")
        self.dir = workdir / "prometheus"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fleet, self.target = fleet, target
        self.targets_file = self.dir / "targets.json"
        self.targets_file.write_text("[]")
        (self.dir / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {scrape_interval}s\n  scrape_timeout: {min(10, scrape_interval)}s\n"
            f"scrape_configs:\n  - job_name: tei\n    file_sd_configs:\n"
            f"      - files: ['{self.targets_file}']\n        refresh_interval: 5s\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log_file = (self.dir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log_file, stderr=subprocess.STDOUT)
        self.stop_event = threading.Event()
        self.written = -1.0
        threading.Thread(target=self._sync, daemon=True).start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"prometheus did not become ready; see {self.dir / 'prometheus.log'}")

    def _sync(self) -> None:
        while not self.stop_event.wait(2.0):
            with self.fleet.lock:
                if self.fleet.pods_changed == self.written:
                    continue
                self.written = self.fleet.pods_changed
                pods = dict(self.fleet.pool_pods)
            groups = [{"targets": [self.target], "labels": {"namespace": ns, "pod": name, "pool": pool}}
                      for (ns, name), pool in sorted(pods.items())]
            tmp = self.targets_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(groups))
            tmp.rename(self.targets_file)

    def queries_total(self) -> float:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as resp:
            metrics = op.parse_exposition(resp.read().decode())
        return sum(v for k, v in metrics.items()
                   if k.startswith("prometheus_engine_query_duration_seconds_count") and 'slice="inner_eval"' in k)

    def stop(self) -> None:
        self.stop_event.set()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
