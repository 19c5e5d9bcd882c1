"""CPU: the references against independent computations, and the checks built on them: the lesson's
rms_norm_reference and check_output, the companion's residual_reference, quantize_reference and
check_quantized."""

import math

import numpy as np
import pytest
import torch

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson


def naive_rms_norm(x, w, eps):
    """Row by row with Python floats (double precision), written independently of the lesson."""
    out = np.empty(x.shape, dtype=np.float64)
    for i, row in enumerate(np.asarray(x, dtype=np.float64)):
        rms = math.sqrt(sum(float(v) * float(v) for v in row) / len(row) + eps)
        out[i] = [float(v) / rms * float(g) for v, g in zip(row, w)]
    return out


@pytest.mark.parametrize("tokens,hidden", [(1, 1), (3, 7), (37, 100), (2, 1000)])
def test_reference_matches_float64_formula(tokens, hidden):
    rng = np.random.default_rng(tokens * 100 + hidden)
    x = rng.standard_normal((tokens, hidden)).astype(np.float16)
    w = rng.uniform(-1, 2, hidden).astype(np.float32)
    np.testing.assert_allclose(lesson.rms_norm_reference(x, w, 1e-5), naive_rms_norm(x, w, 1e-5), rtol=1e-12, atol=1e-15)


def test_zero_row_gives_zeros_not_nan():
    x = np.zeros((2, 64), np.float16)
    x[1] = 1
    y = lesson.rms_norm_reference(x, np.ones(64, np.float32), 1e-6)
    assert np.all(y[0] == 0)
    np.testing.assert_allclose(y[1], 1 / math.sqrt(1 + 1e-6))


def test_large_magnitudes_do_not_overflow_in_float64():
    x = np.full((1, 4096), 65504.0, np.float16)  # fp16 max: x^2 overflows fp16, not the reference
    y = lesson.rms_norm_reference(x, np.full(4096, 0.5, np.float32), 1e-5)
    np.testing.assert_allclose(y, 0.5, rtol=1e-9)


def test_check_output_accepts_one_rounding_and_rejects_real_errors():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 256)).astype(np.float16)
    w = rng.uniform(0.5, 1.5, 256).astype(np.float32)
    ref = lesson.rms_norm_reference(x, w, 1e-5)
    rounded = ref.astype(np.float16).astype(np.float32)
    assert lesson.check_output(rounded, x, w, 1e-5, "float16")[0]
    off = rounded.copy()
    off[3, 7] *= 1 + 2 ** -8  # four fp16 ulps away
    assert not lesson.check_output(off, x, w, 1e-5, "float16")[0]
    nan = rounded.copy()
    nan[0, 0] = np.nan
    assert not lesson.check_output(nan, x, w, 1e-5, "float16")[0]


@pytest.mark.parametrize("bad", [0.0, -1e-5, float("nan"), float("inf"), 1e-50, "abc", None])
def test_bad_epsilon_is_refused_with_a_named_error(bad):
    with pytest.raises(ValueError, match="epsilon"):
        lesson.validate_epsilon(bad)


def test_the_benchmarks_torch_formula_matches_the_numpy_reference():
    """bench_rms_norm.torch_reference is what torch.compile is timed on; it must compute RMSNorm."""
    import sys

    from conftest import ROOT

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_rms_norm import EPS, torch_reference

    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    w = (rng.random(96) + 0.5).astype(np.float32)
    y = torch_reference(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    np.testing.assert_allclose(y, lesson.rms_norm_reference(x, w, EPS), rtol=1e-5, atol=1e-6)


# -- the companion's references ------------------------------------------------------------------------------


def test_the_residual_sum_is_rounded_once_to_xs_dtype():
    """The exact sum rounded to nearest, ties to even: fp16 1 + 2^-11 is a tie between 1 and 1 + 2^-10 and
    rounds to 1, 1 + 3 * 2^-11 to 1 + 2^-9, 1 - 2^-12 to 1; bf16 alike with its 2^-7 steps. A sum truncated,
    or kept in FP32, would not give these."""
    for dtype, step in ((torch.float16, 2.0**-10), (torch.bfloat16, 2.0**-7)):
        x = torch.ones(4, dtype=dtype)
        r = torch.tensor([step / 2, 3 * step / 2, -step / 4, 0.0]).to(dtype)
        s = fused.residual_reference(x, r)
        assert s.dtype == dtype
        assert s.tolist() == [1.0, 1.0 + 2 * step, 1.0, 1.0]


# Values y / y_scale and their E4M3 roundings, worked out by hand: 3 bits after the leading one, so
# the step is 2^(e - 3) in [2^e, 2^(e + 1)) and 2^-9 below 2^-6 (subnormals); ties go to the even
# code; beyond 448 the result saturates at 448 (E4M3FN has no infinity), NaN stays NaN.
QUANTIZED = [
    (1.0625, 1.0),          # between 1 (even code) and 1.125
    (1.1875, 1.25),         # between 1.125 and 1.25 (even)
    (-1.0625, -1.0),
    (2.125, 2.0),           # step 0.25 in [2, 4)
    (3 * 2.0**-10, 2.0**-8),  # subnormal step 2^-9: 1.5 steps round to 2
    (2.0**-10, 0.0),        # half a subnormal step: a tie, to the even code 0
    (0.3, 0.3125),          # step 2^-5 in [0.25, 0.5): 9.6 steps -> 10
    (240.0, 240.0),
    (464.0, 448.0),         # the midpoint of 448 and the missing 480
    (1000.0, 448.0),
    (-np.inf, -448.0),
]


def test_quantize_reference_rounds_to_nearest_even_e4m3_and_saturates():
    values = np.array([v for v, _ in QUANTIZED])
    expected = [q for _, q in QUANTIZED]
    assert fused.quantize_reference(values, 1.0).tolist() == expected
    assert fused.quantize_reference(values * 0.25, 0.25).tolist() == expected  # y / y_scale, exactly
    assert np.isnan(fused.quantize_reference(np.array([np.nan]), 1.0)).all()


def test_check_quantized_accepts_the_rounding_and_refuses_one_step_off():
    """Y decoded from FP8: the exact rounding of the reference passes; another FP8 value (here the rounding
    of 1.2 y) fails, and so does a NaN where the reference has none."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 64).astype(np.float32)
    y_scale = 6.0 / 448.0
    y = fused.quantize_reference(lesson.rms_norm_reference(x, w, 1e-5), y_scale)
    assert fused.check_quantized(y, x, w, 1e-5, y_scale)[0]
    for index in [(0, 0), (5, 31)]:
        off = y.copy()
        off[index] = fused.quantize_reference(np.array([y[index] * 1.2]), 1.0)[0]
        assert off[index] != y[index]
        assert not fused.check_quantized(off, x, w, 1e-5, y_scale)[0], index
    nan = y.copy()
    nan[2, 2] = np.nan
    assert not fused.check_quantized(nan, x, w, 1e-5, y_scale)[0]
