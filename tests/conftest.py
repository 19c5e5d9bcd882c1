"""Shared test plumbing: marker-based skips, the sample loaded against a chosen `tensorrt` (support/), RTX builds."""

import importlib.util
import pathlib

import pytest

from skip_policy import (  # noqa: F401 (hooks)
    pytest_collection_modifyitems, pytest_configure, pytest_make_collect_report, pytest_runtest_makereport,
)
from support.sample_loader import (ROOT, SAMPLE_PATH, FUSED_PATH, load_experiment,  # noqa: F401
                                   load_fused, load_sample)


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


@pytest.fixture(scope="session")
def fused_standin(sample_standin):
    """The fused companion on the lesson bound to the labelled TensorRT stand-in."""
    from support import trt_standin

    return load_fused(trt_standin, "rms_norm_fused_with_standin", sample_standin)


@pytest.fixture(scope="session")
def fused_rtx(sample_rtx):
    """The fused companion on the lesson bound to TensorRT-RTX's Python bindings."""
    import tensorrt_rtx

    return load_fused(tensorrt_rtx, "rms_norm_fused_with_rtx", sample_rtx)


@pytest.fixture(scope="session")
def rtx_lib_dir(tmp_path_factory):
    """A directory with libtensorrt_rtx.so -> the wheel's libtensorrt_rtx.so.1 (the ONNX parser dlopens the former)."""
    pytest.importorskip("tensorrt_rtx")
    spec = importlib.util.find_spec("tensorrt_rtx_libs")  # locates the wheel without loading its libraries
    if spec is None or spec.origin is None:
        pytest.skip("tensorrt_rtx_libs (the TensorRT-RTX library wheel) is not installed")
    so1 = pathlib.Path(spec.origin).parent / "libtensorrt_rtx.so.1"
    if not so1.exists():
        pytest.skip(f"{so1} does not exist")
    lib_dir = tmp_path_factory.mktemp("rtx_libs")
    (lib_dir / "libtensorrt_rtx.so").symlink_to(so1)
    return lib_dir
