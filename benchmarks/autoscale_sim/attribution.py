"""Why a violation-second happened: one cause per second and per run, so that a comparison can tell the part of a
controller's violations that reacting could have changed from the part no reaction could (issue 12's targets are
judged on that). Apart from the simulation loop because the summaries and the targets read the causes too."""

from __future__ import annotations

from .observation import SCRAPE_S
from .world import PoolModel, Realism

CAUSES = ("cold_start", "spike_onset", "spike_bridge", "spike_late", "stale_scrape", "scale_down", "ramp_or_noise")
SCALE_DOWN_BLAME_S = 120   # a violation this soon after capacity was removed is blamed on the removal
SPIKE_TAIL_S = 60          # a spike's backlog is its own for this long after it ends


def attribute(now: int, since_onset: int, realism: Realism, gpu: PoolModel, stale: bool, since_reduce: float) -> str:
    """Why a second violated the SLO, first match wins:
    - cold_start: before a GPU pod asked for at the first scrape is surely ready (every trace starts at the pools'
      minimum size, whatever the traffic);
    - spike_onset: within a spike, before any pod started at its onset could be ready (CPU start-up + actuation
      delay): only capacity that was already ready, or spilled to at once, could have served it;
    - spike_bridge: later, before a GPU pod started at the onset could be ready (only the CPU bridge helps);
    - spike_late: later still in the spike (or its backlog, SPIKE_TAIL_S after it);
    - stale_scrape: outside spikes, the controller's latest tick saw a failed scrape (the policy holds);
    - scale_down: outside spikes, capacity (replicas or the CPU share) was removed in the last SCALE_DOWN_BLAME_S;
    - ramp_or_noise: the rest, the diurnal ramps and the noise on them."""
    if now < SCRAPE_S + realism.delay_s + gpu.startup * (1 + realism.jitter):
        return "cold_start"
    if since_onset >= 0:
        if since_onset < realism.cpu_startup_s + realism.delay_s:
            return "spike_onset"
        return "spike_bridge" if since_onset < gpu.startup + realism.delay_s else "spike_late"
    if stale:
        return "stale_scrape"
    return "scale_down" if since_reduce <= SCALE_DOWN_BLAME_S else "ramp_or_noise"
