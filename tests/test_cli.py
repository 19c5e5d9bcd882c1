"""CPU: the script run as a user runs it, on a machine without a GPU or with bad flags.

Every user error must end in one sentence on stderr and the documented exit
code (2), never a traceback.
"""

import subprocess
import sys

import pytest

from conftest import SAMPLE_PATH

EXIT_USAGE = 2


def run_script(*args, prelude=None):
    if prelude is None:
        cmd = [sys.executable, str(SAMPLE_PATH), *args]
    else:  # run the file as __main__ after `prelude`, e.g. to hide a package
        code = f"{prelude}\nimport runpy, sys\nsys.argv = [{str(SAMPLE_PATH)!r}, *{list(args)!r}]\n" \
               f"runpy.run_path({str(SAMPLE_PATH)!r}, run_name='__main__')"
        cmd = [sys.executable, "-c", code]
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


def test_without_a_gpu_the_script_says_so_and_exits_2():
    code, out, err = run_script()
    assert code == EXIT_USAGE
    assert_one_sentence(err, "no CUDA GPU", "8.0")
    assert "Inference result" not in out


def test_without_a_gpu_the_aot_script_says_so_and_exits_2():
    aot_script = SAMPLE_PATH.parent / "rms_norm_aot_cutedsl.py"
    proc = subprocess.run([sys.executable, str(aot_script)], capture_output=True, text=True, timeout=300,
                          env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == EXIT_USAGE
    assert_one_sentence(proc.stderr, "no CUDA GPU")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--num-tokens", "600"], "outside the profile [1, 512]"),
        (["--num-tokens", "0"], "outside the profile"),
        (["--min-tokens", "200", "--opt-tokens", "100"], "--min-tokens <= --opt-tokens"),
        (["--opt-tokens", "600"], "--opt-tokens <= --max-tokens"),
        (["--epsilon", "0"], "--epsilon"),
        (["--epsilon", "-1e-5"], "--epsilon"),
        (["--epsilon", "nan"], "--epsilon"),
        (["--epsilon", "inf"], "--epsilon"),
        (["--hidden-dim", "0"], "--hidden-dim"),
        (["--hidden-dim", "40000"], "--hidden-dim"),
        (["--dtype", "float32"], "--dtype"),
        (["--num-tokens", "many"], "--num-tokens"),
    ],
)
def test_bad_flags_get_one_sentence_and_exit_2(args, needle):
    code, _, err = run_script(*args)
    assert code == EXIT_USAGE
    assert_one_sentence(err, needle)


@pytest.mark.parametrize("package", ["cupy", "torch", "cutlass"])
def test_missing_package_names_it_and_exits_2(package):
    code, _, err = run_script(prelude=f"import sys; sys.modules[{package!r}] = None")
    assert code == EXIT_USAGE
    assert_one_sentence(err, f"'{package}'", "requirements.txt")


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
