"""The traffic every controller in a comparison is replayed against: request rates per second by shape and seed.

Pure functions of (shape, seed), independent of the operator, so a trace can be rebuilt and looked at alone;
`diurnal_spikes` also gives the spike windows the attribution of violations needs."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np

# Diurnal seeds held out of any tuning and reported apart.
HELD_OUT = (9, 10, 11, 12)


def _noisy(base: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.maximum(0.0, base + rng.normal(0.0, 1.0, base.size) * np.sqrt(np.maximum(base, 0.0)))


def diurnal(hours: float, seed: int, low: float = 100, high: float = 450) -> np.ndarray:
    seconds = int(hours * 3600)
    t = np.arange(seconds)
    rates = low + (high - low) * (1 - np.cos(2 * np.pi * t / 86400.0)) / 2
    for a, b, height in diurnal_spikes(hours, seed):
        rates[a:b] += height
    return _noisy(rates, np.random.default_rng(seed))


def diurnal_spikes(hours: float, seed: int, spikes_per_day: float = 24, spike_low: float = 80,
                   spike_high: float = 300) -> list[tuple[int, int, float]]:
    """The spikes `diurnal` adds: (onset s, end s, extra rps), 2-10 min each, Poisson onsets (also the attribution's
    spike windows)."""
    rng = random.Random(seed)
    seconds = int(hours * 3600)
    spikes = []
    start = rng.expovariate(spikes_per_day / 86400)
    while start < seconds - 600:
        duration = rng.uniform(120, 600)
        spikes.append((int(start), int(start + duration), rng.uniform(spike_low, spike_high)))
        start += duration + rng.expovariate(spikes_per_day / 86400)
    return spikes


def ramp(hours: float = 6, low: float = 50, high: float = 650, seed: int = 1) -> np.ndarray:
    seconds = int(hours * 3600)
    t = np.arange(seconds) / seconds
    return _noisy(low + (high - low) * (1 - np.abs(2 * t - 1)), np.random.default_rng(seed))


def flat(hours: float = 6, level: float = 350, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    seconds = int(hours * 3600)
    drift = np.zeros(seconds)
    value = 0.0
    shocks = rng.normal(0.0, 1.0, seconds)
    for i in range(seconds):                  # AR(1), a ~10 min memory, about +-10%
        value = 0.9983 * value + 0.058 * shocks[i] * 0.1
        drift[i] = value
    return _noisy(level * (1 + drift), rng)


def square(period_min: float, hours: float = 4, low: float = 150, high: float = 550, seed: int = 1) -> np.ndarray:
    """Low and high halves of `period_min`, shifted by a per-seed random phase: edges on exact multiples of the
    half-period also fell on the 5 s policy ticks and the 15 s scrapes, which decided at every edge which
    controller saw it first (the same one each time), a property of the grid rather than of the controllers."""
    seconds = int(hours * 3600)
    half = int(period_min * 30)
    t = np.arange(seconds) + int(np.random.default_rng([seed, 2]).integers(0, 2 * half))
    rates = np.where((t // half) % 2 == 1, high, low).astype(float)
    return _noisy(rates, np.random.default_rng(seed))


def overload(hours: float = 3, low: float = 200, peak: float = 900, seed: int = 1) -> np.ndarray:
    """Ramp to more than all GPUs serve within the SLO, hold an hour, come back."""
    seconds = int(hours * 3600)
    t = np.arange(seconds) / 3600
    rates = np.interp(t, [0, 0.75, 1.0, 2.0, 2.25, hours], [low, low, peak, peak, low, low])
    return _noisy(rates, np.random.default_rng(seed))


# The other shapes by name; their seed changes only the noise (and the runs' random streams).
SHAPES: dict[str, Callable[[int], np.ndarray]] = {
    "ramp": lambda seed: ramp(seed=seed),
    "flat": lambda seed: flat(seed=seed),
    "square10": lambda seed: square(10, seed=seed),
    "square30": lambda seed: square(30, seed=seed),
    "overload": lambda seed: overload(seed=seed),
}


# Recorded traces: the last HELD_OUT_FRACTION of each is held out of any tuning and reported apart.
HELD_OUT_FRACTION = 0.3
# A recorded trace is scaled so that its busiest minute fills this share of the pools' combined capacity at the SLO.
PEAK_SHARE = 0.8


def recorded(path: Path) -> np.ndarray:
    """Per-second arrivals of a recorded request stream: a CSV with a header `t_s,requests`, one row per second from
    0, every second present (zeros included). A file not in that shape is refused with the line that breaks it:
    a trace silently shifted or thinned would be compared as if it were the real one."""
    lines = path.read_text().splitlines()
    if not lines or lines[0].strip().replace(" ", "") != "t_s,requests":
        raise ValueError(f"{path}: the first line must be the header 't_s,requests'")
    counts = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split(",")
        try:
            second, requests = int(fields[0]), float(fields[1])
        except (ValueError, IndexError):
            raise ValueError(f"{path}:{number}: expected 'seconds,requests', got {line!r}") from None
        if second != len(counts):
            raise ValueError(f"{path}:{number}: second {second} where {len(counts)} was expected "
                             "(one row per second from 0, none missing)")
        if not math.isfinite(requests) or requests < 0:
            raise ValueError(f"{path}:{number}: requests must be a finite count >= 0, got {fields[1]!r}")
        counts.append(requests)
    if not counts:
        raise ValueError(f"{path}: no rows")
    return np.array(counts, dtype=float)


def busiest_minute(rates: np.ndarray) -> float:
    """The highest mean rate over any 60 consecutive seconds (the whole trace's mean if it is shorter)."""
    if rates.size <= 60:
        return float(rates.mean())
    sums = np.cumsum(np.concatenate([[0.0], rates]))
    return float((sums[60:] - sums[:-60]).max() / 60)


def scaled(rates: np.ndarray, busiest_rps: float) -> np.ndarray:
    """The trace with every second multiplied alike, so that its busiest minute averages `busiest_rps`. Scaling
    keeps the trace's shape, its bursts and lulls, and makes each recorded request stand for several."""
    peak = busiest_minute(rates)
    if peak <= 0:
        raise ValueError("a trace without any request cannot be scaled")
    return rates * (busiest_rps / peak)


def held_out_from(seconds: int) -> int:
    """The first second of a recorded trace's held-out part."""
    return round(seconds * (1 - HELD_OUT_FRACTION))
