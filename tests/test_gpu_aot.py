"""GPU: the AOT flavor's PTX, loaded and launched the way TensorRT's AOT launcher does it.

No TensorRT and no CuteDSL runtime are involved in the launch: the PTX goes
to the driver with cuModuleLoadData, and cuLaunchKernel receives a parameter
buffer laid out as TensorRT lays it out for an AOT plugin (one pointer per
argument: input pointers, then the extra arguments, then output pointers)
with the grid, block and shared memory that aot_launch_dims computes. A
mismatch in order or types would not fail the launch; it would read garbage,
which the NumPy comparison catches.
"""

import re

import numpy as np
import pytest

import rms_norm_aot_cutedsl as aot
import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as sample

pytestmark = pytest.mark.gpu

EPS = 1e-5


def ok(result):
    from cuda.bindings import driver as cu

    err, *values = result if isinstance(result, tuple) else (result,)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return values[0] if len(values) == 1 else values


@pytest.fixture(scope="module")
def arch():
    import torch

    torch.zeros(1, device="cuda")  # makes the primary context current for the driver API
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def load_function(ptx: str, name: str):
    from cuda.bindings import driver as cu

    module = ok(cu.cuModuleLoadData(ptx.encode() + b"\0"))
    return module, ok(cu.cuModuleGetFunction(module, name.encode()))


def launch_like_tensorrt(function, plan, inputs, num_tokens, outputs, stream):
    """Input pointers, then num_tokens (the extra int32), then output pointers: one kernelParams
    entry each."""
    from cuda.bindings import driver as cu

    grid, block, smem = aot.aot_launch_dims(plan, num_tokens)
    args = ([np.array([t.data_ptr()], np.uint64) for t in inputs]
            + [np.array([num_tokens], np.int32)]
            + [np.array([t.data_ptr()], np.uint64) for t in outputs])
    params = np.array([a.ctypes.data for a in args], dtype=np.uint64)  # void* kernelParams[]
    ok(cu.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, smem, cu.CUstream(stream.cuda_stream),
                         params.ctypes.data, 0))


@pytest.mark.parametrize("dtype, w_dtype", [(x, w) for x in ("float16", "bfloat16", "float32")
                                             for w in ("float32", "float16", "bfloat16")])
# 2048-5120: staged rows.
@pytest.mark.parametrize("hidden", [100, 1024, 2048, 2560, 4096, 5120, 16384])
def test_aot_ptx_runs_under_tensorrts_calling_convention(arch, dtype, w_dtype, hidden):
    import torch

    from cuda.bindings import driver as cu

    name, ptx, plan = aot.aot_kernel(dtype, hidden, EPS, arch, w_dtype)
    assert re.search(rf"^\.version {re.escape(aot.AOT_PTX_ISA[arch])}$", ptx, re.M)
    module, function = load_function(ptx, name)
    stream = torch.cuda.Stream()
    try:
        for tokens in (1, 37, 128, 512):
            x, w = sample.make_inputs(tokens, hidden, dtype, tokens + hidden, w_dtype)
            xd, wd = x.cuda(), w.cuda()
            y = torch.full_like(xd, float("nan"))
            torch.cuda.synchronize()
            launch_like_tensorrt(function, plan, (xd, wd), tokens, (y,), stream)
            stream.synchronize()
            good, err = sample.check_output(y.float().cpu().numpy(), x.float().numpy(),
                                            w.float().numpy(), EPS, dtype)
            assert good, f"{tokens} tokens: max abs error {err:.3e}"
    finally:
        ok(cu.cuModuleUnload(module))


# Rows in registers (100, 2048 in 16 bits, 4096 in fp32), staged X and R (4096 in 16 bits, 2048 in
# fp32, and 12280 in fp16 and 6140 in fp32: 48 KB less 8 bytes, the most a launch without the
# opt-in gets), rows in registers again where staging would pass 48 KB (12288 in 16 bits, 6144 in
# fp32), and R added a vector at a time where X and R do not both fit the registers (19457 in
# fp16, 16388 in fp32).
RESIDUAL_HIDDEN = {"float16": [100, 2048, 4096, 12280, 12288, 19457],
                   "bfloat16": [100, 4096, 12288],
                   "float32": [100, 2048, 4096, 6140, 6144, 16388]}


@pytest.mark.parametrize("dtype, hidden",
                         [(d, h) for d, sizes in RESIDUAL_HIDDEN.items() for h in sizes])
def test_residual_aot_ptx_runs_under_tensorrts_calling_convention(arch, dtype, hidden):
    """The fused op's PTX with (X, R, W, num_tokens, Y, S) as TensorRT passes them: S bit for bit
    x + r rounded to X's dtype, Y the norm of S. A swapped pointer reads the wrong row or writes
    the wrong output, which fails."""
    import torch

    from cuda.bindings import driver as cu

    name, ptx, plan = aot.aot_kernel(dtype, hidden, EPS, arch, "float32", residual=True)
    module, function = load_function(ptx, name)
    stream = torch.cuda.Stream()
    try:
        for tokens in (1, 37, 512):
            seed = tokens * 7919 + hidden
            x, w = sample.make_inputs(tokens, hidden, dtype, seed)
            r = fused.make_residual(tokens, hidden, dtype, seed)
            xd, rd, wd = x.cuda(), r.cuda(), w.cuda()
            # Unwritten, NaN fails.
            y, s = torch.full_like(xd, float("nan")), torch.full_like(xd, float("nan"))
            torch.cuda.synchronize()
            launch_like_tensorrt(function, plan, (xd, rd, wd), tokens, (y, s), stream)
            stream.synchronize()
            s_ref = fused.residual_reference(x, r)
            assert not torch.equal(s_ref, x), "R must change S"
            assert torch.equal(s.cpu(), s_ref), f"{tokens} tokens: S differs from x + r"
            good, err = sample.check_output(y.float().cpu().numpy(), s_ref.float().numpy(),
                                            w.float().numpy(), EPS, dtype)
            assert good, f"{tokens} tokens: max abs error {err:.3e}"
    finally:
        ok(cu.cuModuleUnload(module))


# The FP8 form: Y stored as FP8 E4M3 of y / y_scale. The kernel computes y in FP32 with an
# approximate rsqrt, so where the float64 y lies within 2^-16 (relative) of a midpoint between two
# FP8 values, either neighbour is right; everywhere else only the float64 reference's rounding is.
FP8_SLACK = 2.0 ** -16
# 2^-7 sends the largest |y| (about 7) past 448, where the cvt saturates; 0.3 is not a power of
# two; 16 puts most of Y below 2^-6, among E4M3's subnormals.
FP8_SCALES = [2.0 ** -7, 0.3, 16.0]


def decode_e4m3(bits: np.ndarray) -> np.ndarray:
    """FP8 E4M3 bytes as float64, by the format's definition (fn: no infinities, S.1111.111 NaN)."""
    bits = bits.astype(np.int64)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    exponent, mantissa = (bits >> 3) & 0xF, bits & 0x7
    normal = (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    value = sign * np.where(exponent == 0, mantissa * 2.0 ** -9, normal)
    return np.where((exponent == 0xF) & (mantissa == 0x7), np.nan, value)


def fp8_bounds(y64: np.ndarray, y_scale: float):
    """The lowest and highest FP8 value (as float64) the kernel may store for each float64 y: the
    references of y moved 2^-16 either way, equal unless a rounding midpoint lies that close (the
    rounding is monotonic)."""
    a = fused.quantize_reference(y64 * (1 - FP8_SLACK), y_scale)
    b = fused.quantize_reference(y64 * (1 + FP8_SLACK), y_scale)
    return np.minimum(a, b), np.maximum(a, b)


def check_fp8(y_bits, y64, y_scale, what):
    """Y within fp8_bounds everywhere (an unwritten 0x7F byte is NaN: fails); the bounds tight."""
    low, high = fp8_bounds(y64, y_scale)
    y = decode_e4m3(y_bits)
    bad = ~((low <= y) & (y <= high))
    assert not bad.any(), (f"{what}: {bad.sum()} of {y.size} FP8 values off, e.g. {y[bad][:4]} for "
                           f"{(y64 / y_scale)[bad][:4]}")
    assert np.mean(low != high) < 0.01, "either neighbour is allowed only near a midpoint"


@pytest.fixture(scope="module")
def fp8_arch(arch):
    if not fused.has_fp8(arch):
        pytest.skip(f"{arch} has no FP8 conversion; the FP8 form needs sm_89 or newer")
    return arch


@pytest.mark.parametrize("y_scale", FP8_SCALES)
@pytest.mark.parametrize("dtype, w_dtype, hidden", [
    ("float16", "float32", 1024), ("bfloat16", "float32", 4096), ("float32", "float32", 2048),
    ("float16", "bfloat16", 100), ("bfloat16", "float16", 16384), ("float32", "float16", 7)])
def test_fp8_aot_ptx_runs_under_tensorrts_calling_convention(fp8_arch, y_scale, dtype, w_dtype,
                                                            hidden):
    """rms_norm_fp8's PTX with (X, W, num_tokens, Y) as TensorRT passes them, Y a byte each."""
    import torch

    from cuda.bindings import driver as cu

    name, ptx, plan = aot.aot_kernel(dtype, hidden, EPS, fp8_arch, w_dtype, y_scale=y_scale)
    assert re.search(rf"^\.version {re.escape(aot.AOT_FP8_PTX_ISA[fp8_arch])}$", ptx, re.M)
    module, function = load_function(ptx, name)
    stream = torch.cuda.Stream()
    try:
        for tokens in (1, 37, 512):
            x, w = sample.make_inputs(tokens, hidden, dtype, tokens + hidden, w_dtype)
            xd, wd = x.cuda(), w.cuda()
            # 0x7F: E4M3's NaN, which fails wherever the kernel leaves it.
            y = torch.full((tokens, hidden), 0x7F, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            launch_like_tensorrt(function, plan, (xd, wd), tokens, (y,), stream)
            stream.synchronize()
            y64 = sample.rms_norm_reference(x.double().numpy(), w.double().numpy(), EPS)
            check_fp8(y.cpu().numpy(), y64, fused.validate_y_scale(y_scale), f"{tokens} tokens")
    finally:
        ok(cu.cuModuleUnload(module))


@pytest.mark.parametrize("y_scale", FP8_SCALES)
@pytest.mark.parametrize("dtype, hidden", [("float16", 1024), ("bfloat16", 4096), ("float32", 6144),
                                           ("float16", 12288)])
def test_fused_fp8_aot_ptx_runs_under_tensorrts_calling_convention(fp8_arch, y_scale, dtype,
                                                                   hidden):
    """add_rms_norm_fp8's PTX with (X, R, W, num_tokens, Y, S): S bit for bit x + r in X's dtype,
    Y its norm in FP8; rows staged with R (4096 bf16), in registers past 48 KB (6144 fp32, 12288
    fp16)."""
    import torch

    from cuda.bindings import driver as cu

    name, ptx, plan = aot.aot_kernel(dtype, hidden, EPS, fp8_arch, "float32", True, y_scale)
    module, function = load_function(ptx, name)
    stream = torch.cuda.Stream()
    try:
        for tokens in (1, 37, 512):
            seed = tokens * 7919 + hidden
            x, w = sample.make_inputs(tokens, hidden, dtype, seed)
            r = fused.make_residual(tokens, hidden, dtype, seed)
            xd, rd, wd = x.cuda(), r.cuda(), w.cuda()
            y = torch.full((tokens, hidden), 0x7F, dtype=torch.uint8, device="cuda")
            s = torch.full_like(xd, float("nan"))
            torch.cuda.synchronize()
            launch_like_tensorrt(function, plan, (xd, rd, wd), tokens, (y, s), stream)
            stream.synchronize()
            s_ref = fused.residual_reference(x, r)
            assert torch.equal(s.cpu(), s_ref), f"{tokens} tokens: S differs from x + r"
            y64 = sample.rms_norm_reference(s_ref.double().numpy(), w.double().numpy(), EPS)
            check_fp8(y.cpu().numpy(), y64, fused.validate_y_scale(y_scale), f"{tokens} tokens")
    finally:
        ok(cu.cuModuleUnload(module))
