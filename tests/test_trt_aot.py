"""Real TensorRT >= 10.9 (marker `trt`): the AOT flavor end to end. Skipped where TensorRT is
absent.

Engines are run through an execution context on torch buffers, not Polygraphy's
TrtRunner, which cannot find a pip-installed CUDA 13 runtime.
"""

import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

pytestmark = pytest.mark.trt
AOT_SCRIPT = ROOT / "rms_norm_aot_cutedsl.py"


@pytest.mark.parametrize("dtype, w_dtype", [("float16", "float32"), ("bfloat16", "float32"),
                                            ("float32", "float32"), ("float16", "float16"),
                                            ("bfloat16", "bfloat16"), ("float32", "float16")])
@pytest.mark.parametrize("extra", [[], ["--hidden-dim", "4096", "--epsilon", "1e-3"]])
def test_aot_script_builds_runs_and_checks(dtype, w_dtype, extra):
    """Builds through tensorrt.plugin's real get_launch_params (issue 19 item 1) with a
    float32-array epsilon attribute, which every TensorRT from 10.9 parses under NumPy 2.4 (item
    2)."""
    proc = subprocess.run([sys.executable, str(AOT_SCRIPT), "--dtype", dtype,
                           "--weight-dtype", w_dtype, *extra], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Inference result correct!" in proc.stdout


def test_this_tensorrt_passes_the_aot_version_gate_exactly_when_it_has_aot_impl():
    import tensorrt as trt
    import tensorrt.plugin as trtp

    import rms_norm_aot_cutedsl as aot
    import rms_norm_plugin_cutedsl as sample

    major, minor = (int(v) for v in trt.__version__.split(".")[:2])
    assert hasattr(trtp, "aot_impl") == ((major, minor) >= (10, 9))
    if hasattr(trtp, "aot_impl"):
        aot.check_aot_support()
    else:
        with pytest.raises(sample.UsageError, match="10.9 or newer"):
            aot.check_aot_support()


RUN_ENGINE = """
import sys, numpy as np, torch
engine_path, out_path, build = sys.argv[1], sys.argv[2], sys.argv[3] == "build"
if build:
    sys.path.insert(0, {root!r})
    import rms_norm_aot_cutedsl as aot
    engine = aot.build_aot_engine(1024, "float16", 1, 128, 512, 1e-5)
    open(engine_path, "wb").write(engine.serialize())
else:
    import tensorrt as trt
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(open(engine_path, "rb").read())
    imported = [m for m in sys.modules if m.startswith("rms_norm")]
    assert not imported, "the loader must not import the plugin"
gen = torch.Generator().manual_seed(7)
x = torch.randn(128, 1024, generator=gen).half().cuda()
w = torch.rand(1024, generator=gen).cuda()
y = torch.full_like(x, float("nan"))
context = engine.create_execution_context()
context.set_input_shape("X", tuple(x.shape))
for name, t in (("X", x), ("W", w), ("Y", y)):
    context.set_tensor_address(name, t.data_ptr())
torch.cuda.synchronize()
assert context.execute_async_v3(torch.cuda.current_stream().cuda_stream)
torch.cuda.synchronize()
np.save(out_path, y.cpu().numpy().view(np.uint16))
"""


def test_aot_engine_runs_in_a_process_that_never_imports_the_plugin(tmp_path):
    engine = tmp_path / "rms_aot.engine"
    code = RUN_ENGINE.format(root=str(ROOT))
    for mode in ("build", "load"):
        out = str(tmp_path / f"{mode}.npy")
        proc = subprocess.run([sys.executable, "-c", code, str(engine), out, mode],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(tmp_path / "build.npy"), np.load(tmp_path / "load.npy"))


def test_aot_script_saves_its_engine_with_a_record_and_a_later_run_loads_it(tmp_path):
    """--engine goes through rms_norm_saved_engine.py: built and saved once, then loaded, and
    either way the run says how to run the engine without Python."""
    import json

    import rms_norm_aot_cutedsl as aot

    engine = tmp_path / "rms_aot.engine"
    for expected in ("Saved engine", "Loaded engine"):
        proc = subprocess.run([sys.executable, str(AOT_SCRIPT), "--engine", str(engine)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert expected in proc.stdout and "Inference result correct!" in proc.stdout
        assert f"trtexec --loadEngine={engine} --shapes=X:128x1024" in proc.stdout
    record = json.loads((tmp_path / "rms_aot.engine.json").read_text())
    assert (record["source"], record["plugin"]) == ("aot", aot.OP_NAME)


@pytest.mark.parametrize("dtype, extra", [("float16", []), ("bfloat16", ["--hidden-dim", "4096"]),
                                          ("float32", ["--hidden-dim", "6144",
                                                       "--weight-dtype", "float16"])])
def test_aot_script_builds_the_fused_op_with_residual(tmp_path, dtype, extra):
    """--residual: the fused op, (X, R, W) -> (Y, S), built, saved, loaded and checked (S bit for
    bit) at every count the run checks; a row of 8 KB staged with R (4096 bf16) and one past 48 KB
    in registers (6144 fp32)."""
    import json

    import rms_norm_aot_cutedsl as aot

    engine = tmp_path / "add_rms_aot.engine"
    hidden = extra[1] if extra else "1024"
    for expected in ("Saved engine", "Loaded engine"):
        proc = subprocess.run([sys.executable, str(AOT_SCRIPT), "--residual", "--dtype", dtype,
                               *extra, "--engine", str(engine)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert expected in proc.stdout and "Inference result correct!" in proc.stdout
        assert "X and R" in proc.stdout
        assert "S != X + R" not in proc.stdout and "S == X + R" in proc.stdout
        assert f"--shapes=X:128x{hidden},R:128x{hidden}" in proc.stdout
    record = json.loads((tmp_path / "add_rms_aot.engine.json").read_text())
    assert (record["plugin"], record["residual"]) == (aot.FUSED_OP_NAME, True)


@pytest.mark.skipif(shutil.which("trtexec") is None, reason="trtexec is not on PATH")
@pytest.mark.parametrize("flags, shapes", [([], "X:128x1024"),
                                           (["--residual"], "X:128x1024,R:128x1024")])
def test_trtexec_loads_the_aot_engine(tmp_path, flags, shapes):
    engine = tmp_path / "rms_aot.engine"
    proc = subprocess.run([sys.executable, str(AOT_SCRIPT), "--engine", str(engine), *flags],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"--shapes={shapes}" in proc.stdout
    proc = subprocess.run(["trtexec", f"--loadEngine={engine}", f"--shapes={shapes}"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


FP8_RUNS = [([], "FP8_OP_NAME"), (["--residual", "--dtype", "bfloat16"], "FUSED_FP8_OP_NAME")]


@pytest.mark.parametrize("flags, op", FP8_RUNS)
def test_aot_script_builds_the_fp8_ops_with_y_scale(tmp_path, flags, op):
    """--y-scale: the FP8 op, Y declared FP8 by its desc, built, saved, loaded and checked against
    the FP8 rounding of NumPy at every count the run checks; the record names the op and y_scale."""
    import json

    import rms_norm_aot_cutedsl as aot
    import rms_norm_fused_cutedsl as fused
    import rms_norm_plugin_cutedsl as sample

    if not fused.has_fp8(sample.gpu_arch()):
        pytest.skip("the FP8 form needs an sm_89+ GPU")
    engine = tmp_path / "fp8_aot.engine"
    for expected in ("Saved engine", "Loaded engine"):
        proc = subprocess.run([sys.executable, str(AOT_SCRIPT), "--y-scale", "0.05", *flags,
                               "--engine", str(engine)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert expected in proc.stdout and "Inference result correct!" in proc.stdout
    record = json.loads((tmp_path / "fp8_aot.engine.json").read_text())
    assert (record["plugin"], record["y_scale"]) == (getattr(aot, op), 0.05)
