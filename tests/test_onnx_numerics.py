"""CPU: rms_norm_onnx_model.py's tolerances for ONNX RMSNormalization, against a NumPy evaluation
of the op.

ONNX's RMSNormalization with stash_type=1 computes x / sqrt(mean(x^2) + epsilon)
in FP32, casts that to X's dtype, and multiplies by the scale in the scale's
dtype (the operator's documented two stages; onnx.reference skips the cast, so
it is written out here). This kernel multiplies in FP32 and rounds once. The
companion derives from the dtypes' fraction bits p, with u = 2^-(p+1):
    onnx_tolerance     each side against exact: prod(1 + u) - 1 over its roundings
                       (+ FP32 noise); two roundings of one dtype: 2u + u^2
    engines_tolerance  the two sides: the sum of both; X and scale of one dtype: 3u + u^2
                       (+ subnormals)
The bounds are checked here against evaluations of both definitions, and
shown to refuse what they must: an error of two ulps at the bottom of a
binade, where 2 ulp = 4u|y| exceeds three roundings.
"""

import numpy as np
import pytest
import torch

import rms_norm_onnx_model as companion
import rms_norm_plugin_cutedsl as sample

# IEEE half and bfloat16, written out independently of the lesson.
FRACTION_BITS = {"float16": 10, "bfloat16": 7}


def to_dtype(values, dtype):
    """Round float64 values to `dtype` (round to nearest even, through torch) and return them as
    float64."""
    rounded = torch.from_numpy(np.asarray(values, np.float64)).to(getattr(torch, dtype))
    return rounded.double().numpy()


def onnx_rms_norm(x, scale, eps, dtype):
    """RMSNormalization-23, stash_type=1, by its definition: FP32 statistics, Normalized cast to
    X's type, * scale."""
    x32 = x.astype(np.float32)
    rms = np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + np.float32(eps))
    normalized = to_dtype(x32 / rms, dtype)  # the first rounding
    # The product of two dtype values, rounded: the second.
    return to_dtype(normalized * scale, dtype)


def node(dtype, scale_dtype=None, cast=""):
    """A replaced node of X `dtype` and scale `scale_dtype` (default the same), as the rewrite
    describes it."""
    return companion.Replaced("norm", "rms_normalization", ("X",), "S", "Y", 1e-5, dtype,
                              scale_dtype or dtype, cast)


def within(y, x, scale, eps, relative):
    """Whether y is within `relative` |exact| (and fp16's smallest subnormal) of exact RMSNorm."""
    exact = sample.rms_norm_reference(x, scale, eps)
    return bool(np.all(np.abs(y - exact) <= relative * np.abs(exact) + 2.0 ** -24))


def kernel_rms_norm(x, scale, eps, dtype):
    """This kernel's definition: everything in FP32, one rounding at the end."""
    x32 = x.astype(np.float32)
    rstd = np.float32(1.0) / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + np.float32(eps))
    return to_dtype(x32 * rstd * scale.astype(np.float32), dtype)


def case(dtype, seed, rows=256, hidden=512):
    rng = np.random.default_rng(seed)
    x = to_dtype(rng.standard_normal((rows, hidden)) * 2, dtype)
    scale = to_dtype(rng.uniform(-1.5, 1.5, hidden), dtype)
    return x, scale


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_rounding_error_is_half_the_spacing_above_one(dtype):
    assert companion.rounding_error(dtype) == 2.0 ** -(FRACTION_BITS[dtype] + 1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("seed", [0, 1])
def test_onnx_definition_is_within_two_roundings_of_exact(dtype, seed):
    x, scale = case(dtype, seed)
    exact = sample.rms_norm_reference(x, scale, 1e-5)
    y = onnx_rms_norm(x, scale, 1e-5, dtype)
    theirs = companion.roundings(node(dtype))[1]
    assert theirs == [dtype, dtype]
    assert companion.onnx_tolerance(theirs) == 2 * companion.rounding_error(dtype) + \
        companion.rounding_error(dtype) ** 2 + companion.FP32_NOISE
    assert within(y, x, scale, 1e-5, companion.onnx_tolerance(theirs))
    # Premise of the bound: the first rounding's error really reaches past one rounding's worth
    # somewhere.
    assert np.max(np.abs(y - exact) / np.abs(exact)) > companion.rounding_error(dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_two_definitions_are_within_three_roundings(dtype, seed):
    x, scale = case(dtype, seed)
    exact = sample.rms_norm_reference(x, scale, 1e-5)
    onnx, ours = onnx_rms_norm(x, scale, 1e-5, dtype), kernel_rms_norm(x, scale, 1e-5, dtype)
    assert np.any(onnx != ours), "the definitions differ somewhere (else this checks nothing)"
    bound = companion.engines_tolerance(node(dtype), np.abs(exact), scale)
    assert np.all(np.abs(onnx - ours) <= bound)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_two_ulps_at_the_bottom_of_a_binade_are_refused(dtype):
    """|y| = 1.0 + one ulp: two ulps are 4u|y|/(1 + 2u) > (3u + u^2)|y|, beyond three roundings."""
    u = 2.0 ** -(FRACTION_BITS[dtype] + 1)
    y = np.array([1.0 + 2 * u])
    bound = companion.engines_tolerance(node(dtype), y, np.ones(1))
    assert 2 * (2 * u) > bound[0]      # two ulps: refused
    assert 1 * (2 * u) <= bound[0]     # one ulp, what the definitions produce: accepted


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_onnx_tolerance_refuses_an_error_of_three_roundings(dtype):
    x, scale = case(dtype, 2, rows=4)
    exact = sample.rms_norm_reference(x, scale, 1e-5)
    off = exact * (1 + 3 * companion.rounding_error(dtype))
    relative = companion.onnx_tolerance(companion.roundings(node(dtype))[1])
    assert not within(off, x, scale, 1e-5, relative)


def test_fp16_subnormal_outputs_are_allowed_half_a_spacing_per_rounding():
    """A tiny scale puts y among fp16's subnormals, where roundings err absolutely: the two
    definitions still agree within the bound, and only because of its absolute term."""
    x, _ = case("float16", 3, rows=64, hidden=256)
    scale = np.full(256, 2.0 ** -20)  # y ~ 2^-20: subnormal in fp16 (below 2^-14)
    exact = sample.rms_norm_reference(x, scale, 1e-5)
    theirs = onnx_rms_norm(x, scale, 1e-5, "float16")
    diff = np.abs(theirs - kernel_rms_norm(x, scale, 1e-5, "float16"))
    bound = companion.engines_tolerance(node("float16"), np.abs(exact), scale)
    assert np.all(diff <= bound)
    # Three roundings, half of fp16's subnormal spacing each.
    relative_only = bound - 3 * 2.0 ** -25 * (1 + scale)
    assert np.any(diff > relative_only)


def test_a_replaced_node_is_allowed_what_exact_rmsnorm_makes_of_its_input_difference():
    """check_replaced (rms_norm_onnx_model.py): when an earlier node made the engines' X differ,
    the bound adds |exact(X_ours) - exact(X_theirs)|; without that term the same outputs would be
    refused."""
    rewrite = companion
    x, scale = case("float16", 4, rows=64, hidden=256)
    rng = np.random.default_rng(5)
    x_theirs = to_dtype(x * (1 + rng.choice([-1, 0, 1], x.shape) * 2.0 ** -8), "float16")
    replaced = node("float16")
    ours = {"X": x, "Y": kernel_rms_norm(x, scale, 1e-5, "float16")}
    theirs = {"X": x_theirs, "Y": onnx_rms_norm(x_theirs, scale, 1e-5, "float16")}
    assert rewrite.check_replaced(ours, theirs, {"S": scale}, replaced)[0]
    exact = sample.rms_norm_reference(x_theirs, scale, 1e-5)
    bound = companion.engines_tolerance(replaced, np.abs(exact), scale)
    assert np.any(np.abs(ours["Y"] - theirs["Y"]) > bound)
    wrong = dict(ours, Y=to_dtype(ours["Y"] * 1.01, "float16"))  # a real error: 1 %
    assert not rewrite.check_replaced(wrong, theirs, {"S": scale}, replaced)[0]


def onnx_rms_norm_mixed(x, scale, eps, dtype, scale_dtype):
    """RMSNormalization with X `dtype` and scale `scale_dtype`: Normalized cast to X's type, then
    to the scale's (CastLike, for the Mul), times the scale, rounded to the scale's dtype, then a
    Cast back to X's dtype."""
    x32 = x.astype(np.float32)
    rms = np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + np.float32(eps))
    normalized = to_dtype(x32 / rms, dtype)
    return to_dtype(to_dtype(to_dtype(normalized, scale_dtype) * scale, scale_dtype), dtype)


@pytest.mark.parametrize("dtype, scale_dtype", [("float16", "float32"), ("bfloat16", "float32"),
                                                ("float16", "bfloat16"), ("bfloat16", "float16")])
def test_an_absorbed_cast_back_is_within_the_rounding_list_of_both_dtypes(dtype, scale_dtype):
    """X and scale of different dtypes, the Cast back absorbed (Gemma's export): the definition
    stays within the bound of the roundings the companion lists, and the bound is no wider than it
    needs for X and scale of one dtype when the scale is fp32, beyond its two fp32 roundings."""
    x, _ = case(dtype, 5)
    scale = to_dtype(np.random.default_rng(6).uniform(-1.5, 1.5, x.shape[-1]), scale_dtype)
    replaced = node(dtype, scale_dtype, "absorbed")
    exact = sample.rms_norm_reference(x, scale, 1e-5)
    theirs = onnx_rms_norm_mixed(x, scale, 1e-5, dtype, scale_dtype)
    ours = kernel_rms_norm(x, scale, 1e-5, dtype)
    bound = companion.engines_tolerance(replaced, np.abs(exact), scale)
    assert np.all(np.abs(theirs - ours) <= bound)
    relative = companion.onnx_tolerance(companion.roundings(replaced)[1])
    assert within(theirs, x, scale, 1e-5, relative)
    if scale_dtype == "float32":
        same = companion.engines_tolerance(node(dtype), np.ones(1), np.ones(1))
        assert companion.engines_tolerance(replaced, np.ones(1), np.ones(1)) < same + 3 * 2.0 ** -24


def fused(dtype, parts=2, form="rms_normalization", total="S"):
    """A node fused with its Add (or a skip op's): parts P0, P1, ... summed into S, scale W, Y."""
    return companion.Replaced("norm", form, tuple(f"P{k}" for k in range(parts)), "W", "Y", 1e-5,
                              dtype, dtype, "", fused="with the Add add", sum=total)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_fused_nodes_y_is_held_to_exact_rmsnorm_of_each_engines_own_s(dtype):
    """Both engines normalize the S they wrote, rounded as the original's Add rounds it: Y gets a
    plain node's roundings, nothing for the add. S differing between the engines (an earlier
    node's difference carried into a part) is allowed through the exact term; normalizing X
    instead of S is refused."""
    assert companion.roundings(fused(dtype)) == companion.roundings(node(dtype))
    x, scale = case(dtype, 7)
    rng = np.random.default_rng(8)
    r_ours = to_dtype(rng.standard_normal(x.shape), dtype)
    r_theirs = to_dtype(r_ours * (1 + rng.choice([-1, 0, 1], x.shape) * 2.0 ** -7), dtype)
    s_ours, s_theirs = to_dtype(x + r_ours, dtype), to_dtype(x + r_theirs, dtype)
    ours = {"P0": x, "P1": r_ours, "S": s_ours, "Y": kernel_rms_norm(s_ours, scale, 1e-5, dtype)}
    theirs = {"P0": x, "P1": r_theirs, "S": s_theirs,
              "Y": onnx_rms_norm(s_theirs, scale, 1e-5, dtype)}
    assert companion.check_replaced(ours, theirs, {"W": scale}, fused(dtype))[0]
    assert companion.check_sum(ours, theirs, {"W": scale}, fused(dtype))[0]
    wrong = dict(ours, Y=kernel_rms_norm(x, scale, 1e-5, dtype))
    assert not companion.check_replaced(wrong, theirs, {"W": scale}, fused(dtype))[0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_skip_ops_y_is_allowed_the_sum_it_normalizes_before_rounding(dtype):
    """onnxruntime's skip op normalizes its FP32 sum and rounds S apart, so its Y is up to 2u
    further from exact RMSNorm of the S it reports: that side's roundings list two more, and its
    Y passes the check."""
    skip = fused(dtype, form="skip_simplified_layer_normalization_and_sum")
    assert companion.roundings(skip)[1] == companion.roundings(node(dtype))[1] + [dtype] * 2
    assert companion.roundings(skip)[0] == companion.roundings(node(dtype))[0]
    x, scale = case(dtype, 9)
    r = to_dtype(np.random.default_rng(10).standard_normal(x.shape), dtype)
    s = to_dtype(x + r, dtype)
    ours = {"P0": x, "P1": r, "S": s, "Y": kernel_rms_norm(s, scale, 1e-5, dtype)}
    theirs = dict(ours, Y=kernel_rms_norm(x + r, scale, 1e-5, dtype))  # S not yet rounded
    assert companion.check_replaced(ours, theirs, {"W": scale}, skip)[0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_biased_skip_sum_is_allowed_a_rounding_per_add_of_the_parts_magnitudes(dtype):
    """The plugin's S is input + (skip + bias), each add rounded; onnxruntime's kernel sums the
    three in FP32 and rounds once. Where the parts cancel, the extra rounding of skip + bias is
    many ulps of S: check_sum bounds each add by u of the parts' magnitudes, accepts both orders,
    and refuses an S off by 5u of them."""
    rng = np.random.default_rng(11)
    x = to_dtype(rng.standard_normal((64, 256)) * 8, dtype)
    bias = to_dtype(rng.uniform(-1, 1, 256), dtype)
    skip = to_dtype(-x + rng.standard_normal(x.shape) * 2.0 ** -4, dtype)  # nearly cancels x
    ours = {"P0": x, "P1": skip, "S": to_dtype(x + to_dtype(skip + bias, dtype), dtype)}
    theirs = dict(ours, S=to_dtype(x + skip + bias, dtype))
    biased = fused(dtype, parts=3)
    assert companion.check_sum(ours, theirs, {"P2": bias}, biased)[0]
    ulp = np.spacing(np.abs(theirs["S"]).astype(np.float32)) * 2.0 ** (23 - FRACTION_BITS[dtype])
    assert np.any(np.abs(ours["S"] - theirs["S"]) > ulp), "more than an ulp of S apart somewhere"
    magnitude = np.abs(x) + np.abs(skip) + np.abs(bias)
    off = dict(ours, S=theirs["S"] + 5 * companion.rounding_error(dtype) * magnitude)
    assert not companion.check_sum(off, theirs, {"P2": bias}, biased)[0]
