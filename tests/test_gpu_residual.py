"""GPU: the fused companion's residual form, s = x + r and y = RMSNorm(s) * w in one kernel, against torch's
rounding of the sum and the float64 norm of that sum, at every plan boundary and the odd and ragged sizes the plain
form is tested on.

S must equal x + r rounded once to X's dtype bit for bit (torch's own fp16/bf16 add rounds the same way, see
rms_norm_fused_cutedsl.residual_reference); Y must be within the lesson's tolerance of the float64 norm of S."""

import pytest

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
from support.torch_kernel import add_rms_norm_torch
from test_gpu_kernel import COMBINATION_HIDDEN, COMBINATION_TOKENS, COMBINATIONS, HIDDEN, TOKENS

pytestmark = pytest.mark.gpu


def _run(x, r, w, eps):
    import torch

    x = x.cuda()
    y = torch.full_like(x, float("nan"))  # poison: an unwritten element fails the check
    s = torch.full_like(x, float("nan"))
    add_rms_norm_torch(fused, x, r.cuda(), w.cuda(), eps, out=y, s=s)
    torch.cuda.synchronize()
    return y.cpu(), s.cpu()


def _check(tokens, hidden, dtype, w_dtype, seed, eps=1e-5, edit=None):
    import torch

    x, w = lesson.make_inputs(tokens, hidden, dtype, seed, w_dtype)
    r = fused.make_residual(tokens, hidden, dtype, seed)
    if edit:
        edit(x, r)
    y, s = _run(x, r, w, eps)
    expected_s = fused.residual_reference(x, r)
    same = (s == expected_s) | (s.isnan() & expected_s.isnan())
    assert bool(same.all()), f"S differs from x + r at {int((~same).sum())} elements"
    assert not torch.equal(expected_s, x), "R must change S"
    ok, err = lesson.check_output(y.float().numpy(), expected_s.float().numpy(), w.float().numpy(), eps, dtype)
    assert ok, f"max abs error {err:.3e}"
    return y, s


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", TOKENS)
def test_residual_form_matches_torch_and_numpy(tokens, hidden, dtype):
    _check(tokens, hidden, dtype, "float32", seed=tokens * 7919 + hidden + 5)


@pytest.mark.parametrize("dtype, w_dtype", COMBINATIONS)
@pytest.mark.parametrize("hidden", COMBINATION_HIDDEN)
@pytest.mark.parametrize("tokens", COMBINATION_TOKENS)
def test_residual_form_every_dtype_combination(tokens, hidden, dtype, w_dtype):
    _check(tokens, hidden, dtype, w_dtype, seed=tokens * 7919 + hidden + 23)


@pytest.mark.parametrize("dtype, w_dtype", [("float16", "float32"), ("bfloat16", "float32"), ("float32", "float32"),
                                            ("float32", "bfloat16")])
@pytest.mark.parametrize("tokens", [1, 37, 512, 4097])
def test_residual_form_at_the_largest_hidden(tokens, dtype, w_dtype):
    _check(tokens, lesson.MAX_HIDDEN, dtype, w_dtype, seed=tokens + 1)


def test_a_sum_that_rounds_is_stored_rounded_and_normalized_as_stored():
    """fp16 x = 1 and r = 2**-11 sum to 1 + 2**-11, a tie that rounds to even (1.0): S holds 1.0 and Y is the norm
    of 1.0, not of the exact sum."""
    def edit(x, r):
        x[0] = 1.0
        r[0] = 2.0 ** -11
    y, s = _check(4, 1024, "float16", "float32", seed=9, edit=edit)
    assert bool((s[0] == 1.0).all())


def test_a_nan_or_inf_in_r_stays_in_its_row():
    import torch

    x, w = lesson.make_inputs(16, 1000, "float16", 3)
    r = fused.make_residual(16, 1000, "float16", 3)
    r[3, 10] = float("nan")
    r[9, 0] = float("inf")
    y, s = _run(x, r, w, 1e-5)
    good = [i for i in range(16) if i not in (3, 9)]
    expected_s = fused.residual_reference(x, r)
    assert torch.equal(s[good], expected_s[good])
    ok, err = lesson.check_output(y[good].float().numpy(), expected_s[good].float().numpy(), w.numpy(), 1e-5,
                                  "float16")
    assert ok, err
    assert bool(s[3, 10].isnan()) and bool(s[9, 0].isinf())


@pytest.mark.parametrize("hidden", [2560, 4096, 8192, 16384])
def test_the_launcher_runs_the_residual_plan_for_the_token_count(hidden):
    import torch
    from torch.profiler import ProfilerActivity, profile

    def kernels_run(tokens):
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.float16)
        r = torch.randn_like(x)
        w = torch.rand(hidden, device="cuda") + 0.5
        add_rms_norm_torch(fused, x, r, w)  # compiles
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            add_rms_norm_torch(fused, x, r, w)
            torch.cuda.synchronize()
        names = [event.name for event in prof.events() if "rms_norm_kernel" in event.name]
        if not names:
            pytest.skip("the profiler recorded no kernel (CUPTI unavailable), so the plan that ran is unknown")
        return names

    lo, hi = fused.MID_TOKENS, fused.row_plan(hidden, 2).mid[0]
    counts = [1, 32, 33, fused.FEW_TOKENS, fused.FEW_TOKENS + 1, lo, lo + 1, hi, hi + 1]
    sm90 = fused.is_sm90(lesson.gpu_arch())
    expected = {n: fused.plan_kernel(hidden, 2, n, sm90=sm90, residual=True) for n in counts}
    for tokens, plan in expected.items():
        assert str(plan).endswith("_residual")
        assert [f"_{plan}_" in name for name in kernels_run(tokens)] == [True], (tokens, plan)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("hidden", [16386, 24578, 30002, 32766, 32767])
@pytest.mark.parametrize("tokens", [1, 37, 512])
def test_rows_of_narrow_vectors_over_a_cluster_of_two(tokens, hidden, dtype):
    """Rows in vectors under 16 bytes with more of them than one CTA's threads hold at the line's count: on
    sm_90 the residual form splits them over 2 CTAs (one CTA's registers cannot hold X and R)."""
    plan = fused.plan_kernel(hidden, lesson.DTYPES[dtype].bytes, tokens, fused.is_sm90(lesson.gpu_arch()), True)
    if fused.is_sm90(lesson.gpu_arch()) and dtype == "float32":
        assert plan.cluster_ctas == 2, plan
    _check(tokens, hidden, dtype, "float32", seed=tokens + hidden)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("tokens", [385, 1024, 4095])
def test_a_bulk_mid_plan_with_w_a_vector_at_a_time(tokens, dtype):
    """14344: two staged rows of X and R under a bound of 2 CTAs/SM leave no registers for W through the sums
    (R waits in registers for X; a W loaded for the first row waits through the second's): W comes a vector at
    a time at the store."""
    plan = fused.plan_kernel(14344, 2, tokens, fused.is_sm90(lesson.gpu_arch()), True)
    if fused.is_sm90(lesson.gpu_arch()):
        assert (plan.arrival, plan.weight_by_vector, plan.min_ctas_per_sm) == ("bulk", True, 2), plan
    _check(tokens, 14344, dtype, "float32", seed=tokens)


# Rows of 12289-15360 bytes: the residual forms' own cluster plan (RowPlan.residual_cluster) serves
# 1-8 tokens, the few plan 9+; 6152 x 16 bits is ragged over the cluster's 1024 vector slots.
RESIDUAL_CLUSTER_ROWS = [("float16", 7168), ("bfloat16", 7168), ("float16", 6152),
                         ("bfloat16", 7680), ("float32", 3584)]


@pytest.mark.parametrize("dtype, hidden", RESIDUAL_CLUSTER_ROWS)
@pytest.mark.parametrize("tokens", [1, 3, 8, 9])
def test_the_residual_forms_own_cluster_plan(tokens, hidden, dtype):
    elem_bytes = lesson.DTYPES[dtype].bytes
    assert fused.plan_kernel(hidden, elem_bytes, 8, residual=True).cluster_ctas == fused.CLUSTER_CTAS
    _check(tokens, hidden, dtype, "float32", seed=tokens)
