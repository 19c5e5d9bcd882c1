"""CPU: support/check_kernel.py proves a file's kernel at every hidden size: its rule at every size
(a refusal or a plan over its own ceiling is a finding), then every distinct plan compiled on sm_80
and sm_90a (a spill, a missed launch bound or a failed compile is a finding).

What runs here, on 2 idle cores, and what a user runs:
* the lesson at every size and every distinct plan, on CI's quick pass of pairs (fp16 and fp32 X
  with fp32 W): about 1 minute; the user's `check_kernel.py` compiles all nine pairs, about 6;
* the worked examples the same way, in tests/test_adapting.py;
* the fused companion's rule at every size of every form and family (in this process, under a
  minute) and every plan of its four forms at two sizes (under half a minute); its full proof,
  `check_kernel.py rms_norm_fused_cutedsl.py`, is a user's run (the tool's docstring says how
  long);
* the tool's findings and usage errors on small copies: about 1.5 minutes.
The tool runs as a user runs it, in a subprocess, where it compiles; usage errors in this process.
"""

import dataclasses
import shutil
import subprocess
import sys

import pytest

import rms_norm_plugin_cutedsl as lesson
from conftest import FUSED_PATH, ROOT, SAMPLE_PATH
from support import check_kernel
from support.sample_loader import import_file
from worked_examples import distinct_plans

TOOL = ROOT / "support" / "check_kernel.py"
# CI's pass: one X dtype of each element size with fp32 W, 2 of the 9 pairs (the tool's docstring
# says why a user's proof compiles all 9, and what each costs).
QUICK_PASS = ("--pairs", "float16/float32,float32/float32")
EXIT_FOUND = 1
EXIT_USAGE = 2
pytestmark = pytest.mark.skipif(shutil.which("ptxas") is None,
                                reason="ptxas (CUDA toolkit) not on PATH")


def run_tool(*args):
    proc = subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True,
                          text=True, timeout=1800)
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


def lesson_copy(tmp_path, *changes, name="copy_of_lesson.py"):
    """A copy of the lesson with each (old, new) text of `changes` replaced once."""
    source = SAMPLE_PATH.read_text()
    for old, new in changes:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    path = tmp_path / name
    path.write_text(source)
    return path


def test_the_lesson_at_every_size():
    """CI's full proof of the lesson: the rule at every size 1-32768 of both element sizes, then
    each distinct plan compiled with fp16 and fp32 X (fp32 W) on sm_80 and sm_90a: no finding, every
    load and store as wide as the plan's vectors."""
    code, out, err = run_tool(*QUICK_PASS, "--jobs", "2")
    assert not err, err
    kinds = distinct_plans(lesson)
    assert out.splitlines()[0] == (f"The rule at 32768 sizes, 1-32768: 65536 plans, {kinds} "
                                   "distinct to compile; no findings"), out[:2000]
    assert len(plan_rows(out)) == 2 * kinds, out[-2000:]
    assert out.splitlines()[-1].startswith(
        f"{2 * kinds} kernels compiled, 0 failed to compile; 0 spill, 0 miss their launch bound, "
        "0 have loads or stores narrower than expected; the rule: no findings; "), out[-2000:]
    assert code == 0


@pytest.fixture(scope="module")
def fused():
    return import_file(FUSED_PATH, "fused_under_check")


def test_the_companions_every_form_compiles_at_two_sizes(fused):
    """Every plan of the companion's four forms at hidden 1024 and 12288, fp16 and fp32 X with fp32
    W: the plain and residual forms on sm_80 and sm_90a, the FP8 ones on sm_90a (sm_80 has no FP8).
    No finding; X and R arrive in 16-byte loads, 16-byte cp.async copies or bulk copies, Y and S
    leave in 16-byte stores, an FP8 Y in 8-byte (fp16 X) or 4-byte (fp32 X) ones."""
    code, out, err = run_tool(FUSED_PATH, "--hidden", "1024,12288", *QUICK_PASS, "--jobs", "2")
    assert code == 0, out[-3000:] + err
    expected = 0
    for arch, sm90 in (("sm_80", False), ("sm_90a", True)):
        for residual, fp8 in ((False, False), (True, False), (False, True), (True, True)):
            if fp8 and arch == "sm_80":
                continue
            expected += sum(len(fused.token_schedule(hidden, elem_bytes, sm90, residual, fp8))
                            for hidden in (1024, 12288) for elem_bytes in (2, 4))
    rows = plan_rows(out)
    assert len(rows) == expected, out[-3000:]
    assert out.splitlines()[-1].startswith(f"{expected} kernels compiled, 0 failed to compile; "
                                           "0 spill, 0 miss their launch bound, 0 have"), out
    fp16_sm90 = " ".join(" ".join(row) for row in rows
                         if row[:3] == ["sm_90a", "float16/float32", "12288"])
    assert all(access in fp16_sm90 for access in ("ld 16 B", "cp.async 16 B", "bulk")), out
    stores = {" ".join(row[-2:]) for row in rows}
    assert stores == {"16 B", "8 B", "4 B"}, stores
    residual = [row for row in rows if row[4].endswith(("_residual", "_rv"))]
    assert residual, out
    for row in residual:  # after the plan's tag: X's loads and R's, of one kind and 16 bytes each
        after = " ".join(row[5:])
        assert after.count("ld 16 B") + after.count("cp.async 16 B") + after.count("bulk") == 2, row


@pytest.mark.parametrize("form", check_kernel.FORMS)
@pytest.mark.parametrize("family", [False, True])
def test_the_companions_rule_fits_every_size(fused, family, form):
    """The companion's token_schedule at every size 1-32768 of both element sizes, for one plan
    family and form: no size refused, no plan over its own register ceiling."""
    for elem_bytes in (2, 4):
        rule = check_kernel.check_rule(fused, elem_bytes, family, form,
                                       range(1, fused.MAX_HIDDEN + 1), True)
        assert (rule.refused, rule.over) == ([], []), (elem_bytes, rule.refused[:3], rule.over[:3])
        assert rule.count >= rule.sizes


def test_a_copy_that_spills_exits_1_and_names_the_plan(tmp_path):
    """An estimate that claims 66 registers fewer keeps W with X at 32768 fp32: the 1024-thread CTA
    leaves 64 registers, and ptxas spills to fit them."""
    copy = lesson_copy(tmp_path, ("OTHER_REGISTERS = 26", "OTHER_REGISTERS = -40"))
    code, out, err = run_tool(copy, "--hidden", "32768", "--pairs", "float32/float32", "--arch",
                              "sm_90a", "--jobs", "1")
    assert code == EXIT_FOUND, out + err
    ((arch, pair, hidden, plan), (registers, spills)), = problem_rows(out).items()
    assert (arch, pair, hidden, plan) == ("sm_90a", "float32/float32", 32768,
                                          "h32768b4v4t1024r1k8_wfirst")
    assert registers <= 64 and spills > 0, out


REFUSAL = ("rows of 32768 elements of 32 bits need 76 registers a thread even after every fitting "
           "step, more than the 64 a CTA of 1024 threads leaves (h32768b4v4t1024r1k8_wvector)")


def test_a_size_the_rule_refuses_is_one_sentence_and_exits_1(tmp_path):
    """An estimate 14 registers higher fits no plan at 32768 fp32: the check names the size in one
    sentence, compiles the sizes the rule serves, and exits 1."""
    copy = lesson_copy(tmp_path, ("OTHER_REGISTERS = 26", "OTHER_REGISTERS = 40"))
    code, out, err = run_tool(copy, "--hidden", "1024,32768", "--pairs", "float32/float32",
                              "--arch", "sm_90a", "--jobs", "1")
    assert code == EXIT_FOUND, out + err
    sentence = ("the rule refuses 1 size (32768) (float32 X, plain form, sm_90a): at 32768, "
                f"PlanError: {REFUSAL}")
    assert out.splitlines()[:2] == ["The rule at 2 sizes from 1024 to 32768: 1 plan, 1 of them to "
                                    "compile; 1 finding", sentence], out
    assert [row[:3] for row in plan_rows(out)] == [["sm_90a", "float32/float32", "1024"]], out
    assert out.endswith(f"What the rule does not fit:\n{sentence}\n"), out


OLD_FIT_REGISTERS = '''    if plan.registers_needed() <= plan.register_ceiling():
        return plan
    raise PlanError('''
SILENT_FIT_REGISTERS = '''    return plan
    raise PlanError('''


def test_a_rule_that_returns_a_plan_over_its_ceiling_exits_1(tmp_path):
    """fit_registers as it was (issue 47): after the last step the plan is returned whatever its
    estimate says. The check finds the plan over its own ceiling."""
    copy = lesson_copy(tmp_path, ("OTHER_REGISTERS = 26", "OTHER_REGISTERS = 40"),
                       (OLD_FIT_REGISTERS, SILENT_FIT_REGISTERS))
    code, out, err = run_tool(copy, "--hidden", "32768", "--pairs", "float32/float32", "--arch",
                              "sm_90a", "--jobs", "1")
    assert code == EXIT_FOUND, out + err
    assert out.splitlines()[1] == (
        "the rule gives plans over their own register ceiling at 1 size (32768) (float32 X, plain "
        "form, sm_90a): at 32768, h32768b4v4t1024r1k8_wvector needs 76 of 64"), out


def test_a_launch_bound_ptxas_cannot_meet_exits_1(tmp_path):
    """A copy of the companion whose plan at 1024 asks for 32 CTAs of 128 threads, more than an
    SM's 2048 threads: ptxas ignores the bound, and the check says so."""
    shutil.copyfile(SAMPLE_PATH, tmp_path / SAMPLE_PATH.name)
    copy = tmp_path / "copy_of_fused.py"
    copy.write_text(FUSED_PATH.read_text() + '''

_own_token_schedule = token_schedule


def token_schedule(hidden, elem_bytes=2, sm90=True, residual=False, fp8=False):
    return tuple((dataclasses.replace(plan, min_ctas_per_sm=32), counts)
                 for plan, counts in _own_token_schedule(hidden, elem_bytes, sm90))
''')
    code, out, err = run_tool(copy, "--hidden", "1024", "--pairs", "float16/float32", "--arch",
                              "sm_90a", "--forms", "plain", "--jobs", "1")
    assert code == EXIT_FOUND, out + err
    (arch, pair, hidden, plan), = problem_rows(out)
    assert (arch, pair, hidden) == ("sm_90a", "float16/float32", 1024)
    assert "m32" in plan and " 32 MISSED " in out and "0 spill, 1 miss their launch bound" in out


def test_a_plan_that_fails_to_compile_is_listed_and_the_check_goes_on(tmp_path):
    """The copy's compile_launcher refuses sm_80: that plan's line says why, sm_90a's plan still
    compiles, and the check exits 1."""
    first_line = "    rows = (cute.sym_int32(), plan.hidden)  # num_tokens is symbolic\n"
    refusal = '    if arch == "sm_80":\n        raise ValueError("this copy has no sm_80 kernel")\n'
    copy = lesson_copy(tmp_path, (first_line, refusal + first_line))
    code, out, err = run_tool(copy, "--hidden", "1024", "--pairs", "float16/float32", "--jobs", "1")
    assert code == EXIT_FOUND, out + err
    assert ("FAILED sm_80 float16/float32 hidden 1024, plain form, plan 0 of its schedule: "
            "ValueError: this copy has no sm_80 kernel") in out, out
    assert [row[:3] for row in plan_rows(out)] == [["sm_90a", "float16/float32", "1024"]], out
    assert "1 kernels compiled, 1 failed to compile; 0 spill" in out, out


def usage(monkeypatch, capsys, *args):
    """check_kernel.main() in this process on `args`: (exit code, stderr)."""
    monkeypatch.setattr(sys, "argv", ["check_kernel.py", *map(str, args)])
    try:
        code = check_kernel.main()
    except SystemExit as exit_info:  # argparse's own errors
        code = exit_info.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args, needle", [
    (["no_such_copy.py"], "no_such_copy.py is not a file"),
    (["--arch", "sm_86"], "--arch sm_86 is not one whose SM limits check_kernel.py knows "
                          "(sm_80, sm_89, sm_90a)"),
    (["--dtypes", "float64"], "--dtypes float64 is not an X dtype of the pairs selected "
                              "(float16, bfloat16, float32)"),
    (["--pairs", "float16/int8"], "--pairs float16/int8 is not a pair"),
    (["--hidden", "0"], "--hidden takes sizes in [1, 32768], got '0'"),
    (["--forms", "residual"], "--forms residual is not a form the copy plans (plain)"),
    ([FUSED_PATH, "--forms", "fused"], "--forms fused is not a form the copy plans (plain, "
                                       "residual, fp8, residual-fp8)"),
    ([FUSED_PATH, "--forms", "fp8", "--arch", "sm_80"],
     "no target of --arch sm_80 runs the forms selected (fp8): the FP8 forms need sm_89 or sm_90a"),
    (["--jobs", "0"], "--jobs must be at least 1"),
])
def test_a_usage_error_exits_2_in_one_sentence(monkeypatch, capsys, args, needle):
    code, err = usage(monkeypatch, capsys, *args)
    assert code == EXIT_USAGE
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and needle in err, err


@pytest.mark.parametrize("hook, needle", [
    ("compile_launcher", "does not define compile_launcher, the hook check_kernel.py takes"),
    ("plan_kernel", "does not define plan_kernel or token_schedule and is_sm90, the hook"),
])
def test_a_file_without_a_hook_exits_2_in_one_sentence(monkeypatch, capsys, tmp_path, hook,
                                                       needle):
    path = tmp_path / "copy_of_lesson.py"
    path.write_text(SAMPLE_PATH.read_text() + f"\n\ndel {hook}\n")
    code, err = usage(monkeypatch, capsys, path)
    assert code == EXIT_USAGE
    assert len(err.splitlines()) == 1 and "Traceback" not in err and needle in err, err


def test_without_ptxas_on_path_it_exits_2_in_one_sentence(monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(ROOT / "no_tools_here"))
    code, err = usage(monkeypatch, capsys, "--hidden", "1024")
    assert code == EXIT_USAGE
    assert err == "error: ptxas is not on PATH (pip install nvidia-cuda-nvcc, or a CUDA toolkit)\n"


def test_every_pair_is_compiled_unless_flags_choose():
    """A plan's registers move with W's dtype as well as X's, so the proof compiles DTYPE_PAIRS
    whole; --dtypes and --pairs choose a subset."""
    parser = check_kernel.make_parser()
    chosen = {
        (): list(lesson.DTYPE_PAIRS),
        ("--dtypes", "bfloat16"): [("bfloat16", w) for w in lesson.WEIGHT_DTYPES],
        QUICK_PASS: [("float16", "float32"), ("float32", "float32")],
    }
    for args, pairs in chosen.items():
        assert check_kernel.selected_pairs(lesson, parser.parse_args(list(args))) == pairs, args


def test_a_field_a_copy_adds_makes_plans_of_their_own():
    """Two plans that differ only in a field the copy's plan class adds are two kinds to compile;
    two that differ only in hidden, within one raggedness, are one."""
    @dataclasses.dataclass(frozen=True)
    class GatedPlan(lesson.KernelPlan):
        gate_by_vector: bool = False

    plan = GatedPlan(hidden=32768, elem_bytes=2, vec=8, threads_per_row=1024, rows_per_cta=1,
                     vecs_per_thread=4, weight_by_vector=True)
    gated = dataclasses.replace(plan, gate_by_vector=True)
    shorter = dataclasses.replace(plan, hidden=32768 - 8 * 1024)  # still 4 vectors of all threads
    ragged = dataclasses.replace(plan, hidden=32768 - 8)
    kinds = {check_kernel.plan_kind(p) for p in (plan, gated, shorter, ragged)}
    assert len(kinds) == 3
    assert check_kernel.plan_kind(plan) != check_kernel.plan_kind(gated)


def test_ctas_per_sm_take_each_archs_shared_memory():
    """100 KB of shared memory: one CTA on an sm_80 SM (164 KB), two on sm_90 (228 KB), none on
    sm_89 (100 KB, of which a CTA's reserved 1 KB)."""
    assert check_kernel.ctas_per_sm(256, 32, 100 * 1024, "sm_80") == 1
    assert check_kernel.ctas_per_sm(256, 32, 100 * 1024, "sm_90a") == 2
    assert check_kernel.ctas_per_sm(256, 32, 100 * 1024, "sm_89") == 0
    assert check_kernel.ctas_per_sm(256, 32, 0) == 8  # registers: 64K / (32 x 256)
    assert check_kernel.ctas_per_sm(1024, 32, 0, "sm_89") == 1  # threads: 1536 an SM


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
