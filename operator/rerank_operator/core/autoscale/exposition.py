"""Prometheus text exposition (version 0.0.4) parsing and PromQL-compatible histogram arithmetic.

A small parser of our own rather than prometheus_client's: the direct source must read TEI's un-suffixed
counters (`te_request_count`, no `_total`) exactly as written, and we only need flat samples. Quantiles follow
PromQL's `histogram_quantile` (linear interpolation inside the bucket, the +Inf bucket answered by the highest
finite bound) so the direct and the Prometheus sources agree on the same data.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^(?P<name>{_NAME})\s*(?:\{{(?P<labels>.*)\}})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class ExpositionError(ValueError):
    """The body is not Prometheus text format (e.g. an HTML error page)."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    """All samples in an exposition body; comments and TYPE/HELP lines are skipped."""
    samples = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ExpositionError(f"line {number} is not a sample: {line[:80]!r}")
        samples.append(Sample(match["name"], _parse_labels(match["labels"] or "", number), _parse_value(
            match["value"], number)))
    return samples


def _parse_labels(body: str, number: int) -> dict[str, str]:
    labels: dict[str, str] = {}
    position = 0
    body = body.strip()
    while position < len(body):
        match = _LABEL.match(body, position)
        if match is None:
            raise ExpositionError(f"line {number}: bad labels {body!r}")
        labels[match[1]] = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m[0]], match[2])
        position = match.end()
    return labels


def _parse_value(raw: str, number: int) -> float:
    try:
        return float(raw)  # accepts NaN, +Inf, -Inf as Prometheus writes them
    except ValueError as exc:
        raise ExpositionError(f"line {number}: bad value {raw!r}") from exc


def total(samples: Iterable[Sample], name: str) -> float | None:
    """Sum of a counter or gauge over all its label sets; None when the metric is absent."""
    values = [s.value for s in samples if s.name == name and not math.isnan(s.value)]
    return sum(values) if values else None


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets (upper bound -> count, including +Inf), plus count and sum."""

    buckets: Mapping[float, float]
    count: float
    sum: float

    @classmethod
    def empty(cls) -> Histogram:
        return cls({}, 0.0, 0.0)

    def __add__(self, other: Histogram) -> Histogram:
        bounds = set(self.buckets) | set(other.buckets)
        merged = {b: self.buckets.get(b, 0.0) + other.buckets.get(b, 0.0) for b in bounds}
        return Histogram(merged, self.count + other.count, self.sum + other.sum)

    def since(self, earlier: Histogram) -> Histogram:
        """Observations made after `earlier` (like PromQL's increase()).

        A drop in the count means the process restarted and its counters began again from zero; like
        Prometheus, take the later values as the whole increase.
        """
        if self.count < earlier.count:
            return self
        buckets = {b: max(v - earlier.buckets.get(b, 0.0), 0.0) for b, v in self.buckets.items()}
        return Histogram(buckets, self.count - earlier.count, max(self.sum - earlier.sum, 0.0))


def histogram(samples: Iterable[Sample], name: str) -> Histogram | None:
    """The histogram `name` summed over all label sets except `le`; None when absent."""
    buckets: dict[float, float] = {}
    count = summed = 0.0
    found = False
    for sample in samples:
        if sample.name == f"{name}_bucket" and "le" in sample.labels:
            bound = float(sample.labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
            found = True
        elif sample.name == f"{name}_count":
            count += sample.value
            found = True
        elif sample.name == f"{name}_sum":
            summed += sample.value
    return Histogram(buckets, count, summed) if found else None


def _monotonic(hist: Histogram) -> tuple[list[float], list[float]]:
    """Bounds in order and their cumulative counts made monotonic (a scrape racing with an observation can see a
    bucket behind the one below it), as Prometheus does before interpolating."""
    bounds = sorted(hist.buckets)
    counts, running = [], 0.0
    for bound in bounds:
        running = max(running, hist.buckets[bound])
        counts.append(running)
    return bounds, counts


def quantile(q: float, hist: Histogram) -> float | None:
    """PromQL histogram_quantile(q, ...) over cumulative buckets; None where PromQL gives NaN.

    NaN cases: no observations, fewer than two buckets, or no +Inf bucket. Buckets that are not monotonic (a
    scrape racing with an observation) are made monotonic first, as Prometheus does.
    """
    if not 0 <= q <= 1 or math.inf not in hist.buckets or len(hist.buckets) < 2:
        return None
    bounds, counts = _monotonic(hist)
    observations = counts[-1]
    if observations <= 0:
        return None
    rank = q * observations
    index = next(i for i, c in enumerate(counts) if c >= rank)
    if index == len(bounds) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0 if index == 0 else bounds[index - 1]
    below = 0.0 if index == 0 else counts[index - 1]
    in_bucket = counts[index] - below
    if in_bucket <= 0:
        return bounds[index]
    return start + (bounds[index] - start) * (rank - below) / in_bucket


def fraction_above(bound: float, hist: Histogram) -> float | None:
    """Share of the observations above ``bound`` (seconds), interpolating linearly inside the bucket that holds it,
    the inverse of :func:`quantile` (``fraction_above(quantile(q, h), h) == 1 - q`` within a bucket); None without
    observations. What the SLO counts as slow: a request past its pool's p95 target. Above the highest finite
    bound everything in the +Inf bucket counts as slow (PromQL cannot place those observations either)."""
    if math.inf not in hist.buckets:
        return None
    bounds, counts = _monotonic(hist)
    observations = counts[-1]
    if observations <= 0:
        return None
    below = 0.0
    start, under = 0.0, 0.0
    for b, c in zip(bounds, counts, strict=True):
        if bound < b:
            if b == math.inf:
                below = under
            else:
                width = b - start
                below = under + ((c - under) * (bound - start) / width if width > 0 else 0.0)
            break
        start, under = b, c
    else:
        below = observations
    return min(max(1.0 - below / observations, 0.0), 1.0)
