"""Import the lesson and its fused companion against a chosen ``tensorrt`` module (real bindings,
TensorRT-RTX or the stand-in), and the experiment scripts of benchmarks/experiments/ as modules."""

import contextlib
import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE_PATH = ROOT / "rms_norm_plugin_cutedsl.py"
FUSED_PATH = ROOT / "rms_norm_fused_cutedsl.py"


@contextlib.contextmanager
def modules_as(**modules):
    """sys.modules[name] = module for each keyword while the block runs, then as they were."""
    missing = object()
    saved = {name: sys.modules.get(name, missing) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is missing:
                del sys.modules[name]
            else:
                sys.modules[name] = module


def import_file(path, name):
    """Import the file at `path` as module `name` (its main() does not run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def load_sample(trt_module, name):
    """Import rms_norm_plugin_cutedsl.py as module `name`, with `trt_module` as its `tensorrt`."""
    with modules_as(tensorrt=trt_module):
        return import_file(SAMPLE_PATH, name)


def load_fused(trt_module, name, lesson):
    """Import rms_norm_fused_cutedsl.py as module `name` on top of `lesson` (a module load_sample
    made with the same `trt_module`), with `trt_module` as its `tensorrt`."""
    with modules_as(tensorrt=trt_module, rms_norm_plugin_cutedsl=lesson):
        return import_file(FUSED_PATH, name)


def load_experiment(name):
    """Import benchmarks/experiments/<name>.py as module `name` (its main() does not run)."""
    path = ROOT / "benchmarks" / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
