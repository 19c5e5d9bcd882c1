"""CPU: what the companion's FP8 form compiles to (rms_norm_fused_cutedsl.py; the lesson has none).
Every conversion to FP8 is the hardware's saturating, round-to-nearest-even one, two values per
instruction (cvt.rn.satfinite.e4m3x2.f32: beyond 448 it gives +-448, as QuantizeLinear's saturate=1
does, and NaN stays NaN), and each thread stores each vector of Y with one st.global of the whole
vector (vec bytes of FP8), S as in the residual form. Counted in the PTX of each plan compiled
alone, for sm_89 (Ada: the plans below sm_90) and sm_90a; the plain-dtype form of a plan is the
control."""

import re

import pytest

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
from kernel_ptx import plan_build
from support import check_kernel

X_PARAM = 0
Y_SCALE = 0.0375
FP8_CVT = "cvt.rn.satfinite.e4m3x2.f32"

# (hidden, X dtype): one and two rows per CTA, staged plans, the cluster and bulk plans, 16 KB
# rows, fp32 rows (4-byte FP8 vectors), and ragged and narrow-vector rows (2-byte and 1-byte FP8
# vectors).
CASES = [(1024, "float16"), (4096, "bfloat16"), (16384, "float16"), (2560, "float32"),
         (1000, "bfloat16"), (1030, "float16"), (4095, "float32")]


def schedule_plans(hidden, dtype, arch, residual):
    elem_bytes = lesson.DTYPES[dtype].bytes
    schedule = fused.token_schedule(hidden, elem_bytes, fused.is_sm90(arch), residual, fp8=True)
    return [plan for plan, _ in schedule]


def compiled_ptx(plan, dtype, arch, y_scale=Y_SCALE):
    return plan_build(plan, dtype, arch, y_scale=y_scale).ptx


def fp8_conversions(ptx):
    """Every cvt whose result is an FP8 type, by opcode."""
    return re.findall(r"\bcvt\.[\w.]*(?:e4m3|e5m2)[\w.]*", ptx)


def stores_per_row(plan):
    return plan.vecs_per_thread * plan.rows_in_sequence


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
@pytest.mark.parametrize("hidden, dtype", CASES)
def test_y_is_converted_by_the_saturating_cvt_and_stored_a_whole_vector_at_a_time(
        arch, hidden, dtype, residual):
    elem_bytes = lesson.DTYPES[dtype].bytes
    for plan in schedule_plans(hidden, dtype, arch, residual):
        ptx = compiled_ptx(plan, dtype, arch)
        conversions = fp8_conversions(ptx)
        assert conversions and set(conversions) == {FP8_CVT}, (str(plan), sorted(set(conversions)))
        _, stores = check_kernel.global_access_list(ptx, X_PARAM)
        y_stores = [plan.vec] * stores_per_row(plan)  # vec FP8 values: vec bytes
        s_stores = [plan.vec * elem_bytes] * stores_per_row(plan) if residual else []
        assert sorted(stores) == sorted(y_stores + s_stores), (str(plan), stores)


def test_the_control_without_a_y_scale_converts_nothing_to_fp8_and_stores_xs_width():
    plan = schedule_plans(4096, "bfloat16", "sm_90a", False)[0]
    ptx = compiled_ptx(plan, "bfloat16", "sm_90a", y_scale=None)
    assert fp8_conversions(ptx) == []
    _, stores = check_kernel.global_access_list(ptx, X_PARAM)
    assert stores == [16] * stores_per_row(plan)


def test_the_scale_is_one_multiply_per_row_folded_into_rstd():
    """y / y_scale costs no instruction per element: the FP8 form's PTX has one more mul.f32
    than the plain form's per row, and the same count of fma/mul on elements otherwise."""
    plan = schedule_plans(4096, "bfloat16", "sm_90a", False)[0]
    plain = compiled_ptx(plan, "bfloat16", "sm_90a", y_scale=None)
    fp8 = compiled_ptx(plan, "bfloat16", "sm_90a")
    multiplies = [len(re.findall(r"\bmul(?:\.\w+)*\.f32\b", ptx)) for ptx in (plain, fp8)]
    assert multiplies[1] == multiplies[0] + plan.rows_in_sequence, multiplies


def test_an_fp8_form_for_a_target_without_fp8_conversions_is_refused_before_tracing():
    with pytest.raises(ValueError, match="the FP8 form needs sm_89 or newer"):
        fused.compile_rms_norm("bfloat16", 4096, arch="sm_80", y_scale=Y_SCALE)
