"""Which CPUs an INT8 artifact may be served on (rerank_contracts/cpu_target.py), and the pool's check before TEI
starts (``rerank-fetch-artifact --check-cpu``): its exit code and the one-line reason the operator reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rerank_contracts import cpu_target, shared_store

SAPPHIRE_RAPIDS = "processor\t: 0\nmodel name\t: Intel Xeon 8480+\nflags\t\t: fpu avx2 avx512f avx512_vnni amx_int8\n"
ALDER_LAKE = "flags\t\t: sse2 avx avx2 avx_vnni\n"
EPYC_ROME = "processor\t: 0\nmodel name\t: AMD EPYC 7R32\nflags\t\t: fpu sse2 avx avx2 fma\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd asimddp i8mm\n"


@pytest.mark.parametrize(("target", "reduce_range", "cpuinfo", "machine", "refused"), [
    ("avx512_vnni", False, SAPPHIRE_RAPIDS, "x86_64", None),
    ("avx512_vnni", False, ALDER_LAKE, "x86_64", None),
    ("avx512_vnni", False, EPYC_ROME, "x86_64", "saturate"),  # full range on AVX2: the silent degradation
    ("avx512_vnni", True, EPYC_ROME, "x86_64", None),  # 7-bit weights run anywhere on x86
    ("avx2", True, SAPPHIRE_RAPIDS, "x86_64", None),
    ("avx2", True, GRAVITON, "aarch64", "x86"),
    ("arm64", False, GRAVITON, "aarch64", None),
    ("arm64", False, EPYC_ROME, "x86_64", "arm64"),
])
def test_a_node_may_serve_an_artifact_only_where_its_int8_kernels_are_right(
        target: str, reduce_range: bool, cpuinfo: str, machine: str, refused: str | None) -> None:
    why = cpu_target.mismatch(target, reduce_range, cpuinfo, machine)
    assert (why is None) == (refused is None), why
    if refused is not None:
        assert why is not None and refused in why and ("node" in why or "nodes" in why)
    assert cpu_target.needs_check(target, reduce_range) == ((target == "avx512_vnni" and not reduce_range)
                                                           or target == "arm64")


def test_the_pools_check_refuses_with_a_reason_naming_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    cpuinfo, log = tmp_path / "cpuinfo", tmp_path / "termination-log"
    cpuinfo.write_text(EPYC_ROME)
    monkeypatch.setenv("NODE_NAME", "cpu-avx2-7")
    code = shared_store.main(["--check-cpu", "avx512_vnni", "--cpuinfo", str(cpuinfo), "--machine", "x86_64",
                              "--termination-log", str(log)])
    said = json.loads(log.read_text())
    assert code == shared_store.EXIT_CODES["ArtifactTargetMismatch"] == 23
    assert said["reason"] == "ArtifactTargetMismatch"
    assert said["message"].startswith("node cpu-avx2-7: ") and "VNNI" in said["message"]
    cpuinfo.write_text(SAPPHIRE_RAPIDS)
    assert shared_store.main(["--check-cpu", "avx512_vnni", "--cpuinfo", str(cpuinfo), "--machine", "x86_64",
                              "--termination-log", str(log)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"event": "cpu checked", "target": "avx512_vnni"}
    with pytest.raises(SystemExit):  # neither a check nor a whole fetch
        shared_store.main(["--ref", "r@sha256:" + "0" * 64])
