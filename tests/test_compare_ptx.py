"""CPU: benchmarks/experiments/compare_ptx.py cuts a PTX module into its kernels, loads each side's
file with its own checkout's lesson, refuses a bad command line in one sentence, and finds the
kernels an edit changes, and only those.

The edit below, in a copy of the lesson beside a copy of the companion, touches only the branch of
Step 4 that epsilon 1e-40 takes (its rsqrt made 1 / sqrt), which the companion's kernel imports.
At hidden 1024 every launcher holds one kernel (2 KB and 4 KB rows: ROW_PLANS has no few, mid or
cluster plan for them), so on sm_90a the script compares 12 kernels of the residual FP8 form (the
residual and the FP8 hooks at once): X fp16, bf16 and fp32 with W fp32, at epsilon 1e-5 and 1e-40
(1024 is one of its TINY_EPSILON_HIDDEN), each in the plugin's and the AOT flavor's launcher; the 6
at 1e-40 differ.
"""

import re
import shutil
import subprocess
import sys

import pytest

from conftest import FUSED_PATH, ROOT, SAMPLE_PATH, load_experiment

sys.path.insert(0, str(ROOT / "benchmarks"))

import kernel_files  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "experiments" / "compare_ptx.py"
PLAIN_RSQRT = "    return cute.math.rsqrt(mean_sq_eps)\n"

TWO_KERNELS = """.version 8.8
.target sm_90a
.address_size 64

\t// .globl\tkernel_a_1
.extern .shared .align 1024 .b8 __dynamic_shmem__0[];

.visible .entry kernel_a_1(
\t.param .u64 .ptr .align 16 kernel_a_1_param_0
)
{
\tret;

}
\t// .globl\tkernel_a_10
.visible .entry kernel_a_10(
\t.param .u64 .ptr .align 16 kernel_a_10_param_0
)
{
\texit;

}
"""


def test_a_module_is_cut_into_kernels_each_with_the_header_and_no_names():
    header = ".version 8.8\n.target sm_90a\n.address_size 64\n\n\t// .globl\tKERNEL\n" \
             ".extern .shared .align 1024 .b8 __dynamic_shmem__0[];\n\n"
    entry = ".visible .entry KERNEL(\n\t.param .u64 .ptr .align 16 KERNEL_param_0\n)\n{\n"
    first = entry + "\tret;\n\n}\n\t// .globl\tKERNEL\n"
    second = entry + "\texit;\n\n}\n"
    # kernel_a_1 is a prefix of kernel_a_10: replaced first, it would leave KERNEL0 behind
    assert load_experiment("compare_ptx").kernels_of(TWO_KERNELS) == [
        ("kernel_a_1", header + first), ("kernel_a_10", header + second)]


@pytest.fixture(scope="module")
def compare_ptx():
    return load_experiment("compare_ptx")


@pytest.fixture
def edited_checkout(tmp_path):
    """A checkout of the lesson, its epsilon-1e-40 branch edited, and the companion beside it."""
    source = SAMPLE_PATH.read_text()
    assert source.count(PLAIN_RSQRT) == 1, "the lesson's plain rsqrt moved: update this test's edit"
    (tmp_path / SAMPLE_PATH.name).write_text(source.replace(
        PLAIN_RSQRT, "    return Float32(1.0) / cute.math.sqrt(mean_sq_eps)\n"))
    shutil.copy(FUSED_PATH, tmp_path / FUSED_PATH.name)
    return tmp_path


def test_each_side_defaults_to_its_companion_else_its_sample(tmp_path):
    (tmp_path / SAMPLE_PATH.name).write_text("")
    assert kernel_files.default_file(tmp_path) == tmp_path / SAMPLE_PATH.name  # before the split
    (tmp_path / FUSED_PATH.name).write_text("")
    assert kernel_files.default_file(tmp_path) == tmp_path / FUSED_PATH.name


def test_a_companion_is_loaded_on_the_lesson_beside_it(tmp_path):
    (tmp_path / SAMPLE_PATH.name).write_text(SAMPLE_PATH.read_text() + "\nCHECKOUT = 'other'\n")
    shutil.copy(FUSED_PATH, tmp_path / FUSED_PATH.name)
    before = sys.modules.get("rms_norm_plugin_cutedsl")
    module = kernel_files.load_kernel(tmp_path / FUSED_PATH.name, "companion_of_other_checkout")
    assert module.lesson.CHECKOUT == "other"  # not the lesson on sys.path
    assert module.lesson.__file__ == str(tmp_path / SAMPLE_PATH.name)
    assert sys.modules.get("rms_norm_plugin_cutedsl") is before


@pytest.mark.parametrize("args,message", [
    ([], "give the other checkout's root (BASE) or --base-file FILE, one of the two"),
    (["DIR", "--base-file", "DIR/rms_norm_plugin_cutedsl.py"],
     "give the other checkout's root (BASE) or --base-file FILE, one of the two"),
    (["DIR/nothing"], "DIR/nothing is not a directory (BASE is the other checkout's root)"),
    (["--base-file", "DIR/old.py"], "the base side's file DIR/old.py does not exist"),
    (["DIR", "--new-file", "DIR/new.py"], "the new side's file DIR/new.py does not exist"),
    (["DIR", "--forms", "plain,fp4"],
     "--forms: unknown 'fp4' (choose from plain, residual, fp8, residual_fp8)"),
    (["DIR", "--jobs", "0"], "--jobs must be at least 1"),
])
def test_a_bad_command_line_is_refused_in_one_sentence(compare_ptx, tmp_path, capsys, args,
                                                       message):
    shutil.copy(FUSED_PATH, tmp_path / FUSED_PATH.name)
    argv = [arg.replace("DIR", str(tmp_path)) for arg in args]
    with pytest.raises(SystemExit) as exit_info:
        compare_ptx.main(argv)
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith(" error: " + message.replace("DIR", str(tmp_path)))


def test_a_file_without_the_forms_keywords_is_refused(compare_ptx, tmp_path, capsys):
    """The lesson's compile_rms_norm has one form and no keep_ptx: it is no side to compare."""
    with pytest.raises(SystemExit) as exit_info:
        compare_ptx.main(["--base-file", str(SAMPLE_PATH), "--forms", "plain", "--ptx-only"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f" error: the base side's {SAMPLE_PATH} has no compile_rms_norm keyword "
        "keep_ptx, plans_by_tokens: compare a companion or a sample from before the split")


def test_an_edit_of_one_branch_differs_in_exactly_the_kernels_that_take_it(edited_checkout):
    # requirements-test.txt installs both
    if shutil.which("ptxas") is None or shutil.which("nvdisasm") is None:
        pytest.skip("ptxas or nvdisasm is not on PATH "
                    "(pip install nvidia-cuda-nvcc nvidia-cuda-nvdisasm)")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(edited_checkout), "--arch", "sm_90a",
                           "--hidden", "1024", "--forms", "residual_fp8"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"comparing {edited_checkout / FUSED_PATH.name} (base) with "
                               f"{FUSED_PATH} (new): 6 cases, forms residual_fp8,")
    differing = [re.match(r"DIFFERENT (.*), (\w+) form, (\w+) launcher kernel (\d+) of \d+ "
                          r"\(.*\): PTX and SASS differ$", line)
                 for line in lines if line.startswith("DIFFERENT")]
    assert all(differing), lines
    # Every kernel of the tiny-epsilon cases takes the edited branch: each plan of the plugin
    # launcher's schedule (the companion's own count) and the AOT launcher's one plan.
    import rms_norm_fused_cutedsl as fused

    kernels = {dtype: len(fused.token_schedule(1024, fused.DTYPES[dtype].bytes, True, True, True))
               for dtype in ("float16", "bfloat16", "float32")}
    expected = [(f"sm_90a X {dtype} W float32 hidden 1024 epsilon 1e-40", "residual_fp8", launcher,
                 str(k + 1))
                for dtype, count in kernels.items()
                for launcher, launcher_count in (("plugin", count), ("aot", 1))
                for k in range(launcher_count)]
    assert sorted(m.groups() for m in differing) == sorted(expected)
    total = 2 * len(expected)  # epsilon 1e-5 compiles the same kernels, none of them edited
    assert lines[-1].startswith(f"{total // 2} of {total} kernels identical in PTX or SASS "
                                f"({total // 2} in PTX, 0 only in SASS; 6 cases;")
