"""GPU: both kernels against the NumPy reference over odd and large shapes, for every X x W dtype.

The lesson's kernel (rms_norm_plugin_cutedsl.py) at every kind of plan its rule gives: W first and W a
vector at a time at the store, ragged rows and whole ones, 16-byte and narrower vectors, short rows
sharing a CTA, one row of 1024 threads; launched as compile_rms_norm's launcher on CuTe tensors made
by from_dlpack. The companion's plain form (rms_norm_fused_cutedsl.py) at every plan of its launcher,
by token count, through support/torch_kernel.py, as the old sample's kernel was tested.
"""

import functools

import numpy as np
import pytest

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
from support.torch_kernel import rms_norm_torch

pytestmark = pytest.mark.gpu

# The companion's plans: both sides of each boundary between token plans (cluster plans up to 32 or 128,
# FEW_TOKENS 128, mid plans from MID_TOKENS 384 to 1024 or, for rows of 20 KB and more, 4096; 16 KB rows over 2
# CTAs from 1025); odd counts leave the mid plan's last CTA a spare second row.
TOKENS = [1, 2, 32, 33, 37, 128, 129, 384, 385, 511, 512, 1023, 1024, 1025, 4095, 4096, 4097]
# 2056-6144: 16-bit X staged; 9216: a ragged cluster plan (576 threads' worth of vectors over 640)
HIDDEN = [1, 8, 100, 256, 1000, 1024, 2056, 2560, 4096, 5120, 6144, 8192, 9216, 10240, 12288, 16384]
# Every X x W combination; Y has X's dtype.
COMBINATIONS = [(x, w) for x in ("float16", "bfloat16", "float32") for w in ("float32", "float16", "bfloat16")]

# The lesson's one plan serves every count: counts that leave the last CTA of 2, 4 and 8 rows spare slots, one
# row, and many CTAs.
LESSON_TOKENS = [1, 2, 7, 37, 512, 4097]
# Rows of 1 and 8 elements, 100 (ragged, 4-element vectors, 8 rows a CTA), 256, 1000 (ragged, two rows of two
# warps), 1024, 1536 (96 threads), 4096, 16384 (1024 threads), 19455 and 19457 (1-element vectors, the last
# with W first and the first with W a vector at a time), 24576 and 24584 (the same in 16-byte vectors of 16-bit
# X), 30002 (2-element vectors, W a vector at a time) and 32768; for fp32 X, 16384 and 16388, 18430 and 18434
# (W first, then a vector at a time).
LESSON_HIDDEN = [1, 8, 100, 256, 1000, 1024, 1536, 4096, 16384, 19455, 19457, 24576, 24584, 30002, 32768]
LESSON_FP32_HIDDEN = [16388, 18430, 18434]


def dtype_name(tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def lesson_norm(x, w, epsilon=lesson.DEFAULT_EPSILON, out=None):
    """y = RMSNorm(x) * w by the lesson's compiled launcher, on torch's current stream: X and Y as [tokens,
    hidden] CuTe tensors from from_dlpack, as the plugin's handoff ends."""
    import torch

    out = torch.empty_like(x) if out is None else out
    hidden = x.shape[-1]
    kernel = lesson.compile_rms_norm(dtype_name(x), hidden, epsilon, w_dtype=dtype_name(w))
    x2, y2 = (lesson.from_dlpack(t.view(-1, hidden), assumed_align=lesson.VECTOR_BYTES) for t in (x, out))
    w2 = lesson.from_dlpack(w, assumed_align=lesson.VECTOR_BYTES)
    stream = lesson.cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    kernel(x2, w2, y2, x.numel() // hidden, stream)
    return out


# Y = norm(x, w, epsilon, out=y) for each kernel.
NORMS = {"lesson": lesson_norm, "fused": functools.partial(rms_norm_torch, fused)}


def _run(norm, x, w, eps):
    import torch

    y = torch.full_like(x, float("nan"))  # poison: an unwritten element fails the check
    norm(x, w, eps, out=y)
    torch.cuda.synchronize()
    return y.float().cpu().numpy()


def _check(norm, tokens, hidden, dtype, w_dtype, seed, eps=1e-5):
    x, w = lesson.make_inputs(tokens, hidden, dtype, seed, w_dtype)
    y = _run(norm, x.cuda(), w.cuda(), eps)
    ok, err = lesson.check_output(y, x.float().numpy(), w.float().numpy(), eps, dtype)
    assert ok, f"max abs error {err:.3e}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", TOKENS)
def test_kernel_matches_numpy(tokens, hidden, dtype):
    _check(NORMS["fused"], tokens, hidden, dtype, "float32", seed=tokens * 7919 + hidden)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("hidden", LESSON_HIDDEN)
@pytest.mark.parametrize("tokens", LESSON_TOKENS)
def test_the_lessons_kernel_matches_numpy(tokens, hidden, dtype):
    _check(lesson_norm, tokens, hidden, dtype, "float32", seed=tokens * 7919 + hidden + 3)


@pytest.mark.parametrize("hidden", LESSON_FP32_HIDDEN)
@pytest.mark.parametrize("tokens", LESSON_TOKENS)
def test_the_lessons_fp32_rows_where_w_comes_a_vector_at_a_time(tokens, hidden):
    plan = lesson.plan_kernel(hidden, 4)
    assert plan.weight_by_vector == (hidden != 18430), plan
    _check(lesson_norm, tokens, hidden, "float32", "float32", seed=tokens * 7919 + hidden + 5)


# Every pair at these: 1028-3072, fp32 X staged (rows of 4-12 KB) in the companion; 1030, fp32 X in 2-element
# vectors.
COMBINATION_HIDDEN = [7, 100, 1000, 1028, 1030, 2560, 3072, 8192]
COMBINATION_TOKENS = [1, 37, 512]


@pytest.mark.parametrize("kernel", NORMS)
@pytest.mark.parametrize("dtype, w_dtype", COMBINATIONS)
@pytest.mark.parametrize("hidden", COMBINATION_HIDDEN)
@pytest.mark.parametrize("tokens", COMBINATION_TOKENS)
def test_every_dtype_combination_matches_numpy(tokens, hidden, dtype, w_dtype, kernel):
    _check(NORMS[kernel], tokens, hidden, dtype, w_dtype, seed=tokens * 7919 + hidden + 17)


@pytest.mark.parametrize("kernel", NORMS)
@pytest.mark.parametrize("dtype, w_dtype", [("float16", "float32"), ("bfloat16", "float32"), ("float32", "float32"),
                                            ("float32", "bfloat16"), ("float16", "float16"), ("bfloat16", "bfloat16")])
@pytest.mark.parametrize("tokens", [1, 37, 512])
def test_largest_supported_hidden(tokens, dtype, w_dtype, kernel):
    """MAX_HIDDEN (32768): 1024 threads per row. The lesson: W a vector at a time at the store. The companion: W
    loaded after the reduction (fp32 X: 8 vectors per thread); 16-bit X at 1 and 37 rows: the cluster plan, 256
    threads per CTA."""
    _check(NORMS[kernel], tokens, lesson.MAX_HIDDEN, dtype, w_dtype, seed=tokens)


def kernels_run(norm, tokens, hidden):
    """The names of the kernels one call of `norm` on tokens x hidden fp16 rows runs, by torch's profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.float16)
    w = torch.rand(hidden, device="cuda") + 0.5
    norm(x, w)  # compiles
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        norm(x, w)
        torch.cuda.synchronize()
    names = [event.name for event in prof.events() if "rms_norm_kernel" in event.name]
    if not names:
        pytest.skip("the profiler recorded no kernel (CUPTI unavailable), so the plan that ran is unknown")
    return names


@pytest.mark.parametrize("hidden", [2560, 4096, 8192, 12288, 16384])
def test_launcher_runs_the_plan_for_the_token_count(hidden):
    """The companion's kernel that runs, by its name (which carries its plan), on both sides of every boundary:
    the cluster plan up to the line's count (32, or 128 for 32 KB rows), the few-token plan up to FEW_TOKENS rows,
    the mid plan above MID_TOKENS and up to the line's mid[0], the many-token plan otherwise."""
    lo, hi = fused.MID_TOKENS, fused.row_plan(hidden, 2).mid[0]
    counts = [1, 32, 33, fused.FEW_TOKENS, fused.FEW_TOKENS + 1, lo, lo + 1, hi, hi + 1]
    expected = {n: fused.plan_kernel(hidden, 2, n, sm90=fused.is_sm90(lesson.gpu_arch())) for n in counts}
    assert len(set(expected.values())) >= 2
    for tokens, plan in expected.items():
        assert [f"_{plan}_" in name for name in kernels_run(NORMS["fused"], tokens, hidden)] == [True], (tokens, plan)


@pytest.mark.parametrize("hidden", [1024, 8192, 24584])
def test_the_lesson_runs_its_one_plan_for_every_token_count(hidden):
    """One kernel, named after plan_kernel's plan, for 1 row, FEW_TOKENS rows and many."""
    plan = lesson.plan_kernel(hidden, 2)
    for tokens in (1, 128, 4097):
        assert [f"_{plan}_" in name for name in kernels_run(lesson_norm, tokens, hidden)] == [True], (tokens, plan)


@pytest.mark.parametrize("kernel", NORMS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_zero_rows_give_zeros(dtype, kernel):
    x, w = lesson.make_inputs(64, 1024, dtype, seed=1)
    x[5] = 0
    y = _run(NORMS[kernel], x.cuda(), w.cuda(), 1e-5)
    assert np.all(y[5] == 0)
    assert np.isfinite(y).all()


# fp16's largest value, and a bf16/fp32 value whose square summed over 1024 columns
# still fits FP32 (sqrt(FLT_MAX / 1024) ~ 5.8e17; see README "Limitations").
@pytest.mark.parametrize("kernel", NORMS)
@pytest.mark.parametrize("dtype,big", [("float16", 65504.0), ("bfloat16", 1.0e17), ("float32", 1.0e17)])
def test_large_magnitudes_are_correct(dtype, big, kernel):
    x, w = lesson.make_inputs(8, 1024, dtype, seed=2)
    x[0] = big
    x[1, ::2] = -big
    y = _run(NORMS[kernel], x.cuda(), w.cuda(), 1e-5)
    ok, err = lesson.check_output(y, x.float().numpy(), w.numpy(), 1e-5, dtype)
    assert ok, f"max abs error {err:.3e}"


@pytest.mark.parametrize("kernel", NORMS)
def test_nan_row_leaves_other_rows_correct(kernel):
    x, w = lesson.make_inputs(16, 1000, "float16", seed=3)
    x[3, 10] = float("nan")
    x[9, 0] = float("inf")
    y = _run(NORMS[kernel], x.cuda(), w.cuda(), 1e-5)
    good = [i for i in range(16) if i not in (3, 9)]
    ok, err = lesson.check_output(y[good], x[good].float().numpy(), w.numpy(), 1e-5, "float16")
    assert ok, err


@pytest.mark.parametrize("kernel", NORMS)
def test_subnormal_epsilon_normalizes_a_row_whose_mean_square_is_subnormal(kernel):
    """eps below FLT_MIN keeps the plain rsqrt: a flush-to-zero one would see 0 here and return inf."""
    x, w = lesson.make_inputs(4, 100, "bfloat16", seed=5)
    x[1] = x[1] * 1e-20  # squares near 1e-40, subnormal in float32
    eps = float(np.float32(1e-40))
    y = _run(NORMS[kernel], x.cuda(), w.cuda(), eps)
    ok, err = lesson.check_output(y, x.float().numpy(), w.numpy(), eps, "bfloat16")
    assert ok, err


@pytest.mark.parametrize("kernel", NORMS)
@pytest.mark.parametrize("eps", [1e-12, 1e-6, 1e-3, 1e-1])
def test_epsilon_range_and_odd_weights(eps, kernel):
    x, w = lesson.make_inputs(37, 100, "bfloat16", seed=4)
    w[::3] = 0.0
    w[1::3] = -w[1::3].abs() - 0.5
    x[0] = x[0] * 1e-3  # small rows make epsilon matter
    y = _run(NORMS[kernel], x.cuda(), w.cuda(), eps)
    ok, err = lesson.check_output(y, x.float().numpy(), w.numpy(), eps, "bfloat16")
    assert ok, err
