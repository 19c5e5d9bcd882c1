"""Shared test plumbing: marker-based skips and loading the sample against a chosen `tensorrt`."""

import importlib.util
import pathlib
import sys

import pytest

from skip_policy import (  # noqa: F401 (hooks)
    pytest_collection_modifyitems, pytest_configure, pytest_make_collect_report, pytest_runtest_makereport,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE_PATH = ROOT / "rms_norm_plugin_cutedsl.py"


def load_sample(trt_module, name):
    """Import rms_norm_plugin_cutedsl.py as module `name`, with `trt_module` as its `tensorrt`."""
    missing = object()
    saved = sys.modules.get("tensorrt", missing)
    sys.modules["tensorrt"] = trt_module
    try:
        spec = importlib.util.spec_from_file_location(name, SAMPLE_PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        if saved is missing:
            del sys.modules["tensorrt"]
        else:
            sys.modules["tensorrt"] = saved
    return module


@pytest.fixture(scope="session")
def sample_standin():
    """The sample bound to the labelled TensorRT stand-in (tests/trt_standin.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import trt_standin

    return load_sample(trt_standin, "rms_norm_plugin_with_standin")


@pytest.fixture(scope="session")
def sample_rtx():
    """The sample bound to TensorRT-RTX's Python bindings (real TensorRT-family classes, CPU only)."""
    trt_rtx = pytest.importorskip("tensorrt_rtx")
    return load_sample(trt_rtx, "rms_norm_plugin_with_rtx")
