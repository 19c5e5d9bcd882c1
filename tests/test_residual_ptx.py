"""CPU: what the companion's residual form compiles to (rms_norm_fused_cutedsl.py; the lesson has
none). Every plan of its schedule reads each vector of X and of R with one 16-byte access
(ld.global.v4, cp.async of 16 bytes, or one bulk copy per row), and stores each vector of S and of Y
with one 16-byte st.global: the traffic floor of reading X and R once and writing S and Y once.
Counted in the PTX of each plan compiled alone, as support/check_kernel.py compiles it; the plain
form of the same plan is the control (no R read, half the stores)."""

import dataclasses

import pytest

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
from kernel_ptx import plan_build
from support import check_kernel

X_PARAM = 0
R_PARAM = 1  # the kernel's parameters: X, R, W, num_tokens, Y, S

# (hidden, X dtype): a 2-rows-per-CTA plan, staged cp.async plans of one and two rows in turn, the cluster, the
# bulk-copy mid plan and the 2-CTA many plan, 16 KB rows with W late, fp32 rows.
CASES = [(1024, "float16"), (4096, "float16"), (8192, "bfloat16"), (16384, "float16"), (2560, "float32")]


def plans(hidden, dtype, arch):
    elem_bytes = lesson.DTYPES[dtype].bytes
    schedule = fused.token_schedule(hidden, elem_bytes, fused.is_sm90(arch), residual=True)
    return [plan for plan, _ in schedule]


def expected_copies(plan):
    """Global accesses per thread of one row input: one per vector and row, or one bulk copy per row slot."""
    if plan.arrival == "bulk":
        return plan.rows_per_cta * plan.rows_in_sequence
    return plan.vecs_per_thread * plan.rows_in_sequence


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("hidden, dtype", CASES)
def test_x_and_r_are_read_once_and_s_and_y_stored_once_in_16_byte_accesses(arch, hidden, dtype):
    for plan in plans(hidden, dtype, arch):
        assert plan.residual and not plan.ragged
        ptx = plan_build(plan, dtype, arch).ptx
        x_loads, stores = check_kernel.global_access_list(ptx, X_PARAM)
        r_loads, _ = check_kernel.global_access_list(ptx, R_PARAM)
        copies = expected_copies(plan)
        width = {"ld": 16, "cp.async": 16, "bulk": 0}[x_loads[0][0]]
        assert x_loads == [(x_loads[0][0], width)] * copies, (str(plan), x_loads)
        assert r_loads == x_loads, (str(plan), r_loads)
        assert stores == [16] * (2 * plan.vecs_per_thread * plan.rows_in_sequence), (str(plan), stores)


def test_the_plain_form_of_a_plan_reads_no_r_and_stores_half():
    """The control: the same plan without the residual reads only X and stores only Y."""
    plan = dataclasses.replace(plans(4096, "float16", "sm_90a")[0], residual=False)
    ptx = plan_build(plan, "float16", "sm_90a").ptx
    x_loads, stores = check_kernel.global_access_list(ptx, X_PARAM)
    assert x_loads == [("ld", 16)] * plan.vecs_per_thread
    assert stores == [16] * plan.vecs_per_thread


def test_the_residual_kernels_parameters_are_x_r_w_num_tokens_y_s():
    """TensorRT's AOT order: the inputs X, R, W, the extra num_tokens, the outputs Y, S."""
    plan = plans(1024, "float16", "sm_90a")[0]
    ptx = plan_build(plan, "float16", "sm_90a").ptx
    entry = ptx[ptx.index(".entry"):ptx.index(")", ptx.index(".entry"))]
    kinds = [("u32" if ".u32" in line else "u64 ptr") for line in entry.splitlines() if ".param" in line]
    assert kinds == ["u64 ptr", "u64 ptr", "u64 ptr", "u32", "u64 ptr", "u64 ptr"]
