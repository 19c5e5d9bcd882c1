"""CPU: support/check_kernel.py takes a copy of the sample through its own hooks, reports every
plan's registers, spills, CTAs per SM and access widths on sm_80 and sm_90a, and fails a copy that
spills or misses a launch bound.

The tool runs as a user runs it, in a subprocess. Costs on an idle 2-core machine: each run of the
tool on a few sizes 4-10 s, most of it importing torch and CuteDSL in each process;
test_the_sample_does_not_spill_at_any_size, the expensive one, about 3 minutes (172 s); the rest
under a minute together.
"""

import dataclasses
import itertools
import shutil
import subprocess
import sys

import pytest

import rms_norm_plugin_cutedsl as sample
from conftest import ROOT, SAMPLE_PATH
from support import check_kernel

TOOL = ROOT / "support" / "check_kernel.py"
EXIT_FOUND = 1
EXIT_USAGE = 2
pytestmark = pytest.mark.skipif(shutil.which("ptxas") is None,
                                reason="ptxas (CUDA toolkit) not on PATH")

def run_tool(*args, env=None):
    proc = subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=900)
    return proc.returncode, proc.stdout, proc.stderr


def plan_rows(stdout):
    """The listing's lines of one plan each, split into words."""
    return [line.split() for line in stdout.splitlines() if line.startswith(("sm_80 ", "sm_90a "))]


def problem_rows(stdout):
    """{(arch, X/W dtypes, hidden, plan): (registers, spill bytes)} of the closing section."""
    _, found, section = stdout.partition("Kernels that spill or miss their launch bound:\n")
    rows = {}
    for arch, pair, hidden, _, plan, registers, spills, *_ in plan_rows(section if found else ""):
        rows[arch, pair, int(hidden), plan] = (int(registers), int(spills))
    return rows


def copy_with(tmp_path, code):
    """A copy of the sample with `code` appended, which redefines what the tool takes it through."""
    path = tmp_path / "copy_of_sample.py"
    path.write_text(SAMPLE_PATH.read_text() + "\n\n" + code)
    return path


def bounded_copy(tmp_path, bound):
    """A copy whose every plan asks ptxas for `bound` CTAs per SM, through the token_schedule the
    tool lists plans by (it hands compile_launcher the same plans)."""
    return copy_with(tmp_path, f"""
import dataclasses as _dataclasses

_own_token_schedule = token_schedule


def token_schedule(hidden, elem_bytes=2, sm90=True):
    return tuple((_dataclasses.replace(plan, min_ctas_per_sm={bound}), counts)
                 for plan, counts in _own_token_schedule(hidden, elem_bytes, sm90))
""")


def bounded_tag(hidden, elem_bytes, bound):
    (plan, _), = sample.token_schedule(hidden, elem_bytes, True)
    return str(dataclasses.replace(plan, min_ctas_per_sm=bound))


def test_a_few_sizes_of_the_sample_compile_on_both_archs_without_spills():
    """Every plan of both forms at hidden 1024 and 12288, fp16 and fp32 X with fp32 W, on sm_80 and
    sm_90a: no spill, no bound missed, and the accesses the plans are built for: X (and R) in 16-byte
    loads, 16-byte cp.async copies or bulk copies, Y (and S) in 16-byte stores."""
    code, out, err = run_tool("--hidden", "1024,12288",
                              "--pairs", "float16/float32,float32/float32")
    assert code == 0, out + err
    rows = plan_rows(out)
    expected = sum(len(sample.token_schedule(hidden, elem_bytes, sm90, residual))
                   for hidden in (1024, 12288) for elem_bytes in (2, 4) for sm90 in (False, True)
                   for residual in (False, True))
    assert len(rows) == expected, out
    assert out.splitlines()[-1].startswith(f"{expected} kernels compiled, 0 failed to compile; "
                                           "0 spill, 0 miss their launch bound, 0 have"), out
    fp16_sm90 = " ".join(" ".join(row) for row in rows
                         if row[:3] == ["sm_90a", "float16/float32", "12288"])
    assert all(access in fp16_sm90 for access in ("ld 16 B", "cp.async 16 B", "bulk")), out
    assert all(row[-2:] == ["16", "B"] for row in rows), out
    residual = [row for row in rows if row[4].endswith("_residual")]
    assert len(residual) == expected // 2, out
    for row in residual:  # after the plan's tag: X's loads and R's, of one kind and 16 bytes each
        after = " ".join(row[5:])
        assert after.count("ld 16 B") + after.count("cp.async 16 B") + after.count("bulk") == 2, row


def test_a_copy_that_spills_exits_1_and_names_the_plan(tmp_path):
    """16 CTAs of 128 threads on an SM leave 32 registers a thread: the plan of hidden 1024 spills
    to meet that bound. Its bound is met, so only the spill fails the check."""
    code, out, err = run_tool(bounded_copy(tmp_path, 16), "--hidden", "1024",
                              "--pairs", "float16/float32", "--arch", "sm_90a")
    assert code == EXIT_FOUND, out + err
    ((arch, pair, hidden, plan), (registers, spills)), = problem_rows(out).items()
    assert (arch, pair, hidden, plan) == ("sm_90a", "float16/float32", 1024,
                                          bounded_tag(1024, 2, 16))
    assert registers <= 32 and spills > 0, out
    assert " 16 met " in out, out


def test_a_launch_bound_ptxas_cannot_meet_exits_1(tmp_path):
    """32 CTAs of 128 threads exceed an SM's 2048 threads: ptxas ignores the bound, and the check
    says so."""
    code, out, err = run_tool(bounded_copy(tmp_path, 32), "--hidden", "1024",
                              "--pairs", "float16/float32", "--arch", "sm_90a")
    assert code == EXIT_FOUND, out + err
    assert list(problem_rows(out)) == [("sm_90a", "float16/float32", 1024,
                                        bounded_tag(1024, 2, 32))], out
    assert " 32 MISSED " in out and "0 spill, 1 miss their launch bound" in out, out


def test_a_plan_that_fails_to_compile_is_listed_and_the_check_goes_on(tmp_path):
    """The copy's compile_launcher refuses sm_80: that plan's line says why, sm_90a's plan still
    compiles, and the check exits 1."""
    copy = copy_with(tmp_path, """
_own_compile_launcher = compile_launcher


def compile_launcher(schedule, dtype, w_dtype, epsilon, arch, keep_ptx=False):
    if arch == "sm_80":
        raise ValueError("this copy has no sm_80 kernel")
    return _own_compile_launcher(schedule, dtype, w_dtype, epsilon, arch, keep_ptx)
""")
    code, out, err = run_tool(copy, "--hidden", "1024", "--pairs", "float16/float32", "--forms",
                              "plain")
    assert code == EXIT_FOUND, out + err
    assert ("FAILED sm_80 float16/float32 hidden 1024, plain form, plan 0 of its schedule: "
            "ValueError: this copy has no sm_80 kernel") in out, out
    assert [row[:3] for row in plan_rows(out)] == [["sm_90a", "float16/float32", "1024"]], out
    assert "1 kernels compiled, 1 failed to compile; 0 spill" in out, out


def test_a_file_without_compile_launcher_exits_2_in_one_sentence(tmp_path):
    code, out, err = run_tool(copy_with(tmp_path, "del compile_launcher\n"))
    assert code == EXIT_USAGE
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "does not define compile_launcher, the hook " in err, err


@pytest.mark.parametrize("args, needle", [
    (["no_such_copy.py"], "no_such_copy.py is not a file"),
    (["--arch", "sm_86"], "--arch sm_86 is not one whose SM limits"),
    (["--dtypes", "float64"], "--dtypes float64 is not an X dtype"),
    (["--pairs", "float16/int8"], "--pairs float16/int8 is not a pair"),
    (["--hidden", "0"], "--hidden takes sizes in [1, 32768]"),
    (["--hidden", "1024", "--all-sizes"], "not allowed with argument"),
    (["--forms", "fused"], "--forms fused is not a form the copy plans (plain, residual)"),
    (["--jobs", "0"], "--jobs must be at least 1"),
])
def test_a_usage_error_exits_2_in_one_sentence(args, needle):
    code, out, err = run_tool(*args)
    assert code == EXIT_USAGE
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and needle in err, err


def test_without_ptxas_on_path_it_exits_2_in_one_sentence():
    code, out, err = run_tool("--hidden", "1024", env={"PATH": str(ROOT / "no_tools_here")})
    assert code == EXIT_USAGE
    assert err == "error: ptxas is not on PATH (pip install nvidia-cuda-nvcc, or a CUDA toolkit)\n"


def test_ctas_per_sm_take_each_archs_shared_memory():
    """100 KB of shared memory: one CTA on an sm_80 SM (164 KB), two on sm_90 (228 KB)."""
    assert check_kernel.ctas_per_sm(256, 32, 100 * 1024, "sm_80") == 1
    assert check_kernel.ctas_per_sm(256, 32, 100 * 1024, "sm_90a") == 2
    assert check_kernel.ctas_per_sm(256, 32, 0) == 8  # registers: 64K / (32 x 256)


PTX = """
.visible .entry k(
	.param .u64 .ptr .global .align 16 k_param_0,
	.param .u64 .ptr .global .align 16 k_param_1,
	.param .u64 .ptr .global .align 16 k_param_2
)
{
	ld.param.b64 	%rd1, [k_param_0];
	ld.param.b64 	%rd2, [k_param_1];
	mul.wide.u32 	%rd3, %r1, 8;
	add.s64 	%rd4, %rd1, %rd3;
	add.s64 	%rd5, %rd2, %rd3;
	ld.global.v4.b32 	{%r2, %r3, %r4, %r5}, [%rd5];
	@%p1 ld.global.v2.b32 	{%r6, %r7}, [%rd4+16];
	cp.async.cg.shared.global [%r8], [%rd4], 16, 16;
	cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r9], [%rd4], %r10, [%r11];
	ld.param.b64 	%rd6, [k_param_2];
	st.global.v2.b16 	[%rd6], {%rs1, %rs2};
}
"""


def test_x_loads_are_traced_to_the_first_parameter_and_every_global_store_is_y():
    """W's 16-byte load (parameter 1) is not X's; X's 8-byte load, cp.async and bulk copy are."""
    x_loads, y_stores = check_kernel.global_accesses(PTX)
    assert x_loads == {("ld", 8), ("cp.async", 16), ("bulk", 0)}
    assert y_stores == {4}


def whole_vectors(plan):
    return plan.vec * plan.elem_bytes == 16


def plan_kind(plan):
    """What sets a plan's code apart, hidden aside: how X arrives, a cluster, rows in sequence, W
    first, late or a vector at a time, a launch bound, and whether its vectors are 16 bytes."""
    return (plan.arrival, plan.cluster_ctas > 1, plan.rows_in_sequence > 1, plan.early_weight,
            plan.weight_by_vector, plan.min_ctas_per_sm > 0, whole_vectors(plan))


@pytest.mark.parametrize("elem_bytes", [2, 4])
def test_all_sizes_cover_every_row_class_and_every_plan_kind_in_it(elem_bytes):
    """Within each row-length class, every kind of plan that token_schedule gives at any hidden
    size, on sm_90 and before, is given at one of the sizes --all-sizes compiles; so are rows of
    16-byte vectors that leave a thread short (ragged) and rows that do not, where the class has
    them."""
    sizes = check_kernel.all_sizes(sample, elem_bytes)
    for fewest, most in sample.row_classes(elem_bytes):
        chosen = [hidden for hidden in sizes if fewest <= hidden <= most]
        assert chosen, (fewest, most)
        for sm90, residual in itertools.product((False, True), (False, True)):
            plans = {hidden: [plan for plan, _ in
                              sample.token_schedule(hidden, elem_bytes, sm90, residual)]
                     for hidden in range(fewest, most + 1)}
            everywhere = [plan for hidden_plans in plans.values() for plan in hidden_plans]
            selected = [plan for hidden in chosen for plan in plans[hidden]]
            assert set(map(plan_kind, selected)) == set(map(plan_kind, everywhere)), (fewest, most)
            assert ({plan.ragged for plan in selected if whole_vectors(plan)}
                    == {plan.ragged for plan in everywhere if whole_vectors(plan)}), (fewest, most)


def test_the_sample_does_not_spill_at_any_size():
    """CI's spill check: `check_kernel.py --all-sizes` on the sample, every plan of both forms of
    every row-length class for all nine dtype pairs on sm_80 and sm_90a. Expensive: about 6 minutes
    on CI's 2 idle cores. No kernel may spill or miss its launch bound."""
    code, out, err = run_tool("--all-sizes")
    assert not err, err
    assert problem_rows(out) == {}, out
    assert code == 0, out
