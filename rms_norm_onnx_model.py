# SPDX-License-Identifier: Apache-2.0
"""Putting RmsNormPlugin into your own ONNX model, and checking it against TensorRT's own import.

``python3 rms_norm_plugin_cutedsl.py --from-onnx MODEL.onnx`` runs this file's
``check_model``: it loads the model, replaces every ``RMSNormalization`` node
the plugin can serve by an ``RmsNormPlugin`` node with the same inputs, outputs
and epsilon (``rewrite_model``), builds the rewritten model and the original,
runs both on the same random inputs at the profile's min, opt and max, and
checks every replaced node.

It is a companion of the sample rather than a section of it: the sample
teaches the plugin, this file the graph surgery and the comparison harness
around it, a second program the tutorial need not carry. The sample imports
it only when a model path is given.

Why plain ``onnx``: the rewrite swaps a node's op type and attributes and keeps
its inputs and outputs, which ``onnx.helper.make_node`` does in one call;
onnx-graphsurgeon would add a dependency for no step this needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

import rms_norm_plugin_cutedsl as sample

# ONNX element type -> the sample's dtype name, for the dtypes TensorRT and torch share here.
ONNX_DTYPES = {getattr(onnx.TensorProto, names.onnx): name for name, names in sample.DTYPES.items()}


@dataclass(frozen=True)
class Replaced:
    """One RMSNormalization node now served by the plugin: its tensors and epsilon."""

    name: str
    x: str
    scale: str
    y: str
    epsilon: float
    dtype: str


def load_model(path: str) -> onnx.ModelProto:
    """The model at `path` with its tensors' types and shapes inferred; UsageError if it is not ONNX."""
    try:
        model = onnx.load(path)
        onnx.checker.check_model(model)  # bytes that happen to parse as a protobuf are not a model
    except Exception as exc:  # protobuf's DecodeError, the checker's ValidationError, OSError, ...
        detail = " ".join(str(exc).split())[:200]
        raise sample.UsageError(f"--from-onnx '{path}' is not a valid ONNX model ({detail})") from None
    return onnx.shape_inference.infer_shapes(model)


def tensor_types(model: onnx.ModelProto) -> dict:
    """{tensor name: (ONNX element type, shape)} for every typed tensor; a dynamic dimension is None."""
    infos = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    types = {i.name: (i.type.tensor_type.elem_type,
                      [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
                      if i.type.tensor_type.HasField("shape") else None) for i in infos}
    types.update({t.name: (t.data_type, list(t.dims)) for t in model.graph.initializer})
    return types


def why_not_served(node: onnx.NodeProto, types: dict) -> str | None:
    """None if the plugin computes exactly what this RMSNormalization node asks for, else why not."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x_type, x_shape = types.get(node.input[0], (None, None))
    scale_type, scale_shape = types.get(node.input[1], (None, None)) if len(node.input) > 1 else (None, None)
    if x_shape is None or len(x_shape) < 2:
        return "X needs a known rank of 2 or more"
    axis = attrs.get("axis", -1)
    if axis not in (-1, len(x_shape) - 1):
        return f"it normalizes from axis {axis}; the plugin normalizes over the last axis only"
    if attrs.get("stash_type", 1) != 1:
        return "stash_type is not 1 (FP32); the plugin computes in FP32"
    if x_shape[-1] is None:
        return "the last dimension of X is dynamic; the plugin compiles it into the kernel"
    if not 1 <= x_shape[-1] <= sample.MAX_HIDDEN:
        return f"the last dimension of X is {x_shape[-1]}, outside [1, {sample.MAX_HIDDEN}]"
    if scale_shape != [x_shape[-1]]:
        return f"scale must be 1-D of length {x_shape[-1]}, got shape {scale_shape}"
    if scale_type != x_type or ONNX_DTYPES.get(x_type) not in served_dtypes():
        # ONNX gives Y the scale's type, the plugin X's: the two must be the same dtype.
        names = [ONNX_DTYPES.get(t, onnx.TensorProto.DataType.Name(t)) for t in (x_type, scale_type)]
        return f"X is {names[0]} and scale {names[1]}; the plugin serves X and scale of one dtype of {served_dtypes()}"
    return None


def served_dtypes() -> list:
    """The dtypes the plugin takes for X, W and Y all at once."""
    return [d for d in sample.ACTIVATION_DTYPES if d in sample.WEIGHT_DTYPES]


def rewrite_model(model: onnx.ModelProto):
    """(rewritten model, [Replaced], {name of a node left to TensorRT: why}).

    TensorRT's ONNX parser builds a node whose op type it does not know from
    the plugin registry: the creator named like the op, its version and
    namespace from the node's plugin_version / plugin_namespace attributes,
    every other attribute handed to create_plugin as a PluginField.
    """
    types = tensor_types(model)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    replaced, left = [], {}
    for i, node in enumerate(model.graph.node):
        if node.op_type != "RMSNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        reason = why_not_served(node, types)
        if reason:
            left[node.name or f"node {i}"] = reason
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        epsilon = float(attrs.get("epsilon", 1e-5))  # ONNX's default
        rewritten.graph.node[i].CopyFrom(helper.make_node(
            sample.PLUGIN_NAME, list(node.input), list(node.output), name=node.name, epsilon=epsilon,
            plugin_version=sample.PLUGIN_VERSION, plugin_namespace=sample.PLUGIN_NAMESPACE))
        replaced.append(Replaced(node.name or f"node {i}", node.input[0], node.input[1], node.output[0], epsilon,
                                 ONNX_DTYPES[types[node.input[0]][0]]))
    return rewritten, replaced, left


def input_shapes(model: onnx.ModelProto, min_tokens: int, opt_tokens: int, max_tokens: int) -> dict:
    """{graph input: (min, opt, max) shapes}: the one dynamic dimension takes the token flags.

    Raises UsageError for a model the flags cannot describe: an input of unknown
    rank or of a dtype other than fp16/bf16/fp32, or more than one dynamic
    dimension (two inputs sharing one dimension name count once).
    """
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    dynamic, shapes = set(), {}
    for graph_input in inputs:
        tensor = graph_input.type.tensor_type
        if tensor.elem_type not in ONNX_DTYPES or not tensor.HasField("shape"):
            raise sample.UsageError(f"model input '{graph_input.name}' needs a known shape and a dtype of "
                                    f"{list(sample.DTYPES)} for random inputs")
        dims = []
        for axis, dim in enumerate(tensor.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                dims.append(dim.dim_value)
            else:
                dynamic.add(dim.dim_param or f"{graph_input.name}[{axis}]")
                dims.append(None)
        shapes[graph_input.name] = dims
    if len(dynamic) > 1:
        raise sample.UsageError(f"the model has {len(dynamic)} dynamic dimensions ({', '.join(sorted(dynamic))}); "
                                "--min/--opt/--max-tokens describe one")
    return {name: tuple(tuple(n if d is None else d for d in dims) for n in (min_tokens, opt_tokens, max_tokens))
            for name, dims in shapes.items()}


def with_outputs(model: onnx.ModelProto, names) -> bytes:
    """The model serialized with `names` added to its outputs, so that both engines return those tensors."""
    types = tensor_types(model)
    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    present = {o.name for o in model.graph.output}
    for name in dict.fromkeys(names):
        if name not in present:
            elem, shape = types[name]
            marked.graph.output.append(helper.make_tensor_value_info(name, elem, shape and [
                d if d is not None else f"{name}_{k}" for k, d in enumerate(shape)]))
    return marked.SerializeToString()


def run_engine(engine, feeds: dict) -> dict:
    """{output name: float64 array} of one run on these torch CUDA tensors (no Polygraphy runner, as in run_and_check)."""
    trt = sample.trt
    context = engine.create_execution_context()
    for name, value in feeds.items():
        context.set_input_shape(name, tuple(value.shape))
        context.set_tensor_address(name, value.data_ptr())
    by_trt = {getattr(trt.DataType, names.trt): getattr(torch, names.torch) for names in sample.DTYPES.values()}
    outputs = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if engine.get_tensor_mode(name) == trt.TensorIOMode.OUTPUT:
            outputs[name] = torch.full(tuple(context.get_tensor_shape(name)), float("nan"),
                                       dtype=by_trt[engine.get_tensor_dtype(name)], device="cuda")
            context.set_tensor_address(name, outputs[name].data_ptr())
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()  # the inputs were written on torch's stream
    if not context.execute_async_v3(stream.cuda_stream):
        raise sample.TensorRTError("TensorRT could not run the engine; its log above says why")
    stream.synchronize()
    return {name: value.double().cpu().numpy() for name, value in outputs.items()}


def check_replaced(ours: dict, theirs: dict, values: dict, node: Replaced):
    """(within tolerance, max |ours - theirs|) at one replaced node's output.

    The two engines may feed the node different X (a difference carried from
    earlier replaced nodes), so the bound adds what exact RMSNorm makes of
    that input difference, computed here in float64, to the rounding bound of
    [7] in the sample (three roundings: the plugin's one, ONNX's two).
    """
    def tensor(run, name):  # a graph input or initializer, else what the engine returned for it
        return values[name] if name in values else run[name]

    scale = tensor(theirs, node.scale)
    exact_ours = sample.rms_norm_reference(tensor(ours, node.x), scale, node.epsilon)
    exact_theirs = sample.rms_norm_reference(tensor(theirs, node.x), scale, node.epsilon)
    a, b = ours[node.y], theirs[node.y]
    bound = (np.abs(exact_ours - exact_theirs)
             + sample.engines_tolerance(node.dtype, np.maximum(np.abs(exact_ours), np.abs(exact_theirs)), scale))
    ok = bool(np.all(np.isfinite(a)) and np.all(np.abs(a - b) <= bound))
    return ok, float(np.max(np.abs(a - b), initial=0.0))


def random_inputs(shapes: dict, model: onnx.ModelProto, seed: int) -> dict:
    """{input name: torch CUDA tensor} of standard normal values in each input's dtype."""
    gen = torch.Generator().manual_seed(seed)
    dtypes = {i.name: ONNX_DTYPES[i.type.tensor_type.elem_type] for i in model.graph.input}
    return {name: torch.randn(shape, generator=gen).to(getattr(torch, sample.DTYPES[dtypes[name]].torch)).cuda()
            for name, shape in shapes.items()}


def check_model(args) -> bool:
    """--from-onnx MODEL.onnx: rewrite, build both, run at min/opt/max; whether every replaced node matched."""
    model = load_model(args.from_onnx)
    rewritten, replaced, left = rewrite_model(model)
    if not replaced:
        reasons = "; ".join(f"{name}: {why}" for name, why in left.items()) or "it has no RMSNormalization node"
        raise sample.UsageError(f"the plugin replaces no node of '{args.from_onnx}', so nothing would be "
                                f"compared ({reasons})")
    profile = input_shapes(model, args.min_tokens, args.opt_tokens, args.max_tokens)
    sample.check_environment()
    print(f"Replaced by {sample.PLUGIN_NAME}: {', '.join(node.name for node in replaced)}")
    for name, why in left.items():
        print(f"Left to TensorRT: {name}: {why}")

    # Both engines also return every replaced node's input and output, where the check looks.
    initializers = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    watched = [t for node in replaced for t in (node.x, node.scale, node.y) if t not in initializers
               and t not in profile]
    sample.register_creator()
    engines = [sample.build_onnx_engine(with_outputs(m, watched), profile) for m in (rewritten, model)]
    graph_outputs = [o.name for o in model.graph.output]
    correct = True
    for k, point in enumerate(("min", "opt", "max")):
        feeds = random_inputs({name: shapes[k] for name, shapes in profile.items()}, model, args.seed + k)
        with sample.tensorrt_stage("execution context"):
            ours, theirs = (run_engine(engine, feeds) for engine in engines)
        values = {**initializers, **{name: v.double().cpu().numpy() for name, v in feeds.items()}}
        print(f"  {point}: {', '.join(f'{n} {tuple(v.shape)}' for n, v in feeds.items())}")
        for name in graph_outputs:
            print(f"    output {name}: max |plugin - TensorRT| = {np.max(np.abs(ours[name] - theirs[name])):.3e}")
        for node in replaced:
            ok, diff = check_replaced(ours, theirs, values, node)
            print(f"    {node.name} ({node.y}): max |plugin - TensorRT| = {diff:.3e}  {'ok' if ok else 'MISMATCH'}")
            correct &= ok
    return correct
