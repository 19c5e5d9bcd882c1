"""ONNX models for the companion's tests (rms_norm_onnx_model.py), made the way users make them.

Small decoders built by ``transformers`` from their configs (random weights,
nothing downloaded: hidden 64, two layers, a vocabulary of 128), exported
through the routes LLM users take:

* ``torch.onnx.export(dynamo=True)`` at opset 23: ONNX's RMSNormalization
  (Llama, X and scale fp16; Gemma, X fp16 and its ``1 + w`` folded into an fp32
  scale, followed by a Cast back to fp16), weights in external data;
* the same exporter at torch's default opset (20 in torch 2.13): the
  decomposed Cast, Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Cast, Mul chain
  (Qwen3, bf16, whose q/k norms run over the head dimension of rank-4 tensors;
  Mistral, fp32 without the Casts, its input_ids and attention_mask INT32);
* the TorchScript exporter (``dynamo=False``) at opset 17, as Optimum uses it:
  the chain with ``Div(1, Sqrt)`` and ReduceMean's axes as an attribute (Llama
  fp16, Gemma fp32, Phi-3 fp16, also after onnxruntime's symbolic shape
  inference), and at opset 18 without constant folding, where Gemma's ``1 + w``
  stays an Add (fp16, the Cast back to fp16 after an fp32 product);
* onnxruntime-genai's model builder (``-p fp16``), weights in external data:
  for its CUDA target SimplifiedLayerNormalization and com.microsoft
  SkipSimplifiedLayerNormalization, for its TensorRT-RTX target the chain with
  ``Div(1, Sqrt)``.

In each, the residual Add before a norm is what the rewrite fuses. Each model
is made once per test session (see test_onnx_model.py's fixtures). The
one-node models, written with onnx.helper, vary one attribute at a time;
plugin_functions lets onnxruntime run a rewritten model.
"""

import subprocess
import sys

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

HIDDEN = 64
VOCAB = 128
CONFIG = dict(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=32, vocab_size=VOCAB, max_position_embeddings=256,
              rms_norm_eps=1e-6)  # most families' default; Phi-3's is 1e-5


def decoder(family: str, dtype: str, seed: int = 0):
    """A transformers causal LM of `family` ("llama", "gemma", "qwen3", "mistral", "phi3") with
    random weights, in `dtype`."""
    import transformers

    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
    }[family]
    # Phi-3's default special tokens (32000) lie outside the small vocabulary, which they must not.
    tokens = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2) if family == "phi3" else {}
    torch.manual_seed(seed)
    model = model_class(config_class(**CONFIG, **tokens)).to(getattr(torch, dtype)).eval()
    with torch.no_grad():  # norm weights other than the initial ones, so that a dropped scale shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(-0.5, 1.5)
    return model


class LogitsOnly(torch.nn.Module):
    """(input_ids, attention_mask) -> logits, without a cache: what an exporter's user writes
    around the model."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return outputs.logits


def example_inputs(index_dtype="int64"):
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    ids = ids.to(getattr(torch, index_dtype))
    return ids, torch.ones_like(ids)


def export_dynamo(path, family, dtype, opset=23, external_data=False, index_dtype="int64"):
    """torch.onnx.export(dynamo=True) at `opset` (None: torch's default), batch and sequence
    dynamic; input_ids and attention_mask have the example inputs' dtype, `index_dtype`."""
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=1, max=256)
    dims = {0: batch, 1: seq}
    program = torch.onnx.export(LogitsOnly(decoder(family, dtype)), example_inputs(index_dtype),
                                None, dynamo=True, input_names=["input_ids", "attention_mask"],
                                output_names=["logits"],
                                dynamic_shapes=(dims, dims), verbose=False,
                                **({"opset_version": opset} if opset else {}))
    program.save(str(path), external_data=external_data)
    return path


def export_torchscript(path, family, dtype, opset=17, fold=True):
    """The TorchScript exporter (dynamo=False), as Optimum and older scripts use it; fold=False
    keeps Gemma's 1 + w an Add in the graph (do_constant_folding=False)."""
    dims = {0: "batch", 1: "sequence"}
    torch.onnx.export(LogitsOnly(decoder(family, dtype)), example_inputs(), str(path),
                      dynamo=False, opset_version=opset,
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": dims, "attention_mask": dims},
                      do_constant_folding=fold)
    return path


def with_symbolic_shapes(path):
    """The model at `path` after onnxruntime's symbolic shape inference (auto_merge: a dimension
    ONNX's inference could not name takes the name of the one it must equal), written beside it."""
    out = path.with_name(f"{path.stem}_shapes.onnx")
    subprocess.run([sys.executable, "-m", "onnxruntime.tools.symbolic_shape_infer", "--input",
                    str(path), "--output", str(out), "--auto_merge"], check=True,
                   capture_output=True, timeout=600)
    return out


def export_genai(folder, target="cuda"):
    """onnxruntime-genai's model builder on a Llama saved with save_pretrained (and a word-level
    tokenizer, which the builder copies), in fp16 for `target` ("cuda"; "NvTensorRtRtx" writes the
    decomposed chain instead of onnxruntime's norms); returns the model's path."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    source = folder / "hf_llama"
    decoder("llama", "float16").save_pretrained(source)
    vocab = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    vocab.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=vocab, unk_token="t0", bos_token="t1",
                                        eos_token="t2")
    tokenizer.save_pretrained(source)
    out = folder / "genai"
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source),
                    "-o", str(out), "-p", "fp16", "-e", target, "-c", str(folder / "cache")],
                   check=True, capture_output=True, timeout=600)
    return out / "model.onnx"


def one_node_model(x_shape, scale_shape=(HIDDEN,), x_type=TensorProto.FLOAT16, scale_type=None,
                   **attrs):
    """One RMSNormalization node, X a graph input, scale an initializer; attrs are the node's only
    attributes (none given: ONNX's defaults apply, as in exporters' output that leaves them
    out)."""
    scale_type = x_type if scale_type is None else scale_type
    values = np.linspace(0.5, 1.5, int(np.prod(scale_shape))).reshape(scale_shape)
    scale = numpy_helper.from_array(values.astype(helper.tensor_dtype_to_np_dtype(scale_type)),
                                    "scale")
    node = helper.make_node("RMSNormalization", ["X", "scale"], ["Y"], name="norm", **attrs)
    graph = helper.make_graph([node], "one_norm",
                              [helper.make_tensor_value_info("X", x_type, list(x_shape))],
                              [helper.make_tensor_value_info("Y", scale_type, list(x_shape))],
                              initializer=[scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    return model


def save(model, path):
    onnx.save(model, str(path))
    return path


def genai_style_model(dtype=np.float16, bias=False):
    """SimplifiedLayerNormalization and SkipSimplifiedLayerNormalization as onnxruntime-genai's
    builder writes them.

    Written with onnx.helper, mirroring the builder's output for a Llama (``-e cuda -p fp16``,
    version 0.18): its node names, the norm in ONNX's domain and the skip norms in
    com.microsoft's, epsilon and nothing else as attributes, ``""`` for the unused mean and
    inverse-RMS outputs, the fourth output (the residual sum) on all but the last skip norm, and
    value_info for every tensor. MatMuls stand in for its attention, which TensorRT cannot import
    (GroupQueryAttention is an onnxruntime op); test_onnx_model.py checks the real builder's
    output against the same expectations. `dtype` is every tensor's but input_ids' (the builder's
    -p fp32 writes float32); bias=True gives each skip norm the op's optional fourth input, a
    bias, which the builder leaves out.
    """
    rng = np.random.default_rng(0)
    elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))

    def weight(name, *shape):
        fan_in = shape[0] if len(shape) > 1 else 1
        return numpy_helper.from_array((rng.uniform(-0.5, 1.5, shape) / fan_in).astype(dtype), name)

    act = ["batch_size", "sequence_length", HIDDEN]
    embedded = "/model/embed_tokens/Gather/output_0"
    normed = "/model/layers.0/input_layernorm/output_0"
    attn = "/model/layers.0/attn/o_proj/MatMul/output_0"
    post = "/model/layers.0/post_attention_layernorm/output_0"
    residual = "/model/layers.0/post_attention_layernorm/output_3"
    mlp = "/model/layers.0/mlp/down_proj/MatMul/output_0"
    final = "/model/layers.1/final_norm_layernorm/output_0"
    nodes = [
        helper.make_node("Gather", ["model.embed_tokens.weight", "input_ids"], [embedded],
                         name="/model/embed_tokens/Gather"),
        helper.make_node("SimplifiedLayerNormalization",
                         [embedded, "model.layers.0.input_layernorm.weight"], [normed],
                         name="/model/layers.0/input_layernorm/LayerNorm", epsilon=1e-6, axis=-1,
                         stash_type=1),
        helper.make_node("MatMul", [normed, "attn.weight"], [attn],
                         name="/model/layers.0/attn/o_proj/MatMul"),
        helper.make_node("SkipSimplifiedLayerNormalization",
                         [embedded, attn, "model.layers.0.post_attention_layernorm.weight"]
                         + ["bias.0"] * bias,
                         [post, "", "", residual],
                         name="/model/layers.0/post_attention_layernorm/SkipLayerNorm",
                         domain="com.microsoft", epsilon=1e-6),
        helper.make_node("MatMul", [post, "mlp.weight"], [mlp],
                         name="/model/layers.0/mlp/down_proj/MatMul"),
        helper.make_node("SkipSimplifiedLayerNormalization",
                         [residual, mlp, "model.layers.1.final_norm_layernorm.weight"]
                         + ["bias.1"] * bias,
                         [final], name="/model/layers.1/final_norm_layernorm/SkipLayerNorm",
                         domain="com.microsoft", epsilon=1e-6),
        helper.make_node("MatMul", [final, "lm_head.weight"], ["logits"], name="/lm_head/MatMul"),
    ]
    initializers = [weight("model.embed_tokens.weight", VOCAB, HIDDEN),
                    weight("attn.weight", HIDDEN, HIDDEN),
                    weight("mlp.weight", HIDDEN, HIDDEN),
                    weight("lm_head.weight", HIDDEN, VOCAB)] + [
        weight(f"model.layers.{name}.weight", HIDDEN) for name in
        ("0.input_layernorm", "0.post_attention_layernorm", "1.final_norm_layernorm")] + [
        weight(f"bias.{layer}", HIDDEN) for layer in range(2 * bias)]
    graph = helper.make_graph(
        nodes, "main_graph",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, act[:2])],
        [helper.make_tensor_value_info("logits", elem_type, act[:2] + [VOCAB])],
        initializer=initializers,
        value_info=[helper.make_tensor_value_info(name, elem_type, act)
                    for name in (embedded, normed, attn, post, residual, mlp, final)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def huge_external_model(folder, gigabytes=2.5):
    """A model whose weights exceed 2 GB, in a sparse external data file (no disk or memory spent):
    an embedding table of `gigabytes` for input_ids, then an RMSNormalization, as an LLM export
    starts."""
    rows = int(gigabytes * 2**30) // (HIDDEN * 2)
    table = TensorProto(name="embed.weight", data_type=TensorProto.FLOAT16, dims=[rows, HIDDEN],
                        data_location=TensorProto.EXTERNAL)
    location = (("location", "huge.data"), ("offset", "0"), ("length", str(rows * HIDDEN * 2)))
    for key, value in location:
        table.external_data.add(key=key, value=value)
    with open(folder / "huge.data", "wb") as f:
        f.truncate(rows * HIDDEN * 2)
    scale = numpy_helper.from_array(np.ones(HIDDEN, np.float16), "norm.weight")
    nodes = [helper.make_node("Gather", ["embed.weight", "input_ids"], ["embedded"], name="embed"),
             helper.make_node("RMSNormalization", ["embedded", "norm.weight"], ["normed"],
                              name="norm", epsilon=1e-6)]
    graph = helper.make_graph(
        nodes, "huge", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("normed", TensorProto.FLOAT16, ["b", "s", HIDDEN])],
        initializer=[table, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    onnx.save(model, str(folder / "huge.onnx"))  # the graph only: its table stays in huge.data
    return folder / "huge.onnx", rows


# -- the plugin's contract in ONNX ops, so that onnxruntime runs a rewritten model on the CPU ------

REFERENCE_DOMAIN = "rmsnorm.reference"


def plugin_functions(opset: int):
    """Model-local functions computing what RmsNormPlugin's two forms compute, from its contract:
    "plain" Y = RMSNorm(X) * W; "fused" S = X + R (an Add in X's dtype), then Y = RMSNorm(S) * W.
    Y is computed in FP32 from X (or S) and W, and rounded once to X's dtype, as the kernel does;
    "plain_fp8" and "fused_fp8" (quantize=1) round y / y_scale to FP8 E4M3 instead (opset 19+)."""
    epsilon = helper.make_node("Constant", [], ["eps"])
    epsilon.attribute.append(onnx.AttributeProto(name="value_float", ref_attr_name="epsilon",
                                                 type=onnx.AttributeProto.FLOAT))
    if opset >= 18:  # ReduceMean's axes: an input from opset 18 on, an attribute before
        mean = [helper.make_node("Constant", [], ["axes"], value_ints=[-1]),
                helper.make_node("ReduceMean", ["squares", "axes"], ["mean"])]
    else:
        mean = [helper.make_node("ReduceMean", ["squares"], ["mean"], axes=[-1])]

    def norm(x):
        return [helper.make_node("Cast", [x], ["x32"], to=TensorProto.FLOAT),
                helper.make_node("Mul", ["x32", "x32"], ["squares"]), *mean, epsilon,
                helper.make_node("Add", ["mean", "eps"], ["mean_eps"]),
                helper.make_node("Sqrt", ["mean_eps"], ["rms"]),
                helper.make_node("Reciprocal", ["rms"], ["rstd"]),
                helper.make_node("Cast", ["W"], ["w32"], to=TensorProto.FLOAT),
                helper.make_node("Mul", ["x32", "rstd"], ["normalized"]),
                helper.make_node("Mul", ["normalized", "w32"], ["y32"]),
                helper.make_node("CastLike", ["y32", x], ["Y"])]

    def fp8(nodes):
        """The FP8 form (quantize=1): y32 / y_scale rounded to E4M3 (nearest even, saturated)."""
        y_scale = helper.make_node("Constant", [], ["y_scale"])
        y_scale.attribute.append(onnx.AttributeProto(name="value_float", ref_attr_name="y_scale",
                                                     type=onnx.AttributeProto.FLOAT))
        zero = helper.make_node("Constant", [], ["zero"], value=TensorProto(
            name="zero", data_type=TensorProto.FLOAT8E4M3FN, raw_data=b"\0"))
        quantize = helper.make_node("QuantizeLinear", ["y32", "y_scale", "zero"], ["Y"])
        return nodes[:-1] + [y_scale, zero, quantize]  # in place of the CastLike to X's dtype

    def function(name, inputs, outputs, nodes, attributes=("epsilon",)):
        return helper.make_function(REFERENCE_DOMAIN, name, inputs, outputs, nodes,
                                    [helper.make_opsetid("", opset)], attributes=list(attributes))

    fused = [helper.make_node("Add", ["X", "R"], ["S"])] + norm("S")
    both = ("epsilon", "y_scale")
    fp8_forms = [function("plain_fp8", ["X", "W"], ["Y"], fp8(norm("X")), both),
                 function("fused_fp8", ["X", "R", "W"], ["Y", "S"], fp8(fused), both)]
    return [function("plain", ["X", "W"], ["Y"], norm("X")),
            function("fused", ["X", "R", "W"], ["Y", "S"], fused)] \
        + (fp8_forms if opset >= 19 else [])  # ONNX's QuantizeLinear writes FP8 from opset 19


def runnable_by_onnxruntime(model, watched=()):
    """A copy of a rewritten ModelProto in which every RmsNormPlugin node calls the function of its
    form from plugin_functions instead, and the `watched` tensors are outputs too."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    for node in model.graph.node:
        if node.op_type == "RmsNormPlugin":
            attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            node.op_type = "fused" if attributes.get("residual") == 1 else "plain"
            node.domain = REFERENCE_DOMAIN
            del node.attribute[:]
            node.attribute.append(helper.make_attribute("epsilon", attributes["epsilon"]))
            if attributes.get("quantize") == 1:
                node.op_type += "_fp8"
                node.attribute.append(helper.make_attribute("y_scale", attributes["y_scale"]))
    model.functions.extend(plugin_functions(opset))
    model.opset_import.append(helper.make_opsetid(REFERENCE_DOMAIN, 1))
    outputs = {o.name for o in model.graph.output}
    model.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in watched
                              if name not in outputs)
    return model


# -- FP8 Q/DQ as NVIDIA Model Optimizer writes them --------------------------------------------

FP8_MAX = 448.0


def fp8_qdq_before_matmuls(path, out):
    """The exported model at `path` with FP8 Q/DQ pairs before its MatMuls, written to `out`.

    The pattern mirrors what nvidia-modelopt 0.47.0 writes for
    ``modelopt.onnx.quantization.quantize(path, quantize_mode="fp8",
    op_types_to_quantize=["MatMul"], calibration_eps=["cpu"])`` on an fp16 export
    (checked once against its real output; modelopt itself is not a test
    dependency: its [onnx] extra pins onnx 1.21 and pulls cupy and
    onnxruntime-gpu). For each MatMul input:

    * an activation: ``<t>_QuantizeLinear`` -> ``<t>_DequantizeLinear``, outputs
      ``<t>_QuantizeLinear_Output`` and ``<t>_DequantizeLinear_Output``, a scalar
      scale of the activation's dtype (``<t>_scale_1`` for Q, ``<t>_scale_2`` for
      DQ), a scalar FLOAT8E4M3FN zero point 0 (``<t>_zero_point_1`` / ``_2``), no
      attributes; every reader of ``<t>`` then reads the DQ's output;
    * a weight initializer [K, N]: the same pair with ``axis=1``, one scale and
      zero point per output column.

    Scales are max calibration (amax / 448, one of modelopt's methods) from
    onnxruntime's run of the model on example_inputs(); the opset stays the
    export's (23 here; modelopt raises it to 19 where it is lower).
    """
    import onnxruntime

    model = onnx.load(str(path))
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    matmul_inputs = list(dict.fromkeys(name for node in graph.node if node.op_type == "MatMul"
                                       for name in node.input))
    activations = [name for name in matmul_inputs if name not in weights]

    # Max calibration: each activation's largest magnitude on the example inputs.
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in activations)
    session = onnxruntime.InferenceSession(probe.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    # The example inputs in the dtypes the export declares (int64, or int32).
    declared = {value.name: helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
                for value in graph.input}
    feeds = {name: tensor.numpy().astype(declared[name])
             for name, tensor in zip(("input_ids", "attention_mask"), example_inputs())}
    values = dict(zip(activations, session.run(activations, feeds)))

    def pair(name, scale, axis=None):
        """Q and DQ nodes and their initializers for tensor `name`, `scale` in its dtype."""
        zero = TensorProto(name="", data_type=TensorProto.FLOAT8E4M3FN, dims=list(scale.shape),
                           raw_data=bytes(scale.size))
        attrs = {} if axis is None else {"axis": axis}
        inits = []
        for k in (1, 2):
            inits.append(numpy_helper.from_array(scale, f"{name}_scale_{k}"))
            point = TensorProto()
            point.CopyFrom(zero)
            point.name = f"{name}_zero_point_{k}"
            inits.append(point)
        quantized = f"{name}_QuantizeLinear_Output"
        nodes = [helper.make_node("QuantizeLinear",
                                  [name, f"{name}_scale_1", f"{name}_zero_point_1"], [quantized],
                                  name=f"{name}_QuantizeLinear", **attrs),
                 helper.make_node("DequantizeLinear",
                                  [quantized, f"{name}_scale_2", f"{name}_zero_point_2"],
                                  [f"{name}_DequantizeLinear_Output"],
                                  name=f"{name}_DequantizeLinear", **attrs)]
        return nodes, inits

    after = {}  # producer's output name (or "" for the graph's start) -> the pairs that follow it
    renamed = {}
    for name in matmul_inputs:
        if name in weights:
            w = numpy_helper.to_array(weights[name])
            scale = (np.abs(w.astype(np.float32)).max(axis=0) / FP8_MAX).astype(w.dtype)
            nodes, inits = pair(name, scale, axis=1)
        else:
            v = values[name]
            scale = np.array(np.abs(v.astype(np.float32)).max() / FP8_MAX, dtype=v.dtype)
            nodes, inits = pair(name, scale)
        after.setdefault(name, []).extend(nodes)
        graph.initializer.extend(inits)
        renamed[name] = f"{name}_DequantizeLinear_Output"
    produced = {out for node in graph.node for out in node.output}
    ordered = [n for name, pairs in after.items() if name not in produced for n in pairs]
    for node in graph.node:
        for k, name in enumerate(node.input):
            node.input[k] = renamed.get(name, name)
        ordered.append(node)
        ordered.extend(n for out in node.output for n in after.get(out, ()))
    del graph.node[:]
    graph.node.extend(ordered)
    onnx.save(model, str(out))
    return out
