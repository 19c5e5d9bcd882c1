"""CPU: in CI only gpu/trt marker skips are allowed; every other skip fails the run.

The hooks of tests/skip_policy.py run in an inner pytest session (pytester),
with the marker reasons fixed so the outcome does not depend on this machine.
"""

import importlib.metadata
import pathlib
import time

import pytest

import skip_policy

INNER_TESTS = """
import pytest

def test_passes():
    pass

def test_skips_for_a_missing_tool():
    pytest.skip("ptxas (CUDA toolkit) not on PATH")

@pytest.mark.skipif(True, reason="tensorrt_rtx is not installed")
def test_skipif_without_a_marker():
    pass

@pytest.mark.gpu
def test_gpu():
    pass

@pytest.mark.trt
@pytest.mark.skipif(True, reason="trtexec is not on PATH")
def test_trt_with_its_own_skipif():
    pass

@pytest.mark.xfail(reason="expected")
def test_xfail():
    assert False
"""


MODULE_SKIP = """
import pytest

pytest.importorskip("a_package_that_is_not_installed")

def test_never_collected():
    pass
"""


@pytest.fixture
def inner(pytester, monkeypatch):
    pytester.makeini("[pytest]\nmarkers =\n    gpu: g\n    trt: t\n")
    pytester.makeconftest("from skip_policy import pytest_collection_modifyitems, "
                          "pytest_make_collect_report, pytest_runtest_makereport\n")

    def run(ci, reasons, tests=INNER_TESTS):
        pytester.makepyfile(test_inner=tests)
        monkeypatch.setattr(skip_policy, "marker_reasons", lambda: reasons)
        if ci:
            monkeypatch.setenv("CI", "true")
        else:
            monkeypatch.delenv("CI", raising=False)
        return pytester.runpytest("-ra")

    return run


def test_in_ci_a_skip_without_its_marker_fails(inner):
    result = inner(ci=True, reasons={"gpu": "no CUDA GPU", "trt": "no TensorRT"})
    # A skip at setup (a skip mark) becomes an error, one inside the test a failure: both fail the
    # run.
    result.assert_outcomes(passed=1, failed=1, errors=1, skipped=2, xfailed=1)
    result.stdout.fnmatch_lines([
        "*only gpu/trt marker skips are allowed: tensorrt_rtx is not installed*",
        "*only gpu/trt marker skips are allowed: ptxas (CUDA toolkit) not on PATH*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_in_ci_a_marked_test_may_not_skip_for_another_reason_where_its_marker_runs(inner):
    result = inner(ci=True, reasons={"gpu": None, "trt": None})
    result.assert_outcomes(passed=2, failed=1, errors=2, xfailed=1)
    result.stdout.fnmatch_lines(["*only gpu/trt marker skips are allowed: trtexec is not on PATH*"])


def test_outside_ci_every_skip_stays_a_skip(inner):
    result = inner(ci=False, reasons={"gpu": "no CUDA GPU", "trt": "no TensorRT"})
    result.assert_outcomes(passed=1, skipped=4, xfailed=1)
    assert result.ret == pytest.ExitCode.OK


def test_in_ci_a_module_skipped_at_import_fails(inner):
    result = inner(ci=True, reasons={"gpu": "no CUDA GPU", "trt": "no TensorRT"}, tests=MODULE_SKIP)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*only gpu/trt marker skips are allowed: *a_package_that_is_not_installed*"])
    assert result.ret != pytest.ExitCode.OK
    assert inner(ci=False, reasons={}, tests=MODULE_SKIP).ret == pytest.ExitCode.NO_TESTS_COLLECTED


@pytest.mark.parametrize("tool, wheel", [("ptxas", "nvidia-cuda-nvcc"),
                                         ("nvdisasm", "nvidia-cuda-nvdisasm")])
def test_the_wheels_tools_are_found(monkeypatch, tool, wheel):
    """requirements-test.txt installs nvidia-cuda-nvcc and nvidia-cuda-nvdisasm so the ptxas and
    SASS tests never skip; conftest finds their tools."""
    installed = set()
    for name in (wheel, f"{wheel}-cu12"):
        try:
            installed.add(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            pass
    # e.g. requirements-kernel.txt; in CI (requirements-test.txt) this skip is a failure
    if not installed:
        pytest.skip(f"the {wheel} wheel is not installed")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    skip_policy.put_wheel_tools_on_path()
    assert skip_policy.shutil.which(tool), f"no {tool} on PATH nor in an {wheel} wheel"


HANGING_GPU_TEST = """
import time

import pytest

@pytest.mark.gpu
def test_waits_for_bytes_that_never_come():
    time.sleep(45)
"""


def test_a_hanging_gpu_test_fails_with_its_name_within_its_time_limit(pytester, monkeypatch):
    """With a GPU present, a gpu test that hangs is stopped at its time limit
    (RMS_NORM_TEST_TIMEOUT, here 3 s) and the run fails, naming the test, instead of waiting
    forever. In a subprocess: the limit ends the process."""
    # requirements-test.txt has it; in CI this skip is a failure
    pytest.importorskip("pytest_timeout")
    pytester.makeini("[pytest]\nmarkers =\n    gpu: g\n    trt: t\n")
    pytester.makeconftest("import skip_policy\n"
                          "skip_policy.marker_reasons = lambda: {'gpu': None, 'trt': None}\n"
                          "from skip_policy import pytest_collection_modifyitems\n")
    pytester.makepyfile(test_hang=HANGING_GPU_TEST)
    monkeypatch.setenv("RMS_NORM_TEST_TIMEOUT", "3")
    monkeypatch.setenv("PYTHONPATH", str(pathlib.Path(__file__).parent))
    started = time.monotonic()
    result = pytester.runpytest_subprocess("-v")
    assert time.monotonic() - started < 30
    assert result.ret != 0
    output = result.stdout.str() + result.stderr.str()
    assert "Timeout" in output and "test_waits_for_bytes_that_never_come" in output, output
