"""Shared test plumbing: marker-based skips and the sample loaded against a chosen `tensorrt` (support/)."""

import pytest

from skip_policy import (  # noqa: F401 (hooks)
    pytest_collection_modifyitems, pytest_configure, pytest_make_collect_report, pytest_runtest_makereport,
)
from support.sample_loader import ROOT, SAMPLE_PATH, load_sample  # noqa: F401 (ROOT, SAMPLE_PATH: for tests)


@pytest.fixture(scope="session")
def sample_standin():
    """The sample bound to the labelled TensorRT stand-in (support/trt_standin.py)."""
    from support import trt_standin

    return load_sample(trt_standin, "rms_norm_plugin_with_standin")


@pytest.fixture(scope="session")
def sample_rtx():
    """The sample bound to TensorRT-RTX's Python bindings (real TensorRT-family classes, CPU only)."""
    trt_rtx = pytest.importorskip("tensorrt_rtx")
    return load_sample(trt_rtx, "rms_norm_plugin_with_rtx")
