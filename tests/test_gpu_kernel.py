"""GPU: the CuteDSL kernel against the NumPy reference over odd and large shapes, for every X x W dtype."""

import numpy as np
import pytest

import rms_norm_plugin_cutedsl as sample
from support.torch_kernel import rms_norm_torch

pytestmark = pytest.mark.gpu

# Both sides of each boundary between token plans (cluster plans up to 32 or 128, FEW_TOKENS 128, mid plans from
# MID_TOKENS 384 to 1024 or, for rows of 20 KB and more, 4096; 16 KB rows over 2 CTAs from 1025); odd counts leave
# the mid plan's last CTA a spare second row.
TOKENS = [1, 2, 32, 33, 37, 128, 129, 384, 385, 511, 512, 1023, 1024, 1025, 4095, 4096, 4097]
# 2056-6144: 16-bit X staged; 9216: a ragged cluster plan (576 threads' worth of vectors over 640)
HIDDEN = [1, 8, 100, 256, 1000, 1024, 2056, 2560, 4096, 5120, 6144, 8192, 9216, 10240, 12288, 16384]
# Every X x W combination; Y has X's dtype.
COMBINATIONS = [(x, w) for x in ("float16", "bfloat16", "float32") for w in ("float32", "float16", "bfloat16")]


def _run(x, w, eps):
    import torch

    y = torch.full_like(x, float("nan"))  # poison: an unwritten element fails the check
    rms_norm_torch(sample, x, w, eps, out=y)
    torch.cuda.synchronize()
    return y.float().cpu().numpy()


def _check(tokens, hidden, dtype, w_dtype, seed, eps=1e-5):
    x, w = sample.make_inputs(tokens, hidden, dtype, seed, w_dtype)
    y = _run(x.cuda(), w.cuda(), eps)
    ok, err = sample.check_output(y, x.float().numpy(), w.float().numpy(), eps, dtype)
    assert ok, f"max abs error {err:.3e}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", TOKENS)
def test_kernel_matches_numpy(tokens, hidden, dtype):
    _check(tokens, hidden, dtype, "float32", seed=tokens * 7919 + hidden)


# Every pair at these: 1028-3072, fp32 X staged (rows of 4-12 KB); 1030, fp32 X in 2-element vectors.
COMBINATION_HIDDEN = [7, 100, 1000, 1028, 1030, 2560, 3072, 8192]
COMBINATION_TOKENS = [1, 37, 512]


@pytest.mark.parametrize("dtype, w_dtype", COMBINATIONS)
@pytest.mark.parametrize("hidden", COMBINATION_HIDDEN)
@pytest.mark.parametrize("tokens", COMBINATION_TOKENS)
def test_every_dtype_combination_matches_numpy(tokens, hidden, dtype, w_dtype):
    _check(tokens, hidden, dtype, w_dtype, seed=tokens * 7919 + hidden + 17)


@pytest.mark.parametrize("dtype, w_dtype", [("float16", "float32"), ("bfloat16", "float32"), ("float32", "float32"),
                                            ("float32", "bfloat16"), ("float16", "float16"), ("bfloat16", "bfloat16")])
@pytest.mark.parametrize("tokens", [1, 37, 512])
def test_largest_supported_hidden(tokens, dtype, w_dtype):
    """MAX_HIDDEN (32768): 1024 threads per row, W loaded after the reduction (fp32 X: 8 vectors per thread);
    16-bit X at 1 and 37 rows: the cluster plan, 256 threads per CTA."""
    _check(tokens, sample.MAX_HIDDEN, dtype, w_dtype, seed=tokens)


@pytest.mark.parametrize("hidden", [2560, 4096, 8192, 12288, 16384])
def test_launcher_runs_the_plan_for_the_token_count(hidden):
    """The kernel that runs, by its name (which carries its plan), on both sides of every boundary: the cluster
    plan up to the line's count (32, or 128 for 32 KB rows), the few-token plan up to FEW_TOKENS rows, the mid
    plan above MID_TOKENS and up to the line's mid[0], the many-token plan otherwise."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def kernels_run(tokens):
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.float16)
        w = torch.rand(hidden, device="cuda") + 0.5
        rms_norm_torch(sample, x, w)  # compiles
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            rms_norm_torch(sample, x, w)
            torch.cuda.synchronize()
        names = [event.name for event in prof.events() if "rms_norm_kernel" in event.name]
        if not names:
            pytest.skip("the profiler recorded no kernel (CUPTI unavailable), so the plan that ran is unknown")
        return names

    lo, hi = sample.MID_TOKENS, sample.row_plan(hidden, 2).mid[0]
    counts = [1, 32, 33, sample.FEW_TOKENS, sample.FEW_TOKENS + 1, lo, lo + 1, hi, hi + 1]
    expected = {n: sample.plan_kernel(hidden, 2, n, sm90=sample.is_sm90(sample.gpu_arch())) for n in counts}
    assert len(set(expected.values())) >= 2
    for tokens, plan in expected.items():
        assert [f"_{plan}_" in name for name in kernels_run(tokens)] == [True], (tokens, plan)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_zero_rows_give_zeros(dtype):
    x, w = sample.make_inputs(64, 1024, dtype, seed=1)
    x[5] = 0
    y = _run(x.cuda(), w.cuda(), 1e-5)
    assert np.all(y[5] == 0)
    assert np.isfinite(y).all()


# fp16's largest value, and a bf16/fp32 value whose square summed over 1024 columns
# still fits FP32 (sqrt(FLT_MAX / 1024) ~ 5.8e17; see README "Limitations").
@pytest.mark.parametrize("dtype,big", [("float16", 65504.0), ("bfloat16", 1.0e17), ("float32", 1.0e17)])
def test_large_magnitudes_are_correct(dtype, big):
    x, w = sample.make_inputs(8, 1024, dtype, seed=2)
    x[0] = big
    x[1, ::2] = -big
    y = _run(x.cuda(), w.cuda(), 1e-5)
    ok, err = sample.check_output(y, x.float().numpy(), w.numpy(), 1e-5, dtype)
    assert ok, f"max abs error {err:.3e}"


def test_nan_row_leaves_other_rows_correct():
    x, w = sample.make_inputs(16, 1000, "float16", seed=3)
    x[3, 10] = float("nan")
    x[9, 0] = float("inf")
    y = _run(x.cuda(), w.cuda(), 1e-5)
    good = [i for i in range(16) if i not in (3, 9)]
    ok, err = sample.check_output(y[good], x[good].float().numpy(), w.numpy(), 1e-5, "float16")
    assert ok, err


def test_subnormal_epsilon_normalizes_a_row_whose_mean_square_is_subnormal():
    """eps below FLT_MIN keeps the plain rsqrt: a flush-to-zero one would see 0 here and return inf."""
    x, w = sample.make_inputs(4, 100, "bfloat16", seed=5)
    x[1] = x[1] * 1e-20  # squares near 1e-40, subnormal in float32
    eps = float(np.float32(1e-40))
    y = _run(x.cuda(), w.cuda(), eps)
    ok, err = sample.check_output(y, x.float().numpy(), w.numpy(), eps, "bfloat16")
    assert ok, err


@pytest.mark.parametrize("eps", [1e-12, 1e-6, 1e-3, 1e-1])
def test_epsilon_range_and_odd_weights(eps):
    x, w = sample.make_inputs(37, 100, "bfloat16", seed=4)
    w[::3] = 0.0
    w[1::3] = -w[1::3].abs() - 0.5
    x[0] = x[0] * 1e-3  # small rows make epsilon matter
    y = _run(x.cuda(), w.cuda(), eps)
    ok, err = sample.check_output(y, x.float().numpy(), w.numpy(), eps, "bfloat16")
    assert ok, err
