"""CPU: the lesson's check_output's bounds, derived here independently from the formats' fraction bits.

Both kernels' Y is checked against them (the companion reuses check_output and Y_TOLERANCE).

fp16 stores 10 fraction bits, bf16 7 and fp32 23, so a value v in [2^e, 2^(e+1))
has an ulp of 2^(e-p) with p that number. For fp16 and bf16 output, a kernel
that computes in FP32 and rounds once is within half an ulp (plus FP32 noise);
check_output must accept that and refuse anything 3 ulps away (3 ulps exceed
2^-p * |v| for every v in the binade, so a relative bound of one ulp at the
binade's bottom still refuses them).

For fp32 output nothing is rounded at the end: the error is the FP32
arithmetic's own. Each rounding on the path from a square to the row's sum
adds at most u = 2^-24 to the sum's relative error (all terms are positive),
the mean and epsilon 3 u, the reciprocal square root halves that and adds 2
ulp (4 u, CUDA's bound for it), the two final products 2 u. The number of
roundings in the sum follows from the kernel's design, counted here from its
plan, for every plan of both kernels; check_output must accept the resulting bound, and refuse an output that
went through 16 bits anywhere in the row.

The weight adds nothing: fp16 and bf16 values are exact in FP32 (checked
exhaustively below), so the tolerance depends on Y's dtype only.
"""

import math

import numpy as np
import pytest
import torch

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson

FRACTION_BITS = {"float16": 10, "bfloat16": 7, "float32": 23}
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
U = 2.0 ** -(FRACTION_BITS["float32"] + 1)  # FP32's unit roundoff: half an ulp, relative


def ulp(values, dtype):
    """Spacing of `dtype` at each |value| (normal range), from the exponent alone."""
    exponent = np.floor(np.log2(np.abs(values)))
    return np.exp2(exponent - FRACTION_BITS[dtype])


def case(dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((16, 256), dtype=np.float32)).to(TORCH[dtype]).float().numpy()
    w = rng.uniform(0.5, 1.5, 256).astype(np.float32)
    ref = lesson.rms_norm_reference(x, w, 1e-5)
    return x, w, ref


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_one_rounding_to_the_output_dtype_is_accepted(dtype):
    x, w, ref = case(dtype)
    rounded = torch.from_numpy(ref.astype(np.float32)).to(TORCH[dtype]).float().numpy()
    assert np.all(np.abs(rounded - ref) <= 0.5 * ulp(ref, dtype) * (1 + 2 ** -20))  # the premise
    assert lesson.check_output(rounded, x, w, 1e-5, dtype)[0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("sign", [1, -1])
def test_three_ulps_off_is_refused_anywhere_in_the_row(dtype, sign):
    x, w, ref = case(dtype, seed=1)
    for index in [(0, 0), (3, 17), (15, 255)]:
        y = ref.copy()
        y[index] += sign * 3 * ulp(ref[index], dtype)
        assert not lesson.check_output(y.astype(np.float32), x, w, 1e-5, dtype)[0], (dtype, index)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_values_at_the_top_of_a_binade_get_no_more_than_two_ulps(dtype):
    """Where |ref| is just below 2^(e+1), the relative bound is almost 2 ulps: 2.5 must still fail."""
    x, w, ref = case(dtype, seed=2)
    top = np.argmax(np.abs(ref) / np.exp2(np.floor(np.log2(np.abs(ref)))))
    index = np.unravel_index(top, ref.shape)
    y = ref.copy()
    y[index] += 2.5 * ulp(ref[index], dtype)
    assert not lesson.check_output(y.astype(np.float32), x, w, 1e-5, dtype)[0]


# -- fp32 output ---------------------------------------------------------------------------------


def sum_roundings(plan):
    """Roundings on the longest path from one square to the row's sum, by the kernel's design: the square,
    one add per vector the thread holds and per element of a vector, one per butterfly step, one per warp."""
    butterfly = int(math.log2(min(plan.threads_per_row, 32)))
    return 1 + plan.vecs_per_thread + plan.vec + butterfly + (plan.warps_per_row if plan.warps_per_row > 1 else 0)


def fp32_error_bound(roundings):
    """Relative error of the kernel's FP32 result: the sum, mean and epsilon, halved by the square root,
    plus the square root's own 4 u and the two products."""
    return ((roundings + 3) / 2 + 4 + 2) * U


def test_every_plan_sums_a_row_in_fewer_than_72_roundings():
    """The tolerance's bound below counts on d < 72 for every row length and element size: for the lesson's one
    plan, and for every plan the companion's launcher may run (cluster, few, mid and many rows)."""
    for elem_bytes in (2, 4):
        for hidden in range(1, lesson.MAX_HIDDEN + 1):
            plans = [lesson.plan_kernel(hidden, elem_bytes)]
            plans += [plan for plan, _ in fused.token_schedule(hidden, elem_bytes)]
            longest = max(map(sum_roundings, plans))
            assert longest < 72, (longest, plans)


def test_fp32_output_within_the_worst_case_fp32_error_is_accepted():
    x, w, ref = case("float32", seed=3)
    bound = fp32_error_bound(71)
    assert bound < lesson.Y_TOLERANCE["float32"].rtol  # the premise: the tolerance covers the worst plan
    signs = np.random.default_rng(4).choice([-1.0, 1.0], ref.shape)
    y = ref * (1 + signs * bound)
    assert lesson.check_output(y, x, w, 1e-5, "float32")[0]


@pytest.mark.parametrize("through", ["float16", "bfloat16"])
def test_fp32_output_that_went_through_16_bits_is_refused(through):
    """What a kernel that stored Y, or scaled by W, in 16 bits would produce."""
    x, w, ref = case("float32", seed=5)
    y = torch.from_numpy(ref.astype(np.float32)).to(TORCH[through]).float().numpy()
    assert not lesson.check_output(y, x, w, 1e-5, "float32")[0]


@pytest.mark.parametrize("sign", [1, -1])
def test_fp32_error_of_twice_the_tolerance_is_refused_anywhere_in_the_row(sign):
    """Including at the smallest |ref| of the row, where only the absolute term could let it through."""
    x, w, ref = case("float32", seed=6)
    smallest = np.unravel_index(np.argmin(np.abs(ref)), ref.shape)
    for index in [(0, 0), (7, 100), (15, 255), smallest]:
        y = ref.copy()
        y[index] *= 1 + sign * 2 * lesson.Y_TOLERANCE["float32"].rtol
        assert not lesson.check_output(y, x, w, 1e-5, "float32")[0], index


# -- the weight's dtype --------------------------------------------------------------------------


@pytest.mark.parametrize("w_dtype", ["float16", "bfloat16"])
def test_every_16_bit_weight_is_exact_in_fp32(w_dtype):
    """All 65536 bit patterns: converting W to FP32 (as the kernel does on load) loses nothing."""
    assert FRACTION_BITS[w_dtype] <= FRACTION_BITS["float32"]
    w = torch.arange(-(2 ** 15), 2 ** 15, dtype=torch.int32).to(torch.int16).view(TORCH[w_dtype])
    finite = w[torch.isfinite(w)]
    assert torch.equal(finite.float().to(TORCH[w_dtype]).view(torch.int16), finite.view(torch.int16))
