#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The CuteDSL RMSNorm from PyTorch: a torch op that Torch-TensorRT lowers into the engine.

What you will learn
-------------------
* [1] How a kernel compiled elsewhere becomes a PyTorch op: ``torch.library.custom_op`` with a
  fake function (shapes and dtypes for ``torch.compile`` and ``torch.export``, no kernel) and a
  CUDA function that runs rms_norm_fused_cutedsl.py's compiled launcher on torch's current
  stream. ``torch.ops.rms_norm_cutedsl.rms_norm(x, w, epsilon)``, the residual form
  ``add_rms_norm(x, r, w, epsilon) -> (y, s)`` and their FP8 forms (``rms_norm_fp8``,
  ``add_rms_norm_fp8``, Y as FP8 E4M3 of y / y_scale).
* [2] How to put the op into a Hugging Face decoder: ``swap_rms_norms`` replaces the RMSNorm
  modules of Llama, Qwen3 (its q/k norms too) and Gemma 1-3 (their ``1 + w``), keeping the
  weights.
* [3] How Torch-TensorRT lowers the op into its engine: a converter that adds the QDP op of
  rms_norm_aot_cutedsl.py with ``ctx.net.add_plugin(..., aot=True)``.

Which Torch-TensorRT path, and why
----------------------------------
A hand-written converter (``dynamo_tensorrt_converter``, dynamic shapes) adds the AOT flavor's
QDP op. At build time TensorRT calls that op's aot_impl for each configuration (dtype, W's
dtype, hidden size, epsilon) and the GPU it builds for, and embeds the PTX compiled for it. The
engine runs without Python, and the compiled module can be saved and loaded without this file.
Two other routes were rejected. ``torch_tensorrt.kernels.ptx_op`` fixes one PTX and one kernel
name per op when the op is registered, and never passes epsilon to its aot_fn: it would need one
op per configuration. Torch-TensorRT's JIT plugin generator (``custom_op``,
``generate_plugin_converter``) calls the torch op back in Python from enqueue: a Python plugin's
cost on every call, and an engine that loads only where this module is imported. None of the
three exists in torch-tensorrt-rtx, which turns QDP off: TensorRT-RTX's network has no
add_plugin. The converter needs Torch-TensorRT on full TensorRT.

How to run it
-------------
On an SM80+ GPU with Torch-TensorRT on full TensorRT (pip install -r
requirements-torch-trt-gpu.txt), build a small decoder from its config (random weights, nothing
downloaded), swap its norms, compile it and compare it with the original module:

    python3 rms_norm_torch_op.py --model llama
    python3 rms_norm_torch_op.py --model gemma3 --dtype float16 --save gemma3_trt.ep
    python3 rms_norm_torch_op.py --model qwen3 --swap-only    # any machine: build, swap, count

Exit codes as in rms_norm_plugin_cutedsl.py: 0 correct, 1 incorrect, 2 usage or environment
error.
"""

# No `from __future__ import annotations`: torch.library reads the ops' annotations as types.
import argparse
import copy
import os
import sys

try:
    import rms_norm_aot_cutedsl as aot  # it imports the lesson and the fused companion
except ImportError as exc:  # the lesson's ImportError names the missing pip package
    # As the lesson's own guard: run as a script, one sentence and exit 2.
    if __name__ == "__main__":
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    raise
import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
import torch

from rms_norm_plugin_cutedsl import UsageError


# %% [1] The ops ------------------------------------------------------------------
#
# The ops take rows, x [num_tokens, hidden], as the kernel and the QDP op do:
# a caller with more leading axes reshapes (see [2]). Registering an op is
# cheap; the kernel is compiled at its first call for a configuration.


def dtype_name(tensor: torch.Tensor) -> str:
    """A tensor's dtype as the lesson's DTYPES names it, e.g. "bfloat16"."""
    return str(tensor.dtype).removeprefix("torch.")


def choices(names) -> str:
    """'a, b or c'."""
    return f"{', '.join(names[:-1])} or {names[-1]}"


def check_operands(op: str, x, w, r=None):
    """ValueError, in one sentence, for a shape or dtype the kernel does not serve.

    The fake functions call it too, so torch.compile and torch.export refuse at trace time.
    """
    if dtype_name(x) not in lesson.ACTIVATION_DTYPES:
        raise ValueError(f"{op}: x must be {choices(lesson.ACTIVATION_DTYPES)}, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be [num_tokens, hidden], got shape {tuple(x.shape)}; "
                         "reshape it to (-1, hidden) first")
    hidden = x.shape[1]
    if not 1 <= hidden <= lesson.MAX_HIDDEN:
        raise ValueError(f"{op}: hidden must be in [1, {lesson.MAX_HIDDEN}], got {hidden}")
    if dtype_name(w) not in lesson.WEIGHT_DTYPES or tuple(w.shape) != (hidden,):
        raise ValueError(f"{op}: w must be a [{hidden}] vector of "
                         f"{choices(lesson.WEIGHT_DTYPES)}, got {w.dtype} {tuple(w.shape)}")
    if r is not None and (r.shape != x.shape or r.dtype != x.dtype):
        raise ValueError(f"{op}: r must have x's shape and dtype, {tuple(x.shape)} {x.dtype}, "
                         f"got {tuple(r.shape)} {r.dtype}")


def check_buffers(op: str, tensors: dict):
    """ValueError unless every tensor is contiguous, 16-byte aligned and on x's CUDA device:
    the kernel reads rows as 128-bit vectors from the start of each buffer."""
    names = ", ".join(tensors)
    if not all(t.is_contiguous() and t.data_ptr() % lesson.VECTOR_BYTES == 0
               for t in tensors.values()):
        raise ValueError(f"{op}: {names} must be contiguous and {lesson.VECTOR_BYTES}-byte "
                         "aligned (a strided or offset view is not)")
    devices = [t.device for t in tensors.values()]
    if not all(device.type == "cuda" and device == devices[0] for device in devices):
        raise ValueError(f"{op}: {names} must be CUDA tensors on one device, got "
                         f"{', '.join(map(str, devices))}")


def fp8_y(x: torch.Tensor) -> torch.Tensor:
    """An empty Y of the FP8 forms: x's shape, FP8 E4M3."""
    return torch.empty_like(x, dtype=getattr(torch, lesson.DTYPES[fused.Y_FP8].torch))


def launch(op: str, x, w, y, epsilon: float, y_scale=None, r=None, s=None):
    """The companion's compiled launcher on torch tensors, on torch's current stream.

    r and s: the residual form's R and S; y_scale: the FP8 form's (y then FP8).
    """
    residual = {} if r is None else {"r": r, "s": s}
    check_buffers(op, {"x": x, "w": w, "y": y, **residual})
    if x.shape[0] == 0:
        return  # no rows: a launch of no CTAs is an error
    with torch.cuda.device(x.device):
        launcher = fused.compile_rms_norm(dtype_name(x), x.shape[1], epsilon,
                                          w_dtype=dtype_name(w), residual=r is not None,
                                          y_scale=y_scale)
        stream = lesson.cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        views = cute_views((x, w, y, *residual.values()))
        launcher(*views[:3], x.shape[0], stream, *views[3:])


def cute_views(tensors) -> list:
    """CuTe views of torch tensors, no copy. A module's weight is a Parameter that requires grad
    even under no_grad, and torch exports no such tensor through DLPack: detach() drops only the
    flag."""
    return [lesson.from_dlpack(t.detach(), assumed_align=lesson.VECTOR_BYTES) for t in tensors]


@torch.library.custom_op(aot.OP_NAME, mutates_args=())
def rms_norm(x: torch.Tensor, w: torch.Tensor, epsilon: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + epsilon) * w for each row of x [num_tokens, hidden], in x's
    dtype (W float32, float16 or bfloat16)."""
    check_operands(aot.OP_NAME, x, w)
    lesson.validate_epsilon(epsilon)
    y = torch.empty_like(x)
    launch(aot.OP_NAME, x, w, y, epsilon)
    return y


@rms_norm.register_fake
def rms_norm_fake(x, w, epsilon):
    """Y's shape and dtype for tracing: X's."""
    check_operands(aot.OP_NAME, x, w)
    lesson.validate_epsilon(epsilon)
    return torch.empty_like(x)


@torch.library.custom_op(aot.FUSED_OP_NAME, mutates_args=())
def add_rms_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor,
                 epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, s): s = x + r rounded to x's dtype, y = rms_norm(s, w, epsilon), in one kernel."""
    check_operands(aot.FUSED_OP_NAME, x, w, r)
    lesson.validate_epsilon(epsilon)
    y = torch.empty_like(x)
    s = torch.empty_like(x)
    launch(aot.FUSED_OP_NAME, x, w, y, epsilon, r=r, s=s)
    return y, s


@add_rms_norm.register_fake
def add_rms_norm_fake(x, r, w, epsilon):
    """Y's and S's shape and dtype for tracing: X's."""
    check_operands(aot.FUSED_OP_NAME, x, w, r)
    lesson.validate_epsilon(epsilon)
    return torch.empty_like(x), torch.empty_like(x)


@torch.library.custom_op(aot.FP8_OP_NAME, mutates_args=())
def rms_norm_fp8(x: torch.Tensor, w: torch.Tensor, epsilon: float,
                 y_scale: float) -> torch.Tensor:
    """rms_norm's y / y_scale as FP8 E4M3 (saturated at 448); sm_89 or newer."""
    check_operands(aot.FP8_OP_NAME, x, w)
    lesson.validate_epsilon(epsilon)
    fused.validate_y_scale(y_scale)
    y = fp8_y(x)
    launch(aot.FP8_OP_NAME, x, w, y, epsilon, y_scale)
    return y


@rms_norm_fp8.register_fake
def rms_norm_fp8_fake(x, w, epsilon, y_scale):
    """Y's shape and dtype for tracing: X's shape, FP8."""
    check_operands(aot.FP8_OP_NAME, x, w)
    lesson.validate_epsilon(epsilon)
    fused.validate_y_scale(y_scale)
    return fp8_y(x)


@torch.library.custom_op(aot.FUSED_FP8_OP_NAME, mutates_args=())
def add_rms_norm_fp8(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, epsilon: float,
                     y_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """add_rms_norm with y / y_scale as FP8 E4M3; s stays in x's dtype."""
    check_operands(aot.FUSED_FP8_OP_NAME, x, w, r)
    lesson.validate_epsilon(epsilon)
    fused.validate_y_scale(y_scale)
    y = fp8_y(x)
    s = torch.empty_like(x)
    launch(aot.FUSED_FP8_OP_NAME, x, w, y, epsilon, y_scale, r, s)
    return y, s


@add_rms_norm_fp8.register_fake
def add_rms_norm_fp8_fake(x, r, w, epsilon, y_scale):
    """Y's (FP8) and S's (X's dtype) shape and dtype for tracing."""
    check_operands(aot.FUSED_FP8_OP_NAME, x, w, r)
    lesson.validate_epsilon(epsilon)
    fused.validate_y_scale(y_scale)
    return fp8_y(x), torch.empty_like(x)


# %% [2] The op in a Hugging Face decoder ------------------------------------------
#
# The replacements keep the replaced module's weight Parameter, so the
# model's state_dict keys and any later weight load stay as they were.


class CuteDSLRMSNorm(torch.nn.Module):
    """In place of Llama's and Qwen3's RMSNorm: weight * RMSNorm(x) over x's last axis."""

    def __init__(self, weight: torch.nn.Parameter, epsilon: float):
        super().__init__()
        self.weight = weight
        self.epsilon = float(epsilon)

    @classmethod
    def replacing(cls, module: torch.nn.Module) -> "CuteDSLRMSNorm":
        """The replacement of a Llama or Qwen3 RMSNorm (epsilon in variance_epsilon)."""
        return cls(module.weight, module.variance_epsilon)

    def kernel_weight(self) -> torch.Tensor:
        """W as the kernel takes it."""
        return self.weight

    def output_dtype(self, x: torch.Tensor) -> torch.dtype:
        """Llama returns weight * x_normed.to(x.dtype): a float32 weight promotes Y."""
        return torch.promote_types(x.dtype, self.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        y = torch.ops.rms_norm_cutedsl.rms_norm(rows, self.kernel_weight(), self.epsilon)
        return y.view(x.shape).to(self.output_dtype(x))

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.epsilon}"


class CuteDSLOffsetRMSNorm(CuteDSLRMSNorm):
    """In place of Gemma's, Gemma2's and Gemma3's RMSNorm: (1 + weight) * RMSNorm(x), in x's
    dtype.

    W is 1 + weight in float32 on every call, as Gemma computes it: exact by construction,
    where a 16-bit 1 + weight would round most trained weights, and a float32 W costs the
    kernel nothing it measures (W is read from L2 by every row). Under Torch-TensorRT the
    addition is folded into the engine's constant W.
    """

    @classmethod
    def replacing(cls, module: torch.nn.Module) -> "CuteDSLOffsetRMSNorm":
        """The replacement of a Gemma RMSNorm (epsilon in eps)."""
        return cls(module.weight, module.eps)

    def kernel_weight(self) -> torch.Tensor:
        return 1.0 + self.weight.float()

    def output_dtype(self, x: torch.Tensor) -> torch.dtype:
        return x.dtype


def rms_norm_replacements() -> dict:
    """{transformers RMSNorm class: the class that replaces it} for the decoders served."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    return {
        LlamaRMSNorm: CuteDSLRMSNorm,
        Qwen3RMSNorm: CuteDSLRMSNorm,
        GemmaRMSNorm: CuteDSLOffsetRMSNorm,
        Gemma2RMSNorm: CuteDSLOffsetRMSNorm,
        Gemma3RMSNorm: CuteDSLOffsetRMSNorm,
    }


def swap_rms_norms(model: torch.nn.Module) -> int:
    """Replace every RMSNorm module of a known class in `model` by the op's; how many it replaced.

    Exact classes only: a subclass may compute something else.
    """
    replacements = rms_norm_replacements()
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            replacement = replacements.get(type(child))
            if replacement is not None:
                setattr(parent, name, replacement.replacing(child))
                swapped += 1
    return swapped


# %% [3] The converter: Torch-TensorRT adds the AOT flavor's QDP op ----------------
#
# The torch ops and the QDP ops of rms_norm_aot_cutedsl.py have the same
# names, inputs in the same order and the same attributes, so a node's
# arguments pass straight through: tensors become network tensors (a frozen
# W a constant), and epsilon and y_scale one-element float32 arrays, as the
# QDP ops declare them.

_CONVERTERS_REGISTERED = False


def plugin_converter(residual: bool, fp8: bool):
    """A Torch-TensorRT converter of one op's nodes into the plugin layer of its QDP op."""
    op = aot.op_name(residual, fp8).split("::")[1]
    num_tensors = 3 if residual else 2

    def convert(ctx, target, args, kwargs, name):
        """Called by Torch-TensorRT for each node of the op: the layer's output(s)."""
        import numpy as np
        import tensorrt.plugin as trtp
        from torch_tensorrt.dynamo.conversion.converter_utils import get_trt_tensor

        tensors = [get_trt_tensor(ctx, arg, f"{name}_input{i}")
                   for i, arg in enumerate(args[:num_tensors])]
        values = [np.array([value], dtype=np.float32) for value in args[num_tensors:]]
        attributes = dict(zip(("epsilon", "y_scale"), values))
        plugin = getattr(trtp.op.rms_norm_cutedsl, op)(*tensors, **attributes)
        layer = ctx.net.add_plugin(plugin, aot=True)
        layer.name = f"[{target}]-[{name}]"
        if residual:
            return layer.get_output(0), layer.get_output(1)
        return layer.get_output(0)

    return convert


def static_hidden(node, settings) -> bool:
    """Called by Torch-TensorRT's partitioner: convert a node only where its hidden size is
    static (the kernel compiles it in); others stay in PyTorch, on the op's CUDA function."""
    return isinstance(node.args[0].meta["val"].shape[-1], int)


def register_converters(arch: str | None = None):
    """Register the converters with Torch-TensorRT and the QDP ops with TensorRT (idempotent).

    arch: the GPU the engine's PTX is compiled for (None: the current GPU). UsageError, in one
    sentence, where Torch-TensorRT runs on TensorRT-RTX or TensorRT has no AOT plugins.
    """
    global _CONVERTERS_REGISTERED
    if _CONVERTERS_REGISTERED:
        return
    import torch_tensorrt
    from torch_tensorrt.dynamo.conversion import dynamo_tensorrt_converter

    if torch_tensorrt.ENABLED_FEATURES.tensorrt_rtx:
        raise UsageError("torch-tensorrt-rtx cannot put a plugin into its engines (TensorRT-RTX "
                         "has no plugin layer); install Torch-TensorRT on full TensorRT: "
                         "pip install -r requirements-torch-trt-gpu.txt")
    aot.check_aot_support()
    if arch is None:
        arch = lesson.gpu_arch()
    aot.check_aot_arch(arch)
    aot.register_aot_op(arch)
    forms = [(False, False), (True, False)]
    if fused.has_fp8(arch):
        forms += [(False, True), (True, True)]
    for residual, fp8 in forms:
        op = getattr(torch.ops.rms_norm_cutedsl, aot.op_name(residual, fp8).split("::")[1])
        register = dynamo_tensorrt_converter(op.default, capability_validator=static_hidden,
                                             supports_dynamic_shapes=True)
        register(plugin_converter(residual, fp8))
    _CONVERTERS_REGISTERED = True


# %% [4] Command line: a decoder, swapped, compiled and compared -------------------

MODELS = ("llama", "qwen3", "gemma", "gemma2", "gemma3")
VOCAB = 1024  # token ids of the small decoders
# Relative L2 error of the logits allowed against the original module: the kernel rounds Y
# once where Llama rounds twice, and TensorRT may reorder every sum of the decoder.
LOGITS_TOLERANCE = {"float16": 1e-2, "bfloat16": 4e-2, "float32": 5e-3}


def decoder_config(model: str, hidden: int, layers: int):
    """A small config of `model`'s family: 4 attention heads of hidden / 4, 2 of them for K/V."""
    import transformers

    config_classes = {
        "llama": transformers.LlamaConfig,
        "qwen3": transformers.Qwen3Config,
        "gemma": transformers.GemmaConfig,
        "gemma2": transformers.Gemma2Config,
        "gemma3": transformers.Gemma3TextConfig,
    }
    return config_classes[model](
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
    )


class Logits(torch.nn.Module):
    """A causal LM as a function of its token ids alone, which torch.export takes."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def build_decoder(model: str, hidden: int, layers: int, dtype: torch.dtype, seed: int) -> Logits:
    """A decoder of `model`'s family with random weights, its norms' weights random too (a
    weight of ones or zeros would hide a wrong W), in eval mode."""
    import transformers

    torch.manual_seed(seed)
    config = decoder_config(model, hidden, layers)
    decoder = transformers.AutoModelForCausalLM.from_config(config)
    norms = rms_norm_replacements()
    with torch.no_grad():
        for module in decoder.modules():
            if type(module) in norms:
                module.weight.add_(torch.rand_like(module.weight) - 0.5)
    return Logits(decoder.to(dtype)).eval()


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """||got - expected|| / ||expected||, in float64."""
    diff = got.double() - expected.double()
    return float(diff.norm() / expected.double().norm())


def ops_left_in_pytorch(compiled: torch.nn.Module) -> int:
    """Calls of the ops in the compiled module's graphs outside its TensorRT engines."""
    ours = {getattr(torch.ops.rms_norm_cutedsl, name.split("::")[1]).default
            for name in (aot.OP_NAME, aot.FUSED_OP_NAME, aot.FP8_OP_NAME, aot.FUSED_FP8_OP_NAME)}
    graphs = [m.graph for m in compiled.modules() if isinstance(m, torch.fx.GraphModule)]
    return sum(node.target in ours for graph in graphs for node in graph.nodes)


def compile_decoder(model: Logits, input_ids: torch.Tensor, max_tokens: int):
    """torch.export with a dynamic token count, then Torch-TensorRT with the op's converters."""
    import torch_tensorrt

    tokens = torch.export.Dim("tokens", min=1, max=max_tokens)
    exported = torch.export.export(model, (input_ids,), dynamic_shapes=({1: tokens},))
    ids = torch_tensorrt.Input(min_shape=(1, 1), opt_shape=tuple(input_ids.shape),
                               max_shape=(1, max_tokens), dtype=torch.int64)
    return torch_tensorrt.dynamo.compile(exported, arg_inputs=[ids], min_block_size=1)


def save_compiled(compiled, path: str, example_inputs: list):
    """torch_tensorrt.save to path.tmp, then renamed: a failed save leaves no half-written file."""
    import torch_tensorrt

    partial = f"{path}.tmp"
    try:
        torch_tensorrt.save(compiled, partial, arg_inputs=example_inputs)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Swap the RMSNorms of a small transformers decoder for the CuteDSL op, "
                    "compile it with Torch-TensorRT and compare it with the original module.")
    parser.add_argument("--model", choices=MODELS, default="llama",
                        help="decoder family, built from its config with random weights")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                        default="bfloat16")
    parser.add_argument("--hidden-dim", type=int, default=512, help="a multiple of 4")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64, help="tokens in the compared run")
    parser.add_argument("--max-tokens", type=int, default=1024,
                        help="the engine's largest token count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", metavar="PATH",
                        help="save the compiled module (torch_tensorrt.save) to PATH")
    parser.add_argument("--swap-only", action="store_true",
                        help="build and swap only, and print the count (no GPU needed)")
    return parser


def validate_args(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """parser.error (exit 2, one sentence) for a flag the run cannot take."""
    if args.hidden_dim < 4 or args.hidden_dim % 4 or args.hidden_dim > lesson.MAX_HIDDEN:
        parser.error(f"--hidden-dim must be a multiple of 4 in [4, {lesson.MAX_HIDDEN}], "
                     f"got {args.hidden_dim}")
    for flag in ("layers", "tokens", "max_tokens"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.tokens > args.max_tokens:
        parser.error(f"--tokens ({args.tokens}) must be <= --max-tokens ({args.max_tokens})")
    if args.save is not None and args.swap_only:
        parser.error("--save needs the compiled module, which --swap-only does not make")
    if args.save is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.save))):
        parser.error(f"--save {args.save}: its directory does not exist")
    return args


def check_environment(swap_only: bool):
    """UsageError unless transformers is here and, to compile, an SM80+ GPU and Torch-TensorRT
    on full TensorRT; registers the converters on the way."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise UsageError("the package transformers is not installed; "
                         "pip install -r requirements-torch-trt-gpu.txt") from None
    if swap_only:
        return
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
        raise UsageError("compiling needs an NVIDIA GPU of compute capability 8.0 or newer; "
                         "--swap-only builds and swaps without one")
    try:
        import torch_tensorrt  # noqa: F401
    except ImportError:
        raise UsageError("the package torch-tensorrt is not installed; "
                         "pip install -r requirements-torch-trt-gpu.txt") from None
    register_converters()


def main(argv=None) -> int:
    parser = make_parser()
    args = validate_args(parser, parser.parse_args(argv))
    dtype = getattr(torch, args.dtype)
    try:
        check_environment(args.swap_only)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return lesson.EXIT_USAGE
    original = build_decoder(args.model, args.hidden_dim, args.layers, dtype, args.seed)
    model = copy.deepcopy(original)
    swapped = swap_rms_norms(model)
    print(f"{args.model}: swapped {swapped} RMSNorm modules for "
          f"torch.ops.rms_norm_cutedsl.rms_norm")
    if args.swap_only:
        return lesson.EXIT_CORRECT
    input_ids = torch.randint(0, VOCAB, (1, args.tokens), device="cuda")
    with torch.no_grad():
        original.cuda()
        model.cuda()
        expected = original(input_ids)
        try:
            with lesson.tensorrt_stage("Torch-TensorRT compile"):
                compiled = compile_decoder(model, input_ids, args.max_tokens)
        except lesson.TensorRTError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return lesson.EXIT_USAGE
        print(f"compiled with Torch-TensorRT: {ops_left_in_pytorch(compiled)} calls of the op "
              "left in PyTorch, the others in the engine")
        error = relative_error(compiled(input_ids), expected)
    correct = error <= LOGITS_TOLERANCE[args.dtype]
    print(f"logits against the original module: relative error {error:.2e} "
          f"(tolerance {LOGITS_TOLERANCE[args.dtype]:.0e})")
    if args.save is not None:
        save_compiled(compiled, args.save, [input_ids])
        print(f"saved to {args.save}; torch_tensorrt.load runs it without this file")
    print("Inference result correct!" if correct else "Inference result incorrect!")
    return lesson.EXIT_CORRECT if correct else lesson.EXIT_INCORRECT


if __name__ == "__main__":
    sys.exit(main())
