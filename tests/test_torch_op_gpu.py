"""GPU: the torch ops of rms_norm_torch_op.py against the float64 reference at every plan kind of
the companion's schedule, on torch's current stream, and a torch.compile'd decoder with the op
against the original module; with full TensorRT and Torch-TensorRT (marker trt), the op in a
Torch-TensorRT engine.

The decoder tests need transformers; the trt tests the environment of
requirements-torch-trt-gpu.txt. One test here runs on the CPU: that the cases cover every plan
kind on sm_90, the H200's target.
"""

import copy

import pytest
import torch

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
import rms_norm_torch_op as op
from test_torch_op import Forms

OPS = torch.ops.rms_norm_cutedsl
EPS = 1e-5
# Rows of every kind on sm_90: 100 and 24578 in vectors under 16 bytes, 100, 2056 and 9216 ragged
# (a thread with fewer vectors), 2056 to 9216 staged by cp.async or bulk copy, 8192 to 32768
# split over a cluster at few tokens, 16384 and 32768 over 2 CTAs at many, 32768 with W (and,
# fp32 residual, R) a vector at a time.
KIND_HIDDEN = [100, 2056, 8192, 9216, 16384, 24578, 32768]
# The few-token plan (up to FEW_TOKENS), the many plan between it and MID_TOKENS, the mid plan
# above, the many plan past the line's mid rows; 1 and 37 are cluster plans where rows are long.
KIND_TOKENS = [1, 37, 129, 512, 2048]
DTYPES = ["float16", "bfloat16", "float32"]
KINDS = {"cluster", "few", "mid", "many", "staged", "bulk", "registers", "ragged", "narrow"}


def plan_kinds(plan, tokens: int) -> set:
    """The kinds a plan of the companion's schedule is, for a run of `tokens` rows."""
    kinds = {"staged" if plan.arrival != "registers" else "registers"}
    if plan.arrival == "bulk":
        kinds.add("bulk")
    if plan.cluster_ctas > 1 and tokens <= fused.FEW_TOKENS:
        kinds.add("cluster")
    elif plan.rows_in_sequence > 1:
        kinds.add("mid")
    elif tokens <= fused.FEW_TOKENS:
        kinds.add("few")
    else:
        kinds.add("many")
    if plan.ragged:
        kinds.add("ragged")
    if plan.vec * plan.elem_bytes < lesson.VECTOR_BYTES:
        kinds.add("narrow")
    return kinds


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("elem_bytes", [2, 4])
def test_the_gpu_cases_cover_every_plan_kind_on_sm_90(elem_bytes, residual):
    """CPU: the plans the GPU tests below run on an H200, by the companion's own table."""
    kinds = set()
    for hidden in KIND_HIDDEN:
        for tokens in KIND_TOKENS:
            plan = fused.plan_kernel(hidden, elem_bytes, tokens, sm90=True, residual=residual)
            kinds |= plan_kinds(plan, tokens)
    assert kinds == KINDS


def inputs(tokens, hidden, dtype, w_dtype, seed):
    x, w = lesson.make_inputs(tokens, hidden, dtype, seed, w_dtype)
    return x, w, fused.make_residual(tokens, hidden, dtype, seed)


def check_plain(x, w, y, dtype):
    ok, err = lesson.check_output(y.float().cpu().numpy(), x.float().numpy(), w.float().numpy(),
                                  EPS, dtype)
    assert ok, f"max abs error {err:.3e}"


def check_residual(x, r, w, y, s, dtype):
    expected_s = fused.residual_reference(x, r)
    assert torch.equal(s.cpu(), expected_s), "S must be x + r rounded once to x's dtype"
    check_plain(expected_s, w, y, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("hidden", KIND_HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_op_matches_the_float64_reference_at_every_plan_kind(dtype, hidden, residual):
    w_dtype = lesson.WEIGHT_DTYPES[KIND_HIDDEN.index(hidden) % 3]  # every W dtype, in turn
    for tokens in KIND_TOKENS:
        x, w, r = inputs(tokens, hidden, dtype, w_dtype, seed=tokens * 7919 + hidden)
        if residual:
            y, s = OPS.add_rms_norm(x.cuda(), r.cuda(), w.cuda(), EPS)
            check_residual(x, r, w, y, s, dtype)
        else:
            check_plain(x, w, OPS.rms_norm(x.cuda(), w.cuda(), EPS), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("hidden", [1000, 4096, 8192])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_fp8_ops_quantize_the_reference(dtype, hidden, residual):
    if not fused.has_fp8(lesson.gpu_arch()):
        with pytest.raises(ValueError, match="the FP8 form needs sm_89 or newer"):
            OPS.rms_norm_fp8(*(t.cuda() for t in inputs(1, hidden, dtype, "float32", 1)[:2]),
                             EPS, 0.05)
        return
    for tokens in KIND_TOKENS:
        x, w, r = inputs(tokens, hidden, dtype, "float32", seed=tokens + hidden)
        if residual:
            y, s = OPS.add_rms_norm_fp8(x.cuda(), r.cuda(), w.cuda(), EPS, 0.05)
            assert torch.equal(s.cpu(), fused.residual_reference(x, r))
            x = s.cpu()
        else:
            y = OPS.rms_norm_fp8(x.cuda(), w.cuda(), EPS, 0.05)
        assert y.dtype == torch.float8_e4m3fn
        ok, err = fused.check_quantized(y.float().cpu().numpy(), x.float().numpy(),
                                        w.numpy(), EPS, 0.05)
        assert ok, f"max abs error {err:.3e}"


@pytest.mark.gpu
def test_the_op_runs_on_torchs_current_stream():
    """X is written on a side stream held up by a sleep kernel (torch's side streams do not wait
    for the default stream, nor it for them): a kernel launched on any other stream would read
    X before that write lands, and normalize zeros."""
    x, w = lesson.make_inputs(512, 4096, "bfloat16", 5)
    x_values = x.cuda()
    x_gpu = torch.zeros_like(x_values)
    w_gpu = w.cuda()
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU cycles
        x_gpu.copy_(x_values)  # device to device: the host does not wait
        y = OPS.rms_norm(x_gpu, w_gpu, EPS)
    side.synchronize()
    check_plain(x, w, y, "bfloat16")


@pytest.mark.gpu
def test_cuda_tensors_the_kernel_cannot_read_are_refused_in_one_sentence():
    x, w = (t.cuda() for t in lesson.make_inputs(8, 64, "float16", 2))
    flat = torch.zeros(x.numel() + 8, dtype=x.dtype, device="cuda")
    misaligned = flat[1:1 + x.numel()].view(x.shape)
    with pytest.raises(ValueError, match=r"^rms_norm_cutedsl::rms_norm: x, w, y must be "
                                         r"contiguous and 16-byte aligned"):
        OPS.rms_norm(misaligned, w, EPS)
    wide = torch.zeros(1, lesson.MAX_HIDDEN + 1, dtype=x.dtype, device="cuda")
    with pytest.raises(ValueError, match=r"hidden must be in \[1, 32768\], got 32769"):
        OPS.rms_norm(wide, torch.ones(wide.shape[1], device="cuda"), EPS)
    assert OPS.rms_norm(x[:0], w, EPS).shape == (0, 64), "no rows: nothing to launch"


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_torch_compiled_decoder_with_the_op_matches_the_original(model, dtype):
    """Inductor compiles the swapped decoder in one graph (fullgraph), the op inside it; logits
    within the CLI's tolerance of the original module's, at two token counts."""
    pytest.importorskip("transformers")
    original = op.build_decoder(model, 512, 2, getattr(torch, dtype), seed=7).cuda()
    swapped = copy.deepcopy(original)
    assert op.swap_rms_norms(swapped) > 0
    compiled = torch.compile(swapped, fullgraph=True)
    generator = torch.Generator().manual_seed(3)
    for tokens in (37, 200):
        ids = torch.randint(0, op.VOCAB, (1, tokens), generator=generator).cuda()
        with torch.no_grad():
            expected = original(ids)
            assert op.relative_error(swapped(ids), expected) <= op.LOGITS_TOLERANCE[dtype]
            assert op.relative_error(compiled(ids), expected) <= op.LOGITS_TOLERANCE[dtype]


@pytest.mark.trt
def test_torch_tensorrt_runs_both_forms_inside_its_engine(tmp_path):
    """Every op call in the engine (none left in PyTorch), a dynamic token count, the engine's
    results against the float64 reference; saved and loaded again, the same."""
    import torch_tensorrt

    op.register_converters()
    hidden = 4096
    module = Forms(hidden, (EPS, EPS)).cuda().eval()
    w = module.w.detach().cpu()
    g = 1.0 + module.g.detach().float().cpu()
    x, _, r = inputs(8, hidden, "bfloat16", "float32", seed=1)
    tokens = torch.export.Dim("tokens", min=1, max=4096)
    rows = torch_tensorrt.Input(min_shape=(1, hidden), opt_shape=(128, hidden),
                                max_shape=(4096, hidden), dtype=torch.bfloat16)
    with torch.no_grad():
        exported = torch.export.export(module, (x.cuda(), r.cuda()),
                                       dynamic_shapes=({0: tokens}, {0: tokens}))
        compiled = torch_tensorrt.dynamo.compile(exported, arg_inputs=[rows, rows],
                                                 min_block_size=1)
        assert op.ops_left_in_pytorch(compiled) == 0
        path = tmp_path / "forms.ep"
        op.save_compiled(compiled, str(path), [x.cuda(), r.cuda()])
        loaded = torch_tensorrt.load(str(path)).module()
        for count in (1, 37, 512, 4096):
            x, _, r = inputs(count, hidden, "bfloat16", "float32", seed=count)
            for run in (compiled, loaded):
                y, y2, s = (t.cpu() for t in run(x.cuda(), r.cuda()))
                check_plain(x, w, y, "bfloat16")
                check_residual(y, r, g, y2, s, "bfloat16")


@pytest.mark.trt
@pytest.mark.parametrize("model", ["llama", "qwen3", "gemma3"])
def test_the_cli_compiles_a_swapped_decoder_into_one_engine(model, capsys):
    assert op.main(["--model", model, "--tokens", "37"]) == 0
    out = capsys.readouterr().out
    assert "compiled with Torch-TensorRT: 0 calls of the op left in PyTorch" in out
    assert out.endswith("Inference result correct!\n")
