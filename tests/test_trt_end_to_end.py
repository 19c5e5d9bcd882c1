"""Real TensorRT (marker `trt`): skipped where TensorRT is absent, run by users on their GPU
machines.

These are the end-to-end checks no stand-in can make: TensorRT builds the engine, chooses formats,
calls the plugin through its own bindings and captures it in its own CUDA graph; an engine built by
one file's creator loads through the other's, as far as that creator serves its form. Saving an
engine and loading it in a fresh process is rms_norm_saved_engine.py's lesson:
tests/test_saved_engine.py.
"""

import subprocess
import sys

import pytest

from conftest import FUSED_PATH, SAMPLE_PATH

pytestmark = pytest.mark.trt


def run_script(*args, script=SAMPLE_PATH):
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=900)
    return proc.returncode, proc.stdout, proc.stderr


def build(module, *argv):
    """The engine of `module` (the lesson or the companion) for these flags, as its main() builds
    it."""
    parser = module.make_parser("test")
    return module.build_engine(module.validate_args(parser, parser.parse_args(list(argv))))


@pytest.mark.parametrize("dtype, w_dtype", [(x, w) for x in ("float16", "bfloat16", "float32")
                                             for w in ("float32", "float16", "bfloat16")])
def test_script_builds_runs_and_checks_min_opt_max(dtype, w_dtype):
    code, out, err = run_script("--dtype", dtype, "--weight-dtype", w_dtype)
    assert code == 0, out + err
    assert "Inference result correct!" in out
    for tokens in (128, 1, 512, 37):
        assert f"tokens={tokens:<5d}" in out


def test_run_needs_no_cuda_runtime_lookup_by_polygraphy():
    """Issue 19 item 4: Polygraphy finds libcudart only where a pip-installed CUDA 13 does not put
    it; the run must not depend on that lookup. Here any use of Polygraphy's CUDA wrapper fails the
    run."""
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
        ok, err = s.check_output(y.float().cpu().numpy(), x.float().cpu().numpy(),
                                 w.cpu().numpy(), 1e-5, "float16")
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
        ok, err = s.check_output(y.float().cpu().numpy(), new_x.float().numpy(), new_w.numpy(),
                                 1e-5, "bfloat16")
        assert ok, err


# -- the companion's forms, through the network API and TensorRT's ONNX parser ---------------------


@pytest.mark.parametrize("form", [
    ["--dtype", "bfloat16"],
    ["--residual", "--dtype", "float16", "--weight-dtype", "float16"],
    ["--residual", "--dtype", "float32", "--weight-dtype", "bfloat16"],
    ["--y-scale", "0.05"],  # sm_89 and newer
    ["--residual", "--y-scale", "0.05", "--dtype", "bfloat16"],
    ["--residual", "--hidden-dim", "16388", "--dtype", "float32"],  # R a vector at a time
], ids=["plain", "residual-fp16", "residual-fp32", "fp8", "residual-fp8", "residual-by-vector"])
def test_the_companions_script_builds_runs_and_checks_each_form(form):
    code, out, err = run_script(*form, script=FUSED_PATH)
    assert code == 0, out + err
    assert "Inference result correct!" in out
    if "--residual" in form:
        assert out.count("S == X + R") == 4  # each of the four counts, S bit for bit


@pytest.mark.parametrize("form", [
    ["--dtype", "float16", "--weight-dtype", "float32"],
    ["--dtype", "bfloat16", "--weight-dtype", "float32"],
    ["--dtype", "float16", "--weight-dtype", "float16"],
    ["--dtype", "float32", "--weight-dtype", "bfloat16"],
    ["--residual", "--dtype", "bfloat16"],
    ["--residual", "--y-scale", "0.05"],
])
def test_engine_built_through_the_onnx_parser_checks_out(form):
    code, out, err = run_script("--from-onnx", *form, script=FUSED_PATH)
    assert code == 0, out + err
    assert "Inference result correct!" in out


# An engine holds the plugin's name, version and fields; the creator registered where it is loaded
# makes the plugin. This process builds with one file's creator and prints the engine's size; a
# fresh one registers the other's and deserializes it (None: refused).
CROSS_LOAD = """
import sys
sys.path.insert(0, {root!r})
import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
from polygraphy.backend.trt import get_trt_logger
modules = {{"lesson": lesson, "fused": fused}}
builder, loader, path, *argv = sys.argv[1:]
if builder != "-":
    module = modules[builder]
    parser = module.make_parser("worker")
    engine = module.build_engine(module.validate_args(parser, parser.parse_args(argv)))
    open(path, "wb").write(engine.serialize())
else:
    modules[loader].register_creator()
    engine = lesson.trt.Runtime(get_trt_logger()).deserialize_cuda_engine(open(path, "rb").read())
    print("loaded" if engine is not None else "refused")
"""


def cross_load(tmp_path, builder, loader, *argv):
    """(what the loading process printed, its stderr): an engine built by `builder`'s creator,
    deserialized in a fresh process where only `loader`'s creator is registered."""
    path = str(tmp_path / "cross.engine")
    code = CROSS_LOAD.format(root=str(SAMPLE_PATH.parent))
    for build_by, load_by in ((builder, "-"), ("-", loader)):
        proc = subprocess.run([sys.executable, "-c", code, build_by, load_by, path, *argv],
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1], proc.stderr


@pytest.mark.parametrize("builder, loader", [("lesson", "fused"), ("fused", "lesson")])
def test_a_plain_engine_of_either_file_loads_through_the_others_creator(tmp_path, builder, loader):
    loaded, err = cross_load(tmp_path, builder, loader)
    assert loaded == "loaded", err


@pytest.mark.parametrize("form, field", [(["--residual"], "residual"),
                                         (["--y-scale", "0.05"], "quantize")])
def test_a_fused_engine_is_refused_by_the_lessons_creator_naming_the_companion(tmp_path, form,
                                                                             field):
    loaded, err = cross_load(tmp_path, "fused", "lesson", *form)
    assert loaded == "refused"
    assert (f"RmsNormPlugin: field '{field}' selects a form that rms_norm_fused_cutedsl.py "
            "serves") in err
