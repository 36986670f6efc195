"""The dev cluster's listeners take ports outside the range outgoing connections draw from (a CI failure: a
connection's source port took a port between free_port() and the controller-manager's bind)."""

from __future__ import annotations

import socket
from pathlib import Path

from rerank_devcluster import processes


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    floor = processes.ephemeral_floor()
    ports = [processes.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(processes.LOWEST_PORT <= p < floor for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))


def test_the_ephemeral_floor_is_read_from_the_kernel_and_defaults_when_unreadable(tmp_path: Path) -> None:
    (tmp_path / "range").write_text("40000\t60999\n")
    assert processes.ephemeral_floor(tmp_path / "range") == 40000
    assert processes.ephemeral_floor(tmp_path / "missing") == 32768
