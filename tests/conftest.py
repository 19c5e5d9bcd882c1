"""Shared test plumbing: marker-based skips and the sample loaded against a chosen `tensorrt` (support/)."""

import pytest

from support.sample_loader import ROOT, SAMPLE_PATH, load_sample  # noqa: F401 (ROOT, SAMPLE_PATH: for tests)


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


def pytest_collection_modifyitems(config, items):
    gpu, trt = _gpu_reason(), _trt_reason()
    for item in items:
        if "trt" in item.keywords and trt:
            item.add_marker(pytest.mark.skip(reason=f"trt: {trt}"))
        elif "gpu" in item.keywords and gpu:
            item.add_marker(pytest.mark.skip(reason=f"gpu: {gpu}"))


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
