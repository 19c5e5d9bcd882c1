"""CPU: what --compare-builtin's network of TensorRT layers computes, evaluated layer by layer with NumPy.

The network is built by the sample's define_builtin_network with TensorRT-RTX's
real bindings (which build networks without a GPU); tests/network_numpy.py then
evaluates its layers. The expected values come from the RMSNorm formula in
float64, written here; the bound is one ulp of a 16-bit output dtype (2^-10 for
fp16, 2^-7 for bf16, relative), as the network computes in FP32 and rounds once,
and 2^-18 for fp32 output, where only FP32 arithmetic differs (64 u; a few
roundings of a pairwise sum, a square root and a division need far less).
"""


import numpy as np
import pytest
import torch

import network_numpy

BOUND = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -18}
ATOL = {"float16": 1e-6, "bfloat16": 1e-6, "float32": 1e-30}  # fp16's subnormals; FP32 results are normal here


@pytest.fixture(scope="module")
def trt():
    return pytest.importorskip("tensorrt_rtx")


def rms_norm_float64(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).sum(axis=1, keepdims=True) / x.shape[1] + eps) * w.astype(np.float64)


def rounded(values, dtype):
    """float32 values rounded to `dtype`, fed as the evaluator takes them (bf16 as float32 carriers)."""
    r = torch.from_numpy(np.ascontiguousarray(values, np.float32)).to(getattr(torch, dtype))
    return r.numpy() if dtype == "float16" else r.float().numpy()


@pytest.mark.parametrize("dtype, w_dtype", [(x, w) for x in ("float16", "bfloat16", "float32")
                                            for w in ("float32", "float16", "bfloat16")])
@pytest.mark.parametrize("hidden, eps", [(64, 1e-5), (1000, 1e-2)])
def test_builtin_network_computes_rms_norm(sample_rtx, trt, dtype, w_dtype, hidden, eps):
    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    keep_alive = sample_rtx.define_builtin_network(network, hidden, dtype, eps, w_dtype)  # noqa: F841
    rng = np.random.default_rng(hidden)
    x = torch.from_numpy(rng.standard_normal((5, hidden), dtype=np.float32) * 3)
    x[1] *= 1e-3  # a small row, where epsilon matters
    x_feed = rounded(x, dtype)
    w_feed = rounded(rng.uniform(-0.5, 1.5, hidden), w_dtype)
    y = network_numpy.evaluate(trt, network, {"X": x_feed, "W": w_feed})["Y"]
    assert y.dtype == (np.float16 if dtype == "float16" else np.float32)
    ref = rms_norm_float64(x_feed, w_feed, eps)
    assert y.shape == ref.shape
    err = np.abs(y.astype(np.float64) - ref)
    assert np.all(err <= BOUND[dtype] * np.abs(ref) + ATOL[dtype]), f"max error {err.max():.3e}"


def test_the_evaluator_refuses_layers_it_does_not_know(trt):
    """Guards the evaluator: an unknown layer kind is an error, not a silent pass-through."""
    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    x = network.add_input("X", trt.DataType.FLOAT, (2, 3))
    network.mark_output(network.add_identity(x).get_output(0))
    with pytest.raises(NotImplementedError, match="IDENTITY"):
        network_numpy.evaluate(trt, network, {"X": np.zeros((2, 3), np.float32)})
