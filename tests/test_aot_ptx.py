"""CPU: the AOT flavor's PTX has TensorRT's AOT calling convention and a PTX version drivers accept."""

import functools
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


# The residual form at every dtype pair, and per X dtype at sizes that take each way of holding X and R: in
# registers (1, 100, 16384), staged (4096 in 16 bits; 12280 fp16 and 6140 fp32, 48 KB less 8 bytes with the warp
# sums) and in registers again where staging would pass 48 KB (12288 bf16, 6144 fp32).
RESIDUAL_CASES = ([(x, w, 1024) for x, w in COMBINATIONS]
                  + [(x, "float32", h) for x in ("float16", "bfloat16", "float32") for h in (1, 100, 4096, 16384)]
                  + [("float16", "float32", 12280), ("bfloat16", "float32", 12288), ("float32", "float32", 6140),
                     ("float32", "float32", 6144)])


@functools.cache
def residual_kernel(dtype, w_dtype, hidden, arch):
    """aot_kernel's residual form, compiled once for the tests that read and assemble it."""
    return aot.aot_kernel(dtype, hidden, 1e-5, arch, w_dtype, residual=True)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype, w_dtype, hidden", RESIDUAL_CASES)
def test_residual_entry_is_x_r_w_num_tokens_y_s(arch, dtype, w_dtype, hidden):
    """The fused op's inputs (X, R, W), its extra int32, its outputs (Y, S): 3 pointers, a u32, 2 pointers."""
    name, ptx, plan = residual_kernel(dtype, w_dtype, hidden, arch)
    entries = re.findall(r"^\.visible \.entry (\w+)\(([^)]*)\)", ptx, re.M)
    assert [e[0] for e in entries] == [name]
    params = re.findall(r"\.param \.(\w+)[^,]* \w+_param_(\d+)", entries[0][1])
    assert params == [("u64", "0"), ("u64", "1"), ("u64", "2"), ("u32", "3"), ("u64", "4"), ("u64", "5")]
    assert plan.residual and plan.num_row_inputs == 2 and str(plan) in name
    assert re.search(rf"^\.target {arch}\b", ptx, re.M)
    assert re.search(rf"^\.version {re.escape(aot.AOT_PTX_ISA[arch])}$", ptx, re.M)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype, w_dtype", COMBINATIONS)
@pytest.mark.parametrize("hidden", [7, 1024, 16384])
def test_ptx_assembles_at_the_chosen_isa_version(tmp_path, arch, dtype, w_dtype, hidden):
    """ptxas refuses an instruction newer than the declared .version: the version is honest."""
    assemble(tmp_path, arch, aot.aot_kernel(dtype, hidden, 1e-5, arch, w_dtype)[1])


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype, w_dtype, hidden", RESIDUAL_CASES)
def test_residual_ptx_assembles_at_the_chosen_isa_version(tmp_path, arch, dtype, w_dtype, hidden):
    assemble(tmp_path, arch, residual_kernel(dtype, w_dtype, hidden, arch)[1])


def assemble(tmp_path, arch, ptx):
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


@pytest.mark.parametrize("dtype, w_dtype, hidden", RESIDUAL_CASES[9:] + [("float16", "float32", sample.MAX_HIDDEN)])
def test_the_residual_forms_shared_memory_is_what_cutedsl_allocates(dtype, w_dtype, hidden):
    """As above for the fused op, whose staged plans keep R beside X: its one-plan launcher compiled as aot_kernel
    compiles it (compile_rms_norm would plan without the 48 KB rule)."""
    from support.check_kernel import compile_plan, launch_shared_memory

    plan = aot.aot_plan(hidden, sample.DTYPES[dtype].bytes, residual=True)
    inferred = launch_shared_memory(compile_plan(sample, dtype, plan, "sm_90a", w_dtype))
    for tokens in (1, 37, 512):
        assert aot.aot_launch_dims(plan, tokens)[2] == inferred
    assert inferred <= aot.AOT_SHARED_BYTES == 48 * 1024


@pytest.mark.parametrize("elem_bytes, fits, too_long", [(2, 12280, 12288), (4, 6140, 6144)])
def test_the_residual_form_stages_its_rows_only_within_48_kb(elem_bytes, fits, too_long):
    """Hand-derived: X and R of hidden 12280 in 16 bits take 2 x 24560 bytes, and 6 warps' sums 24: 48 KB less 8,
    so they stay staged; one vector more (12288) needs 48 KB + 24, which TensorRT's launch would refuse, so the
    rows move to registers. fp32 the same at half the elements. The sample's plan, made for a launch that opts
    in to more, stages both."""
    assert aot.aot_plan(fits, elem_bytes, residual=True).arrival == "cp.async"
    assert aot.shared_memory_bytes(aot.aot_plan(fits, elem_bytes, residual=True)) == 2 * 24560 + 24
    assert sample.plan_kernel(too_long, elem_bytes, sm90=False, residual=True).arrival == "cp.async"
    plan = aot.aot_plan(too_long, elem_bytes, residual=True)
    assert plan.arrival == "registers" and aot.shared_memory_bytes(plan) == 24
    assert sample.registers_needed(plan) <= sample.register_ceiling(plan), "refitted to its registers"


def test_unknown_arch_is_refused():
    with pytest.raises(sample.UsageError, match="sm_70"):
        aot.aot_kernel("float16", 1024, 1e-5, "sm_70")
