"""A real node left behind by a killed run (its teardown never ran) is removed by the next run, mounts and all;
a node that a process still uses, or one that is starting up, is not (a CI failure: leftover nodes filled the
disk and the kubelet evicted the next run's pods for DiskPressure)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rerank_devcluster import realnode

pytestmark = pytest.mark.node  # mounts a tmpfs: needs root, as the real node does


def _aged(path: Path, seconds: float) -> Path:
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


@pytest.fixture
def user_of(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line names ``rerank-node-live``, as containerd's ``--config`` does."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "--config", str(tmp_path / "rerank-node-live" / "containerd.toml")])
    yield proc
    proc.kill()
    proc.wait()


def test_abandoned_nodes_go_with_their_mounts_and_used_or_young_ones_stay(
        tmp_path: Path, user_of: subprocess.Popen[bytes]) -> None:
    abandoned = tmp_path / "rerank-node-dead01"
    pinned = abandoned / "containerd" / "state" / "rootfs"
    pinned.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(pinned)], check=True)
    (pinned / "layer").write_bytes(b"x" * 1024)
    _aged(abandoned, 3600)
    live = tmp_path / "rerank-node-live"
    live.mkdir()
    _aged(live, 3600)
    young = tmp_path / "rerank-node-young"
    young.mkdir()
    (tmp_path / "other-dir").mkdir()
    unrelated = _aged(tmp_path / "other-dir", 3600)

    reaped = realnode.reap_abandoned(tmp_path, min_age_s=600)

    assert reaped == [abandoned]
    assert not abandoned.exists()
    assert str(pinned) not in Path("/proc/self/mountinfo").read_text()
    assert live.is_dir() and young.is_dir() and unrelated.is_dir()
