"""CPU: benchmarks/experiments/compare_ptx.py cuts a PTX module into its kernels, and finds the kernels an edit of
the sample changes, and only those.

The edit below touches only the branch of Step 4 that epsilon 1e-40 takes (its rsqrt made 1 / sqrt).
At hidden 1024 every launcher holds one kernel (2 KB and 4 KB rows: ROW_PLANS has no few, mid or cluster plan
for them), so on sm_80 the script compares 12 kernels: X fp16, bf16 and fp32 with W fp32, at epsilon 1e-5 and
1e-40 (1024 is one of its TINY_EPSILON_HIDDEN), each in the plugin's and the AOT flavor's launcher; the 6 at
1e-40 differ.
"""

import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, SAMPLE_PATH, load_experiment

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
    first = (".visible .entry KERNEL(\n\t.param .u64 .ptr .align 16 KERNEL_param_0\n)\n{\n\tret;\n\n}\n"
             "\t// .globl\tKERNEL\n")
    second = ".visible .entry KERNEL(\n\t.param .u64 .ptr .align 16 KERNEL_param_0\n)\n{\n\texit;\n\n}\n"
    # kernel_a_1 is a prefix of kernel_a_10: replaced first, it would leave KERNEL0 behind
    assert load_experiment("compare_ptx").kernels_of(TWO_KERNELS) == [
        ("kernel_a_1", header + first), ("kernel_a_10", header + second)]


def test_an_edit_of_one_branch_differs_in_exactly_the_kernels_that_take_it(tmp_path):
    if shutil.which("ptxas") is None or shutil.which("nvdisasm") is None:  # requirements-test.txt installs both
        pytest.skip("ptxas or nvdisasm is not on PATH (pip install nvidia-cuda-nvcc nvidia-cuda-nvdisasm)")
    source = SAMPLE_PATH.read_text()
    assert source.count(PLAIN_RSQRT) == 1, "the sample's plain rsqrt moved: update this test's edit"
    (tmp_path / SAMPLE_PATH.name).write_text(source.replace(PLAIN_RSQRT,
                                                            "    return Float32(1.0) / cute.math.sqrt(mean_sq_eps)\n"))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--arch", "sm_80", "--hidden", "1024"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    differing = [re.match(r"DIFFERENT (.*), (\w+) launcher kernel 1 of 1 \(.*\): PTX and SASS differ$", line)
                 for line in lines if line.startswith("DIFFERENT")]
    assert all(differing), lines
    assert sorted(m.groups() for m in differing) == sorted(
        (f"sm_80 X {dtype} W float32 hidden 1024 epsilon 1e-40", launcher)
        for dtype in ("float16", "bfloat16", "float32") for launcher in ("plugin", "aot"))
    assert lines[-1].startswith("6 of 12 kernels identical in PTX or SASS (6 in PTX, 0 only in SASS; 6 cases;")
