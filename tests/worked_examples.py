"""The two worked examples of README.md's "Adapting it": patches that make a copy of the lesson
another op, applied as a reader applies them, and float64 references of their ops written here,
apart from the copies (the tests compare a copy with these, not with its own reference).

* tests/fixtures/layer_norm_bias.patch -> layer_norm_cutedsl.py: y = (x - mean) / sqrt(var + eps)
  * w + b; B a third input held like W (COLUMN_INPUTS = 2), two row sums (REDUCTIONS = 2).
* tests/fixtures/gated_rms_norm.patch -> gated_rms_norm_cutedsl.py: y = x / rms(x) * w * silu(z);
  Z a second row input read only at the store (ROW_INPUTS = 2), held from Step 1 or, a further fit
  step where it does not fit (gate_by_vector), loaded a vector at a time at the store.
"""

import collections
import dataclasses
import pathlib
import shutil
import subprocess

import numpy as np

from support.sample_loader import ROOT, SAMPLE_PATH, import_file, modules_as

FIXTURES = ROOT / "tests" / "fixtures"
# inputs: {name: "x" (X's dtype) or "w" (W's dtype)} in the plugin's order; columns: the inputs
# of [hidden].
Example = collections.namedtuple("Example", "patch copy_name plugin_name inputs columns")
EXAMPLES = {
    "layer_norm": Example(FIXTURES / "layer_norm_bias.patch", "layer_norm_cutedsl.py",
                          "LayerNormPlugin", {"X": "x", "W": "w", "B": "w"}, ("W", "B")),
    "gated": Example(FIXTURES / "gated_rms_norm.patch", "gated_rms_norm_cutedsl.py",
                     "GatedRmsNormPlugin", {"X": "x", "Z": "x", "W": "w"}, ("W",)),
}


def apply_patch(example: Example, directory: pathlib.Path) -> pathlib.Path:
    """The lesson copied into directory under the example's name and its patch applied."""
    copy = directory / example.copy_name
    shutil.copyfile(SAMPLE_PATH, copy)
    subprocess.run(["git", "apply", str(example.patch)], cwd=directory, check=True,
                   capture_output=True, text=True)
    return copy


def import_copy(path: pathlib.Path, name: str, trt_module=None):
    """Import a patched copy (its main() does not run), with trt_module as its `tensorrt`."""
    if trt_module is None:
        return import_file(path, name)
    with modules_as(tensorrt=trt_module):
        return import_file(path, name)


def distinct_plans(module) -> int:
    """The plans module.plan_kernel gives at every size of both element sizes (a size it refuses
    gives none), counted here: by every field of the plan but hidden, and by raggedness."""
    kinds = set()
    for elem_bytes in (2, 4):
        for hidden in range(1, module.MAX_HIDDEN + 1):
            try:
                plan = module.plan_kernel(hidden, elem_bytes)
            except module.PlanError:
                continue
            fields = dataclasses.asdict(plan)
            del fields["hidden"]
            kinds.add((tuple(fields.items()), plan.ragged))
    return len(kinds)


def reference(name: str, inputs: dict, epsilon: float) -> np.ndarray:
    """The example's op in float64 on numpy inputs by name."""
    x = np.asarray(inputs["X"], dtype=np.float64)
    w = np.asarray(inputs["W"], dtype=np.float64)
    if name == "layer_norm":
        centered = x - x.mean(axis=-1, keepdims=True)
        variance = (centered * centered).mean(axis=-1, keepdims=True)
        return centered / np.sqrt(variance + epsilon) * w + np.asarray(inputs["B"], np.float64)
    z = np.asarray(inputs["Z"], dtype=np.float64)
    rms = np.sqrt((x * x).mean(axis=-1, keepdims=True) + epsilon)
    return x / rms * w * (z / (1.0 + np.exp(-z)))


# One rounding of Y on top of FP32 arithmetic: 16-bit Y within an ulp of its dtype, FP32 Y within
# 2^-18 (the lesson's Y_TOLERANCE). A LayerNorm's bias cancels where y is near 0: there FP32's
# error scales with |b|, so the bound takes |ref| + |b|.
RTOL = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-18}
ATOL = 1e-6


def within_tolerance(name: str, y: np.ndarray, ref: np.ndarray, inputs: dict, dtype: str):
    """(elements out of tolerance, max abs error) of Y against the float64 reference."""
    scale = np.abs(ref)
    if name == "layer_norm":
        scale = scale + np.abs(np.asarray(inputs["B"], dtype=np.float64))
    err = np.abs(y.astype(np.float64) - ref)
    bad = ~(err <= ATOL + RTOL[dtype] * scale)  # NaN counts as bad
    return int(np.sum(bad)), float(np.nanmax(err, initial=0.0))
