"""One guarded model's configuration: what the operator writes as JSON for the guard's process.

The operator renders it (``rerank_operator/core/builders/guard.py``) into an environment variable of the guard's
Deployment, and :mod:`.server` reads it back with :meth:`Config.from_dict`; a guard run by hand reads the same JSON
from a file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import compare, detector, reference, sample


@dataclass(frozen=True)
class Config:
    """One model: its pools (name -> base URL), the reference's base URL, the floor and the cost limits."""

    namespace: str
    model: str
    pools: Mapping[str, str]
    reference: str
    floor: detector.Floor = field(default_factory=detector.Floor)
    settings: detector.Settings = field(default_factory=detector.Settings)
    fraction: float = 0.05
    calls_per_second: float = 1.0
    k: int = compare.DEFAULT_K
    timeout_seconds: float = 10.0
    seed: int = 0
    #: Pools that start below the floor: the operator carries its last recorded verdict into a new guard pod, so a
    #: restarted guard does not hand traffic back to a pool that has not proven itself (the recovery window applies).
    below_floor: Sequence[str] = ()
    #: Endpoint (a pool's name, or "reference") -> the environment variable holding its TEI API key, if it has one.
    api_key_env: Mapping[str, str] = field(default_factory=dict)
    #: Without mirrored traffic (no Gateway): a JSONL of {"query", "text"} pairs (the artifact's evaluation set)
    #: replayed as requests, ``replay_per_second`` of them (still within the budget).
    replay: str | None = None
    replay_per_second: float = 0.0
    #: With ``reference`` = ``"local"`` (:data:`.reference.LOCAL`): the directory of the original weights (the
    #: artifact's ``original/``) whose FP32 scores this process computes as the reference (:mod:`.reference`).
    reference_model: str | None = None
    #: The checked pool's TEI ``--max-batch-tokens`` and ``--auto-truncate``: a local reference truncates (or refuses)
    #: a long pair as that pool does.
    reference_max_batch_tokens: int | None = None
    reference_auto_truncate: bool = True
    #: With the tenant's consent: where and how much of the mirrored traffic to keep (:mod:`.sample`).
    live_sample: sample.Settings | None = None
    #: The environment variable holding the token the model's route sets on what it mirrors (:mod:`.intake`): POSTs
    #: without it are dropped. None (a guard run by hand): every POST counts.
    mirror_token_env: str | None = None

    def __post_init__(self) -> None:
        if self.reference == reference.LOCAL and not self.reference_model:
            raise ValueError("a local reference needs reference_model: the directory of the original weights")

    @property
    def calls_per_sample(self) -> int:
        return len(self.pools) + 1

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Config:
        floor = detector.Floor(**d.get("floor", {}))
        settings = detector.Settings(**d.get("settings", {}))
        rest = {k: v for k, v in d.items() if k not in ("floor", "settings")}
        if "below_floor" in rest:
            rest["below_floor"] = tuple(rest["below_floor"])
        if rest.get("live_sample") is not None:
            rest["live_sample"] = sample.Settings.from_dict(rest["live_sample"])
        return cls(floor=floor, settings=settings, **rest)
