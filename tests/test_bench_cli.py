"""CPU: the benchmark's output directory and selections are checked before any GPU work; --dry-run
needs none."""

import subprocess
import sys

import pytest

from conftest import ROOT

BENCH = ROOT / "benchmarks" / "bench_rms_norm.py"


def run_bench(*args, cwd):
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd,
                          env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin",
                               "OUT": str(cwd / "env-out")})


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


def test_dry_run_lists_the_issues_shapes_without_a_gpu(tmp_path):
    proc = run_bench("--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # matrix (46) + mid (2) + sweep (32) - 9 shared
    assert "71 shapes: 1x1024, 128x1024," in proc.stdout
    # the companion's plain form ("this") and the lesson, each a column of its own
    assert ("implementations: copy, this, lesson, torch_eager, torch_compile, quack, liger"
            in proc.stdout)
    assert "x 2 dtypes x" in proc.stdout and "estimated device time:" in proc.stdout
    assert not (tmp_path / "bench-results").exists()  # a dry run writes nothing


def test_dry_run_of_one_part_and_dtype(tmp_path):
    proc = run_bench("--dry-run", "--only", "sweep", "--dtypes", "bfloat16", "--impls", "copy,this",
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "32 shapes: 4096x512, 4096x1024," in proc.stdout
    assert "timings: 32 shapes x 1 dtypes x 2 implementations x 7 rounds = 448" in proc.stdout


@pytest.mark.parametrize("args,message", [
    (("--only", "matrix,nope"), "--only: unknown 'nope'"),
    (("--dtypes", "float32"), "--dtypes: unknown 'float32'"),
    (("--impls", "triton"), "--impls: unknown 'triton'"),
    (("--shapes", "4096x"), "--shapes '4096x': expected comma-separated TOKENSxHIDDEN"),
    (("--rounds", "0"), "--rounds must be at least 1"),
])
def test_bad_selections_are_refused_in_one_line(tmp_path, args, message):
    proc = run_bench(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert message in proc.stderr.splitlines()[-1]


def test_a_peer_version_comes_from_its_distribution_metadata(tmp_path, monkeypatch):
    """A package need not set __version__ (liger_kernel does not); its installed metadata always
    names the version. Here a minimal distribution without __version__ is installed into
    tmp_path."""
    (tmp_path / "versionless").mkdir()
    (tmp_path / "versionless" / "__init__.py").write_text("")
    info = tmp_path / "versionless-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: versionless\nVersion: 1.2.3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_rms_norm

    assert not hasattr(__import__("versionless"), "__version__")
    assert bench_rms_norm.package_version("versionless") == "1.2.3"
    assert bench_rms_norm.package_version("no-such-distribution-here") == "-"
