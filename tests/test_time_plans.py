"""CPU: benchmarks/experiments/time_plans.py builds the plans its specs name, and its launch bound
reaches ptxas; its flags, --copy's file and hooks among them, are checked before any GPU work, and a
user's error ends in one sentence.

The plans below are worked out by hand from the spec grammar in the script's docstring (not from
plan_kernel).
"""

import re
import shutil

import pytest

from conftest import SAMPLE_PATH, load_experiment


@pytest.fixture(scope="module")
def time_plans():
    return load_experiment("time_plans")


@pytest.mark.parametrize("spec,hidden,fields,min_ctas", [
    # (threads, rows per CTA, vectors per thread, W early, how X arrives)
    ("t96k2", 1536, (96, 1, 2, True, "registers"), 0),
    ("t160k4sl", 5120, (160, 1, 4, False, "cp.async"), 0),
    # 100 % 8 != 0: vectors of 4, 25 of them
    ("t16k2lr16m8", 100, (16, 16, 2, False, "registers"), 8),
    ("t32k4", 1000, (32, 4, 4, True, "registers"), 0),  # 128 threads per CTA: 4 rows
])
def test_a_spec_names_the_plan(time_plans, spec, hidden, fields, min_ctas):
    plan = time_plans.parse_plan(spec, hidden, 2)
    assert (plan.threads_per_row, plan.rows_per_cta, plan.vecs_per_thread, plan.early_weight,
            plan.arrival) == fields
    assert plan.min_ctas_per_sm == min_ctas
    assert plan.rows_in_sequence == 1


def test_a_spec_puts_rows_in_sequence(time_plans):
    plan = time_plans.parse_plan("t384k4sq2", 12288, 2)
    assert (plan.threads_per_row, plan.vecs_per_thread, plan.arrival, plan.early_weight) == (
        384, 4, "cp.async", True)
    assert (plan.rows_per_cta, plan.rows_in_sequence, plan.cta_rows, plan.min_ctas_per_sm) == (
        1, 2, 2, 0)
    bulk = time_plans.parse_plan("t384k4sbq2", 12288, 2)
    assert (bulk.arrival, bulk.threads_per_row, bulk.vecs_per_thread, bulk.rows_in_sequence) == (
        "bulk", 384, 4, 2)


@pytest.mark.parametrize("spec,hidden,why", [
    ("t64k1", 1024, "covers 512 elements"),
    ("t32k4s", 100, "8-byte vectors"),
    ("64k2", 1024, "not of the form"),
    ("t48k4", 1536, "whole warps"),        # 48 threads: Step 3 would sum one warp of the row's two
    ("t96k2q2", 1536, "needs s"),
    # a bulk copy writes to shared memory only
    ("t256k4b", 8192, "copies rows in bulk, which needs s"),
    ("t256k4sc2", 8192, "splits a row over a cluster"),       # a cluster's row stays in registers
    ("t256k4r2c2", 8192, "splits a row over a cluster"),      # one row per CTA of a cluster
    ("t96k2c4", 1536, "splits a row over a cluster"),         # 24 threads per CTA: not whole warps
])
def test_a_spec_that_cannot_serve_the_row_is_refused(time_plans, spec, hidden, why):
    with pytest.raises(ValueError, match=why):
        time_plans.parse_plan(spec, hidden, 2)


def test_the_launch_bound_reaches_the_ptx(time_plans):
    plan = time_plans.parse_plan("t64k2lm16", 1024, 2)
    ptx = time_plans.compile_plan(plan, "float16", "sm_90a").__ptx__
    assert re.search(r"\.minnctapersm 16\b", ptx)
    unbounded = time_plans.compile_plan(time_plans.parse_plan("t64k2l", 1024, 2), "float16",
                                        "sm_90a").__ptx__
    assert ".minnctapersm" not in unbounded


@pytest.mark.parametrize("spec, hidden, order", [
    # 2 X loads, 4 W loads (fp32, 16 bytes each); W's come after X is first read
    ("t96k2", 1536, (4, 6)),
    ("t96k2m8", 1536, (0, 6)),  # under 8 CTAs per SM every load comes first
    # ragged, unbounded: X's two (predicated) loads first, all four W loads after
    ("t64k2", 1000, (4, 6)),
])
def test_the_register_report_counts_loads_issued_after_the_first_wait(time_plans, spec, hidden,
                                                                      order):
    """Counts read off nvdisasm's listings by hand (CUDA 13.0 and 13.5 ptxas agree)."""
    if shutil.which("nvdisasm") is None:  # requirements-test.txt installs it; in CI a failure
        pytest.skip("nvdisasm is not on PATH (pip install nvidia-cuda-nvdisasm)")
    plan = time_plans.parse_plan(spec, hidden, 2)
    ptx = time_plans.compile_plan(plan, "float16", "sm_90a").__ptx__
    assert time_plans.ptxas_report(ptx)[2:] == order


@pytest.fixture
def lesson_copy(tmp_path):
    """A copy of the lesson under another name, as a user starts an adaptation."""
    path = tmp_path / "my_norm.py"
    shutil.copy(SAMPLE_PATH, path)
    return path


def refusal(time_plans, capsys, *argv):
    """The one line a refused command line writes to stderr (exit 2, nothing on stdout)."""
    with pytest.raises(SystemExit) as exit_:
        time_plans.main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    assert (exit_.value.code, out) == (2, ""), err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_the_shapes_of_a_copy_are_parsed(time_plans, lesson_copy):
    args = time_plans.parse_args(["--copy", str(lesson_copy), "--shapes", "4096x1536, 1 x1024"])
    assert args.shapes == [(4096, 1536), (1, 1024)]
    assert args.copy.__file__ == str(lesson_copy)
    assert args.copy.plan_kernel is not time_plans.lesson.plan_kernel  # the copy's own


@pytest.mark.parametrize("shapes", ["4096x", "4096", "0x1024", "4096x1536,", "ax1024"])
def test_malformed_shapes_are_refused(time_plans, capsys, lesson_copy, shapes):
    line = refusal(time_plans, capsys, "--copy", lesson_copy, "--shapes", shapes)
    assert f"--shapes {shapes!r}: expected comma-separated TOKENSxHIDDEN" in line


def test_a_copy_that_is_no_file_is_refused(time_plans, capsys, tmp_path):
    line = refusal(time_plans, capsys, "--copy", tmp_path / "missing.py", "--shapes", "1x1024")
    assert line == f"error: --copy {tmp_path / 'missing.py'} is not a file"


@pytest.mark.parametrize("source,why", [
    ("x = 1\n", "lacks compile_launcher, plan_kernel, gpu_arch, make_inputs, DTYPES, "
                "DEFAULT_EPSILON"),
    ("def (:\n", "failed to import (SyntaxError: "),
    ("import no_such_package_here\n", "failed to import (ModuleNotFoundError: "),
])
def test_a_file_without_the_hooks_is_refused(time_plans, capsys, tmp_path, source, why):
    path = tmp_path / "not_a_copy.txt"  # any name: a copy need not end in .py
    path.write_text(source)
    assert why in refusal(time_plans, capsys, "--copy", path, "--shapes", "1x1024")


def test_a_copy_that_dropped_one_hook_is_refused_naming_it(time_plans, capsys, lesson_copy):
    lesson_copy.write_text(lesson_copy.read_text().replace("def make_inputs(", "def inputs_for("))
    line = refusal(time_plans, capsys, "--copy", lesson_copy, "--shapes", "1x1024")
    assert f"--copy {lesson_copy} lacks make_inputs: a copy keeps the lesson's" in line


@pytest.mark.parametrize("argv,why", [
    (("--plans", "t64k2"), "exactly one of --plans"),  # with --copy: both
    (("--dtypes", "float64"), "the lesson has no dtype 'float64'"),
    (("--rounds", "0"), "--rounds must be at least 1"),
    (("--compile",), "--compile times torch.compile's RMSNorm"),
])
def test_a_copy_with_flags_it_cannot_take_is_refused(time_plans, capsys, lesson_copy, argv, why):
    assert why in refusal(time_plans, capsys, "--copy", lesson_copy, "--shapes", "1x1024", *argv)


@pytest.mark.parametrize("argv,why", [
    (("--shapes", "1x1024"), "exactly one of --plans"),  # neither
    (("--plans", "t64k2"), "timing needs --shapes"),
    (("--registers", "--plans", "t64k2"), "--registers needs --hidden"),
    (("--shapes", "1x1024", "--plans", "t64k1"), "plan 't64k1' covers 512 elements"),
    (("--registers", "--hidden", "40000", "--copy", "COPY"), "the copy cannot serve hidden 40000"),
])
def test_flags_that_cannot_be_served_are_refused(time_plans, capsys, lesson_copy, argv, why):
    argv = [lesson_copy if arg == "COPY" else arg for arg in argv]
    assert why in refusal(time_plans, capsys, *argv)


def test_timing_without_a_gpu_is_refused_after_the_flags(time_plans, capsys, lesson_copy,
                                                         monkeypatch):
    monkeypatch.setattr(time_plans.torch.cuda, "is_available", lambda: False)
    line = refusal(time_plans, capsys, "--copy", lesson_copy, "--shapes", "1x1024")
    assert line == "error: timing needs a CUDA GPU, and torch finds none (--registers needs none)"


def test_the_registers_of_a_copy_of_the_lesson_are_the_lessons(time_plans, capsys, lesson_copy):
    """The copy's plan compiles through the copy's own compile_launcher, as the lesson's does."""
    time_plans.main(["--registers", "--copy", str(lesson_copy), "--hidden", "1024"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[3] for line in lines] == ["copy", "lesson"]
    copy_line, lesson_line = (line.split(maxsplit=4)[4] for line in lines)
    assert copy_line == lesson_line
    # the lesson's plan for 1024 fp16 values: 128 vectors, 64 threads x 2, 2 rows per CTA
    assert copy_line.startswith("(h1024b2v8t64r2k2")
    assert " registers, 0 bytes spilled, " in copy_line
    assert "CTAs of 128 threads per SM" in copy_line
