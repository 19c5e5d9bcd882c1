"""CPU: the AOT flavor's PTX has TensorRT's AOT calling convention and a PTX version drivers
accept."""

import functools
import re
import shutil
import struct
import subprocess

import pytest

import rms_norm_aot_cutedsl as aot
import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as sample
from support.check_kernel import launch_shared_memory

ARCHES = ["sm_80", "sm_90a"]
COMBINATIONS = [(x, w) for x in ("float16", "bfloat16", "float32")
                for w in ("float32", "float16", "bfloat16")]


@functools.cache
def kernel(dtype, w_dtype, hidden, arch, residual=False, y_scale=None):
    """(name, PTX, plan, shared memory) of aot_kernel at epsilon 1e-5, compiled once a session for
    every test that reads, assembles or measures it. The shared memory is what CuteDSL computed
    for the launch of the very launcher aot_kernel took its PTX from (its host code stores it)."""
    launchers = []
    compile_launcher = fused.compile_launcher

    def keep(*args, **kwargs):
        launchers.append(compile_launcher(*args, **kwargs))
        return launchers[-1]

    fused.compile_launcher = keep  # a spy: the launcher is compiled as aot_kernel asks
    try:
        name, ptx, plan = aot.aot_kernel(dtype, hidden, 1e-5, arch, w_dtype, residual, y_scale)
    finally:
        fused.compile_launcher = compile_launcher
    (launcher,) = launchers
    return name, ptx, plan, launch_shared_memory(launcher)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype, w_dtype", COMBINATIONS)
@pytest.mark.parametrize("hidden", [1, 100, 1024, 4096, 16384])
def test_entry_is_x_w_num_tokens_y(arch, dtype, w_dtype, hidden):
    """TensorRT passes input pointers, the extra int32 arguments, then output pointers."""
    name, ptx, _, _ = kernel(dtype, w_dtype, hidden, arch)
    entries = re.findall(r"^\.visible \.entry (\w+)\(([^)]*)\)", ptx, re.M)
    assert [e[0] for e in entries] == [name]
    assert re.findall(r"\.param \.(\w+)", entries[0][1]) == ["u64", "u64", "u32", "u64"]
    assert re.search(rf"^\.target {arch}\b", ptx, re.M)
    assert re.search(rf"^\.version {re.escape(aot.AOT_PTX_ISA[arch])}$", ptx, re.M)


# The residual form at every dtype pair, and per X dtype at sizes that take each way of holding X
# and R: in registers (1, 100, 16384), staged (4096 in 16 bits; 12280 fp16 and 6140 fp32, 48 KB
# less 8 bytes with the warp sums) and in registers again where staging would pass 48 KB (12288
# bf16, 6144 fp32).
RESIDUAL_CASES = ([(x, w, 1024) for x, w in COMBINATIONS]
                  + [(x, "float32", h) for x in ("float16", "bfloat16", "float32")
                     for h in (1, 100, 4096, 16384)]
                  + [("float16", "float32", 12280), ("bfloat16", "float32", 12288),
                     ("float32", "float32", 6140), ("float32", "float32", 6144)])


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype, w_dtype, hidden", RESIDUAL_CASES)
def test_residual_entry_is_x_r_w_num_tokens_y_s(arch, dtype, w_dtype, hidden):
    """The fused op's inputs (X, R, W), its extra int32, its outputs (Y, S): 3 pointers, a u32,
    2 pointers."""
    name, ptx, plan, _ = kernel(dtype, w_dtype, hidden, arch, residual=True)
    entries = re.findall(r"^\.visible \.entry (\w+)\(([^)]*)\)", ptx, re.M)
    assert [e[0] for e in entries] == [name]
    params = re.findall(r"\.param \.(\w+)[^,]* \w+_param_(\d+)", entries[0][1])
    assert params == [("u64", "0"), ("u64", "1"), ("u64", "2"), ("u32", "3"), ("u64", "4"),
                      ("u64", "5")]
    assert plan.residual and plan.num_row_inputs == 2 and str(plan) in name
    assert re.search(rf"^\.target {arch}\b", ptx, re.M)
    assert re.search(rf"^\.version {re.escape(aot.AOT_PTX_ISA[arch])}$", ptx, re.M)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype, w_dtype", COMBINATIONS)
@pytest.mark.parametrize("hidden", [7, 1024, 16384])
def test_ptx_assembles_at_the_chosen_isa_version(tmp_path, arch, dtype, w_dtype, hidden):
    """ptxas refuses an instruction newer than the declared .version: the version is honest."""
    assemble(tmp_path, arch, kernel(dtype, w_dtype, hidden, arch)[1])


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype, w_dtype, hidden", RESIDUAL_CASES)
def test_residual_ptx_assembles_at_the_chosen_isa_version(tmp_path, arch, dtype, w_dtype, hidden):
    assemble(tmp_path, arch, kernel(dtype, w_dtype, hidden, arch, residual=True)[1])


# Residual rows whose X and R do not both fit a thread's registers, the first of each kind: R is
# added a vector at a time (the companion's last fit step) from 16388 fp32 elements and from 19457
# 16-bit ones (2-byte vectors). Their kernel names cut the plan's tag, so the plan is checked here.
R_BY_VECTOR_CASES = [("float32", "float32", 16388), ("float16", "float32", 19457)]


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype, w_dtype, hidden", R_BY_VECTOR_CASES)
def test_residual_rows_past_the_registers_take_r_a_vector_at_a_time(tmp_path, arch, dtype, w_dtype,
                                                                    hidden):
    name, ptx, plan, inferred = kernel(dtype, w_dtype, hidden, arch, residual=True)
    assert plan.residual_by_vector and plan.registers_needed() <= plan.register_ceiling()
    (entry,) = re.findall(rf"^\.visible \.entry {name}\(([^)]*)\)", ptx, re.M)
    assert re.findall(r"\.param \.(\w+)", entry) == ["u64", "u64", "u64", "u32", "u64", "u64"]
    assert aot.aot_launch_dims(plan, 37)[2] == inferred
    assemble(tmp_path, arch, ptx)


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
    ptx_1e5 = kernel("float16", "float32", 1024, "sm_90a")[1]
    assert f32_literal(1e-3) in ptx_1e3 and f32_literal(1e-3) not in ptx_1e5


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("hidden", [1, 100, 1024, 2560, 4096, 5120, 8192, 16384])
def test_launch_dims_cover_every_row_with_the_threads_the_ptx_requires(dtype, hidden):
    name, ptx, plan, _ = kernel(dtype, "float32", hidden, "sm_90a")
    assert str(plan) in name, ("the plan returned is the one the PTX was compiled with (its name "
                               "carries it)")
    assert re.search(rf"\.reqntid {plan.cta_threads}, 1, 1", ptx)
    for tokens in (1, 37, 512):
        grid, block, smem = aot.aot_launch_dims(plan, tokens)
        assert (grid - 1) * plan.rows_per_cta < tokens <= grid * plan.rows_per_cta
        assert block == plan.cta_threads
        assert (smem > 0) == ("__dynamic_shmem__" in ptx and "st.shared" in ptx)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("hidden", [1, 100, 1024, 2048, 2560, 3072, 4096, 5120, 8192, 16384,
                                    sample.MAX_HIDDEN])
def test_the_shared_memory_asked_of_tensorrt_is_what_cutedsl_allocates(dtype, hidden):
    """TensorRT gives the AOT kernel exactly the dynamic shared memory aot_launch_dims asks for: it
    must equal the size CuteDSL itself computed for the launch (support/check_kernel.py reads it
    from the host code of the launcher aot_kernel compiled), and stay within the 48 KB a launch
    gets without an opt-in attribute, which TensorRT's AOT launch does not set."""
    _, _, plan, inferred = kernel(dtype, "float32", hidden, "sm_90a")
    for tokens in (1, 37, 512):
        assert aot.aot_launch_dims(plan, tokens)[2] == inferred
    assert inferred <= 48 * 1024


@pytest.mark.parametrize("dtype, w_dtype, hidden",
                         RESIDUAL_CASES[9:] + [("float16", "float32", sample.MAX_HIDDEN)])
def test_the_residual_forms_shared_memory_is_what_cutedsl_allocates(dtype, w_dtype, hidden):
    """As above for the fused op, whose staged plans keep R beside X (compile_rms_norm would plan
    without the 48 KB rule)."""
    _, _, plan, inferred = kernel(dtype, w_dtype, hidden, "sm_90a", residual=True)
    for tokens in (1, 37, 512):
        assert aot.aot_launch_dims(plan, tokens)[2] == inferred
    assert inferred <= aot.AOT_SHARED_BYTES == 48 * 1024


@pytest.mark.parametrize("elem_bytes, fits, too_long", [(2, 12280, 12288), (4, 6140, 6144)])
def test_the_residual_form_stages_its_rows_only_within_48_kb(elem_bytes, fits, too_long):
    """Hand-derived: X and R of hidden 12280 in 16 bits take 2 x 24560 bytes, and 6 warps' sums
    24: 48 KB less 8, so they stay staged; one vector more (12288) needs 48 KB + 24, which
    TensorRT's launch would refuse, so the rows move to registers. fp32 the same at half the
    elements. The companion's plan, made for a launch that opts in to more, stages both."""
    assert aot.aot_plan(fits, elem_bytes, residual=True).arrival == "cp.async"
    assert aot.shared_memory_bytes(aot.aot_plan(fits, elem_bytes, residual=True)) == 2 * 24560 + 24
    assert fused.plan_kernel(too_long, elem_bytes, sm90=False, residual=True).arrival == "cp.async"
    plan = aot.aot_plan(too_long, elem_bytes, residual=True)
    assert plan.arrival == "registers" and aot.shared_memory_bytes(plan) == 24
    assert plan.registers_needed() <= plan.register_ceiling(), "refitted to its registers"


def test_unknown_arch_is_refused():
    with pytest.raises(sample.UsageError, match="sm_70"):
        aot.aot_kernel("float16", 1024, 1e-5, "sm_70")


# The FP8 form (Y as FP8 E4M3): the PTX versions chosen for it, by hand. ptxas takes the conversion
# to E4M3 on sm_90 from ISA 7.8 (below sm_90a's own 8.0) but on sm_89 only from 8.1; sm_80 and
# sm_86 have none.
FP8_ISA = {"sm_89": "8.1", "sm_90a": "8.0", "sm_100a": "8.6", "sm_120a": "8.7"}
Y_SCALE = 0.3  # not a power of two: 1 / y_scale is an immediate of its own in the PTX
FP8_CASES = [("float16", "float32", 1024), ("bfloat16", "bfloat16", 100), ("float32", "float16", 7),
             ("float16", "float32", 4096), ("float32", "float32", 16384)]


def test_the_fp8_form_has_a_ptx_version_for_exactly_the_fp8_capable_arches():
    assert aot.AOT_FP8_PTX_ISA == FP8_ISA
    assert set(FP8_ISA) == {arch for arch in aot.AOT_PTX_ISA if fused.has_fp8(arch)}


@pytest.mark.parametrize("arch", list(FP8_ISA))
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("dtype, w_dtype, hidden", FP8_CASES)
def test_fp8_entry_keeps_the_calling_convention_and_bakes_in_y_scale(arch, residual, dtype, w_dtype,
                                                                     hidden):
    """The FP8 form's parameters are the other forms' (Y a pointer like any), its Y converted by the
    saturating cvt to E4M3, 1 / y_scale an immediate, and the declared ISA the FP8 form's own."""
    name, ptx, plan, _ = kernel(dtype, w_dtype, hidden, arch, residual, Y_SCALE)
    (entry,) = re.findall(rf"^\.visible \.entry {name}\(([^)]*)\)", ptx, re.M)
    pointers = ["u64"] * (3 if residual else 2) + ["u32"] + ["u64"] * (2 if residual else 1)
    assert re.findall(r"\.param \.(\w+)", entry) == pointers
    same_plan = aot.aot_plan(hidden, sample.DTYPES[dtype].bytes, residual)
    assert plan == same_plan, "Y is not staged: the FP8 form's plan is the other forms'"
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert f32_literal(1.0 / fused.validate_y_scale(Y_SCALE)) in ptx and f32_literal(1e-5) in ptx
    assert re.search(rf"^\.target {arch}\b", ptx, re.M)
    assert re.search(rf"^\.version {re.escape(FP8_ISA[arch])}$", ptx, re.M)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
@pytest.mark.parametrize("arch", list(FP8_ISA))
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("dtype, w_dtype, hidden", FP8_CASES)
def test_fp8_ptx_assembles_at_the_chosen_isa_version(tmp_path, arch, residual, dtype, w_dtype,
                                                     hidden):
    assemble(tmp_path, arch, kernel(dtype, w_dtype, hidden, arch, residual, Y_SCALE)[1])


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
def test_sm_89s_fp8_ptx_needs_isa_8_1(tmp_path):
    """Why sm_89's FP8 form declares 8.1 where its other forms declare 8.0: ptxas refuses the E4M3
    cvt there."""
    ptx = kernel("float16", "float32", 1024, "sm_89", False, Y_SCALE)[1]
    path = tmp_path / "k.ptx"
    path.write_text(ptx.replace(".version 8.1\n", ".version 8.0\n", 1))
    proc = subprocess.run(["ptxas", "-arch=sm_89", str(path), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "e4m3x2" in proc.stderr and "8.1" in proc.stderr


@pytest.mark.parametrize("arch", ["sm_80", "sm_86"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "fused"])
def test_the_fp8_form_is_refused_without_fp8_in_one_sentence_before_compiling(monkeypatch, arch,
                                                                              residual):
    def compile_launcher(*args):
        raise AssertionError("compiled before refusing")

    monkeypatch.setattr(fused, "compile_launcher", compile_launcher)
    with pytest.raises(sample.UsageError) as info:
        aot.aot_kernel("float16", 1024, 1e-5, arch, residual=residual, y_scale=1.0)
    assert str(info.value) == ("the FP8 form (--y-scale) needs sm_89 or newer, which convert to "
                               f"FP8 in hardware, got {arch}")


@pytest.mark.parametrize("y_scale", [0.0, -1.0, float("inf"), float("nan"), 1e-39])
def test_a_y_scale_the_kernel_cannot_divide_by_is_refused(y_scale):
    with pytest.raises(ValueError, match="field 'y_scale' must be finite and >= 2\\^-126"):
        aot.aot_kernel("float16", 1024, 1e-5, "sm_90a", y_scale=y_scale)
