"""CPU: rms_norm_onnx_model.py folds a norm's FP8 QuantizeLinear into the plugin's FP8 form.

The models are exported decoders (tests/onnx_models.py) with FP8 Q/DQ pairs
before their MatMuls as NVIDIA Model Optimizer writes them
(onnx_models.fp8_qdq_before_matmuls): a norm's Y then reaches its MatMuls only
through QuantizeLinear -> DequantizeLinear, and the plugin writes that FP8
tensor itself. Checked here: which Quantizes fold and why others do not (one
attribute at a time), that onnxruntime computes the folded model as the
original, and that TensorRT-RTX builds it for SM89 with the plugin's Y in FP8.
"""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_models
import rms_norm_onnx_model as companion
import rms_norm_plugin_cutedsl as sample
from test_onnx_model import (export, model_spec, nodes, profile_args, rtx_builds,
                             run_onnxruntime)

LAYERS = onnx_models.CONFIG["num_hidden_layers"]
H = onnx_models.HIDDEN

# name -> the export of test_onnx_model.py quantized; each holds 2 norms per layer and the final
# one, the first (after the embedding) alone and the others fused with their residual Add.
MODELS = {
    # modelopt's default high_precision_dtype="fp16" on an fp16 Llama: ONNX's RMSNormalization
    "llama_dynamo_opset23_fp16": "llama_dynamo_opset23",
    # high_precision_dtype="fp32" on an fp32 Mistral at torch's default opset: the decomposed chain
    "mistral_dynamo_default_opset_fp32": "mistral_dynamo_default_opset_fp32_int32_inputs",
}


@pytest.fixture(scope="session")
def quantized(tmp_path_factory):
    """{name: path} of each export with modelopt's FP8 Q/DQ pairs before its MatMuls."""
    pytest.importorskip("transformers")
    paths = {}
    for name, source in MODELS.items():
        folder = tmp_path_factory.mktemp(name)
        exported = export(tmp_path_factory.getbasetemp(), source)
        paths[name] = onnx_models.fp8_qdq_before_matmuls(exported, folder / "fp8.onnx")
    return paths


@pytest.fixture(scope="session")
def folds(quantized):
    """{name: (original, rewritten, replaced, left)}."""
    results = {}
    for name, path in quantized.items():
        rewritten = companion.load_model(str(path))
        replaced, left = companion.rewrite_model(rewritten)
        results[name] = (companion.load_model(str(path)), rewritten, replaced, left)
    return results


def quantize_of(model: ir.Model, tensor: str) -> ir.Node:
    (node,) = [n for n in model.graph
               if n.op_type == "QuantizeLinear" and n.inputs[0].name == tensor]
    return node


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_norms_quantize_is_folded_and_its_dequantize_reads_the_plugins_fp8_y(folds, name):
    original, rewritten, replaced, left = folds[name]
    assert left == {}, left
    assert len(replaced) == 2 * LAYERS + 1
    assert sum(bool(r.fused) for r in replaced) == 2 * LAYERS  # the residual form folds too
    plugins = {node.name: node for node in nodes(rewritten, sample.PLUGIN_NAME)}
    for record in replaced:
        norm_output = next(n for n in original.graph if n.name == record.name).outputs[0].name
        quantize = quantize_of(original, norm_output)
        assert record.quantized == quantize.name
        assert record.y == quantize.outputs[0].name
        scale = quantize.inputs[1].const_value.numpy()
        node = plugins[record.name]
        assert node.attributes["quantize"].value == 1
        assert node.attributes["y_scale"].value == pytest.approx(float(scale), rel=0, abs=0)
        assert record.y_scale == float(scale)
        y = node.outputs[0]
        assert y.name == quantize.outputs[0].name
        assert y.dtype == ir.DataType.FLOAT8E4M3FN
        assert [user.op_type for user, _ in y.uses()] == ["DequantizeLinear"]
        assert node.outputs[-1].dtype != ir.DataType.FLOAT8E4M3FN or len(node.outputs) == 1  # S
    # Only the MatMuls' own Quantizes remain: one per activation that is not a norm's Y.
    remaining = len(nodes(original, "QuantizeLinear")) - len(replaced)
    assert len(nodes(rewritten, "QuantizeLinear")) == remaining
    assert not nodes(rewritten, "RMSNormalization") and not nodes(rewritten, "ReduceMean")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_folded_model_passes_onnx_checker_and_drops_the_quantizes_constants(folds, tmp_path,
                                                                                 name):
    original, rewritten, replaced, _ = folds[name]
    path = tmp_path / "folded.onnx"
    companion.save_model(rewritten, str(path))
    companion.declare_schemas()
    onnx.checker.check_model(str(path), full_check=True)
    kept = {t.name for t in onnx.load(str(path)).graph.initializer}
    folded = [n for n in original.graph if n.name in {r.quantized for r in replaced}]
    constants = {v.name for quantize in folded for v in quantize.inputs[1:]}
    assert len(constants) == 2 * len(replaced) and not constants & kept  # each scale, zero point


def test_the_report_says_which_quantize_each_norm_took(folds, capsys):
    _, _, replaced, left = folds["llama_dynamo_opset23_fp16"]
    companion.print_report(replaced, left)
    out = capsys.readouterr().out
    for record in replaced:
        assert f"Y FP8 E4M3 by folding {record.quantized} (y_scale {record.y_scale:g})" in out


def test_onnxruntime_computes_the_folded_model_as_the_original(quantized, folds):
    """Each folded node's FP8 Y within check_replaced's FP8 bound of the original Quantize's output,
    S within check_sum's, logits within FP32 noise (FP32: onnxruntime's CPU rounds as the graph)."""
    original, rewritten, replaced, _ = folds["mistral_dynamo_default_opset_fp32"]
    profile = companion.input_profile(original, profile_args(original, 2, 7, 9))
    feeds = {k: v.numpy() for k, v in companion.input_values(
        original, {n: s[1] for n, s in profile.items()}, seed=0).items()}
    path = quantized["mistral_dynamo_default_opset_fp32"]
    source = onnx.load(str(path))
    weights = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in source.graph.initializer
               if t.data_type != TensorProto.FLOAT8E4M3FN}
    watched = [t for r in replaced for t in (*r.x, r.y, r.sum)
               if t and t not in weights and t not in feeds]
    source.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in watched)
    folded = path.with_name("folded_for_onnxruntime.onnx")
    companion.save_model(rewritten, str(folded))
    runnable = onnx_models.runnable_by_onnxruntime(onnx.load(str(folded)), watched)
    ours, theirs = run_onnxruntime(runnable, feeds), run_onnxruntime(source, feeds)
    values = {**weights, **{k: v.astype(np.float64) for k, v in feeds.items()}}
    for record in replaced:
        assert np.abs(ours[record.y]).max() > 16  # FP8 values, y / y_scale, not Y in X's dtype
        assert companion.check_replaced(ours, theirs, values, record)[0], record.name
        assert not record.sum or companion.check_sum(ours, theirs, values, record)[0], record.name
        # The check can fail: two FP8 steps off at one element is no rounding difference.
        moved = dict(ours)
        moved[record.y] = ours[record.y].copy()
        flat = moved[record.y].reshape(-1)
        flat[np.argmax(np.abs(flat))] *= 1 - 2 * 2.0 ** -3
        assert not companion.check_replaced(moved, theirs, values, record)[0], record.name
    logits = theirs["logits"]
    assert np.max(np.abs(ours["logits"] - logits)) <= 1e-4 * np.max(np.abs(logits))


# -- one attribute at a time: which Quantize folds, and why not -----------------------------------


def quantized_norm(scale=0.01, zero=(TensorProto.FLOAT8E4M3FN, 0.0), quantize_attrs=None,
                   extra_reader=False, y_output=False, scale_input=False, opset=23):
    """RMSNormalization over X [n, H] fp16 -> QuantizeLinear(scale, zero) -> DequantizeLinear."""
    scale = np.asarray(scale, np.float16)
    inits = [numpy_helper.from_array(np.linspace(0.5, 1.5, H).astype(np.float16), "w")]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT16, ["n", H])]
    if scale_input:
        inputs.append(helper.make_tensor_value_info("q_scale", TensorProto.FLOAT16, []))
    else:
        inits.append(numpy_helper.from_array(scale, "q_scale"))
    q_inputs = ["Y", "q_scale"]
    if zero is not None:
        kind, value = zero
        inits.append(helper.make_tensor("q_zero", kind, list(scale.shape),
                                        np.full(scale.shape, value).ravel().tolist()))
        q_inputs.append("q_zero")
    dequantize_attrs = {k: v for k, v in (quantize_attrs or {}).items()
                        if k in ("axis", "block_size")}
    graph_nodes = [helper.make_node("RMSNormalization", ["X", "w"], ["Y"], name="norm",
                                    epsilon=1e-5),
                   helper.make_node("QuantizeLinear", q_inputs, ["Yq"], name="quantize",
                                    **(quantize_attrs or {})),
                   helper.make_node("DequantizeLinear", ["Yq", *q_inputs[1:]], ["Z"],
                                    name="dequantize", **dequantize_attrs)]
    outputs = [helper.make_tensor_value_info("Z", TensorProto.FLOAT16, ["n", H])]
    if extra_reader:
        graph_nodes.append(helper.make_node("Relu", ["Y"], ["other"], name="relu"))
        outputs.append(helper.make_tensor_value_info("other", TensorProto.FLOAT16, ["n", H]))
    if y_output:
        outputs.append(helper.make_tensor_value_info("Y", TensorProto.FLOAT16, ["n", H]))
    graph = helper.make_graph(graph_nodes, "g", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 11
    return model


def fold_one(model):
    ir_model = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model))
    return companion.rewrite_model(ir_model)


@pytest.mark.parametrize("model_args", [
    dict(), dict(zero=None, quantize_attrs=dict(output_dtype=TensorProto.FLOAT8E4M3FN)),
    dict(scale=[0.01]), dict(quantize_attrs=dict(saturate=1)),
    dict(zero=(TensorProto.FLOAT8E4M3FN, -0.0)),
])
def test_a_quantize_to_e4m3fn_with_one_constant_scale_and_zero_point_0_is_folded(model_args):
    replaced, left = fold_one(quantized_norm(**model_args))
    assert left == {}
    folded = [(r.quantized, r.y, r.y_scale) for r in replaced]
    assert folded == [("quantize", "Yq", float(np.float16(0.01)))]


@pytest.mark.parametrize("model_args, why", [
    (dict(extra_reader=True), "Y 'Y' has 1 other reader(s) (a Relu among them)"),
    (dict(y_output=True), "Y 'Y' is also a graph output"),
    (dict(scale_input=True), "its scale is not a constant"),
    (dict(scale=np.full(H, 0.01), quantize_attrs=dict(axis=1)),
     f"its scale has shape [{H}] (per axis 1); the plugin takes one scalar scale"),
    (dict(scale=np.full((4, H // 16), 0.01), quantize_attrs=dict(axis=1, block_size=16)),
     "it quantizes in blocks of 16"),
    (dict(zero=(TensorProto.FLOAT8E4M3FN, 1.0)), "its zero point is 1, not 0"),
    (dict(zero=(TensorProto.INT8, 0)), "it quantizes to INT8; the plugin writes FLOAT8E4M3FN only"),
    (dict(zero=(TensorProto.FLOAT8E5M2, 0.0)), "it quantizes to FLOAT8E5M2"),
    (dict(zero=None), "it quantizes to UINT8"),
    (dict(quantize_attrs=dict(saturate=0)), "it has saturate=0"),
    (dict(scale=0.0), "its scale 0 is not finite and >= 2^-126"),
])
def test_a_quantize_the_fp8_form_cannot_write_stays_and_the_report_says_why(model_args, why,
                                                                             capsys):
    model = quantized_norm(**model_args)
    if "block_size" in (model_args.get("quantize_attrs") or {}):  # blocks need a static X
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 4
    replaced, left = fold_one(model)
    assert [r.quantized for r in replaced] == [""]  # the norm is served, Y in X's dtype
    assert list(left) == ["quantize"]
    assert left["quantize"].startswith("a QuantizeLinear after norm, not folded: ")
    assert why in left["quantize"]
    companion.print_report(replaced, left)
    assert f"  quantize: {left['quantize']}" in capsys.readouterr().out


def test_a_norm_without_a_quantize_keeps_y_in_xs_dtype_and_lists_nothing():
    replaced, left = fold_one(onnx_models.one_node_model(("n", H)))
    assert left == {} and [(r.quantized, r.y_scale) for r in replaced] == [("", 0.0)]


def test_the_cast_the_rewrite_appends_goes_with_a_folded_quantize():
    """X fp16, scale fp32: ONNX's Y is fp32, the plugin's fp16 Y is cast to it, then quantized;
    folded, the plugin writes the FP8 tensor from its FP32 y, and no Cast is left."""
    model = quantized_norm()
    w = np.linspace(0.5, 1.5, H).astype(np.float32)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "w"))
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.float32(0.01), "q_scale"))
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    ir_model = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model))
    replaced, left = companion.rewrite_model(ir_model)
    assert left == {}
    (record,) = replaced
    assert (record.quantized, record.cast, record.scale_dtype) == ("quantize", "", "float32")
    assert [n.op_type for n in ir_model.graph] == [sample.PLUGIN_NAME, "DequantizeLinear"]


# -- TensorRT-RTX builds the folded model for an FP8 target ---------------------------------------


@pytest.fixture(scope="session")
def fp8_builds(quantized, folds, rtx_lib_dir):
    """{compute capability: (folded build, original build, watched)} of the fp16 Llama."""
    name = "llama_dynamo_opset23_fp16"
    original, rewritten, replaced, _ = folds[name]
    profile = companion.input_profile(original, profile_args(original))
    watched = [t for r in replaced for t in (*r.x, r.y, r.sum)
               if t and t not in profile and t not in original.graph.initializers]
    path = str(quantized[name].with_name("folded.onnx"))
    companion.save_model(rewritten, path)
    shapes = {k: [list(s) for s in v] for k, v in profile.items()}

    jobs = [(path, "SM89"), (str(quantized[name]), "SM89"), (path, "SM80")]
    specs = [model_spec(model_path, shapes, watched, target) for model_path, target in jobs]
    folded, original_build, sm80 = rtx_builds(rtx_lib_dir, specs)
    return folded, original_build, sm80, watched, replaced


def test_tensorrt_rtx_builds_the_folded_model_for_sm89_with_the_plugins_y_in_fp8(fp8_builds):
    folded, original, _, watched, replaced = fp8_builds
    for build in (folded, original):
        assert build["parse_ok"], build.messages()
        assert build["build_ok"], build.messages()
        outputs = dict(build["outputs"])
        assert set(watched) <= set(outputs)
        assert {outputs[r.y] for r in replaced} == {"DataType.FP8"}  # compared FP8 to FP8
        assert {outputs[r.sum] for r in replaced if r.sum} == {"DataType.HALF"}
    calls = folded["configure_plugin"]
    assert len(calls) == len(replaced)
    assert {call["outputs"][0]["type"] for call in calls} == {"DataType.FP8"}
    assert {o["type"] for call in calls for o in call["outputs"][1:]} == {"DataType.HALF"}
    assert original["configure_plugin"] == []


def test_tensorrt_rtx_refuses_fp8_for_sm80_in_its_own_words(fp8_builds):
    """What an SM80 target says of any FP8 tensor: why these builds target SM89."""
    sm80 = fp8_builds[2]
    assert sm80["parse_ok"], sm80.messages()
    assert not sm80["build_ok"]
    assert "Cannot compile for target(s) sm80, because the model contains HW-specific datatypes: " \
           "fp8_e4m3" in sm80.messages()
