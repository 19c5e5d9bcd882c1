"""CPU: the AOT flavor's PTX has TensorRT's AOT calling convention and a PTX version drivers accept."""

import re
import shutil
import struct
import subprocess

import pytest

import rms_norm_aot_cutedsl as aot
import rms_norm_plugin_cutedsl as sample

ARCHES = ["sm_80", "sm_90a"]
COMBINATIONS = [(x, w) for x in ("float16", "bfloat16", "float32") for w in ("float32", "float16", "bfloat16")]


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype, w_dtype", COMBINATIONS)
@pytest.mark.parametrize("hidden", [1, 100, 1024, 4096, 16384])
def test_entry_is_x_w_num_tokens_y(arch, dtype, w_dtype, hidden):
    """TensorRT passes input pointers, the extra int32 arguments, then output pointers."""
    name, ptx, _ = aot.aot_kernel(dtype, hidden, 1e-5, arch, w_dtype)
    entries = re.findall(r"^\.visible \.entry (\w+)\(([^)]*)\)", ptx, re.M)
    assert [e[0] for e in entries] == [name]
    assert re.findall(r"\.param \.(\w+)", entries[0][1]) == ["u64", "u64", "u32", "u64"]
    assert re.search(rf"^\.target {arch}\b", ptx, re.M)
    assert re.search(rf"^\.version {re.escape(aot.AOT_PTX_ISA[arch])}$", ptx, re.M)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype, w_dtype", COMBINATIONS)
@pytest.mark.parametrize("hidden", [7, 1024, 16384])
def test_ptx_assembles_at_the_chosen_isa_version(tmp_path, arch, dtype, w_dtype, hidden):
    """ptxas refuses an instruction newer than the declared .version: the version is honest."""
    _, ptx, _ = aot.aot_kernel(dtype, hidden, 1e-5, arch, w_dtype)
    path = tmp_path / "k.ptx"
    path.write_text(ptx)
    proc = subprocess.run(["ptxas", f"-arch={arch}", str(path), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def f32_literal(value):
    """How PTX writes a float32 immediate: 0f + the IEEE bits in hex."""
    return "0f%08X" % struct.unpack(">I", struct.pack(">f", value))[0]


def test_epsilon_is_baked_into_the_ptx():
    """AOT extra arguments are int32 only, so epsilon travels as an immediate in the PTX."""
    ptx_1e3 = aot.aot_kernel("float16", 1024, 1e-3, "sm_90a")[1]
    ptx_1e5 = aot.aot_kernel("float16", 1024, 1e-5, "sm_90a")[1]
    assert f32_literal(1e-3) in ptx_1e3 and f32_literal(1e-3) not in ptx_1e5


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("hidden", [1, 100, 1024, 2560, 4096, 5120, 8192, 16384])
@pytest.mark.parametrize("tokens", [1, 37, 512])
def test_launch_dims_cover_every_row_with_the_threads_the_ptx_requires(dtype, hidden, tokens):
    name, ptx, plan = aot.aot_kernel(dtype, hidden, 1e-5, "sm_90a")
    assert str(plan) in name, "the plan returned is the one the PTX was compiled with (its name carries it)"
    grid, block, smem = aot.aot_launch_dims(plan, tokens)
    assert (grid - 1) * plan.rows_per_cta < tokens <= grid * plan.rows_per_cta
    assert re.search(rf"\.reqntid {block}, 1, 1", ptx)
    assert (smem > 0) == ("__dynamic_shmem__" in ptx and "st.shared" in ptx)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("hidden", [1, 100, 1024, 2048, 2560, 3072, 4096, 5120, 8192, 16384, sample.MAX_HIDDEN])
def test_the_shared_memory_asked_of_tensorrt_is_what_cutedsl_allocates(dtype, hidden):
    """TensorRT gives the AOT kernel exactly the dynamic shared memory aot_launch_dims asks for: it must equal the
    size CuteDSL itself computed for the launch (support/check_kernel.py reads it from the host code), and stay
    within the 48 KB a launch gets without an opt-in attribute, which TensorRT's AOT launch does not set."""
    from support.check_kernel import launch_shared_memory

    plan = aot.aot_kernel(dtype, hidden, 1e-5, "sm_90a")[2]
    compiled = sample.compile_rms_norm(dtype, hidden, 1e-5, arch="sm_90a", plans_by_tokens=False)
    for tokens in (1, 37, 512):
        assert aot.aot_launch_dims(plan, tokens)[2] == launch_shared_memory(compiled)
    assert launch_shared_memory(compiled) <= 48 * 1024


def test_unknown_arch_is_refused():
    with pytest.raises(sample.UsageError, match="sm_70"):
        aot.aot_kernel("float16", 1024, 1e-5, "sm_70")
