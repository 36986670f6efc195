"""The contract between the operator, a model's quality guard and what copies live requests to it.

The operator has the model's route (or, on a gateway without RequestMirror, the sampler beside TEI in each pool pod)
set :data:`MIRROR_TOKEN_HEADER` to the model's mirror token on the copies sent to the quality guard; the guard counts
only requests carrying it (``quality_guard/intake.py``). The guard's whole configuration is :class:`GuardConfig`,
written by the operator as JSON and read back by the guard: neither side spells a key anywhere else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .quantize_job import DEFAULT_MIN_SPEARMAN, DEFAULT_MIN_TOPK_AGREEMENT

#: The header a model's HTTPRoute sets to its mirror token on what it routes, and so on the copies it mirrors to the
#: quality guard, which counts only requests carrying it.
MIRROR_TOKEN_HEADER = "X-Rerank-Mirror-Token"

#: The environment variable holding the model's mirror token, in the guard's container (which checks it) and in the
#: sampler's (which sets it on its copies).
MIRROR_TOKEN_ENV = "RERANK_GUARD_MIRROR_TOKEN"
#: The sampler (``rerank_sampler``, beside TEI in each serving pod of a guarded model): the port the model's Service
#: sends to (every request proxied to TEI on the pod's loopback), the port of its own /metrics (TEI's /metrics is
#: proxied like every other path), and the one path it answers itself, for the kubelet's probes.
#: Not the guard's own port (8081): one NetworkPolicy selects the pools and the guard, and opens the TEI and
#: sampler ports to the routing layer and the model's namespace, never the guard's.
SAMPLER_PORT = 8082
SAMPLER_METRICS_PORT = 9091
SAMPLER_HEALTH_PATH = "/sampler/healthz"

# -- the guard's configuration: what the operator writes, what the guard reads ----------------------------------------

#: The environment variable of the guard's container holding its configuration (:meth:`GuardConfig.to_json`).
CONFIG_ENV = "RERANK_GUARD_CONFIG"
#: ``GuardConfig.reference`` for "score FP32 in the guard itself", from ``reference_model``'s original weights.
LOCAL_REFERENCE = "local"
#: How many of the reference's top documents a pool must keep (the quality gate's top-k).
DEFAULT_TOPK = 3


@dataclass(frozen=True)
class Floor:
    """The quality floor: the model's quality gate, the one its artifact passed (the Job's defaults unless the model
    or its class sets one)."""

    min_spearman: float = DEFAULT_MIN_SPEARMAN
    min_topk_agreement: float = DEFAULT_MIN_TOPK_AGREEMENT


@dataclass(frozen=True)
class LiveSampleSettings:
    """With the tenant's consent: where the guard keeps the live requests it receives, and how many, how long."""

    path: str
    max_pairs: int
    max_age_seconds: float

    def __post_init__(self) -> None:
        if self.max_pairs < 1 or self.max_age_seconds <= 0:
            raise ValueError(f"a live sample needs max_pairs >= 1 and max_age_seconds > 0, got {self}")


@dataclass(frozen=True)
class GuardConfig:
    """One guarded model: its pools (name -> base URL), the reference's base URL (or :data:`LOCAL_REFERENCE`), the
    floor and the cost limits. The operator builds it (``core/builders/guard.py``) into :data:`CONFIG_ENV` of the
    guard's Deployment; the guard reads it back (``quality_guard/server.py``); a guard run by hand reads the same JSON
    from a file."""

    namespace: str
    model: str
    pools: Mapping[str, str]
    reference: str
    floor: Floor = field(default_factory=Floor)
    k: int = DEFAULT_TOPK
    #: The share of the copies the guard checks (the mirror or the sampler already took ``sampleFraction``: 1.0).
    fraction: float = 0.05
    calls_per_second: float = 1.0
    timeout_seconds: float = 10.0
    seed: int = 0
    #: Pools that start below the floor: the operator carries its last recorded verdict into a new guard pod, so a
    #: restarted guard does not hand traffic back to a pool that has not proven itself (the recovery window applies).
    below_floor: tuple[str, ...] = ()
    #: Endpoint (a pool's name, or "reference") -> the environment variable holding its TEI API key, if it has one.
    api_key_env: Mapping[str, str] = field(default_factory=dict)
    #: Without live traffic (no Gateway): a JSONL of {"query", "text"} pairs (the artifact's evaluation set) replayed
    #: as requests, ``replay_per_second`` of them (still within the budget).
    replay: str | None = None
    replay_per_second: float = 0.0
    #: With ``reference`` = :data:`LOCAL_REFERENCE`: the directory of the original weights (the artifact's
    #: ``original/``) whose FP32 scores the guard computes itself.
    reference_model: str | None = None
    #: The checked pool's TEI ``--max-batch-tokens`` and ``--auto-truncate``: a local reference truncates (or refuses)
    #: a long pair as that pool does.
    reference_max_batch_tokens: int | None = None
    reference_auto_truncate: bool = True
    live_sample: LiveSampleSettings | None = None
    #: The environment variable holding the token the model's route (or its pools' samplers) set on what they copy:
    #: POSTs without it are dropped. None: every POST is dropped, unless ``accept_unsigned``.
    mirror_token_env: str | None = None
    #: Count POSTs that carry no token (only with no ``mirror_token_env``): a guard run by hand, on a trusted network,
    #: says so; the operator never does.
    accept_unsigned: bool = False
    #: The guard's own evidence settings (window sizes, thresholds: ``quality_guard.detector.Settings``) where a test
    #: or a person running it by hand overrides them; the operator writes none.
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reference == LOCAL_REFERENCE and not self.reference_model:
            raise ValueError("a local reference needs reference_model: the directory of the original weights")

    @property
    def calls_per_sample(self) -> int:
        return len(self.pools) + 1

    def to_json(self) -> str:
        """Compact, key-sorted JSON: the same configuration is the same environment (no needless rollout)."""
        data = asdict(self)
        data["below_floor"] = list(self.below_floor)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> GuardConfig:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GuardConfig:
        """ValueError (or TypeError) naming what is wrong with a configuration this version cannot read."""
        rest = {k: v for k, v in data.items() if k not in ("floor", "live_sample", "below_floor")}
        sample = data.get("live_sample")
        return cls(floor=Floor(**(data.get("floor") or {})), below_floor=tuple(data.get("below_floor") or ()),
                   live_sample=LiveSampleSettings(**sample) if sample is not None else None, **rest)
