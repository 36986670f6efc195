"""Which CPUs an INT8 artifact runs well on: the contract between the quantization Job, which records the target it
chose for the CPU it ran on (``recipe.target``, ``recipe.reduce_range``), and a CPU pool's pods, which check their
node before TEI starts (``rerank-fetch-artifact --check-cpu``). Stdlib only.

ONNX Runtime's dynamic INT8 kernels (MLAS) multiply u8 activations by s8 weights. With VNNI (AVX512-VNNI, AVX-VNNI,
AMX) the dot products accumulate in 32 bits; without it (AVX2 and older x86) VPMADDUBSW sums pairs into 16 bits and
saturates unless the weights are 7-bit (``reduce_range``). So an artifact built on a VNNI CPU with full-range weights
ranks worse, silently, on an AVX2 node; one built with 7-bit weights runs anywhere on x86. ARM64 and x86 artifacts
are not exchanged either way: the recipe and the measured speed are the other architecture's.
"""

from __future__ import annotations

#: The targets the Job builds for.
TARGETS = ("avx512_vnni", "avx2", "arm64")
#: Any one of these gives MLAS its non-saturating u8 x s8 dot product.
VNNI_FLAGS = frozenset({"avx512_vnni", "avx512vnni", "avx_vnni", "amx_int8"})


def cpu_flags(cpuinfo_text: str) -> set[str]:
    """The feature flags of the first CPU in ``/proc/cpuinfo`` (x86 ``flags`` or arm ``Features``)."""
    for line in cpuinfo_text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return set(value.split())
    return set()


def is_arm(machine: str) -> bool:
    m = machine.lower()
    return m in ("aarch64", "arm64") or m.startswith("arm")


def needs_check(target: str, reduce_range: bool) -> bool:
    """Whether an artifact of ``target`` can be served wrongly somewhere: full-range VNNI weights, or ARM64."""
    return (target == "avx512_vnni" and not reduce_range) or target == "arm64"


def mismatch(target: str, reduce_range: bool, cpuinfo_text: str, machine: str) -> str | None:
    """Why a node (its ``/proc/cpuinfo`` and machine) must not serve an artifact built for ``target`` (None: it
    may), saying what to change."""
    if target == "arm64" and not is_arm(machine):
        return (f"the artifact was built for arm64 and this node is {machine}: place the class's CPU pool on arm64 "
                "nodes, or build on this node pool")
    if target != "arm64" and is_arm(machine):
        return (f"the artifact was built for {target} (x86) and this node is {machine}: place the class's CPU pool "
                "on x86 nodes, or build on this node pool")
    if target == "avx512_vnni" and not reduce_range and not (cpu_flags(cpuinfo_text) & VNNI_FLAGS):
        return ("the artifact was built for avx512_vnni with full-range INT8 weights, which saturate on a CPU "
                "without VNNI (this one has none of avx512_vnni, avx_vnni, amx_int8): select VNNI nodes for the "
                "class's CPU pool (or Node Feature Discovery's feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI), or "
                "build on this node pool so the Job chooses 7-bit weights")
    return None
