"""CPU: the torch ops of rms_norm_torch_op.py, their tracing, and their swap into decoders.

Everything here is the real code of torch and transformers: registration, the fake functions
(on meta tensors and under torch.compile and torch.export), the refusals, the swap on decoders
built from configs. One test double, labelled where it is defined: where a test runs a
decoder's forward on the CPU, the op's CPU kernel is NumPy's float64 reference, since the CUDA
kernel cannot run here (tests/test_torch_op_gpu.py runs it). Runs in the main test environment
and in the Torch-TensorRT one (requirements-torch-trt.txt).
"""

import contextlib
import copy
import re
import sys

import numpy as np
import pytest
import torch

import rms_norm_plugin_cutedsl as lesson
import rms_norm_torch_op as op

OPS = torch.ops.rms_norm_cutedsl
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def meta(*shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_the_ops_are_registered_with_their_schemas():
    schemas = {name: str(getattr(OPS, name).default._schema)
               for name in ("rms_norm", "add_rms_norm", "rms_norm_fp8", "add_rms_norm_fp8")}
    assert schemas == {
        "rms_norm": "rms_norm_cutedsl::rms_norm(Tensor x, Tensor w, float epsilon) -> Tensor",
        "add_rms_norm": "rms_norm_cutedsl::add_rms_norm(Tensor x, Tensor r, Tensor w, "
                        "float epsilon) -> (Tensor, Tensor)",
        "rms_norm_fp8": "rms_norm_cutedsl::rms_norm_fp8(Tensor x, Tensor w, float epsilon, "
                        "float y_scale) -> Tensor",
        "add_rms_norm_fp8": "rms_norm_cutedsl::add_rms_norm_fp8(Tensor x, Tensor r, Tensor w, "
                            "float epsilon, float y_scale) -> (Tensor, Tensor)",
    }


@pytest.mark.parametrize("w_dtype", DTYPES)
@pytest.mark.parametrize("x_dtype", DTYPES)
def test_the_fake_functions_give_every_output_its_shape_and_dtype(x_dtype, w_dtype):
    x = meta(37, 1000, dtype=x_dtype)
    w = meta(1000, dtype=w_dtype)
    y = OPS.rms_norm(x, w, 1e-6)
    assert (y.shape, y.dtype, y.device.type) == ((37, 1000), x_dtype, "meta")
    y, s = OPS.add_rms_norm(x, torch.empty_like(x), w, 1e-6)
    assert [(t.shape, t.dtype) for t in (y, s)] == [((37, 1000), x_dtype)] * 2
    y = OPS.rms_norm_fp8(x, w, 1e-6, 0.5)
    assert (y.shape, y.dtype) == ((37, 1000), torch.float8_e4m3fn)
    y, s = OPS.add_rms_norm_fp8(x, torch.empty_like(x), w, 1e-6, 0.5)
    assert [(t.shape, t.dtype) for t in (y, s)] == [((37, 1000), torch.float8_e4m3fn),
                                                    ((37, 1000), x_dtype)]


X, W = meta(8, 64), meta(64, dtype=torch.float32)
REFUSALS = [
    ((meta(8, 64, dtype=torch.float64), W), "x must be float16, bfloat16 or float32, "
                                            "got torch.float64"),
    ((meta(2, 8, 64), W), r"x must be \[num_tokens, hidden\], got shape \(2, 8, 64\); "
                          r"reshape it to \(-1, hidden\) first"),
    ((meta(8, 0), meta(0)), r"hidden must be in \[1, 32768\], got 0"),
    ((meta(1, 32769), meta(32769)), r"hidden must be in \[1, 32768\], got 32769"),
    ((X, meta(32, dtype=torch.float32)), r"w must be a \[64\] vector of float32, float16 or "
                                         r"bfloat16, got torch.float32 \(32,\)"),
    ((X, meta(64, dtype=torch.float64)), r"w must be a \[64\] vector .*, got torch.float64 "
                                         r"\(64,\)"),
    ((X, meta(1, 64)), r"w must be a \[64\] vector .*, got torch.float16 \(1, 64\)"),
]


@pytest.mark.parametrize("operands, sentence", REFUSALS)
def test_shapes_and_dtypes_the_kernel_does_not_serve_are_refused_in_one_sentence(operands,
                                                                                 sentence):
    x, w = operands
    with pytest.raises(ValueError, match=rf"^rms_norm_cutedsl::rms_norm: {sentence}$"):
        OPS.rms_norm(x, w, 1e-6)
    with pytest.raises(ValueError, match=rf"^rms_norm_cutedsl::add_rms_norm_fp8: {sentence}$"):
        OPS.add_rms_norm_fp8(x, torch.empty_like(x), w, 1e-6, 0.5)


@pytest.mark.parametrize("r", [meta(8, 32), meta(8, 64, dtype=torch.bfloat16)])
def test_an_r_of_another_shape_or_dtype_is_refused(r):
    sentence = (r"^rms_norm_cutedsl::add_rms_norm: r must have x's shape and dtype, "
                rf"\(8, 64\) torch.float16, got {re.escape(str(tuple(r.shape)))} {r.dtype}$")
    with pytest.raises(ValueError, match=sentence):
        OPS.add_rms_norm(X, r, W, 1e-6)


@pytest.mark.parametrize("epsilon", [0.0, -1e-6, float("nan"), 1e-50])
def test_an_epsilon_the_kernel_cannot_use_is_refused(epsilon):
    """1e-50 is 0 in float32, the precision the kernel adds it in."""
    with pytest.raises(ValueError, match=r"^field 'epsilon' must be finite and > 0 in float32"):
        OPS.rms_norm(X, W, epsilon)


@pytest.mark.parametrize("y_scale", [0.0, float("inf"), 1e-39])
def test_a_y_scale_the_kernel_cannot_use_is_refused(y_scale):
    with pytest.raises(ValueError, match=r"^field 'y_scale' must be finite and >= 2\^-126"):
        OPS.rms_norm_fp8(X, W, 1e-6, y_scale)


@pytest.fixture
def no_compile(monkeypatch):
    """The companion's compile step raises: a refusal must come before it."""
    def compile_rms_norm(*args, **kwargs):
        raise AssertionError("compiled before the operands were checked")

    monkeypatch.setattr(op.fused, "compile_rms_norm", compile_rms_norm)


def cpu_operands(tokens=8, hidden=64):
    x = torch.randn(tokens, hidden, dtype=torch.float16)
    return x, torch.rand(hidden), torch.randn_like(x)


def test_the_cuda_function_refuses_cpu_tensors_before_compiling(no_compile):
    x, w, r = cpu_operands()
    with pytest.raises(ValueError, match=r"^rms_norm_cutedsl::rms_norm: x, w, y must be CUDA "
                                         r"tensors on one device, got cpu, cpu, cpu$"):
        OPS.rms_norm(x, w, 1e-6)
    with pytest.raises(ValueError, match=r"^rms_norm_cutedsl::add_rms_norm: x, w, y, r, s must "
                                         r"be CUDA tensors on one device, got cpu(, cpu){4}$"):
        OPS.add_rms_norm(x, r, w, 1e-6)


def strided(x):
    """x's values in every other column of a wider tensor: not contiguous."""
    wide = torch.zeros(x.shape[0], 2 * x.shape[1], dtype=x.dtype)
    wide[:, ::2] = x
    return wide[:, ::2]


def offset(x):
    """x's values 2 bytes past a 16-byte boundary (one fp16 element): contiguous, misaligned."""
    flat = torch.zeros(x.numel() + 8, dtype=x.dtype)
    view = flat[1:1 + x.numel()].view(x.shape)
    view.copy_(x)
    return view


@pytest.mark.parametrize("layout", [strided, offset])
def test_a_strided_or_misaligned_tensor_is_refused_before_compiling(layout, no_compile):
    x, w, r = cpu_operands()
    sentence = (r"^rms_norm_cutedsl::{}: {} must be contiguous and 16-byte aligned "
                r"\(a strided or offset view is not\)$")
    with pytest.raises(ValueError, match=sentence.format("rms_norm", "x, w, y")):
        OPS.rms_norm(layout(x), w, 1e-6)
    with pytest.raises(ValueError, match=sentence.format("add_rms_norm", "x, w, y, r, s")):
        OPS.add_rms_norm(x, layout(r), w, 1e-6)


def norms(x, r, w, w2):
    """Both forms and arithmetic around them, on [..., hidden] activations."""
    rows = x.reshape(-1, x.shape[-1])
    y = OPS.rms_norm(rows, w, 1e-6)
    y2, s = OPS.add_rms_norm(y, r.reshape(rows.shape), w2, 2.0**-10)
    return (y2 * 2).view(x.shape), s


def ops_in(graph) -> dict:
    """{op name: calls} of this module's ops in an FX graph (by packet or overload)."""
    calls = {}
    for node in graph.nodes:
        name = str(node.target)
        if name.startswith("rms_norm_cutedsl."):
            name = name.split(".")[1]
            calls[name] = calls.get(name, 0) + 1
    return calls


def test_torch_compile_traces_both_ops_into_one_graph():
    """fullgraph=True raises on any graph break; the backend only records what dynamo made, and the
    call runs on meta tensors, through the fake functions."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(norms, fullgraph=True, dynamic=True, backend=record)
    x = meta(3, 5, 64, dtype=torch.bfloat16)
    y, s = compiled(x, torch.empty_like(x), meta(64, dtype=torch.bfloat16), meta(64))
    assert (y.shape, y.dtype, s.shape) == ((3, 5, 64), torch.bfloat16, (15, 64))
    assert len(graphs) == 1
    assert ops_in(graphs[0].graph) == {"rms_norm": 1, "add_rms_norm": 1}


class Forms(torch.nn.Module):
    """Both forms in a module: rms_norm with a bfloat16 W, then add_rms_norm of its Y with a
    Gemma-style 1 + w in float32; epsilons: the two norms' epsilon."""

    def __init__(self, hidden, epsilons=(1e-6, 2.0**-10)):
        super().__init__()
        generator = torch.Generator().manual_seed(hidden)
        self.w = torch.nn.Parameter(torch.rand(hidden, generator=generator).bfloat16())
        self.g = torch.nn.Parameter(torch.rand(hidden, generator=generator) - 0.5)
        self.epsilons = epsilons

    def forward(self, x, r):
        y = OPS.rms_norm(x, self.w, self.epsilons[0])
        y2, s = OPS.add_rms_norm(y, r, 1.0 + self.g.float(), self.epsilons[1])
        return y, y2, s


def test_torch_export_keeps_the_token_count_dynamic():
    x = torch.randn(8, 256, dtype=torch.bfloat16)
    tokens = torch.export.Dim("tokens", min=1, max=4096)
    with torch.no_grad():
        exported = torch.export.export(Forms(256), (x, x.clone()),
                                       dynamic_shapes=({0: tokens}, {0: tokens}))
    assert ops_in(exported.graph) == {"rms_norm": 1, "add_rms_norm": 1}
    (node,) = [n for n in exported.graph.nodes if n.target == OPS.rms_norm.default]
    rows, hidden = node.args[0].meta["val"].shape
    assert isinstance(rows, torch.SymInt) and hidden == 256 and isinstance(hidden, int)
    (bounds,) = exported.range_constraints.values()
    assert bounds.upper == 4096


# %% The swap into transformers decoders ------------------------------------------

LAYERS = 2
# Hand-counted from each family's decoder layer: input and post-attention norms in every layer,
# Qwen3 and Gemma3 norm the queries and keys of each head too, Gemma2 and Gemma3 add pre- and
# post-feedforward norms; one final norm after the last layer.
NORMS = {
    "llama": 2 * LAYERS + 1,
    "qwen3": 4 * LAYERS + 1,
    "gemma": 2 * LAYERS + 1,
    "gemma2": 4 * LAYERS + 1,
    "gemma3": 6 * LAYERS + 1,
}


def decoder(model, dtype=torch.float32):
    return op.build_decoder(model, 128, LAYERS, dtype, seed=len(model))


@pytest.mark.parametrize("model", op.MODELS)
def test_the_swap_replaces_every_rms_norm_and_keeps_the_weights(model):
    original = decoder(model)
    swapped = copy.deepcopy(original)
    count = op.swap_rms_norms(swapped)
    assert count == NORMS[model]
    names = {type(m).__name__ for m in original.modules() if "RMSNorm" in type(m).__name__}
    assert names == {f"{model.capitalize()}RMSNorm"}
    replaced = [m for m in swapped.modules() if isinstance(m, op.CuteDSLRMSNorm)]
    assert len(replaced) == count
    offset_kind = model.startswith("gemma")
    assert all(isinstance(m, op.CuteDSLOffsetRMSNorm) == offset_kind for m in replaced)
    assert not any("RMSNorm" in type(m).__name__ and not isinstance(m, op.CuteDSLRMSNorm)
                   for m in swapped.modules())
    assert list(swapped.state_dict()) == list(original.state_dict())
    assert op.swap_rms_norms(swapped) == 0, "a second swap finds nothing left"


def test_the_swap_keeps_the_replaced_parameter_objects():
    """The replacement holds the module's own Parameter: a weight loaded after the swap is used."""
    model = decoder("llama")
    weights = [m.weight for m in model.modules() if "RMSNorm" in type(m).__name__]
    op.swap_rms_norms(model)
    assert [m.weight for m in model.modules() if isinstance(m, op.CuteDSLRMSNorm)] == weights
    assert all(a is b for a, b in zip(weights, [m.weight for m in model.modules()
                                                if isinstance(m, op.CuteDSLRMSNorm)]))


def test_a_parameter_weight_reaches_the_kernel_without_a_copy():
    """Llama's and Qwen3's norms hand the op their Parameter, which requires grad even under
    no_grad, and torch exports no such tensor through DLPack (on the H200 the compiled Llama and
    Qwen3 failed there). The views are CuTe's own, on CPU tensors here: no GPU needed."""
    w = torch.nn.Parameter(torch.ones(1024))
    with torch.no_grad():
        (view,) = op.cute_views([w])
    assert view.iterator._pointer == w.data_ptr()  # CuTe's pointer: the Parameter's own memory


def test_a_swapped_decoder_exports_with_one_op_call_per_norm():
    """Qwen3's q/k norms normalize rows of head_dim, one row per token and head."""
    model = decoder("qwen3")
    swapped = op.swap_rms_norms(model)
    ids = torch.randint(0, op.VOCAB, (1, 8))
    tokens = torch.export.Dim("tokens", min=1, max=1024)
    with torch.no_grad():
        exported = torch.export.export(model, (ids,), dynamic_shapes=({1: tokens},))
    calls = [n for n in exported.graph.nodes if n.target == OPS.rms_norm.default]
    assert len(calls) == swapped
    widths = sorted(n.args[0].meta["val"].shape[1] for n in calls)
    assert widths == [128 // 4] * 2 * LAYERS + [128] * (2 * LAYERS + 1)


def float64_reference(x, w, epsilon):
    """TEST DOUBLE of the CUDA kernel, for the CPU: NumPy's float64 RMSNorm (the lesson's
    rms_norm_reference), rounded once to X's dtype as the kernel rounds Y."""
    y = lesson.rms_norm_reference(x.double().numpy(), w.double().numpy(), epsilon)
    return torch.from_numpy(y).to(x.dtype)


@contextlib.contextmanager
def kernel_double():
    """The op's CPU kernel is float64_reference while the block runs (a CPU kernel outranks the
    op's own function for CPU tensors; torch removes it again on exit)."""
    with torch.library._scoped_library("rms_norm_cutedsl", "IMPL") as library:
        library.impl("rms_norm", float64_reference, "CPU")
        yield


@pytest.mark.parametrize("model", op.MODELS)
def test_a_swapped_decoder_computes_what_the_original_computes(model):
    """In float32 with random norm weights: a W of w where Gemma needs 1 + w, or the wrong
    epsilon, moves the logits by far more than float32's rounding."""
    original = decoder(model)
    swapped = copy.deepcopy(original)
    op.swap_rms_norms(swapped)
    ids = torch.randint(0, op.VOCAB, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), kernel_double():
        assert op.relative_error(swapped(ids), original(ids)) < 1e-5


def test_torch_compile_traces_a_swapped_decoder_into_one_graph():
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    original = decoder("gemma3")
    swapped = copy.deepcopy(original)
    count = op.swap_rms_norms(swapped)
    ids = torch.randint(0, op.VOCAB, (1, 12))
    with torch.no_grad(), kernel_double():
        logits = torch.compile(swapped, fullgraph=True, backend=record)(ids)
        assert op.relative_error(logits, original(ids)) < 1e-5
    assert len(graphs) == 1
    assert ops_in(graphs[0].graph) == {"rms_norm": count}


@pytest.mark.parametrize("w_dtype, y_dtype", [(torch.bfloat16, torch.bfloat16),
                                              (torch.float32, torch.float32)])
def test_a_swapped_llama_norm_returns_the_dtype_llama_returns(w_dtype, y_dtype):
    """Llama multiplies by its weight last: a float32 weight makes a bfloat16 X's Y float32."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(64).to(w_dtype)
    replacement = op.CuteDSLRMSNorm.replacing(norm)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad(), kernel_double():
        assert norm(x).dtype == replacement(x).dtype == y_dtype


# %% The command line -------------------------------------------------------------


@pytest.mark.parametrize("model", op.MODELS)
def test_the_cli_reports_how_many_norms_it_swapped(model, capsys):
    assert op.main(["--model", model, "--swap-only", "--hidden-dim", "128",
                    "--layers", str(LAYERS)]) == 0
    assert capsys.readouterr().out == (f"{model}: swapped {NORMS[model]} RMSNorm modules for "
                                       "torch.ops.rms_norm_cutedsl.rms_norm\n")


def test_the_cli_refuses_to_compile_without_a_gpu_in_one_sentence(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # double: a GPU-less machine

    def build_decoder(*args):
        raise AssertionError("built a decoder before the environment check")

    monkeypatch.setattr(op, "build_decoder", build_decoder)
    assert op.main(["--model", "qwen3"]) == 2
    assert capsys.readouterr().err == (
        "error: compiling needs an NVIDIA GPU of compute capability 8.0 or newer; --swap-only "
        "builds and swaps without one\n")


def test_the_cli_names_transformers_when_it_is_missing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    assert op.main(["--swap-only"]) == 2
    assert capsys.readouterr().err == ("error: the package transformers is not installed; "
                                       "pip install -r requirements-torch-trt-gpu.txt\n")


@pytest.mark.parametrize("argv, sentence", [
    (["--hidden-dim", "130"], r"--hidden-dim must be a multiple of 4 in \[4, 32768\], got 130"),
    (["--layers", "0"], "--layers must be >= 1, got 0"),
    (["--tokens", "65", "--max-tokens", "64"], r"--tokens \(65\) must be <= --max-tokens \(64\)"),
    (["--swap-only", "--save", "m.ep"], "--save needs the compiled module, which --swap-only "
                                        "does not make"),
    (["--save", "/nonexistent/m.ep"], "--save /nonexistent/m.ep: its directory does not exist"),
])
def test_the_cli_refuses_a_flag_in_one_sentence(argv, sentence, capsys):
    with pytest.raises(SystemExit) as exit_info:
        op.main(argv)
    assert exit_info.value.code == 2
    assert re.search(rf"error: {sentence}\n$", capsys.readouterr().err)


def test_numpy_is_the_reference_the_double_uses():
    """The double's float64 arithmetic, checked on values worked by hand: x = (3, 4), w = (1, 2),
    mean square 12.5, so y = (3, 8) / sqrt(12.5 + epsilon)."""
    y = float64_reference(torch.tensor([[3.0, 4.0]], dtype=torch.float64),
                          torch.tensor([1.0, 2.0]), 0.0)
    np.testing.assert_allclose(y.numpy(), [[3 / 12.5**0.5, 8 / 12.5**0.5]], rtol=1e-15)
