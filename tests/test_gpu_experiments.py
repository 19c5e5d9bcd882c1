"""GPU: the exploration scripts whose figures benchmarks/NOTES.md quotes run, and their kernels are correct.

Each script checks every kernel's output against the float64 formula (bench_rms_norm.out_of_tolerance) before
timing it and exits non-zero on a mismatch; one round keeps these runs short.
"""

import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.gpu

EXPERIMENTS = ROOT / "benchmarks" / "experiments"


def run(script, *args):
    proc = subprocess.run([sys.executable, str(EXPERIMENTS / script), *args], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if line.startswith("| ") and not line.startswith("| dtype")]


def test_time_plans_times_torch_compile_in_the_same_rounds():
    rows = run("time_plans.py", "--shapes", "128x1024", "--plans", "t64k2", "--rounds", "1", "--compile")
    assert [row.split(" | ")[2].split()[0] for row in rows] == ["copy_", "own", "torch.compile", "t64k2"]
    assert all(row.count("|") == 8 for row in rows)  # seven cells: the third ratio is time / torch.compile


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_persistent_ring_normalizes_every_row(dtype):
    # 1000 rows: not a multiple of any grid, so CTAs get different numbers of rows and slots refill unevenly
    rows = run("persistent_ring.py", "--shapes", "1000x4096,3x4096", "--variants", "t128k4s2p2,t128k4s3p1",
               "--dtypes", dtype, "--rounds", "1")
    assert [row.split(" | ")[2] for row in rows] == ["copy_", "the sample", "t128k4s2p2", "t128k4s3p1"] * 2
