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
    """Input pointers, then num_tokens (the extra int32), then output pointers: one kernelParams entry each."""
    from cuda.bindings import driver as cu

    grid, block, smem = aot.aot_launch_dims(plan, num_tokens)
    args = ([np.array([t.data_ptr()], np.uint64) for t in inputs] + [np.array([num_tokens], np.int32)]
            + [np.array([t.data_ptr()], np.uint64) for t in outputs])
    params = np.array([a.ctypes.data for a in args], dtype=np.uint64)  # void* kernelParams[]
    ok(cu.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, smem, cu.CUstream(stream.cuda_stream),
                         params.ctypes.data, 0))


@pytest.mark.parametrize("dtype, w_dtype", [(x, w) for x in ("float16", "bfloat16", "float32")
                                             for w in ("float32", "float16", "bfloat16")])
@pytest.mark.parametrize("hidden", [100, 1024, 2048, 2560, 4096, 5120, 16384])  # 2048-5120: staged rows
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
            good, err = sample.check_output(y.float().cpu().numpy(), x.float().numpy(), w.float().numpy(), EPS, dtype)
            assert good, f"{tokens} tokens: max abs error {err:.3e}"
    finally:
        ok(cu.cuModuleUnload(module))


# Rows in registers (100, 2048 in 16 bits, 4096 in fp32), staged X and R (4096 in 16 bits, 2048 in fp32, and 12280
# in fp16 and 6140 in fp32: 48 KB less 8 bytes, the most a launch without the opt-in gets) and rows in registers
# again where staging would pass 48 KB (12288 in 16 bits, 6144 in fp32).
RESIDUAL_HIDDEN = {"float16": [100, 2048, 4096, 12280, 12288], "bfloat16": [100, 4096, 12288],
                   "float32": [100, 2048, 4096, 6140, 6144]}


@pytest.mark.parametrize("dtype, hidden", [(d, h) for d, sizes in RESIDUAL_HIDDEN.items() for h in sizes])
def test_residual_aot_ptx_runs_under_tensorrts_calling_convention(arch, dtype, hidden):
    """The fused op's PTX with (X, R, W, num_tokens, Y, S) as TensorRT passes them: S bit for bit x + r rounded
    to X's dtype, Y the norm of S. A swapped pointer reads the wrong row or writes the wrong output, which fails."""
    import torch

    from cuda.bindings import driver as cu

    name, ptx, plan = aot.aot_kernel(dtype, hidden, EPS, arch, "float32", residual=True)
    module, function = load_function(ptx, name)
    stream = torch.cuda.Stream()
    try:
        for tokens in (1, 37, 512):
            seed = tokens * 7919 + hidden
            x, w = sample.make_inputs(tokens, hidden, dtype, seed)
            r = sample.make_residual(tokens, hidden, dtype, seed)
            xd, rd, wd = x.cuda(), r.cuda(), w.cuda()
            y, s = torch.full_like(xd, float("nan")), torch.full_like(xd, float("nan"))  # unwritten: NaN fails
            torch.cuda.synchronize()
            launch_like_tensorrt(function, plan, (xd, rd, wd), tokens, (y, s), stream)
            stream.synchronize()
            s_ref = sample.residual_reference(x, r)
            assert not torch.equal(s_ref, x), "R must change S"
            assert torch.equal(s.cpu(), s_ref), f"{tokens} tokens: S differs from x + r"
            good, err = sample.check_output(y.float().cpu().numpy(), s_ref.float().numpy(), w.float().numpy(), EPS,
                                            dtype)
            assert good, f"{tokens} tokens: max abs error {err:.3e}"
    finally:
        ok(cu.cuModuleUnload(module))
