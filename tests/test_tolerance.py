"""CPU: check_output's bound is one unit in the last place of the output dtype, derived here independently.

fp16 stores 10 fraction bits and bf16 7, so a value v in [2^e, 2^(e+1)) has an
ulp of 2^(e-10) or 2^(e-7). A kernel that computes in FP32 and rounds once is
within half an ulp (plus FP32 noise); check_output must accept that and refuse
anything 3 ulps away (3 ulps exceed 2^-p * |v| for every v in the binade, so a
relative bound of one ulp at the binade's bottom still refuses them).
"""

import numpy as np
import pytest
import torch

import rms_norm_plugin_cutedsl as sample

FRACTION_BITS = {"float16": 10, "bfloat16": 7}
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def ulp(values, dtype):
    """Spacing of `dtype` at each |value| (normal range), from the exponent alone."""
    exponent = np.floor(np.log2(np.abs(values)))
    return np.exp2(exponent - FRACTION_BITS[dtype])


def case(dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((16, 256), dtype=np.float32)).to(TORCH[dtype]).float().numpy()
    w = rng.uniform(0.5, 1.5, 256).astype(np.float32)
    ref = sample.rms_norm_reference(x, w, 1e-5)
    return x, w, ref


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_one_rounding_to_the_output_dtype_is_accepted(dtype):
    x, w, ref = case(dtype)
    rounded = torch.from_numpy(ref.astype(np.float32)).to(TORCH[dtype]).float().numpy()
    assert np.all(np.abs(rounded - ref) <= 0.5 * ulp(ref, dtype) * (1 + 2 ** -20))  # the premise
    assert sample.check_output(rounded, x, w, 1e-5, dtype)[0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("sign", [1, -1])
def test_three_ulps_off_is_refused_anywhere_in_the_row(dtype, sign):
    x, w, ref = case(dtype, seed=1)
    for index in [(0, 0), (3, 17), (15, 255)]:
        y = ref.copy()
        y[index] += sign * 3 * ulp(ref[index], dtype)
        assert not sample.check_output(y.astype(np.float32), x, w, 1e-5, dtype)[0], (dtype, index)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_values_at_the_top_of_a_binade_get_no_more_than_two_ulps(dtype):
    """Where |ref| is just below 2^(e+1), the relative bound is almost 2 ulps: 2.5 must still fail."""
    x, w, ref = case(dtype, seed=2)
    top = np.argmax(np.abs(ref) / np.exp2(np.floor(np.log2(np.abs(ref)))))
    index = np.unravel_index(top, ref.shape)
    y = ref.copy()
    y[index] += 2.5 * ulp(ref[index], dtype)
    assert not sample.check_output(y.astype(np.float32), x, w, 1e-5, dtype)[0]
