"""Import the sample against a chosen ``tensorrt`` module (real bindings, TensorRT-RTX or the stand-in), and the
experiment scripts of benchmarks/experiments/ as modules."""

import importlib.util
import pathlib
import sys

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


def load_experiment(name):
    """Import benchmarks/experiments/<name>.py as module `name` (its main() does not run)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
