"""Real TensorRT (marker `trt`): skipped where TensorRT is absent, run by users on their GPU machines.

These are the end-to-end checks no stand-in can make: TensorRT builds the
engine, chooses formats, calls the plugin through its own bindings, captures
it in its own CUDA graph and deserializes it in a fresh process.
"""

import subprocess
import sys

import numpy as np
import pytest

from conftest import SAMPLE_PATH

pytestmark = pytest.mark.trt


def run_script(*args):
    proc = subprocess.run([sys.executable, str(SAMPLE_PATH), *args], capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("dtype, w_dtype", [(x, w) for x in ("float16", "bfloat16", "float32")
                                             for w in ("float32", "float16", "bfloat16")])
def test_script_builds_runs_and_checks_min_opt_max(dtype, w_dtype):
    code, out, err = run_script("--dtype", dtype, "--weight-dtype", w_dtype)
    assert code == 0, out + err
    assert "Inference result correct!" in out
    for tokens in (128, 1, 512, 37):
        assert f"tokens={tokens:<5d}" in out


def test_run_needs_no_cuda_runtime_lookup_by_polygraphy():
    """Issue 19 item 4: Polygraphy finds libcudart only where a pip-installed CUDA 13 does not put it;
    the run must not depend on that lookup. Here any use of Polygraphy's CUDA wrapper fails the run."""
    prelude = ("import polygraphy.cuda.cuda as c\n"
               "def refuse(self): raise RuntimeError('Polygraphy CUDA wrapper used')\n"
               "c.Cuda.__init__ = refuse\n")
    code = f"{prelude}import runpy, sys\nsys.argv = [{str(SAMPLE_PATH)!r}]\n" \
           f"runpy.run_path({str(SAMPLE_PATH)!r}, run_name='__main__')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Inference result correct!" in proc.stdout


def test_odd_profile_and_hidden():
    code, out, err = run_script("--hidden-dim", "1000", "--min-tokens", "3", "--opt-tokens", "37",
                                "--max-tokens", "511", "--num-tokens", "511")
    assert code == 0, out + err


def test_saved_engine_loads_in_a_fresh_process_and_matches_bit_for_bit(tmp_path):
    engine = tmp_path / "rms.engine"
    out_built, out_loaded = tmp_path / "built.npy", tmp_path / "loaded.npy"
    worker = f"""
import sys, numpy as np, torch
sys.path.insert(0, {str(SAMPLE_PATH.parent)!r})
import rms_norm_plugin_cutedsl as s
path, out = sys.argv[1], sys.argv[2]
import os
engine = s.load_engine(path) if os.path.exists(path) else s.build_engine(1024, "float16", 1, 128, 512, 1e-5)
if not os.path.exists(path):
    open(path, "wb").write(engine.serialize())
x, w = s.make_inputs(128, 1024, "float16", seed=5)
x, w = x.cuda(), w.cuda()
y = torch.full_like(x, float("nan"))
context = engine.create_execution_context()
s.bind_io(context, x, w, y)
torch.cuda.synchronize()
assert context.execute_async_v3(torch.cuda.current_stream().cuda_stream)
torch.cuda.synchronize()
np.save(out, y.cpu().numpy().view(np.uint16))
"""
    for out in (out_built, out_loaded):  # the first process builds and saves, the second only loads
        proc = subprocess.run([sys.executable, "-c", worker, str(engine), str(out)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(out_built), np.load(out_loaded))


def test_script_reuses_a_saved_engine(tmp_path):
    engine = str(tmp_path / "rms.engine")
    assert run_script("--engine", engine)[0] == 0
    code, out, err = run_script("--engine", engine)
    assert code == 0 and "Loaded engine" in out, out + err
    code, _, err = run_script("--engine", engine, "--hidden-dim", "4096")
    assert code == 2 and "was built for" in err


def test_a_file_that_is_not_an_engine_gives_one_sentence(tmp_path):
    import rms_norm_plugin_cutedsl as s

    bad = tmp_path / "bad.engine"  # saved with the default flags' record, so TensorRT gets to read it
    s.save_engine(str(bad), b"not an engine" * 100, s.engine_record(s.parse_args([]), "plugin", "RmsNormPlugin v1"))
    code, out, err = run_script("--engine", str(bad))
    assert code == 2
    assert "cannot deserialize engine file" in err and "Traceback" not in err


def test_loading_without_the_creator_registered_fails(tmp_path):
    engine = tmp_path / "rms.engine"
    assert run_script("--engine", str(engine))[0] == 0
    code = "import tensorrt as trt, sys\n" \
           "rt = trt.Runtime(trt.Logger(trt.Logger.ERROR))\n" \
           f"sys.exit(0 if rt.deserialize_cuda_engine(open({str(engine)!r}, 'rb').read()) is None else 1)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_two_execution_contexts_on_two_streams():
    import torch

    import rms_norm_plugin_cutedsl as s

    engine = s.build_engine(1024, "float16", 1, 128, 512, 1e-5)
    contexts = [engine.create_execution_context() for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    cases = []
    for ctx, tokens, seed in zip(contexts, (1, 512), (1, 2)):
        x, w = s.make_inputs(tokens, 1024, "float16", seed)
        x, w = x.cuda(), w.cuda()
        y = torch.full_like(x, float("nan"))
        ctx.set_input_shape("X", tuple(x.shape))
        for name, t in (("X", x), ("W", w), ("Y", y)):
            ctx.set_tensor_address(name, t.data_ptr())
        cases.append((ctx, x, w, y))
    torch.cuda.synchronize()
    for _ in range(50):
        for (ctx, *_), stream in zip(cases, streams):
            assert ctx.execute_async_v3(stream.cuda_stream)
    torch.cuda.synchronize()
    for _, x, w, y in cases:
        ok, err = s.check_output(y.float().cpu().numpy(), x.float().cpu().numpy(), w.cpu().numpy(), 1e-5, "float16")
        assert ok, err


def test_execute_async_v3_captured_in_a_cuda_graph():
    import torch

    import rms_norm_plugin_cutedsl as s

    engine = s.build_engine(1024, "bfloat16", 1, 128, 512, 1e-5)
    ctx = engine.create_execution_context()
    x, w = s.make_inputs(37, 1024, "bfloat16", seed=3)
    x, w = x.cuda(), w.cuda()
    y = torch.full_like(x, float("nan"))
    ctx.set_input_shape("X", tuple(x.shape))
    for name, t in (("X", x), ("W", w), ("Y", y)):
        ctx.set_tensor_address(name, t.data_ptr())
    stream = torch.cuda.Stream()
    assert ctx.execute_async_v3(stream.cuda_stream)  # TensorRT's advice: one run before capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        ctx.execute_async_v3(stream.cuda_stream)
    for seed in (10, 11):
        new_x, new_w = s.make_inputs(37, 1024, "bfloat16", seed)
        x.copy_(new_x)
        w.copy_(new_w)
        y.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        ok, err = s.check_output(y.float().cpu().numpy(), new_x.float().numpy(), new_w.numpy(), 1e-5, "bfloat16")
        assert ok, err


@pytest.mark.parametrize("dtype, w_dtype", [("float16", "float32"), ("bfloat16", "float32"), ("float16", "float16"),
                                            ("float32", "bfloat16")])
def test_engine_built_through_the_onnx_parser_checks_out(dtype, w_dtype):
    code, out, err = run_script("--from-onnx", "--dtype", dtype, "--weight-dtype", w_dtype)
    assert code == 0, out + err
    assert "Inference result correct!" in out
