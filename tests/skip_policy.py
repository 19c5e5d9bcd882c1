"""Which tests may skip, and where: marker skips for `gpu` and `trt`, no other skip in CI.

Hooks for tests/conftest.py (it imports them), kept in their own module so
tests/test_skip_policy.py can run them in an inner pytest session.
"""

import functools
import os
import pathlib
import shutil

import pytest


def put_wheel_tools_on_path():
    """Append to PATH the bin/ of the nvidia-cuda-nvcc and nvidia-cuda-nvdisasm wheels (requirements-test.txt)
    that hold ptxas and nvdisasm, for each tool not already on it."""
    try:
        import nvidia  # namespace package of NVIDIA's CUDA wheels
    except ImportError:
        return
    for tool in ("ptxas", "nvdisasm"):
        # CUDA 13 wheels share nvidia/cu13/bin; CUDA 12 wheels have a bin/ each
        found = [bin_dir for root in map(pathlib.Path, nvidia.__path__)
                 for bin_dir in (root / "cu13" / "bin", root / "cuda_nvcc" / "bin", root / "cuda_nvdisasm" / "bin")
                 if (bin_dir / tool).is_file()]
        if found and not shutil.which(tool):
            os.environ["PATH"] = os.pathsep.join(filter(None, (os.environ.get("PATH"), str(found[0]))))


def _gpu_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if torch.cuda.get_device_capability()[0] < 8:
        return "GPU older than SM80"
    return None


def _trt_reason():
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return "real TensorRT is not installed (pip install -r requirements.txt on a GPU machine)"
    return _gpu_reason()


@functools.cache
def marker_reasons():
    """{marker: why its tests skip here, or None where they run}."""
    return {"gpu": _gpu_reason(), "trt": _trt_reason()}


def in_ci():
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_configure(config):
    put_wheel_tools_on_path()


def device_test_seconds():
    """The time limit of one gpu or trt test (RMS_NORM_TEST_TIMEOUT overrides it): a kernel that hangs, waiting on
    an mbarrier for bytes that never come, then fails with the test's name instead of stalling the whole run."""
    return float(os.environ.get("RMS_NORM_TEST_TIMEOUT", "300"))


def pytest_collection_modifyitems(config, items):
    reasons = marker_reasons()
    for item in items:
        for marker in ("trt", "gpu"):
            if marker in item.keywords and reasons[marker]:
                item.add_marker(pytest.mark.skip(reason=f"{marker}: {reasons[marker]}"))
                break
            if marker in item.keywords and config.pluginmanager.hasplugin("timeout"):
                # pytest-timeout's thread method: a hung CUDA call never returns to Python, so no signal handler
                # would run; a watchdog thread prints every thread's stack, the test's frame included, and exits.
                item.add_marker(pytest.mark.timeout(device_test_seconds(), method="thread"))
                break


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI (CI=true), a skip is a failure unless the test's gpu/trt marker explains it.

    Anything else that skips (tensorrt_rtx, ptxas or a wheel download missing)
    means the test set did not install what the tests need, which a green run
    must not hide.
    """
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and in_ci()) or hasattr(report, "wasxfail"):
        return
    reasons = marker_reasons()
    if any(marker in item.keywords and reasons[marker] for marker in ("gpu", "trt")):
        return
    why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    why = why.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = f"skipped in CI, where only gpu/trt marker skips are allowed: {why}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """In CI, a whole module skipped at import (a module-level importorskip) is a failure too."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci():
        why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where only gpu/trt marker skips are allowed: {why.removeprefix('Skipped: ')}"
