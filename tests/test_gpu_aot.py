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


def launch_like_tensorrt(function, plan, x, w, y, num_tokens, stream):
    from cuda.bindings import driver as cu

    grid, block, smem = aot.aot_launch_dims(plan, num_tokens)
    args = [np.array([x.data_ptr()], np.uint64), np.array([w.data_ptr()], np.uint64),
            np.array([num_tokens], np.int32), np.array([y.data_ptr()], np.uint64)]
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
            launch_like_tensorrt(function, plan, xd, wd, y, tokens, stream)
            stream.synchronize()
            good, err = sample.check_output(y.float().cpu().numpy(), x.float().numpy(), w.float().numpy(), EPS, dtype)
            assert good, f"{tokens} tokens: max abs error {err:.3e}"
    finally:
        ok(cu.cuModuleUnload(module))
