"""Detect which INT8 instruction set the CPU offers, and the CPU budget the Job really has.

Pure functions over ``/proc/cpuinfo`` text and the machine name, so they can be tested on any host.
"""

from __future__ import annotations

import math
import os
import platform

from rerank_contracts import cpu_target

#: What each target means for ONNX Runtime's dynamic INT8 kernels (MLAS):
#: - avx512_vnni: u8 x s8 with VPDPBUSD, no saturation; full 8-bit range is safe.
#: - avx2: u8 x s8 via VPMADDUBSW saturates 16-bit intermediates; weights need reduce_range (7 bits).
#: - arm64: u8/s8 via SDOT/UDOT where present; no saturation issue.
TARGETS = cpu_target.TARGETS

REDUCE_RANGE_REQUIRED = {"avx512_vnni": False, "avx2": True, "arm64": False}


def saturation_hint(target: str, reduce_range: bool) -> str | None:
    """What to change when a recipe failed the quality gate on a target whose INT8 kernels saturate.

    ``recipe: fixed`` takes reduceRange exactly as given (default false), and on AVX2-only CPUs (many AMD EPYC
    and older Xeon nodes) full-range weights overflow VPMADDUBSW's 16-bit sums: the gate then fails for a reason
    that says nothing about the model. None where the target does not saturate or reduce_range is already on.
    """
    if reduce_range or not REDUCE_RANGE_REQUIRED.get(target, False):
        return None
    return (f"the {target} INT8 kernels (no VNNI) saturate with full-range weights: set "
            "spec.quantization.reduceRange: true (7-bit weights) or recipe: auto, which does")


parse_cpu_flags = cpu_target.cpu_flags


def detect_target(cpuinfo_text: str, machine: str) -> str:
    """Map CPU flags and ``platform.machine()`` to one of :data:`TARGETS`.

    x86 without AVX2 gets ``avx2`` too: MLAS then falls back to SSE kernels that have the same saturation
    problem, so the avx2 recipe (reduce_range) is the safe choice.
    """
    if cpu_target.is_arm(machine):
        return "arm64"
    if parse_cpu_flags(cpuinfo_text) & cpu_target.VNNI_FLAGS:
        # AVX-VNNI (Alder Lake and later, 256-bit) and AMX have the same non-saturating dot product.
        return "avx512_vnni"
    return "avx2"


#: The CPU flags that decide how INT8 runs (x86 ``flags``, arm ``Features`` spellings): what an artifact records of
#: the CPU it was chosen and timed on.
INT8_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512vnni", "avx_vnni", "amx_int8", "amx_bf16", "amx_tile",
              "asimddp", "i8mm", "sve")


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def detect_local_target() -> str:
    return detect_target(_cpuinfo(), platform.machine())


def describe_cpu(cpuinfo_text: str, machine: str) -> dict[str, object]:
    """What an artifact records of the CPU it was built on: the model name (x86 ``model name``; arm has none,
    its ``CPU part`` then), the machine, the target, and which of :data:`INT8_FLAGS` it has."""
    fields: dict[str, str] = {}
    for line in cpuinfo_text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    flags = parse_cpu_flags(cpuinfo_text)
    name = fields.get("model name") or (f"CPU part {fields['cpu part']}" if "cpu part" in fields else "unknown")
    return {"model": name, "machine": machine, "target": detect_target(cpuinfo_text, machine),
            "flags": sorted(f for f in INT8_FLAGS if f in flags)}


def describe_local_cpu() -> dict[str, object]:
    return describe_cpu(_cpuinfo(), platform.machine())


def parse_cgroup_cpu_max(text: str) -> float | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` line (``"200000 100000"`` -> 2.0; ``"max 100000"`` -> None)."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def cpu_budget() -> int:
    """Threads to use: the affinity mask, further limited by a cgroup CPU quota (what a pod limit sets)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota = parse_cgroup_cpu_max(f.read())
        if quota is not None:
            n = min(n, max(1, math.ceil(quota)))
    except OSError:
        pass
    return max(1, n)
