#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Putting RmsNormPlugin into your own ONNX model, and checking it against TensorRT's own import.

What you will learn
-------------------
* How the RMSNorms of an exported LLM look in ONNX, route by route: ONNX's
  ``RMSNormalization`` (``torch.onnx.export(dynamo=True)`` at opset 23), a
  decomposed ``Pow -> ReduceMean -> Add -> Sqrt -> Reciprocal or Div -> Mul``
  chain (earlier opsets, the TorchScript exporter, Optimum), and onnxruntime's
  ``SimplifiedLayerNormalization`` and ``SkipSimplifiedLayerNormalization``
  (onnxruntime-genai's model builder).
* How to find every one of them with onnxscript's pattern rewriter and put a
  plugin node in its place, which TensorRT's ONNX parser then builds from the
  plugin registry, and how to list, with the reason, each one left to TensorRT.
* How to fuse the residual Add before a norm into the plugin node (its fused
  form takes X and R and also writes S = X + R, the next layer's residual),
  and why a norm stays alone: its X is no Add of two activations of one shape.
* How to fold the QuantizeLinear that an FP8-quantized model (NVIDIA Model
  Optimizer's Q/DQ pairs before each MatMul) puts after a norm into the
  plugin's FP8 form (quantize=1, y_scale), and why one stays.
* How to do that to a model of any size: the weights stay in their external
  data file and are never loaded; TensorRT's parser reads the model by path.
* How to build the rewritten model and the original, feed both the same
  realistic inputs (token ids within the vocabulary, masks of ones), compare
  every replaced node within the rounding the two computations allow, and time
  both engines.

What it runs on
---------------
The report (``--report-only``, and ``-o``) needs only onnx, onnx-ir and
onnxscript besides the lesson's packages: no GPU, no TensorRT. Building and
comparing need what the lesson needs (an NVIDIA GPU of SM80+, TensorRT 10 or
11); TensorRT's own import of ONNX's RMSNormalization, which the one-node
model and opset-23 exports are compared against, needs TensorRT 10.15+. A
model with folded FP8 Quantizes needs an SM89+ GPU, as FP8 itself does.
TensorRT's parser makes the plugin nodes with the creator of
rms_norm_fused_cutedsl.py, which serves every form they take.

How to run it
-------------
    python3 rms_norm_onnx_model.py     # one RMSNormalization node: plugin vs TensorRT, timed
    python3 rms_norm_onnx_model.py model.onnx --report-only -o model_rmsnorm.onnx
    python3 rms_norm_onnx_model.py model.onnx \\
        --min-shapes input_ids:1x1,attention_mask:1x1 \\
        --opt-shapes input_ids:1x128,attention_mask:1x128 \\
        --max-shapes input_ids:4x512,attention_mask:4x512

Exit codes: 0 every replaced node matched TensorRT's import, 1 one did not,
2 usage or environment error (one sentence on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import math
import os
import sys
import tempfile

EXIT_USAGE = 2  # the lesson's code for a usage error, needed before the lesson is imported
FLAGS_OF_THE_ONE_NODE_MODEL = ("hidden_dim", "dtype", "weight_dtype", "epsilon")
FLAGS_OF_A_MODEL = ("output", "report_only", "min_shapes", "opt_shapes", "max_shapes")


# %% [0] Flags ------------------------------------------------------------------
#
# Standard library only, so that --help and a mistyped flag answer at once.


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        """One sentence on stderr and exit code 2, instead of argparse's usage dump."""
        self.exit(EXIT_USAGE, f"error: {message} (see --help)\n")


def parse_shapes(text: str) -> dict:
    """{input name: shape} from trtexec's spelling, e.g. 'input_ids:1x128,attention_mask:1x128'."""
    shapes = {}
    for item in filter(None, text.split(",")):
        name, colon, dims = item.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        except ValueError:
            shape = None
        if not colon or not name or shape is None or any(d < 0 for d in shape):
            raise argparse.ArgumentTypeError(f"'{item}' is not NAME:DIMxDIM... "
                                             "(e.g. input_ids:1x128)")
        shapes[name] = shape
    return shapes


def parse_args(argv=None) -> argparse.Namespace:
    parser = _ArgumentParser(
        description="Replace the RMSNorms of an ONNX model by RmsNormPlugin, print which and why "
                    "not, and compare the rewritten model with TensorRT's import of the original. "
                    "Without MODEL.onnx: a one-node RMSNormalization model.",
        epilog="The report comes first and needs no GPU; --report-only stops there. "
               "Exit codes: 0 every replaced node matched TensorRT's import, 1 one did not, "
               "2 usage or environment error.")
    parser.add_argument("model", nargs="?", metavar="MODEL.onnx",
                        help="the model (its external data beside it)")
    parser.add_argument("-o", "--output", metavar="OUT.onnx",
                        help="write the rewritten model there (in MODEL's directory if it has "
                             "external data)")
    parser.add_argument("--report-only", action="store_true",
                        help="print the per-node report (and write -o), build nothing: no GPU or "
                             "TensorRT needed")
    for point in ("min", "opt", "max"):
        parser.add_argument(f"--{point}-shapes", f"--{point}Shapes", type=parse_shapes,
                            metavar="NAME:DxD,...",
                            help=f"the profile's {point} shape of each named input, as trtexec's "
                                 f"--{point}Shapes")
    parser.add_argument("--min-tokens", type=int, default=1,
                        help="the one dynamic dimension's minimum (default 1)")
    parser.add_argument("--opt-tokens", type=int, default=128, help="its optimum (default 128)")
    parser.add_argument("--max-tokens", type=int, default=512, help="its maximum (default 512)")
    one_node = parser.add_argument_group("the one-node model (no MODEL.onnx)")
    one_node.add_argument("--hidden-dim", type=int, help="hidden size (default 1024)")
    one_node.add_argument("--dtype", choices=("float16", "bfloat16", "float32"),
                          help="X dtype (default float16)")
    one_node.add_argument("--weight-dtype", choices=("float32", "float16", "bfloat16"),
                          help="scale dtype (default float32)")
    one_node.add_argument("--epsilon", type=float, help="default 1e-5")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for the random inputs (default 0)")
    args = parser.parse_args(argv)

    # Flags that describe the other kind of run are refused, not ignored.
    misplaced = FLAGS_OF_THE_ONE_NODE_MODEL if args.model else FLAGS_OF_A_MODEL
    for name in misplaced:
        if (value := getattr(args, name)) is not None and value is not False:  # 0 is a value given
            flag = "-o" if name == "output" else "--" + name.replace("_", "-")
            if args.model:
                parser.error(f"{flag} applies to the one-node model, not to MODEL.onnx")
            parser.error(f"{flag} applies to MODEL.onnx, which was not given")
    if not 1 <= args.min_tokens <= args.opt_tokens <= args.max_tokens:
        parser.error(f"the profile needs 1 <= --min-tokens <= --opt-tokens <= --max-tokens, got "
                     f"{args.min_tokens}, {args.opt_tokens}, {args.max_tokens}")
    named = [set(getattr(args, f"{p}_shapes") or {}) for p in ("min", "opt", "max")]
    if named[0] != named[1] or named[1] != named[2]:
        parser.error("--min-shapes, --opt-shapes and --max-shapes must name the same inputs, got "
                     + " / ".join(", ".join(sorted(n)) or "none" for n in named))
    if args.model and not os.path.isfile(args.model):
        parser.error(f"'{args.model}' does not exist or is not a file")
    if args.output:
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
            parser.error(f"-o '{args.output}': '{folder}' is not a writable directory")
        if os.path.abspath(args.output) == os.path.abspath(args.model):
            parser.error("-o must not be MODEL.onnx itself")
    if not args.model:
        args.hidden_dim = 1024 if args.hidden_dim is None else args.hidden_dim
        args.dtype, args.weight_dtype = args.dtype or "float16", args.weight_dtype or "float32"
        args.epsilon = 1e-5 if args.epsilon is None else args.epsilon
    return args


if __name__ == "__main__":
    ARGS = parse_args()  # before the heavy imports: --help and flag errors must not wait for torch

try:
    # The lesson first: its ImportError names a missing package of its set in one sentence. The
    # plugin nodes this file writes take the fused forms' fields, which the fused companion's
    # creator serves, and its FP8 rounding checks them.
    import rms_norm_plugin_cutedsl as lesson
    import rms_norm_fused_cutedsl as fused

    import numpy as np
    import onnx
    import onnx_ir as ir
    import torch
    from onnx_ir.passes.common import ShapeInferencePass
    from onnxscript.rewriter import pattern
except ImportError as exc:
    module = (exc.name or "").partition(".")[0]
    if module in ("onnx", "onnx_ir", "onnxscript"):
        message = (f"the Python package {module.replace('_', '-')} is not installed; install "
                   "the ONNX packages with `pip install onnx onnx-ir onnxscript`")
    else:
        message = str(exc)  # the lesson's sentence
    if __name__ == "__main__":
        print(f"error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    raise ImportError(message, name=exc.name) from exc

# ONNX element type (as onnx-ir names it) -> the lesson's dtype name.
DTYPE_NAMES = {ir.DataType[names.onnx]: name for name, names in lesson.DTYPES.items()}
# The plugin node's attribute that selects its fused form: 1 takes [X, R, W], writes [Y, S = X + R].
RESIDUAL_ATTRIBUTE = "residual"
# Its FP8 form: quantize=1 writes Y as FLOAT8E4M3FN, y / y_scale rounded to nearest even, saturated.
QUANTIZE_ATTRIBUTE, Y_SCALE_ATTRIBUTE = "quantize", "y_scale"


# %% [1] Load: check by path, keep the weights where they are -------------------
#
# onnx.checker reads the file itself (models over 2 GB included) and resolves
# external data beside it; onnx-ir maps external tensors lazily, so the graph
# is rewritten without reading a weight. onnxruntime's
# SimplifiedLayerNormalization, and the plugin's op in a rewritten model, sit
# in ONNX's own domain without an ONNX schema, which the checker refuses;
# declaring their schemas here (inputs, outputs, attributes) lets it check them
# like any other op. Ops in other domains (com.microsoft) the checker skips.


def declare_schemas():
    """Give onnx.checker the schemas of SimplifiedLayerNormalization (onnxruntime's) and of the
    plugin's op."""
    def parameter(name, dtypes, option="Single"):
        option = getattr(onnx.defs.OpSchema.FormalParameterOption, option)
        # A variadic list may mix dtypes (R has X's, W its own), so it is declared heterogeneous.
        return onnx.defs.OpSchema.FormalParameter(name, dtypes, param_option=option,
                                                  is_homogeneous=option.name != "Variadic")

    def attribute(name, value):
        return onnx.defs.OpSchema.Attribute(name, onnx.helper.make_attribute(name, value), "")

    floats = ["tensor(float16)", "tensor(bfloat16)", "tensor(float)", "tensor(double)"]
    fp8 = ["tensor(float8e4m3fn)"]  # the plugin's Y in its FP8 form (quantize=1)
    # The plugin's two forms are [X, W] -> [Y] and, fused, [X, R, W] -> [Y, S]. A schema binds a
    # node's inputs to its parameters by position, and an absent optional one is written as "", so
    # an optional R between X and W would bind the plain form's W to R. X and then a variadic list,
    # [W] or [R, W], checks both forms (the plugin refuses other lengths); S, last, is optional.
    schemas = [("SimplifiedLayerNormalization", [parameter("X", "T"), parameter("scale", "V")],
                [parameter("Y", "V"), parameter("inv_std_var", "U", "Optional")],
                [attribute("axis", -1), attribute("epsilon", 1e-5), attribute("stash_type", 1)]),
               (lesson.PLUGIN_NAME, [parameter("X", "T"), parameter("R_and_W", "V", "Variadic")],
                [parameter("Y", "Q"), parameter("S", "T", "Optional")],
                [attribute("epsilon", lesson.DEFAULT_EPSILON), attribute(RESIDUAL_ATTRIBUTE, 0),
                 attribute(QUANTIZE_ATTRIBUTE, 0),
                 # no default: y_scale is absent unless quantize is 1
                 onnx.defs.OpSchema.Attribute(Y_SCALE_ATTRIBUTE, onnx.defs.OpSchema.AttrType.FLOAT,
                                              "", required=False),
                 attribute("plugin_version", lesson.PLUGIN_VERSION),
                 attribute("plugin_namespace", lesson.PLUGIN_NAMESPACE)])]
    for name, inputs, outputs, attributes in schemas:
        if not onnx.defs.has(name):
            onnx.defs.register_schema(onnx.defs.OpSchema(
                name, "", 1, inputs=inputs, outputs=outputs, attributes=attributes,
                type_constraints=[(t, floats, "") for t in ("T", "U", "V")]
                + [("Q", floats + fp8, "")]))


def load_model(path: str) -> ir.Model:
    """The model at `path`, its tensors' types and shapes inferred; UsageError if it is not ONNX."""
    declare_schemas()
    try:
        onnx.checker.check_model(path)  # bytes that happen to parse as a protobuf are not a model
        model = ir.load(path)
    except Exception as exc:  # protobuf's DecodeError, the checker's ValidationError, OSError, ...
        detail = " ".join(str(exc).split())[:200]
        raise lesson.UsageError(f"'{path}' is not a valid ONNX model ({detail})") from None
    # Inference sees the graph without its large weights (onnx-ir passes their shapes only); it
    # fills in what the exporter left untyped and does not fail on ops it has no rule for, or on
    # an exporter's type annotation it disagrees with.
    ShapeInferencePass(strict_mode=False, check_type=False)(model)
    return model


def external_data_dirs(model: ir.Model) -> set:
    """The directories whose files hold the model's external weights."""
    return {os.path.abspath(value.const_value.base_dir)
            for value in model.graph.initializers.values()
            if isinstance(value.const_value, ir.ExternalTensor)}


# %% [2] The rewrite: every RMSNorm form, found by onnxscript's pattern matcher ---
#
# Each form is an onnxscript pattern; the matcher finds it whatever the order
# of a commutative op's inputs (commute=True) and only where its inner values
# are used by it alone. check() decides whether the plugin computes what the
# match computes; rewrite() writes the plugin node, named like the original.
# Forms ending in a Cast back to X's dtype are tried first, so that the plugin
# (whose Y has X's dtype) absorbs the Cast. onnxscript's own RMSNorm fusions match
# the Reciprocal chain only (Pow, the mean's axes an input [-1], no Div, no
# x*x, no Cast back) and write RMSNormalization or onnxruntime's op in its
# place even where the plugin cannot serve it, so the forms are written here
# for its matcher, with the plugin node as the rewrite.
#
# Then the residual: in a decoder, a norm's X is mostly the Add of the
# residual stream and a block's output, and that Add's output is also the next
# residual. The plugin's fused form computes S = X + R (rounded to X's dtype,
# as the Add rounds it) and normalizes S, so one node replaces the Add and
# the norm, and its S takes the Add's place for every other consumer. The
# matcher cannot take that Add into a pattern (its output is used outside the
# match), so fuse_residual_adds() follows each plugin node's X back instead.


@dataclasses.dataclass(frozen=True)
class Replaced:
    """One RMSNorm now computed by the plugin: where it reads and writes, and how each side
    rounds."""

    name: str
    form: str
    x: tuple           # what X sums: X, the fused Add's inputs, or a skip op's input, skip, bias
    scale: str
    y: str             # the tensor compared: the node's output, or that of the Cast it absorbed
    epsilon: float
    dtype: str         # X's, and the plugin's Y
    scale_dtype: str
    # "absorbed": the Cast back to X's dtype is gone; "appended": Y is cast to scale's dtype
    cast: str
    fused: str = ""    # the fused form: what it adds, for the report; "" where the node is alone
    alone: str = ""    # why the node is alone: its X is no Add of two like activations
    sum: str = ""      # S as the original names it, compared too; "" where it has no such tensor
    y_scale: float = 0.0   # the FP8 form's scale, the folded QuantizeLinear's; 0.0: Y in X's dtype
    quantized: str = ""    # that QuantizeLinear's name; y then names its output, FP8 in both models


def rms_normalization(op, x, skip, scale, epsilon):
    """ONNX's op (opset 23), torch.onnx.export(dynamo=True)'s output at that opset."""
    return op.RMSNormalization(x, scale, _outputs=["norm"])


def simplified_layer_normalization(op, x, skip, scale, epsilon):
    """onnxruntime's RMSNorm, which its tools write in ONNX's own domain."""
    return op.SimplifiedLayerNormalization(x, scale, _outputs=["norm"])


def decomposed(op, stats, scale, epsilon):
    """The chain torch writes below opset 23 from `stats`: Pow or x*x, the mean, Reciprocal(Sqrt)
    or Div by it, an optional Cast, the weight (Gemma's 1 + w, folded or not, is a weight like any
    other)."""
    # (Each backtracking alternative carries a tag_var, which onnxscript 0.7's commute() needs to
    # copy it.)
    square = pattern.OrValue([op.Pow(stats, 2.0), op.Mul(stats, stats)])
    mean = op.ReduceMean(square, _allow_other_inputs=True, _outputs=["mean"])
    rms = op.Sqrt(op.Add(mean, epsilon))
    normalized = pattern.OrValue([op.Mul(stats, op.Reciprocal(rms)),
                                  op.Mul(stats, op.Div(1.0, rms)),
                                  op.Div(stats, rms)], tag_var="divide")
    cast = pattern.OrValue([op.Cast(normalized), normalized], tag_var="cast_normalized")
    return op.Mul(cast, scale, _outputs=["norm"])


def decomposed_after_cast(op, x, skip, scale, epsilon):
    """The chain on X cast to FP32 first, as transformers' RMSNorms do: the plugin takes X before
    the Cast."""
    return decomposed(op, op.Cast(x, _outputs=["stats"]), scale, epsilon)


def decomposed_in_x_dtype(op, x, skip, scale, epsilon):
    """The chain on X itself: an FP32 X, or a Cast whose output something else uses too (it
    stays)."""
    return decomposed(op, x, scale, epsilon)


def skip_simplified_layer_normalization(op, x, skip, scale, epsilon):
    """onnxruntime-genai's residual add and RMSNorm in one op; the last one writes only the norm."""
    return op.SkipSimplifiedLayerNormalization(x, skip, scale, _domain="com.microsoft",
                                               _allow_other_inputs=True, _outputs=["norm"])


def skip_simplified_layer_normalization_and_sum(op, x, skip, scale, epsilon):
    """The same op also writing the sum (its fourth output), the next layer's residual."""
    norm, _, _, total = op.SkipSimplifiedLayerNormalization(
        x, skip, scale, _domain="com.microsoft", _allow_other_inputs=True,
        _outputs=["norm", None, None, "total"])
    return norm, total


FORMS = (rms_normalization, simplified_layer_normalization, decomposed_after_cast,
         decomposed_in_x_dtype)
SKIP_FORMS = (skip_simplified_layer_normalization, skip_simplified_layer_normalization_and_sum)
DEFAULT_EPSILONS = {"RMSNormalization": 1e-5, "SimplifiedLayerNormalization": 1e-5,
                    "SkipSimplifiedLayerNormalization": 1e-12}  # ONNX's and onnxruntime's defaults
NORM_OPS = set(DEFAULT_EPSILONS)


def node_name(node: ir.Node) -> str:
    return node.name or f"unnamed {node.op_type} writing '{node.outputs[0].name}'"


def constant(value):
    """The value's constant as a NumPy array, or None if it is computed."""
    tensor = ir.convenience.get_const_tensor(value) if value is not None else None
    return None if tensor is None else tensor.numpy()


class PluginRule(pattern.RewriteRuleClassBase):
    """One form, optionally followed by a Cast back to X's dtype, rewritten to an RmsNormPlugin
    node."""

    def __init__(self, form, cast_back: bool, found: dict):
        super().__init__(form.__name__ + (" + Cast" if cast_back else ""))
        self.form, self.cast_back, self.found = form, cast_back, found

    def pattern(self, op, x, skip, scale, epsilon, to):
        y = self.form(op, x, skip, scale, epsilon)
        return op.Cast(y, to=to, _outputs=["out"]) if self.cast_back else y

    def check(self, op, x, scale, epsilon, norm, to=None, stats=None, mean=None, **_):
        node = norm.producer()
        dtype, scale_dtype = (DTYPE_NAMES.get(v.dtype, str(v.dtype)) for v in (x, scale))
        if self.cast_back and DTYPE_NAMES.get(ir.DataType(to.as_int())) != dtype:
            # The plain form decides.
            return pattern.MatchResult().fail("not a Cast back to X's dtype")
        used = [k for k, v in enumerate(node.outputs)
                if k and v is not None and (v.uses() or v.is_graph_output())]
        writes_sum = self.form is skip_simplified_layer_normalization_and_sum
        if self.form in SKIP_FORMS and (3 in used) != writes_sum:
            # onnxscript 0.7 matches a pattern of four outputs on a node of one, and one output on
            # a node whose others are used.
            return pattern.MatchResult().fail("the other skip form writes the sum")
        if node.op_type in NORM_OPS:
            epsilon = node.attributes.get_float("epsilon", DEFAULT_EPSILONS[node.op_type])
        else:  # the decomposed chain: its constant
            epsilon = constant(epsilon)
            epsilon = float(epsilon) if epsilon is not None and epsilon.size == 1 else None
        reason = why_not_served(node, x, scale, epsilon, x if stats is None else stats, mean) or (
            "its mean or inverse-RMS output is used" if {1, 2} & set(used) else None)
        name = node_name(node)
        if reason:
            self.found["left"][name] = reason
            matched = (node, mean and mean.producer())
            self.found["matched"].update(n.name for n in matched if n is not None)
            return pattern.MatchResult().fail(reason)
        cast = "absorbed" if self.cast_back and dtype != scale_dtype else (
            "appended" if dtype != scale_dtype else "")
        self.found["left"].pop(name, None)
        self.pending = Replaced(name, self.name, (), scale.name, "",
                                lesson.validate_epsilon(epsilon), dtype, scale_dtype, cast)
        return pattern.MatchResult()

    def rewrite(self, op, x, skip, scale, norm, out=None, total=None, **_):
        node, replaced = norm.producer(), self.pending
        plugin = dict(_name=replaced.name, epsilon=replaced.epsilon,
                      plugin_version=lesson.PLUGIN_VERSION,
                      plugin_namespace=lesson.PLUGIN_NAMESPACE)
        parts, r, record = (x,), None, {}
        if self.form in SKIP_FORMS:
            bias = node.inputs[3] if len(node.inputs) > 3 else None  # the optional fourth input
            parts = (x, skip) + (() if bias is None else (bias,))
            x, r, record = skip_sum(op, replaced.name, norm.graph, parts, total)
        if r is not None:  # the fused form
            y, s = op.RmsNormPlugin(x, r, scale, _outputs=2, **plugin, **{RESIDUAL_ATTRIBUTE: 1})
            s.dtype, s.shape = x.dtype, x.shape
            if total is None:  # S is written even where no node reads it, so it needs a name
                s.name = unused_name(norm.graph, f"{replaced.name}/sum")
        else:
            y, s = op.RmsNormPlugin(x, scale, **plugin), x
        y.dtype, y.shape = x.dtype, x.shape  # the plugin's Y: X's dtype and shape
        self.found["nodes"].append(y.producer())
        if replaced.cast == "appended":  # ONNX's Y has the scale's dtype, the plugin's X's
            y = op.Cast(y, to=scale.dtype, _name=f"{replaced.name}/to_scale_dtype")
        checked = (out if self.cast_back else norm).name
        self.found["replaced"].append(dataclasses.replace(
            replaced, x=tuple(v.name for v in parts), y=checked, **record))
        return (y, s) if total is not None else y


# What a skip norm's fused node adds, without and with the op's bias, for the report.
SKIP_SUMS = ("its own input + skip",
             "its own input + (skip + bias): TensorRT adds the bias to the skip first, so S also "
             "rounds skip + bias, where onnxruntime's CPU kernel sums all three in FP32")


def skip_sum(op, name: str, graph: ir.Graph, parts: tuple, total):
    """(X, R, the record's fields) of a skip op's plugin node, from its input, skip and bias.

    The fused form adds two tensors, so TensorRT adds a bias to the skip first. A skip broadcast
    over the input is no R of X's shape: TensorRT adds the parts, and R is None (the plain form).
    """
    x, skip, *bias = parts
    differ = shapes_differ(x, skip)
    if differ is None:
        if bias:
            skip = op.Add(skip, bias[0], _name=f"{name}/bias_add")
            skip.name = unused_name(graph, f"{name}/skip_plus_bias")
            skip.dtype, skip.shape = x.dtype, x.shape
        return x, skip, dict(fused=SKIP_SUMS[bool(bias)], sum="" if total is None else total.name)
    for addend, suffix in zip((skip, *bias), ("residual_add", "bias_add")):
        x = op.Add(x, addend, _name=f"{name}/{suffix}")
        x.dtype, x.shape = parts[0].dtype, parts[0].shape
    return x, None, dict(alone=f"its input and skip {differ}")


def unused_name(graph: ir.Graph, name: str) -> str:
    """`name`, or `name` with a number appended where a value of `graph` already has it."""
    taken = {*graph.initializers, *(v.name for v in graph.inputs),
             *(v.name for node in ir.traversal.RecursiveGraphIterator(graph) for v in node.outputs)}
    candidates = (f"{name}_{k}" if k else name for k in itertools.count())
    return next(n for n in candidates if n not in taken)


def shapes_differ(a: ir.Value, b: ir.Value) -> str | None:
    """None where `a` and `b` are known to have one shape, else how they differ (a clause)."""
    first, second = a.shape, b.shape
    if first is not None and second is not None:
        # An unnamed symbolic dimension equals any other in onnx-ir: only named ones prove equality.
        named = all(isinstance(d, int) or d.value for d in (*first, *second))
        if named and first == second:
            return None
        static = [(p, q) for p, q in zip(first, second)
                  if isinstance(p, int) and isinstance(q, int)]
        if len(first) != len(second) or any(p != q for p, q in static):
            return f"differ in shape ({first} and {second})"
    return (f"are not known to have one shape ({first} and {second}; onnxruntime.tools."
            "symbolic_shape_infer may prove more)")


def why_not_served(node, x, scale, epsilon, stats, mean) -> str | None:
    """None if the plugin computes what this match computes, else why not (one clause)."""
    shape = x.shape
    if x.dtype is None:
        return "X has no known dtype"
    if shape is None or len(shape) < 2:
        return "X needs a known rank of 2 or more"
    rank = len(shape)
    if mean is None:  # an op: it normalizes from `axis` to the last axis
        axis = node.attributes.get_int("axis", -1)
        if axis not in (-1, rank - 1):
            return f"it normalizes from axis {axis}; the plugin normalizes over the last axis only"
        if node.attributes.get_int("stash_type", 1) != 1:
            return "stash_type is not 1 (FP32); the plugin computes in FP32"
    else:
        reduce = mean.producer()
        if len(reduce.inputs) > 1:
            axes = constant(reduce.inputs[1])
        else:
            axes = reduce.attributes.get_ints("axes", None)
        listed = None if axes is None else list(np.ravel(axes))
        if axes is None or [a % rank if -rank <= a < rank else a for a in listed] != [rank - 1]:
            return (f"its mean is over axes {listed}; the plugin normalizes over the last axis "
                    "only")
        if reduce.attributes.get_int("keepdims", 1) != 1:
            return "its mean drops the reduced axis (keepdims=0)"
        if stats.dtype != ir.DataType.FLOAT:
            return (f"it computes its statistics in {DTYPE_NAMES.get(stats.dtype, stats.dtype)}; "
                    "the plugin computes them in FP32")
    hidden = shape[-1]
    if not isinstance(hidden, int):
        return "the last dimension of X is dynamic; the plugin compiles it into the kernel"
    if not 1 <= hidden <= lesson.MAX_HIDDEN:
        return f"the last dimension of X is {hidden}, outside [1, {lesson.MAX_HIDDEN}]"
    if scale.shape is None or list(scale.shape) != [hidden]:
        got = None if scale.shape is None else list(scale.shape)
        return f"scale must be 1-D of length {hidden}, got shape {got}"
    dtype, scale_dtype = (DTYPE_NAMES.get(v.dtype, str(v.dtype)) for v in (x, scale))
    if dtype not in lesson.ACTIVATION_DTYPES or scale_dtype not in lesson.WEIGHT_DTYPES:
        return (f"X is {dtype} and scale {scale_dtype}; the plugin takes X of "
                f"{list(lesson.ACTIVATION_DTYPES)} and scale of {list(lesson.WEIGHT_DTYPES)}")
    if epsilon is None:
        return "its epsilon is not one constant"
    try:
        lesson.validate_epsilon(epsilon)
    except ValueError:
        return f"epsilon {epsilon:g} is not finite and > 0 in float32, as the plugin requires"
    return None


def residual_add(node: ir.Node):
    """(the Add that writes the plugin node's X, None), or (None, why the node stays alone)."""
    x = node.inputs[0]
    producer = x.producer()
    if producer is not None and producer.op_type == "Cast" and producer.inputs[0].dtype == x.dtype:
        x, producer = producer.inputs[0], producer.inputs[0].producer()  # a Cast to the dtype X has
    if producer is None:
        return None, f"its X '{x.name}' is a graph input, not an Add"
    if producer.op_type != "Add" or producer.domain not in ("", "ai.onnx"):
        return None, f"its X is not an Add of two activations (a {producer.op_type} writes it)"
    if producer.graph is not node.graph:
        return None, "its Add is in an enclosing graph"
    for value in producer.inputs:
        if value.is_initializer() or ir.convenience.get_const_tensor(value) is not None:
            return None, f"the Add's input '{value.name}' is a constant, not an activation"
    a, b = producer.inputs
    if not a.dtype == b.dtype == x.dtype:
        return None, f"the Add's inputs are {a.dtype} and {b.dtype}, not both X's {x.dtype}"
    differ = shapes_differ(a, b)
    return (None, f"the Add's inputs {differ}") if differ else (producer, None)


def fuse_residual_adds(found: dict):
    """Make each plain plugin node whose X is a residual Add the fused form; record why not, if not.

    The fused node takes the Add's inputs as X and R, and its S, named like the
    Add's output, replaces that output everywhere; the Add goes. A Cast that X
    passed through (to the dtype it already had) stays for its other readers.
    """
    graphs = set()
    for k, (record, node) in enumerate(zip(found["replaced"], found["nodes"])):
        if record.fused or record.alone:  # a skip norm: its rule decided
            continue
        add, why = residual_add(node)
        if add is None:
            found["replaced"][k] = dataclasses.replace(record, alone=why)
            continue
        total, graph = add.outputs[0], node.graph
        cast = node.inputs[0].producer() if node.inputs[0] is not total else None
        attributes = {name: attribute.value for name, attribute in node.attributes.items()}
        fused = ir.node(lesson.PLUGIN_NAME, [*add.inputs, node.inputs[1]],
                        {**attributes, RESIDUAL_ATTRIBUTE: 1}, num_outputs=2, name=node.name)
        found["replaced"][k] = dataclasses.replace(
            record, x=tuple(v.name for v in add.inputs), sum=total.name,
            fused=f"with the Add {node_name(add)}: S replaces its output '{total.name}'")
        ir.convenience.replace_nodes_and_values(graph, node, [node, add], [fused],
                                                [node.outputs[0], total], list(fused.outputs))
        found["nodes"][k] = fused  # where the FP8 fold looks next
        unread = cast is not None and not cast.outputs[0].uses()
        if unread and not cast.outputs[0].is_graph_output():
            graph.remove(cast)  # the Cast only fed the norm
        graphs.add(graph)
    for graph in graphs:  # S now comes later than the Add did, after the norm's weight is ready
        graph.sort()


# Then the FP8 form. A model quantized for FP8 matmuls (NVIDIA Model Optimizer
# writes a QuantizeLinear -> DequantizeLinear pair before each MatMul's
# activation) reads a norm's Y only through a QuantizeLinear to FLOAT8E4M3FN
# with one constant scale. The plugin can write that FP8 tensor itself
# (quantize=1, y_scale): Y is stored once, a byte an element, and no Quantize
# reads it again. The Quantize goes and the plugin's Y takes its output's
# name, so its readers (the DequantizeLinear) stay as they are. Y must have no
# other reader, which would need Y in X's dtype.

def quantize_after(node: ir.Node):
    """(the QuantizeLinear reading the plugin node's Y, the Cast between or None), or (None, None).

    Y reaches it directly or through the Cast the rewrite appended (Y in the scale's dtype, as
    ONNX's op writes it); the plugin's FP8 Y replaces both.
    """
    y, cast = node.outputs[0], None
    readers = [user for user, _ in y.uses()]
    appended = len(readers) == 1 and readers[0].op_type == "Cast" \
        and readers[0].name.endswith("/to_scale_dtype")
    if appended:
        cast, y = readers[0], readers[0].outputs[0]
    quantizes = [user for user, index in y.uses() if user.op_type == "QuantizeLinear"
                 and user.domain in ("", "ai.onnx") and index == 0]
    return (quantizes[0], cast) if quantizes else (None, None)


def why_not_folded(y: ir.Value, quantize: ir.Node) -> str | None:
    """None if the plugin's FP8 form writes what `quantize` makes of Y, else why not (a clause)."""
    others = [user for user, _ in y.uses() if user is not quantize]
    if y.is_graph_output():
        return f"Y '{y.name}' is also a graph output, which needs Y in X's dtype"
    if others:
        return f"Y '{y.name}' has {len(others)} other reader(s) (a {others[0].op_type} among " \
               "them), which need Y in X's dtype"
    scale = constant(quantize.inputs[1]) if len(quantize.inputs) > 1 else None
    zero = quantize.inputs[2] if len(quantize.inputs) > 2 else None
    block_size = quantize.attributes.get_int("block_size", 0)
    if block_size:
        return f"it quantizes in blocks of {block_size}; the plugin takes one scale"
    if scale is None:
        return "its scale is not a constant"
    if scale.size != 1 or scale.ndim > 1:
        axis = quantize.attributes.get_int("axis", 1)
        return f"its scale has shape {list(scale.shape)} (per axis {axis}); the plugin takes one " \
               "scalar scale"
    if zero is not None:
        zero_point = constant(zero)
        if zero_point is None:
            return "its zero point is not a constant"
        if np.any(zero_point.astype(np.float64) != 0):
            return f"its zero point is {zero_point.astype(np.float64).ravel()[0]:g}, not 0"
    output = quantize.outputs[0].dtype
    if output is None:  # not inferred: the zero point's type, else output_dtype, else UINT8
        output = zero.dtype if zero is not None and zero.dtype is not None else ir.DataType(
            quantize.attributes.get_int("output_dtype", 0) or ir.DataType.UINT8)
    if output != ir.DataType.FLOAT8E4M3FN:
        return f"it quantizes to {output.name}; the plugin writes FLOAT8E4M3FN only"
    if quantize.attributes.get_int("saturate", 1) != 1:
        return "it has saturate=0 (out-of-range values become NaN); the plugin saturates at 448"
    try:
        fused.validate_y_scale(float(scale.ravel()[0]))
    except ValueError:
        return f"its scale {float(scale.ravel()[0]):g} is not finite and >= 2^-126, as the " \
               "plugin requires"
    return None


def fold_quantizes(found: dict):
    """Make each plugin node whose Y only a FLOAT8E4M3FN QuantizeLinear reads the FP8 form;
    record why not where a QuantizeLinear reads Y but stays."""
    for k, (record, node) in enumerate(zip(found["replaced"], found["nodes"])):
        quantize, cast = quantize_after(node)
        if quantize is None:
            continue
        name = node_name(quantize)
        why = why_not_folded(quantize.inputs[0], quantize)
        if why:
            found["left"][name] = f"a QuantizeLinear after {record.name}, not folded: {why}"
            continue
        y_scale = fused.validate_y_scale(float(constant(quantize.inputs[1]).ravel()[0]))
        attributes = {key: attribute.value for key, attribute in node.attributes.items()}
        folded = ir.node(lesson.PLUGIN_NAME, list(node.inputs),
                         {**attributes, QUANTIZE_ATTRIBUTE: 1, Y_SCALE_ATTRIBUTE: y_scale},
                         num_outputs=len(node.outputs), name=node.name)
        old = [quantize.outputs[0], *node.outputs[1:]]  # Y takes the Quantize's output and name
        parameters, graph = quantize.inputs[1:], node.graph
        gone = [node, quantize, *filter(None, [cast])]
        ir.convenience.replace_nodes_and_values(graph, node, gone, [folded], old,
                                                list(folded.outputs))
        for value in parameters:  # the Quantize's scale and zero point, unless read elsewhere
            if value is not None and value.is_initializer() and not value.uses() \
                    and not value.is_graph_output():
                graph.initializers.pop(value.name)
        found["nodes"][k] = folded
        found["replaced"][k] = dataclasses.replace(  # an appended Cast went with the Quantize
            record, y=folded.outputs[0].name, y_scale=y_scale, quantized=name,
            cast="" if record.cast == "appended" else record.cast)


def rewrite_model(model: ir.Model):
    """Rewrite `model` in place; return ([Replaced], {name of an RMSNorm, or of a QuantizeLinear
    after one that stays, left to TensorRT: why}).

    TensorRT's ONNX parser builds a node whose op type it does not know from
    the plugin registry: the creator named like the op, its version and
    namespace from the node's plugin_version / plugin_namespace attributes,
    every other attribute handed to create_plugin as a PluginField.
    """
    found = {"replaced": [], "nodes": [], "left": {}, "matched": set()}
    for cast_back in (True, False):
        forms = FORMS + (SKIP_FORMS if not cast_back else ())
        rules = [PluginRule(form, cast_back, found) for form in forms]
        pattern.RewriteRuleSet([pattern.RewriteRule(r.pattern, r.rewrite, r.check, name=r.name)
                                for r in rules], commute=True).apply_to_model(model)
    fuse_residual_adds(found)
    fold_quantizes(found)
    # What no form matched but still looks like an RMSNorm: an op of that kind, or a mean of
    # squares, in the graph, its subgraphs and the model's functions (which apply_to_model rewrites
    # too).
    graphs = (model.graph, *model.functions.values())
    for node in (n for g in graphs for n in ir.traversal.RecursiveGraphIterator(g)):
        square = None
        if node.op_type == "ReduceMean" and node.inputs:
            square = node.inputs[0].producer()
        is_square = square is not None and (
            square.op_type == "Pow" and constant(square.inputs[1]) == 2
            or square.op_type == "Mul" and square.inputs[0] is square.inputs[1])
        name = node_name(node)
        seen = found["left"].keys() | found["matched"]
        if (node.op_type in NORM_OPS or is_square) and name not in seen:
            found["left"][name] = (f"a {node.op_type} that matches no form served (or a value "
                                   "inside it is also used elsewhere)")
    return found["replaced"], found["left"]


# %% [3] The report, and the rewritten model for your own pipeline ---------------


def print_report(replaced: list, left: dict):
    """What the plugin took, fused with its Add or alone and why, and what it left to TensorRT and
    why: one line each."""
    groups = (("Fused with their residual Add into", [r for r in replaced if r.fused]),
              ("Replaced alone by", [r for r in replaced if not r.fused]))
    for heading, nodes in groups:
        print(f"{heading} {lesson.PLUGIN_NAME} ({len(nodes)}):")
        for node in nodes:
            cast = {"absorbed": ", absorbing the Cast back",  # (a folded node has no appended Cast)
                    "appended": ", Y cast to the scale's dtype"}.get(node.cast, "")
            fp8 = f", Y FP8 E4M3 by folding {node.quantized} (y_scale {node.y_scale:g})" \
                if node.quantized else ""
            print(f"  {node.name}: {node.form}, X {node.dtype}, scale {node.scale_dtype}, epsilon "
                  f"{node.epsilon:g}{cast}{fp8}; {node.fused or 'alone: ' + node.alone}")
    print(f"Left to TensorRT ({len(left)}):")
    for name, why in left.items():
        print(f"  {name}: {why}")


def save_model(model: ir.Model, path: str):
    """Write `model` to `path` through a temporary file beside it; external weights stay where
    they are.

    The rewritten graph refers to the same external data files by relative
    path, so it is written into their directory; nothing a user saved is left
    half-written if the write fails.
    """
    folder = os.path.dirname(os.path.abspath(path))
    elsewhere = external_data_dirs(model) - {folder}
    if elsewhere:
        raise lesson.UsageError(f"-o '{path}' must be in '{sorted(elsewhere)[0]}', beside the "
                                "model's external data, which the rewritten model refers to")
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.partial")
    try:
        ir.save(model, temporary)
        os.replace(temporary, path)
    except OSError as exc:
        raise lesson.UsageError(f"cannot write -o '{path}' ({exc.strerror})") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)


# %% [4] The profile: every dynamic dimension, from the flags ---------------------
#
# Shapes named per input (trtexec's spelling) fix their dimensions, and any
# input sharing a dimension's name; what is left may be one dynamic dimension,
# which the token flags set.


def model_inputs(model: ir.Model) -> list:
    """The graph inputs a caller feeds (old models also list their initializers as inputs)."""
    return [v for v in model.graph.inputs if v.name not in model.graph.initializers]


def input_profile(model: ir.Model, args) -> dict:
    """{input name: (min, opt, max) shapes}; UsageError naming a dimension the flags cannot
    describe."""
    named = {p: getattr(args, f"{p}_shapes") or {} for p in ("min", "opt", "max")}
    inputs = {v.name: v for v in model_inputs(model)}
    unknown = sorted(set(named["min"]) - set(inputs))
    if unknown:
        raise lesson.UsageError(f"the model has no input '{unknown[0]}' (its inputs: "
                                f"{', '.join(inputs)})")
    sizes = {}  # dimension name -> (min, opt, max), from the named inputs
    for name in named["min"]:
        dims = list(inputs[name].shape or [])
        given = [named[p][name] for p in ("min", "opt", "max")]
        if any(len(shape) != len(dims) for shape in given):
            raise lesson.UsageError(f"input '{name}' has rank {len(dims)}, but the shapes given "
                                    "for it are "
                                    + ", ".join("x".join(map(str, s)) for s in given))
        for axis, dim in enumerate(dims):
            values = tuple(shape[axis] for shape in given)
            if isinstance(dim, int) and values != (dim,) * 3:
                raise lesson.UsageError(f"input '{name}' dimension {axis} is {dim}, not {values}")
            if not values[0] <= values[1] <= values[2]:
                raise lesson.UsageError(f"input '{name}' dimension {axis} needs min <= opt <= "
                                        f"max, got {values}")
            key = dim.value if not isinstance(dim, int) and dim.value else f"{name}[{axis}]"
            if sizes.setdefault(key, values) != values:
                raise lesson.UsageError(f"dimension '{key}' is {sizes[key]} in one input and "
                                        f"{values} in '{name}'")
    tokens, token_dimension, profile = (args.min_tokens, args.opt_tokens, args.max_tokens), None, {}
    for name, value in inputs.items():
        if value.shape is None or value.dtype is None:
            raise lesson.UsageError(f"model input '{name}' needs a known shape and dtype")
        dims = []
        for axis, dim in enumerate(value.shape):
            key = dim if isinstance(dim, int) else dim.value or f"{name}[{axis}]"
            if not isinstance(key, int) and key not in sizes:
                if token_dimension is not None:
                    raise lesson.UsageError(
                        f"input '{name}' dimension '{key}' is a second dynamic dimension besides "
                        f"'{token_dimension}', and --min/--opt/--max-tokens set one; give the "
                        "inputs' shapes with --min-shapes, --opt-shapes and --max-shapes")
                token_dimension, sizes[key] = key, tokens
            dims.append((key,) * 3 if isinstance(key, int) else sizes[key])
        profile[name] = tuple(tuple(d[k] for d in dims) for k in range(3))
    return profile


# %% [5] Inputs a model accepts ----------------------------------------------------
#
# Random normal values drive activations and caches, not token ids: an integer
# input that indexes an embedding (a Gather's indices) gets ids below the
# table's row count, a mask ones, positions 0, 1, 2, ... along the last axis.


INTEGER_DTYPES = {ir.DataType.INT64: torch.int64, ir.DataType.INT32: torch.int32,
                  ir.DataType.BOOL: torch.bool}


def input_values(model: ir.Model, shapes: dict, seed: int) -> dict:
    """{input name: torch CPU tensor} for one shape of each input, deterministic in `seed`."""
    gen = torch.Generator().manual_seed(seed)
    values = {}
    for value in model_inputs(model):
        name, shape = value.name, shapes[value.name]
        if value.dtype in DTYPE_NAMES:
            dtype = getattr(torch, lesson.DTYPES[DTYPE_NAMES[value.dtype]].torch)
            values[name] = torch.randn(shape, generator=gen).to(dtype)
            continue
        if value.dtype not in INTEGER_DTYPES:
            raise lesson.UsageError(f"model input '{name}' is {value.dtype}; the comparison "
                                    "feeds float16, bfloat16, float32 and integer inputs")
        dtype = INTEGER_DTYPES[value.dtype]
        tables = [user.inputs[0].shape for user, index in value.uses()
                  if user.op_type == "Gather" and index == 1]
        if "mask" in name.lower():
            values[name] = torch.ones(shape, dtype=dtype)
        elif "position" in name.lower():
            if shape:
                values[name] = torch.arange(shape[-1], dtype=dtype).expand(shape).contiguous()
            else:
                values[name] = torch.zeros((), dtype=dtype)
        elif tables and tables[0] is not None and isinstance(tables[0][0], int):
            values[name] = torch.randint(0, tables[0][0], shape, generator=gen).to(dtype)
        else:
            raise lesson.UsageError(f"model input '{name}' is {value.dtype} but neither token ids "
                                    "(a Gather's indices), a mask nor positions, so the comparison "
                                    "cannot choose its values")
    return values


# %% [6] Both engines, from the files -----------------------------------------------
#
# TensorRT's parser reads each model by path, so external data is read by
# TensorRT from beside the file. Both engines also return every replaced
# node's inputs and output, where the check looks.


@contextlib.contextmanager
def beside_its_data(model: ir.Model):
    """A temporary path for `model`, in a directory that links its external data files."""
    with tempfile.TemporaryDirectory(prefix="rmsnorm-") as folder:
        for value in model.graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                link = os.path.join(folder, tensor.location)
                if not os.path.lexists(link):
                    os.makedirs(os.path.dirname(link), exist_ok=True)
                    target = os.path.join(os.path.abspath(tensor.base_dir), tensor.location)
                    os.symlink(target, link)
        path = os.path.join(folder, "model_rmsnorm.onnx")
        ir.save(model, path)
        yield path


def build_engine(path: str, watched: list, profile: dict):
    """Parse the model at `path`, also mark `watched` as outputs, and build it for `profile`."""
    from polygraphy.backend.trt import modify_network_outputs, network_from_onnx_path

    fused.register_creator()  # the parser looks an op type it does not know up in the registry
    with lesson.tensorrt_stage("ONNX parse"):
        builder, network, parser = network_from_onnx_path(path, strongly_typed=True)
        outputs = [network.get_output(i).name for i in range(network.num_outputs)]
        network = modify_network_outputs((builder, network, parser),
                                         outputs=list(dict.fromkeys(outputs + watched)))
    return lesson.build_from_network(network, profile)


# %% [7] Run and compare --------------------------------------------------------
#
# ONNX's RMSNormalization (stash_type=1, what exporters write) rounds twice:
# x/rms to X's dtype, then its product with the scale, in the scale's dtype;
# the decomposed chains round the same way or less. The plugin rounds once, to
# X's dtype. One rounding to a dtype with p fraction bits errs by at most
# u = 2^-(p+1) relative, and the errors compound: each side is within
# prod(1 + u) - 1 of exact RMSNorm over its roundings, and the two engines
# within the sum of both. For X and scale of one dtype that is 3u + u^2: one
# ulp of Y at some elements, by definition. FP32_NOISE covers the FP32
# arithmetic before the roundings (a tree sum of up to 32768 squares and a
# square root: about 20 FP32 roundings, 2^-19.7). In the subnormal range each
# rounding errs by half the subnormal spacing instead, times |scale| at most.
#
# A fused node's S is its X + R rounded once to X's dtype, as the Add it
# replaces rounds, so where the original has that tensor too, each engine's Y
# is held to exact RMSNorm of its own S, and S to the exact sum: each add errs
# by at most u of a partial sum, which the sum of the parts' magnitudes
# bounds. onnxruntime's skip op normalizes its sum before rounding it, 2u more
# on that side. A skip op that does not write its sum leaves no S to read:
# its Y is held to exact RMSNorm of the parts' exact sum, each add moving Y by
# up to 2u on either side.

FP32_NOISE = 2.0 ** -18
# TensorRT's name of a dtype -> torch's.
TORCH_DTYPES = {**{names.trt: getattr(torch, names.torch) for names in lesson.DTYPES.values()},
                "INT32": torch.int32, "INT64": torch.int64, "BOOL": torch.bool}


def rounding_error(dtype: str) -> float:
    """u: the largest relative error of one rounding to `dtype`, 2^-(fraction bits + 1)."""
    return torch.finfo(getattr(torch, lesson.DTYPES[dtype].torch)).eps / 2


def roundings(node: Replaced):
    """(the plugin's, TensorRT's import's): the dtype of every rounding from X (each engine's S
    where the node names one, else the exact sum of node.x) to the compared Y, or for a folded
    node to the y that the FP8 rounding then takes."""
    ours = [node.dtype] + ([node.scale_dtype] if node.cast == "appended" else [])
    theirs = ([node.dtype] + ([node.scale_dtype] if node.scale_dtype != node.dtype else [])
              + [node.scale_dtype] + ([node.dtype] if node.cast == "absorbed" else []))
    if node.quantized:  # before the FP8 rounding: the plugin's y is FP32, the Quantize divides y
        ours, theirs = [], theirs + theirs[-1:]  # in its input's dtype
    if not node.sum:
        adds = [node.dtype] * 2 * (len(node.x) - 1)  # each add's rounding moves Y by up to 2u
        ours, theirs = ours + adds, theirs + adds
    elif node.form in {form.__name__ for form in SKIP_FORMS}:
        theirs += [node.dtype] * 2  # onnxruntime's op normalizes its sum before rounding it
    return ours, theirs


def onnx_tolerance(dtypes) -> float:
    """Relative bound of a computation rounding to each of `dtypes` in turn, against exact
    RMSNorm."""
    return math.prod(1 + rounding_error(d) for d in dtypes) - 1 + FP32_NOISE


def side_tolerance(dtypes, magnitude, scale):
    """Largest |one side - exact RMSNorm| where that is `magnitude`, rounding to `dtypes`."""
    spacings = [torch.finfo(getattr(torch, lesson.DTYPES[d].torch)) for d in dtypes]
    subnormal = sum(f.tiny * f.eps / 2 for f in spacings)
    return onnx_tolerance(dtypes) * magnitude + subnormal * (1 + np.abs(scale))


def engines_tolerance(node: Replaced, magnitude, scale):
    """Largest |plugin - TensorRT's import| at `node`'s output where exact RMSNorm is
    `magnitude`."""
    ours, theirs = roundings(node)
    return side_tolerance(ours, magnitude, scale) + side_tolerance(theirs, magnitude, scale)


def bind_inputs(engine, context, feeds: dict):
    """Set each of `feeds` on `context`, its shape and address, once it has the dtype the engine
    reads: TensorRT reads the bytes there as that dtype (int64 ones read as int32: 1, 0, 1, 0)."""
    for name, value in feeds.items():
        wanted = engine.get_tensor_dtype(name).name
        if value.dtype != TORCH_DTYPES.get(wanted):
            raise TypeError(f"input '{name}' is {value.dtype}, but the engine reads it as {wanted}")
        context.set_input_shape(name, tuple(value.shape))
        context.set_tensor_address(name, value.data_ptr())


def bind(engine, feeds: dict):
    """(execution context, {output name: torch CUDA tensor}) with `feeds` and fresh outputs
    bound."""
    context = engine.create_execution_context()
    bind_inputs(engine, context, feeds)
    outputs = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if engine.get_tensor_mode(name) == lesson.trt.TensorIOMode.OUTPUT:
            dtype = TORCH_DTYPES.get(trt_dtype := engine.get_tensor_dtype(name).name)
            if dtype is None:
                raise lesson.UsageError(f"model output '{name}' is {trt_dtype}; the comparison "
                                        f"reads outputs of {', '.join(TORCH_DTYPES)}")
            shape = tuple(context.get_tensor_shape(name))
            outputs[name] = torch.zeros(shape, dtype=dtype, device="cuda")
            # An element the engine leaves unwritten fails the check.
            if dtype.itemsize == 1 and dtype.is_floating_point:
                outputs[name].view(torch.uint8).fill_(0x7F)  # E4M3FN's NaN
            elif dtype.is_floating_point:
                outputs[name].fill_(float("nan"))
            context.set_tensor_address(name, outputs[name].data_ptr())
    return context, outputs


def run_engine(engine, feeds: dict) -> dict:
    """{output name: float64 array} of one run on these torch CUDA tensors."""
    context, outputs = bind(engine, feeds)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()  # the inputs were written on torch's stream
    if not context.execute_async_v3(stream.cuda_stream):
        raise lesson.TensorRTError("TensorRT could not run the engine; its log above says why")
    stream.synchronize()
    return {name: value.double().cpu().numpy() for name, value in outputs.items()}


def value_of(run: dict, values: dict, name: str):
    """A graph input or initializer from `values`, else what the engine returned for it."""
    return values[name] if name in values else run[name]


def check_replaced(ours: dict, theirs: dict, values: dict, node: Replaced):
    """(within tolerance, max |ours - theirs|) at one replaced node's output.

    The two engines may feed the node different X (a difference carried from
    earlier replaced nodes), so the bound adds what exact RMSNorm makes of
    that input difference, computed here in float64. A folded node's Y is FP8
    in both engines (the plugin's, and the original QuantizeLinear's): there
    the bound is what the FP8 rounding makes of both engines' reach.
    """
    def x(run):  # the engine's own S where the node names one, else the exact sum of the parts
        if node.sum:
            return value_of(run, values, node.sum)
        return sum(value_of(run, values, part) for part in node.x)

    scale = value_of(theirs, values, node.scale)
    exact_ours, exact_theirs = (lesson.rms_norm_reference(x(run), scale, node.epsilon)
                                for run in (ours, theirs))
    a, b = ours[node.y], theirs[node.y]
    if node.quantized:
        # Both are FP8 roundings of y / y_scale, and rounding keeps order: each engine's y lies
        # within its roundings' reach of its exact RMSNorm, so both FP8 values lie between the
        # roundings of the lowest and highest y either may hold: equal, or a step apart there.
        sides = [(exact, side_tolerance(dtypes, np.abs(exact), scale))
                 for exact, dtypes in zip((exact_ours, exact_theirs), roundings(node))]
        low = np.minimum(*(exact - reach for exact, reach in sides))
        high = np.maximum(*(exact + reach for exact, reach in sides))
        bound = fused.quantize_reference(high, node.y_scale) \
            - fused.quantize_reference(low, node.y_scale)
    else:
        bound = np.abs(exact_ours - exact_theirs) + engines_tolerance(
            node, np.maximum(np.abs(exact_ours), np.abs(exact_theirs)), scale)
    ok = bool(np.all(np.isfinite(a)) and np.all(np.abs(a - b) <= bound))
    return ok, float(np.max(np.abs(a - b), initial=0.0))


def check_sum(ours: dict, theirs: dict, values: dict, node: Replaced):
    """(within tolerance, max |ours - theirs|) at a fused node's S: the engines' exact sums of
    node.x differ by what earlier nodes carried, and each add errs by u of the parts' sizes."""
    parts = [[value_of(run, values, name) for name in node.x] for run in (ours, theirs)]
    adds = [node.dtype] * (len(node.x) - 1)
    spacing = torch.finfo(getattr(torch, lesson.DTYPES[node.dtype].torch))
    subnormal = len(adds) * spacing.tiny * spacing.eps / 2  # half the subnormal spacing per add
    bound = np.abs(sum(parts[0]) - sum(parts[1])) + sum(
        onnx_tolerance(adds) * sum(np.abs(part) for part in side) + subnormal for side in parts)
    a, b = ours[node.sum], theirs[node.sum]
    ok = bool(np.all(np.isfinite(a)) and np.all(np.abs(a - b) <= bound))
    return ok, float(np.max(np.abs(a - b), initial=0.0))


# %% [8] Time both engines --------------------------------------------------------
#
# CUDA events around many execute_async_v3 calls on one stream measure what an
# application sees per call, which for a Python plugin includes the Python
# enqueue on the host.


def time_engine(engine, feeds: dict, iterations: int = 200) -> float:
    """Microseconds per execute_async_v3 call on these inputs, after 20 calls of warm-up."""
    context, _ = bind(engine, feeds)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for calls in (20, iterations):  # the first round warms up, the second is timed
        start.record(stream)
        for _ in range(calls):
            context.execute_async_v3(stream.cuda_stream)
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iterations


def verdict(ratios: list) -> str:
    """Which engine to deploy, from plugin / TensorRT time ratios at the profile's shapes."""
    if all(r < 1 for r in ratios):
        return "deploy the plugin: it is faster at every profiled shape"
    if all(r > 1 for r in ratios):
        return "deploy TensorRT's own import: it is faster at every profiled shape"
    return "mixed: the plugin wins only at some shapes; measure at your real shapes"


# %% [9] Command line: report, write, build both, compare, time ----------------------


def one_node_model(args) -> ir.Model:
    """ONNX's RMSNormalization over X [num_tokens, hidden], scale an initializer; a Cast back to
    X's dtype where the scale's differs (ONNX gives Y the scale's dtype), so that the plugin
    absorbs it."""
    dtype, w_dtype = (ir.DataType[lesson.DTYPES[d].onnx] for d in (args.dtype, args.weight_dtype))
    _, weights = lesson.make_inputs(1, args.hidden_dim, args.dtype, args.seed, args.weight_dtype)
    x = ir.Value(name="X", type=ir.TensorType(dtype),
                 shape=ir.Shape(["num_tokens", args.hidden_dim]))
    scale = ir.Value(name="W", type=ir.TensorType(w_dtype), shape=ir.Shape([args.hidden_dim]),
                     const_value=ir.tensor(weights, dtype=w_dtype, name="W"))
    attributes = {"axis": -1, "epsilon": float(args.epsilon), "stash_type": 1}
    norm = ir.node("RMSNormalization", [x, scale], attributes, name="rms_norm")
    nodes, y = [norm], norm.outputs[0]
    y.name, y.dtype, y.shape = "Y", w_dtype, x.shape
    if w_dtype != dtype:
        y.name = "Y_scaled"
        nodes.append(ir.node("Cast", [y], {"to": dtype}, name="to_x_dtype"))
        y = nodes[-1].outputs[0]
        y.name, y.dtype, y.shape = "Y", dtype, x.shape
    graph = ir.Graph([x], [y], nodes=nodes, initializers=[scale], opset_imports={"": 23},
                     name="rms_norm")
    return ir.Model(graph, ir_version=11)


def compare(model_path: str, rewritten: ir.Model, original: ir.Model, replaced: list,
            profile: dict, seed: int):
    """Build both, run both at the profile's min, opt and max, check every replaced node, time
    both."""
    try:  # first, so that an input it cannot feed is refused before any build
        inputs = [input_values(original, {name: shapes[k] for name, shapes in profile.items()},
                               (seed + k) % 2**64)
                  for k in range(3)]
    except (MemoryError, RuntimeError) as exc:  # torch's allocation failure is a RuntimeError
        raise lesson.UsageError(f"the model's inputs at the profile's shapes do not fit in host "
                                f"memory ({' '.join(str(exc).split())[:120]})") from None
    lesson.check_environment()
    watched = list(dict.fromkeys(
        t for node in replaced for t in (*node.x, node.scale, node.y, node.sum)
        if t and t not in original.graph.initializers and t not in profile))
    with beside_its_data(rewritten) as path:
        engines = [build_engine(path, watched, profile), build_engine(model_path, watched, profile)]
    weights = {name: original.graph.initializers[name].const_value.numpy().astype(np.float64)
               for node in replaced for name in (node.scale, *node.x)
               if name in original.graph.initializers}
    correct, ratios = True, []
    for point, host in zip(("min", "opt", "max"), inputs):
        feeds = {name: value.cuda() for name, value in host.items()}
        with lesson.tensorrt_stage("execution context"):
            ours, theirs = (run_engine(engine, feeds) for engine in engines)
            times = [time_engine(engine, feeds) for engine in engines]
        values = {**weights, **{name: v.double().numpy() for name, v in host.items()}}
        print(f"  {point}: {', '.join(f'{n} {tuple(v.shape)}' for n, v in feeds.items())}")
        for name in (v.name for v in original.graph.outputs):
            diff = np.max(np.abs(ours[name] - theirs[name]))
            print(f"    output {name}: max |plugin - TensorRT| = {diff:.3e}")
        for node in replaced:
            checks = [(node.y, check_replaced)] + ([(node.sum, check_sum)] if node.sum else [])
            for tensor_name, check in checks:  # Y, and a fused node's S
                ok, diff = check(ours, theirs, values, node)
                print(f"    {node.name} ({tensor_name}): max |plugin - TensorRT| = {diff:.3e}  "
                      f"{'ok' if ok else 'MISMATCH'}")
                correct &= ok
        ratios.append(times[0] / times[1])
        print(f"    time per call: plugin {times[0]:8.2f} us   TensorRT's import "
              f"{times[1]:8.2f} us   plugin / TensorRT {ratios[-1]:.2f}")
    print(f"For these shapes: {verdict(ratios)}.")
    return correct


def check_flag_values(args):
    """UsageError unless each flag this script shares with the lesson is in the lesson's range."""
    for flag, _, lowest, highest, _ in lesson.INT_FLAGS:
        # --num-tokens is the lesson's alone.
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None and not lowest <= value <= highest:
            raise lesson.UsageError(f"{flag} must be in [{lowest}, {highest}], got {value}")
    if args.epsilon is not None:
        try:
            lesson.validate_epsilon(args.epsilon)
        except ValueError:
            raise lesson.UsageError("--epsilon must be finite and > 0 in float32, got "
                                    f"{args.epsilon}") from None


def main(args) -> int:
    """Exit code 0 every replaced node matched, 1 one did not, 2 usage, environment or TensorRT
    error."""
    try:
        check_flag_values(args)
        with tempfile.TemporaryDirectory(prefix="rmsnorm-") as folder:
            path = args.model
            if path is None:
                path = os.path.join(folder, "rms_norm.onnx")
                ir.save(one_node_model(args), path)
            rewritten, original = load_model(path), load_model(path)
            replaced, left = rewrite_model(rewritten)
            print_report(replaced, left)
            if args.output:
                save_model(rewritten, args.output)
                print(f"Wrote the rewritten model to {args.output}")
            if args.report_only:
                return lesson.EXIT_CORRECT
            if not replaced:
                raise lesson.UsageError(f"the plugin replaces no RMSNorm of '{path}', so nothing "
                                        "would be compared")
            profile = input_profile(original, args)
            correct = compare(path, rewritten, original, replaced, profile, args.seed)
    except (lesson.UsageError, lesson.TensorRTError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return lesson.EXIT_USAGE
    print("Inference result correct!" if correct else "Inference result incorrect!")
    return lesson.EXIT_CORRECT if correct else lesson.EXIT_INCORRECT


if __name__ == "__main__":
    sys.exit(main(ARGS))
