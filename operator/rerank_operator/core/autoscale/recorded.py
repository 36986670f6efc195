"""The autoscaler's decision as ``status.autoscaling.lastDecision`` records it, and read back typed.

The status is the only channel between the two loops (``controllers/handoff.py``): the autoscaler writes its decision
there (``record.decision_status``), the reconcile loop reads it back with :meth:`RecordedDecision.from_status` for
the pools' replicas (``reconcile/plan.py``), the traffic split (``split.split``) and the route to the activator
(``zero.routing_to``). This module is the one place that spells the record's keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rerank_operator.core import names

POOLS: tuple[names.PoolName, ...] = ("gpu", "cpu")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RecordedDecision:
    """``status.autoscaling.lastDecision``. ``replicas``: only the pools whose replicas the operator manages;
    ``scale_to_zero``: the phase of a model that may go to zero (``zero.py``), None for the others."""

    time: str = ""
    reason: str = ""
    held: bool = False
    gpu_percent: int | None = None
    cpu_percent: int | None = None
    replicas: Mapping[names.PoolName, int] = field(default_factory=dict)
    scale_to_zero: str | None = None

    def to_status(self) -> dict[str, Any]:
        record: dict[str, Any] = {"time": self.time, "reason": self.reason, "held": self.held}
        if self.scale_to_zero is not None:
            record["scaleToZero"] = self.scale_to_zero
        for pool in POOLS:
            if pool in self.replicas:
                record[f"{pool}Replicas"] = self.replicas[pool]
        if self.gpu_percent is not None:
            record["gpuPercent"] = self.gpu_percent
        if self.cpu_percent is not None:
            record["cpuPercent"] = self.cpu_percent
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RecordedDecision:
        """A recorded decision; a key of the wrong type (a hand-edited status) reads as absent."""
        replicas = {pool: n for pool in POOLS if (n := _int(record.get(f"{pool}Replicas"))) is not None}
        zero = record.get("scaleToZero")
        return cls(time=str(record.get("time") or ""), reason=str(record.get("reason") or ""),
                   held=record.get("held") is True, gpu_percent=_int(record.get("gpuPercent")),
                   cpu_percent=_int(record.get("cpuPercent")), replicas=replicas,
                   scale_to_zero=zero if isinstance(zero, str) else None)

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> RecordedDecision | None:
        """The decision a model's status records, None when it records none."""
        record = (status.get("autoscaling") or {}).get("lastDecision")
        return cls.from_record(record) if isinstance(record, Mapping) else None
