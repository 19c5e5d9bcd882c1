"""GPU: the fused companion's FP8 form, Y = saturate(round-to-nearest-even(y / y_scale)) in FP8 E4M3,
against the float64 reference.

Y must be the FP8 rounding of the float64 norm (rms_norm_fused_cutedsl.quantize_reference),
exactly, except where that norm lies within FP8_MIDPOINT_BAND of a midpoint between two FP8 values,
where either is right (check_quantized). Tested at every plan boundary and the odd and ragged sizes
the plain form is tested on, in both forms (the residual form's S stays in X's dtype, bit for bit),
at saturation, on NaN and inf rows, and on exact ties."""

import numpy as np
import pytest

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
from support.torch_kernel import add_rms_norm_torch, rms_norm_torch
from test_gpu_kernel import COMBINATION_HIDDEN, COMBINATION_TOKENS, COMBINATIONS, HIDDEN, TOKENS
from test_gpu_residual import RESIDUAL_CLUSTER_ROWS

pytestmark = pytest.mark.gpu

# make_inputs' y has |y| up to about 4 * 1.5: this scale spreads it over E4M3's range (448 at
# the top) with a few values saturated, and puts the smallest ones among its subnormals.
Y_SCALE = 6.0 / 448.0


def fp8_poison(x):
    """An FP8 Y of NaNs: an element the kernel leaves unwritten fails the check."""
    import torch

    return torch.full_like(x, float("nan"), dtype=torch.float8_e4m3fn)


def _check(tokens, hidden, dtype, w_dtype, seed, residual=False, y_scale=Y_SCALE, eps=1e-5,
           edit=None):
    x, w = lesson.make_inputs(tokens, hidden, dtype, seed, w_dtype)
    r = fused.make_residual(tokens, hidden, dtype, seed) if residual else None
    if edit:
        edit(x, w)
    y = fp8_poison(x.cuda())
    normalized = x
    if residual:
        s = x.cuda().clone().fill_(float("nan"))
        add_rms_norm_torch(fused, x.cuda(), r.cuda(), w.cuda(), eps, out=y, s=s, y_scale=y_scale)
        normalized = fused.residual_reference(x, r)
        assert bool((s.cpu() == normalized).all()), "S differs from x + r"
    else:
        rms_norm_torch(fused, x.cuda(), w.cuda(), eps, out=y, y_scale=y_scale)
    decoded = y.float().cpu().numpy()
    ok, err = fused.check_quantized(decoded, normalized.float().numpy(), w.float().numpy(), eps,
                                     y_scale)
    assert ok, f"max abs error {err:.3e} against the FP8 rounding of the reference"
    return decoded


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", TOKENS)
def test_fp8_form_matches_the_quantized_reference(tokens, hidden, dtype):
    _check(tokens, hidden, dtype, "float32", seed=tokens * 7919 + hidden + 41)


# fp16 and bf16 rows take one path to FP8: the residual form is tested on one of them.
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", [1, 33, 129, 385, 1025, 4097])
def test_residual_fp8_form_matches_the_quantized_reference(tokens, hidden, dtype):
    _check(tokens, hidden, dtype, "float32", seed=tokens * 7919 + hidden + 43, residual=True)


@pytest.mark.parametrize("dtype, w_dtype", COMBINATIONS)
@pytest.mark.parametrize("hidden", COMBINATION_HIDDEN)
@pytest.mark.parametrize("tokens", COMBINATION_TOKENS)
def test_fp8_form_every_dtype_combination(tokens, hidden, dtype, w_dtype):
    _check(tokens, hidden, dtype, w_dtype, seed=tokens + hidden)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("hidden", [14344, 16386, 30002, 32767, lesson.MAX_HIDDEN])
@pytest.mark.parametrize("tokens", [1, 37, 512])
def test_fp8_form_of_the_longest_and_narrow_vector_rows(tokens, hidden, dtype, residual):
    """The W-a-vector-at-a-time and cluster plans, and rows of narrow vectors (smaller Y stores)."""
    _check(tokens, hidden, dtype, "float32", seed=tokens + hidden, residual=residual)


def test_values_beyond_448_saturate_instead_of_becoming_nan():
    """A small y_scale puts most of y / y_scale past E4M3's 448 (74 % in the reference at 2^-12):
    they must read +-448, as QuantizeLinear's saturate=1 gives, never NaN (E4M3FN's only
    non-finite code)."""
    decoded = _check(64, 4096, "bfloat16", "float32", seed=5, y_scale=2.0**-12)
    assert np.mean(np.abs(decoded) == 448.0) > 0.5
    assert not np.isnan(decoded).any()


def test_nan_and_inf_rows_quantize_as_the_reference_and_leave_other_rows_alone():
    """A NaN row is NaN throughout; a row holding inf has inf / inf = NaN there and 0 elsewhere
    (its mean square is inf), as the float64 reference computes."""
    def edit(x, w):
        x[3, 10] = float("nan")
        x[9, 0] = float("inf")
        x[11, 5] = float("-inf")
    decoded = _check(16, 1000, "float16", "float32", seed=3, edit=edit)
    assert np.isnan(decoded[3]).all()
    assert np.isnan(decoded[9, 0]) and (decoded[9, 1:] == 0).all()
    assert not np.isnan(np.delete(decoded, [3, 9, 11], axis=0)).any()


def test_exact_ties_round_to_even():
    """Rows of ones with epsilon 2^-126 have rstd exactly 1, so y = w: w set to midpoints between
    FP8 values must round to the one with an even last bit, and 464 (between 448 and E4M3's missing
    480) saturates to 448."""
    import torch

    w = torch.tensor([1.0625, 1.1875, -1.0625, -1.1875, 2.125, 3 * 2.0**-10, 464.0, 1000.0])
    expected = [1.0, 1.25, -1.0, -1.25, 2.0, 2.0**-8, 448.0, 448.0]
    assert fused.quantize_reference(w.numpy(), 1.0).tolist() == expected  # the reference agrees
    x = torch.ones(4, 8, dtype=torch.bfloat16, device="cuda")
    y = rms_norm_torch(fused, x, w.cuda(), lesson.FLT_MIN, y_scale=1.0)
    assert y.float().cpu().tolist() == [expected] * 4


@pytest.mark.parametrize("dtype, hidden", RESIDUAL_CLUSTER_ROWS)
@pytest.mark.parametrize("tokens", [1, 3, 8, 9])
def test_the_residual_fp8_forms_own_cluster_plan(tokens, hidden, dtype):
    _check(tokens, hidden, dtype, "float32", seed=tokens, residual=True)
