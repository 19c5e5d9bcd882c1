"""Shared test plumbing: marker-based skips and loading the sample against a chosen `tensorrt`."""

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE_PATH = ROOT / "rms_norm_plugin_cutedsl.py"


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
