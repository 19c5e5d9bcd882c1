"""Real TensorRT (marker `trt`): rms_norm_onnx_model.py builds, runs, compares and times, on the
user's GPU.

What no CPU test can do: TensorRT builds the rewritten model around the
plugin and the original with its own importers, runs both on the same
inputs at the profile's min, opt and max, and every replaced node must match
within the rounding the two computations allow (see the companion's [7]).
The models are those of test_onnx_model.py, exported the same way.
"""

import re
import subprocess
import sys

import pytest

import onnx_models
import rms_norm_onnx_model as companion
from test_onnx_model import BUILT, EXPORTS

pytestmark = pytest.mark.trt


def run_companion(*args):
    proc = subprocess.run([sys.executable, companion.__file__, *map(str, args)],
                          capture_output=True, text=True, timeout=1800)
    return proc.returncode, proc.stdout, proc.stderr


def assert_every_node_checked_and_timed(out, checks):
    checked = [line for line in out.splitlines()
               if "max |plugin - TensorRT|" in line and line.endswith(" ok")]
    assert len(checked) == 3 * checks, out  # each Y, and a fused node's S, at min, opt and max
    rows = re.findall(r"time per call: plugin\s+([\d.]+) us\s+TensorRT's import\s+([\d.]+) us"
                      r"\s+plugin / TensorRT ([\d.]+)", out)
    assert len(rows) == 3, out
    for ours, theirs, ratio in rows:
        assert float(ours) > 0 and float(theirs) > 0
        assert abs(float(ratio) - float(ours) / float(theirs)) < 0.02
    verdicts = r"(deploy the plugin|deploy TensorRT's own import|mixed)"
    assert re.search(rf"For these shapes: {verdicts}", out)
    assert "Inference result correct!" in out


@pytest.mark.parametrize("dtype, w_dtype", [("float16", "float32"), ("bfloat16", "float32"),
                                            ("float16", "float16"), ("float32", "bfloat16")])
def test_the_one_node_model_matches_tensorrts_import_and_both_are_timed(dtype, w_dtype):
    """What the sample's --compare-builtin did: ONNX's RMSNormalization, the plugin against
    TensorRT's import."""
    code, out, err = run_companion("--dtype", dtype, "--weight-dtype", w_dtype)
    assert code == 0, out + err
    assert_every_node_checked_and_timed(out, 1)
    assert "  min: X (1, 1024)" in out and "  max: X (512, 1024)" in out


# Every export test_onnx_model.py builds with TensorRT-RTX, and one with FP8 Q/DQ before the
# MatMuls (Model Optimizer's pattern): every norm's Quantize folded, the plugin's FP8 Y compared
# with TensorRT's QuantizeLinear output (SM89+).
MODELS = {
    **{name: EXPORTS[name][0] for name in BUILT},
    "llama_dynamo_opset23_fp8_qdq": lambda d: onnx_models.fp8_qdq_before_matmuls(
        onnx_models.export_dynamo(d / "m.onnx", "llama", "float16"), d / "fp8.onnx"),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_an_exported_model_rewritten_matches_tensorrts_import_of_the_original(tmp_path, name):
    path = MODELS[name](tmp_path)
    model = companion.load_model(str(path))
    replaced, _ = companion.rewrite_model(companion.load_model(str(path)))
    shapes = [f"--{point}-shapes=" + ",".join(
        f"{v.name}:" + "x".join(str(d if isinstance(d, int) else n) for d in v.shape)
        for v in companion.model_inputs(model))
        for point, n in (("min", 1), ("opt", 16), ("max", 64))]
    code, out, err = run_companion(path, *shapes, "-o", tmp_path / "model_rmsnorm.onnx")
    assert code == 0, out + err
    assert_every_node_checked_and_timed(out, len(replaced) + sum(bool(r.sum) for r in replaced))
