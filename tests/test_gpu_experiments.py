"""GPU: the exploration scripts whose figures benchmarks/NOTES.md quotes run, and their kernels are
correct.

Each script checks every kernel's output against the float64 formula
(bench_rms_norm.out_of_tolerance) before timing it and exits non-zero on a mismatch; one round keeps
these runs short. time_plans.py --copy (a copy of the lesson against the lesson) checks only that
each launcher writes all of Y, finite (a copy computes its own math), and times five rounds, as its
ratios are held to a band.
"""

import shutil
import subprocess
import sys

import pytest

from conftest import FUSED_PATH, ROOT, SAMPLE_PATH

pytestmark = pytest.mark.gpu

EXPERIMENTS = ROOT / "benchmarks" / "experiments"


def run(script, *args):
    proc = subprocess.run([sys.executable, str(EXPERIMENTS / script), *args], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    headers = ("| dtype", "| tokens x hidden")
    lines = proc.stdout.splitlines()
    return [line for line in lines if line.startswith("| ") and not line.startswith(headers)]


def test_time_plans_times_torch_compile_in_the_same_rounds():
    rows = run("time_plans.py", "--shapes", "128x1024", "--plans", "t64k2", "--rounds", "1",
               "--compile")
    assert [row.split(" | ")[2].split()[0] for row in rows] == ["copy_", "own", "torch.compile",
                                                                 "t64k2"]
    # seven cells: the third ratio is time / torch.compile
    assert all(row.count("|") == 8 for row in rows)


# A copy with a third input, B, as a LayerNorm's bias: the lesson's kernel, which ignores it. A
# launcher that the script called with the lesson's (X, W) alone would fail on the missing argument.
THREE_INPUTS = """
import torch

import rms_norm_plugin_cutedsl as lesson
from rms_norm_plugin_cutedsl import DEFAULT_EPSILON, DTYPES, gpu_arch, plan_kernel


def make_inputs(num_tokens, hidden, dtype, seed, w_dtype="float32"):
    return (*lesson.make_inputs(num_tokens, hidden, dtype, seed, w_dtype), torch.zeros(hidden))


def compile_launcher(plan, dtype, w_dtype, epsilon, arch, keep_ptx=False):
    launcher = lesson.compile_launcher(plan, dtype, w_dtype, epsilon, arch, keep_ptx)
    return lambda x, w, b, y, num_tokens, stream: launcher(x, w, y, num_tokens, stream)
"""


@pytest.mark.parametrize("source", ["the lesson's", "three inputs"])
def test_time_plans_times_a_copy_against_the_lesson(tmp_path, source):
    """The same kernel either side: copy / lesson within a loose band around 1, at a few-token and
    a many-token count (one plan for both)."""
    copy = tmp_path / "my_norm.py"
    if source == "three inputs":
        copy.write_text(THREE_INPUTS)
    else:
        shutil.copy(SAMPLE_PATH, copy)
    rows = run("time_plans.py", "--copy", str(copy), "--shapes", "1x4096,4096x4096", "--dtypes",
               "float16,bfloat16", "--rounds", "5")
    cells = [row.strip("| ").split(" | ") for row in rows]
    assert [cell[:2] for cell in cells] == [["1x4096", "float16"], ["4096x4096", "float16"],
                                            ["1x4096", "bfloat16"], ["4096x4096", "bfloat16"]]
    for cell in cells:
        to_copy, lesson_to_copy, to_lesson = map(float, cell[2:])
        assert 0.7 <= to_lesson <= 1.4, cell
        assert to_copy > 0.0 and lesson_to_copy > 0.0, cell


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_persistent_ring_normalizes_every_row(dtype):
    # 1000 rows: not a multiple of any grid, so CTAs get different numbers of rows and slots refill
    # unevenly
    rows = run("persistent_ring.py", "--shapes", "1000x4096,3x4096", "--variants",
               "t128k4s2p2,t128k4s3p1", "--dtypes", dtype, "--rounds", "1")
    assert [row.split(" | ")[2] for row in rows] == ["copy_", "the companion", "t128k4s2p2",
                                                     "t128k4s3p1"] * 2


def test_compare_checkouts_checks_and_times_every_form_against_a_copy_of_itself(tmp_path):
    """The same companion either side: every output checked and the same bytes, every form timed."""
    base = tmp_path / "base"
    base.mkdir()
    shutil.copy(SAMPLE_PATH, base / SAMPLE_PATH.name)
    shutil.copy(FUSED_PATH, base / FUSED_PATH.name)
    rows = run("compare_checkouts.py", str(base), "--shapes", "1x1024,512x4096", "--dtypes",
               "bfloat16", "--rounds", "1")
    cells = [row.strip("| ").split(" | ") for row in rows if not row.startswith("| form |")]
    assert [cell[:3] for cell in cells] == [
        [form, "bfloat16", shape] for form in ("plain", "residual", "fp8", "residual_fp8")
        for shape in ("1x1024", "512x4096")]
    assert all(cell[-1] == "identical" for cell in cells), cells


def test_the_plain_benchmark_times_the_lesson_beside_the_companion(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_rms_norm.py"),
                           "--quick", "--shapes", "128x1024", "--dtypes", "float16", "--rounds",
                           "1", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (tmp_path / "h200.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| dtype |")).split(" | ")
    row = next(line for line in lines if line.startswith("| float16 | 128x1024 |")).split(" | ")
    assert "the lesson" in header and "this / lesson" in header
    assert float(row[header.index("this / lesson")]) > 0.0


def test_fused_plans_checks_and_times_the_residual_forms_plans():
    """The own plan and a spec, checked (exit 0: Y and S right) and timed against FlashInfer."""
    proc = subprocess.run([sys.executable, str(EXPERIMENTS / "fused_plans.py"), "--residual",
                           "--dtype", "float16", "--shapes", "512x4096", "--plans", "own,t64k8s",
                           "--rounds", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    timed = [line.split(" (")[0] for line in proc.stdout.splitlines() if " us" in line]
    assert timed[:2] == ["512x4096 float16 own", "512x4096 float16 t64k8s"]
