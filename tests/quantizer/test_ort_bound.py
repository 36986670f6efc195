"""The attention-wall bound of benchmarks/ort_profile.py: weight GEMMs at the kernels' ratio, the rest as profiled."""

from __future__ import annotations

import pytest

from benchmarks import ort_profile

pytestmark = pytest.mark.quantizer

FP32 = {"ms_per_batch_ops": 200.0, "weight_gemm_ms_per_batch": 150.0,
        "ops": {"MatMul": {"ms_per_batch": 170.0}, "Softmax": {"ms_per_batch": 30.0}}}


def test_weight_gemms_at_the_kernel_ratio_and_the_rest_as_profiled():
    int8 = {"ms_per_batch_ops": 100.0, "ops": {"DynamicQuantizeMatMul": {"ms_per_batch": 45.0},
                                               "MatMulIntegerToFloat": {"ms_per_batch": 15.0},
                                               "MultiHeadAttention": {"ms_per_batch": 32.0},
                                               "FastGelu": {"ms_per_batch": 8.0}}}
    b = ort_profile.bound(FP32, int8, gemm_ratio=3.0)
    assert b is not None
    assert (b["int8_gemm_ms"], b["int8_rest_ms"]) == (60.0, 40.0)
    assert b["ms_per_batch"] == 150.0 / 3.0 + 40.0          # 90 ms: the best these kernels allow
    assert b["x_fp32"] == round(200.0 / 90.0, 3) and b["achieved_x_fp32"] == 2.0
    assert b["of_bound"] == round(2.0 / (200.0 / 90.0), 3)


def test_qattention_cannot_be_split():
    int8 = {"ms_per_batch_ops": 100.0, "ops": {"QAttention": {"ms_per_batch": 50.0},
                                               "DynamicQuantizeMatMul": {"ms_per_batch": 50.0}}}
    assert ort_profile.bound(FP32, int8, gemm_ratio=3.0) is None
