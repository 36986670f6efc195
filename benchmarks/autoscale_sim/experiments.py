"""What one comparison runs on one variant of the world: the policy as the CRD configures it (`policy_spec`), its
ablations (`ABLATIONS`: each part switched off, the earlier defaults), every baseline over its sweep and, if asked,
the bounds (`runs_for`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rerank_operator.core.autoscale import split as routing
from rerank_operator.core.autoscale.config import AutoscalingSpec

from .controllers import BASELINES, BOUNDS, make_baseline, policy_controller
from .observation import BASELINE_LAG_S, RATE_WINDOW_S, SCRAPE_S
from .simulation import RunSpec
from .world import PoolModel, Realism


def policy_spec(gpu: PoolModel, cpu: PoolModel, extra: dict[str, Any] | None = None) -> AutoscalingSpec:
    return AutoscalingSpec.from_spec({
        "pools": {"gpu": {"minReplicas": gpu.min_replicas, "maxReplicas": gpu.max_replicas},
                  "cpu": {"minReplicas": cpu.min_replicas, "maxReplicas": cpu.max_replicas}},
        "routing": {"policy": "gpu-first"},
        "autoscaling": extra or {},
    })


def runs_for(variant: str, realism: Realism, gpu: PoolModel, cpu: PoolModel, slo: float, spec: AutoscalingSpec,
             sweep: bool, ablations: dict[str, tuple[AutoscalingSpec, routing.Tuning]],
             baselines: Sequence[str], bounds: bool = False, *, baseline_period: int = SCRAPE_S,
             baseline_lag: int = BASELINE_LAG_S, rate_window: int = RATE_WINDOW_S) -> list[RunSpec]:
    """``baseline_period``, ``baseline_lag`` and ``rate_window``: the baselines' scrape and sync period, their sync's
    offset after each scrape and their rate() range (production defaults: 15 s, 8 s, 1 min; the policy's own
    cadence: its interval, 0 s, and a short window)."""
    cadence = {"period": baseline_period, "phase": baseline_lag, "rate_window": rate_window}
    runs = [RunSpec(f"{variant}|policy", lambda: policy_controller(spec), realism,
                    period=int(spec.interval_seconds), histogram=True)]
    runs += [RunSpec(f"{variant}|ablation:{name}", (lambda s=s, t=t: policy_controller(s, t)), realism,
                     period=int(s.interval_seconds), histogram=True)
             for name, (s, t) in ablations.items()]
    runs.append(RunSpec(f"{variant}|hpa_util@0.7", make_baseline("hpa_util", gpu, cpu, slo, 0.7), realism,
                        **cadence))
    for name, tuning in BASELINES.items():
        if name not in baselines:
            continue
        factors = tuning["sweep"] if sweep else (tuning["f"],)
        factors = sorted(set(factors) | {tuning["f"]})
        for f in factors:
            runs.append(RunSpec(f"{variant}|{name}@{f}", make_baseline(name, gpu, cpu, slo, f), realism,
                                **cadence))
    if bounds:
        for name, tuning in BOUNDS.items():
            for f in sorted(set(tuning["sweep"]) | {tuning["f"]}):
                runs.append(RunSpec(f"{variant}|{name}@{f}", make_baseline(name, gpu, cpu, slo, f), realism,
                                    period=1))
    return runs


# The ablation: each part of the policy switched off alone (routing.Tuning), and the CRD defaults undone: the 15 s
# interval alone, and the defaults before issue 12 (15 s, scaleUp maxStep 2 with a 15 s cooldown).
ABLATIONS: dict[str, dict[str, Any]] = {
    "no_exact_spill": {"tuning": {"exact_spill": False}},
    "no_drain": {"tuning": {"drain": False}},
    "no_damping": {"tuning": {"damping": False}},
    "no_surge": {"tuning": {"surge": False}},
    "no_probe": {"tuning": {"probe": False}},
    "no_bridge_drain": {"tuning": {"bridge_drain": False}},
    "no_drain_room": {"tuning": {"drain_room": False}},
    "no_backoff": {"tuning": {"backoff": False}},
    "no_reserve": {"tuning": {"reserve": False}},
    "no_noise_bridge": {"tuning": {"noise_bridge": False}},
    "no_brief_bursts": {"tuning": {"brief_bursts": False}},
    "no_noise_reserve": {"tuning": {"noise_reserve": False}},
    "interval_15s": {"intervalSeconds": 15},
    "old_defaults": {"intervalSeconds": 15, "scaleUp": {"maxStep": 2, "cooldownSeconds": 15}},
}
