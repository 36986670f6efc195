"""The dev cluster's child processes: started in one place, awaited while they run, stopped in reverse order.

Every component (etcd, the control plane, kwok, and a real node's containerd and kubelet) is a plain local
process in its own session, logging stdout and stderr to ``<logs>/<name>.log``. Waiting on a condition also
watches these processes: a component that exits fails the wait at once with its name and exit code, instead of
the wait running out its timeout.
"""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rerank_devcluster.waiting import eventually

#: the lowest port a listener of ours takes: below it, well-known and registered services
LOWEST_PORT = 10000
_handed_out: set[int] = set()


def ephemeral_floor(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The lowest port the kernel gives outgoing connections (32768 by default)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port nothing listens on now, below the kernel's ephemeral range. Not the kernel's own pick: that comes
    from the range outgoing connections draw their source ports from, and on a busy machine (a second dev cluster,
    the operator's pods) a connection took a port between this call and the listener's bind ("address already in
    use", seen in CI). Ports below the range are only ever taken by listeners."""
    top = ephemeral_floor()
    for _ in range(200):
        port = random.randrange(LOWEST_PORT, top)
        if port in _handed_out:
            continue
        try:
            for host in ("127.0.0.1", "0.0.0.0"):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((host, port))
        except OSError:
            continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free TCP port found between {LOWEST_PORT} and {top}")


@dataclass
class Processes:
    """Running children by name, in start order. ``error`` is what a failed wait raises (the owner's error type)."""

    logs_dir: Path
    cwd: Path
    error: Callable[[str], BaseException] = RuntimeError
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def spawn(self, name: str, argv: list[str]) -> None:
        """Start ``argv`` in its own session: a terminal's Ctrl-C reaches only us; :meth:`stop` ends it in order."""
        log = open(self.logs_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child process holds it open
        self.running[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                              start_new_session=True)

    def wait_for(self, check: Callable[[], Any], deadline: float, what: str) -> None:
        """Poll ``check`` until it holds or ``deadline`` (``time.monotonic()``) passes; fail early if a child exits."""

        def alive_and_done() -> Any:
            for name, proc in self.running.items():
                if proc.poll() is not None:
                    log = self.logs_dir / f"{name}.log"
                    tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
                    raise self.error(f"{name} exited with {proc.returncode} while waiting for {what}; its log ends:\n"
                                     + "\n".join(tail))
            return check()

        eventually(alive_and_done, max(0.0, deadline - time.monotonic()), what, error=self.error)

    def stop(self, name: str, timeout: float = 20) -> None:
        """Stop one child now (SIGTERM, then SIGKILL after ``timeout``); nothing if it never started."""
        proc = self.running.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def stop_all(self, timeout: float = 15) -> None:
        """SIGTERM every child at once, newest first, then wait for each (SIGKILL after ``timeout``)."""
        for proc in reversed(list(self.running.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(list(self.running.values())):
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.running.clear()
