"""CPU: the NumPy reference against an independent float64 formula, and the tolerance check."""

import math

import numpy as np
import pytest

import rms_norm_plugin_cutedsl as sample


def naive_rms_norm(x, w, eps):
    """Row by row with Python floats (double precision), written independently of the sample."""
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
    np.testing.assert_allclose(sample.rms_norm_reference(x, w, 1e-5), naive_rms_norm(x, w, 1e-5), rtol=1e-12, atol=1e-15)


def test_zero_row_gives_zeros_not_nan():
    x = np.zeros((2, 64), np.float16)
    x[1] = 1
    y = sample.rms_norm_reference(x, np.ones(64, np.float32), 1e-6)
    assert np.all(y[0] == 0)
    np.testing.assert_allclose(y[1], 1 / math.sqrt(1 + 1e-6))


def test_large_magnitudes_do_not_overflow_in_float64():
    x = np.full((1, 4096), 65504.0, np.float16)  # fp16 max: x^2 overflows fp16, not the reference
    y = sample.rms_norm_reference(x, np.full(4096, 0.5, np.float32), 1e-5)
    np.testing.assert_allclose(y, 0.5, rtol=1e-9)


def test_check_output_accepts_one_rounding_and_rejects_real_errors():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 256)).astype(np.float16)
    w = rng.uniform(0.5, 1.5, 256).astype(np.float32)
    ref = sample.rms_norm_reference(x, w, 1e-5)
    rounded = ref.astype(np.float16).astype(np.float32)
    assert sample.check_output(rounded, x, w, 1e-5, "float16")[0]
    off = rounded.copy()
    off[3, 7] *= 1 + 2 ** -8  # four fp16 ulps away
    assert not sample.check_output(off, x, w, 1e-5, "float16")[0]
    nan = rounded.copy()
    nan[0, 0] = np.nan
    assert not sample.check_output(nan, x, w, 1e-5, "float16")[0]


@pytest.mark.parametrize("bad", [0.0, -1e-5, float("nan"), float("inf"), 1e-50, "abc", None])
def test_bad_epsilon_is_refused_with_a_named_error(bad):
    with pytest.raises(ValueError, match="epsilon"):
        sample.validate_epsilon(bad)


def test_the_benchmarks_torch_formula_matches_the_numpy_reference():
    """bench_rms_norm.torch_reference is what torch.compile is timed on; it must compute RMSNorm."""
    import sys

    import torch

    from conftest import ROOT

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_rms_norm import EPS, torch_reference

    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    w = (rng.random(96) + 0.5).astype(np.float32)
    y = torch_reference(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    np.testing.assert_allclose(y, sample.rms_norm_reference(x, w, EPS), rtol=1e-5, atol=1e-6)
