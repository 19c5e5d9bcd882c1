"""CPU: the benchmark's output directory is the user's choice and is checked before any GPU work."""

import subprocess
import sys

from conftest import ROOT

BENCH = ROOT / "benchmarks" / "bench_rms_norm.py"


def run_bench(*args, cwd):
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin", "OUT": str(cwd / "env-out")})


def test_an_unusable_out_dir_is_refused_at_once(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = run_bench("--out-dir", str(blocker / "results"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"--out-dir {blocker / 'results'}" in proc.stderr.splitlines()[-1]


def test_help_names_the_default_which_is_not_the_committed_results(tmp_path):
    proc = run_bench("--help", cwd=tmp_path)
    assert proc.returncode == 0
    text = "".join(proc.stdout.split())  # argparse wraps lines, also at hyphens
    assert "default./bench-results" in text
    assert "benchmarks/results" not in text
