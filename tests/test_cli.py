"""CPU: the scripts run as a user runs them, on a machine without a GPU or with bad flags.

Every user error must end in one sentence on stderr and the documented exit
code (2), never a traceback; flags are checked before torch, CuteDSL or
TensorRT is imported, so those errors come at once.
"""

import subprocess
import sys
import time

import pytest

from conftest import SAMPLE_PATH

EXIT_USAGE = 2
AOT_PATH = SAMPLE_PATH.parent / "rms_norm_aot_cutedsl.py"
HEAVY = ("torch", "cutlass", "cupy", "tensorrt", "numpy")


def run_script(*args, prelude=None, script=SAMPLE_PATH, python_flags=()):
    if prelude is None:
        cmd = [sys.executable, *python_flags, str(script), *args]
    else:  # run the file as __main__ after `prelude`, e.g. to hide a package
        code = f"{prelude}\nimport runpy, sys\nsys.argv = [{str(script)!r}, *{list(args)!r}]\n" \
               f"runpy.run_path({str(script)!r}, run_name='__main__')"
        cmd = [sys.executable, *python_flags, "-c", code]
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_sentence(stderr, *needles):
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


# What the script imported before it exited, printed by an atexit hook (runs after sys.exit).
REPORT_HEAVY_IMPORTS = (
    "import atexit, sys\n"
    f"atexit.register(lambda: print('HEAVY', sorted({{m.partition('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))"
)


def heavy_imports(stdout):
    (line,) = [line for line in stdout.splitlines() if line.startswith("HEAVY ")]
    return line


def test_without_a_gpu_the_script_says_so_and_exits_2():
    code, out, err = run_script()
    assert code == EXIT_USAGE
    assert_one_sentence(err, "no CUDA GPU", "8.0")
    assert "Inference result" not in out


def test_without_a_gpu_the_aot_script_says_so_and_exits_2():
    code, _, err = run_script(script=AOT_PATH)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "no CUDA GPU")


BAD_FLAGS = [
    (["--num-tokens", "600"], "outside the profile [1, 512]"),
    (["--num-tokens", "0"], "outside the profile"),
    (["--min-tokens", "200", "--opt-tokens", "100"], "--min-tokens <= --opt-tokens"),
    (["--opt-tokens", "600"], "--opt-tokens <= --max-tokens"),
    (["--epsilon", "0"], "--epsilon"),
    (["--epsilon", "-1e-5"], "--epsilon"),
    (["--epsilon", "nan"], "--epsilon"),
    (["--epsilon", "inf"], "--epsilon"),
    (["--epsilon", "1e-50"], "--epsilon"),  # > 0 as a double, 0 in float32
    (["--epsilon", "1e39"], "--epsilon"),   # finite as a double, beyond float32
    (["--hidden-dim", "0"], "--hidden-dim"),
    (["--hidden-dim", "40000"], "--hidden-dim"),
    (["--dtype", "float64"], "--dtype"),
    (["--weight-dtype", "float64"], "--weight-dtype"),
    (["--num-tokens", "many"], "--num-tokens"),
    (["--engine", "/nonexistent/dir/x.engine"], "directory '/nonexistent/dir' does not exist"),
    (["--engine", "/etc/hostname/x.engine"], "'/etc/hostname' is not a directory"),
    (["--engine", "/tmp"], "'/tmp' exists but is not a file"),
]


@pytest.mark.parametrize("args,needle", BAD_FLAGS)
def test_bad_flags_get_one_sentence_and_exit_2_before_any_heavy_import(args, needle):
    code, out, err = run_script(*args, prelude=REPORT_HEAVY_IMPORTS)
    assert code == EXIT_USAGE
    assert_one_sentence(err, needle)
    assert heavy_imports(out) == "HEAVY []"


@pytest.mark.parametrize("args,needle", BAD_FLAGS[:2] + BAD_FLAGS[-3:])
def test_the_aot_script_checks_the_same_flags(args, needle):
    code, _, err = run_script(*args, script=AOT_PATH)
    assert code == EXIT_USAGE
    assert_one_sentence(err, needle)


def test_help_and_a_flag_error_return_well_under_a_second():
    for args, expected_code in ((["--help"], 0), (["--dtype", "float64"], EXIT_USAGE)):
        start = time.perf_counter()
        code, out, _ = run_script(*args, prelude=REPORT_HEAVY_IMPORTS)
        elapsed = time.perf_counter() - start
        assert code == expected_code
        assert heavy_imports(out) == "HEAVY []"
        assert elapsed < 1.0, f"{args}: {elapsed:.2f} s"


@pytest.mark.parametrize("package,pip_name", [
    ("numpy", "numpy"), ("cuda", "cuda-python"), ("cupy", "cupy-cuda12x"), ("torch", "torch"),
    ("cutlass", "nvidia-cutlass-dsl"),
])
@pytest.mark.parametrize("script", [SAMPLE_PATH, AOT_PATH], ids=["plugin", "aot"])
def test_missing_package_names_its_pip_package_and_exits_2(package, pip_name, script):
    code, _, err = run_script(prelude=f"import sys; sys.modules[{package!r}] = None", script=script)
    assert code == EXIT_USAGE
    assert_one_sentence(err, f"package {pip_name} ", "pip install -r requirements.txt")


def test_an_environment_without_site_packages_names_numpy_first():
    """python -S: only the standard library, as in a fresh virtual environment."""
    code, _, err = run_script(python_flags=["-S"])
    assert code == EXIT_USAGE
    assert_one_sentence(err, "package numpy ")


def test_help_documents_the_exit_codes():
    code, out, _ = run_script("--help")
    assert code == 0
    assert "0 every run matched NumPy, 1 a run did not, 2 usage or environment error" in " ".join(out.split())


def test_from_onnx_without_onnx_installed_says_what_to_install(monkeypatch):
    import sys as _sys

    import rms_norm_plugin_cutedsl as sample

    monkeypatch.setitem(_sys.modules, "onnx", None)
    with pytest.raises(sample.UsageError, match="pip install onnx"):
        sample.make_onnx_model(1024, "float16", 1e-5)


@pytest.mark.parametrize(
    "num, lo, opt, hi, expected",
    [
        (128, 1, 128, 512, [128, 1, 512, 37]),   # README: "runs 128/1/512/37 tokens"
        (511, 3, 37, 511, [511, 3, 37]),         # 37 is in the profile; 511 is both main run and max
        (150, 100, 150, 200, [150, 100, 200, 199]),  # 37 is outside: one below the max instead
        (64, 64, 64, 64, [64]),                  # a one-shape profile has no other count to run
    ],
)
def test_token_counts_are_the_main_run_the_profile_edges_and_an_odd_count(num, lo, opt, hi, expected):
    import argparse

    import rms_norm_plugin_cutedsl as sample

    args = argparse.Namespace(num_tokens=num, min_tokens=lo, opt_tokens=opt, max_tokens=hi)
    assert sample.token_counts(args) == expected
