"""A real Prometheus server (Debian's ``prometheus`` package) for tests: started on a free port with a given
configuration, queried through its HTTP API, stopped.

- :class:`PrometheusServer`: ``prometheus.yml`` from a mapping (scrape jobs, ``rule_files``...) written into a work
  directory, the server on 127.0.0.1:<free port> with its TSDB there, ready when ``/-/ready`` answers; instant
  queries (:meth:`PrometheusServer.query`, every result type read as samples), label values, rules and targets.
- :func:`write_file_sd`: a ``file_sd_configs`` target file, replaced atomically so the server (which watches it)
  never reads half of one. Tests list pods there as the chart's PodMonitor would find them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rerank_devcluster.processes import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class PrometheusError(RuntimeError):
    """The server did not start, or answered a request with an error (the message carries Prometheus' own)."""


@dataclass(frozen=True)
class Sample:
    """One element of an instant query's result: its labels (empty for a scalar) and value."""

    labels: Mapping[str, str]
    value: float

    @property
    def is_number(self) -> bool:
        """False for NaN and infinities: what Grafana draws as a gap (e.g. a quantile over no requests)."""
        return math.isfinite(self.value)


@dataclass
class PrometheusServer:
    """``config``: prometheus.yml as a mapping. ``workdir`` holds the file, the TSDB and ``prometheus.log``."""

    workdir: Path
    config: Mapping[str, Any]
    binary: str = PROMETHEUS
    port: int = 0
    extra_args: Sequence[str] = ()
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "prometheus.log"

    @property
    def config_file(self) -> Path:
        return self.workdir / "prometheus.yml"

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        if not Path(self.binary).exists():
            raise PrometheusError(f"{self.binary} not found: apt-get install -y prometheus")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(yaml.safe_dump(dict(self.config), sort_keys=False))
        self.port = free_port()
        with self.log.open("ab") as log:  # the child keeps its own copy of the file
            self.process = subprocess.Popen(
                [self.binary, f"--config.file={self.config_file}", f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(timeout)
        except PrometheusError:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise PrometheusError(f"prometheus exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready after {timeout:g}s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def __enter__(self) -> PrometheusServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the HTTP API -------------------------------------------------------------------------------------------------

    def api(self, path: str, params: Mapping[str, str | Sequence[str]] | None = None, timeout: float = 10.0) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a success, else :class:`PrometheusError` with the server's error
        (a bad query answers 400 with ``errorType`` and ``error``)."""
        query = urllib.parse.urlencode(params or {}, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=timeout) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                raise PrometheusError(f"/api/v1/{path}: HTTP {exc.code}") from exc
        except OSError as exc:
            raise PrometheusError(f"/api/v1/{path}: {exc}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType', 'error')}: {body.get('error', body)}")
        return body.get("data")

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant query; a scalar reads as one sample without labels, a range vector as its last points."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self.api("query", params)
        kind, result = data["resultType"], data["result"]
        if kind == "scalar":
            return [Sample({}, float(result[1]))]
        if kind == "vector":
            return [Sample(r["metric"], float(r["value"][1])) for r in result]
        if kind == "matrix":
            return [Sample(r["metric"], float(r["values"][-1][1])) for r in result if r["values"]]
        raise PrometheusError(f"{expr}: a {kind} result ({result!r}), not samples")

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        """``/api/v1/label/<label>/values``, of the series ``match`` selects (Grafana's ``label_values``)."""
        values = self.api(f"label/{label}/values", {"match[]": [match]} if match else None)
        return [str(v) for v in values]

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self.api("rules")["groups"])

    def active_targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", {"state": "active"})["activeTargets"])


def write_file_sd(path: Path, groups: Sequence[Mapping[str, Any]]) -> None:
    """``[{"targets": ["host:port"], "labels": {...}}, ...]`` into ``path``, replaced atomically (write, rename)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(list(groups)))
    os.replace(partial, path)
