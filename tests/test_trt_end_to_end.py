"""Real TensorRT (marker `trt`): skipped where TensorRT is absent, run by users on their GPU machines.

These are the end-to-end checks no stand-in can make: TensorRT builds the
engine, chooses formats, calls the plugin through its own bindings and
captures it in its own CUDA graph. Saving an engine and loading it in a fresh
process is rms_norm_saved_engine.py's lesson: tests/test_saved_engine.py.
"""

import subprocess
import sys

import pytest

from conftest import SAMPLE_PATH

pytestmark = pytest.mark.trt


def run_script(*args):
    proc = subprocess.run([sys.executable, str(SAMPLE_PATH), *args], capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout, proc.stderr


def build(sample, *argv):
    """The sample's engine for these flags, as its main() builds it."""
    parser = sample.make_parser("test")
    return sample.build_engine(sample.validate_args(parser, parser.parse_args(list(argv))))


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


def test_two_execution_contexts_on_two_streams():
    import torch

    import rms_norm_plugin_cutedsl as s

    engine = build(s)  # hidden 1024, float16, profile [1, 128, 512], epsilon 1e-5
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

    engine = build(s, "--dtype", "bfloat16")
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
