"""CPU: rms_norm_onnx_model.py on what exporters write: every RMSNorm replaced or listed, both models built.

The models are real exporter output (tests/onnx_models.py: transformers decoders
through torch's dynamo exporter at opset 23 and at its default opset, the
TorchScript exporter, and onnxruntime-genai's builder), plus one-node models
that vary one attribute at a time. TensorRT-RTX (a real TensorRT-family
builder that runs on the CPU, see tests/rtx_build_worker.py) parses each
rewritten model by path, with the sample's plugin, and the original with its
own importers. Running the two engines and comparing them needs a GPU and
TensorRT: test_trt_onnx_model.py.
"""

import argparse
import concurrent.futures
import os
import subprocess
import sys

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import onnx_models
import rms_norm_onnx_model as companion
import rms_norm_plugin_cutedsl as sample
from test_cli import EXIT_USAGE, REPORT_HEAVY_IMPORTS, assert_one_sentence, heavy_imports, run_script
from test_rtx_build_contract import TRT_TYPE, run_worker

COMPANION = companion.__file__
LAYERS = onnx_models.CONFIG["num_hidden_layers"]
H = onnx_models.HIDDEN

# name -> (how it is made, the forms its RMSNorms take, how many: two per layer and the final norm, plus
# Qwen3's q and k norms per layer).
EXPORTS = {
    "llama_dynamo_opset23": (lambda d: onnx_models.export_dynamo(d / "m.onnx", "llama", "float16", external_data=True),
                             {"rms_normalization"}, 2 * LAYERS + 1),
    "gemma_dynamo_opset23": (lambda d: onnx_models.export_dynamo(d / "m.onnx", "gemma", "float16"),
                             {"rms_normalization + Cast"}, 2 * LAYERS + 1),
    "qwen3_dynamo_default_opset": (lambda d: onnx_models.export_dynamo(d / "m.onnx", "qwen3", "bfloat16", opset=None),
                                   {"decomposed_after_cast"}, 4 * LAYERS + 1),
    "llama_torchscript_opset17": (lambda d: onnx_models.export_torchscript(d / "m.onnx", "llama", "float16"),
                                  {"decomposed_after_cast"}, 2 * LAYERS + 1),
    "gemma_torchscript_opset17": (lambda d: onnx_models.export_torchscript(d / "m.onnx", "gemma", "float32"),
                                  {"decomposed_after_cast", "decomposed_in_x_dtype"}, 2 * LAYERS + 1),
    "gemma_torchscript_opset18_unfolded": (
        lambda d: onnx_models.export_torchscript(d / "m.onnx", "gemma", "float16", opset=18, fold=False),
        {"decomposed_after_cast + Cast", "decomposed_after_cast"}, 2 * LAYERS + 1),
    "genai_builder": (onnx_models.export_genai, {"simplified_layer_normalization",
                                                 "skip_simplified_layer_normalization_and_sum",
                                                 "skip_simplified_layer_normalization"}, 2 * LAYERS + 1),
    "genai_builder_tensorrt_rtx_target": (lambda d: onnx_models.export_genai(d, "NvTensorRtRtx"),
                                          {"decomposed_after_cast"}, 2 * LAYERS + 1),
    "genai_style_nodes": (lambda d: onnx_models.save(onnx_models.genai_style_model(), d / "m.onnx"),
                          {"simplified_layer_normalization", "skip_simplified_layer_normalization_and_sum",
                           "skip_simplified_layer_normalization"}, 3),
}
# The builder's models hold GroupQueryAttention, an onnxruntime op no TensorRT imports; the norms of its CUDA
# target are built from genai_style_nodes, which mirror them, and its TensorRT-RTX target's chain is the
# TorchScript exporter's.
BUILT = [name for name in EXPORTS if not name.startswith("genai_builder")]


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """{name: path} of every model in EXPORTS, exported once per session."""
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime_genai")
    return {name: make(tmp_path_factory.mktemp(name)) for name, (make, _, _) in EXPORTS.items()}


@pytest.fixture(scope="session")
def rewrites(exported):
    """{name: (original, rewritten, replaced, left)}, each model loaded twice and the second rewritten."""
    results = {}
    for name, path in exported.items():
        rewritten = companion.load_model(str(path))
        replaced, left = companion.rewrite_model(rewritten)
        results[name] = (companion.load_model(str(path)), rewritten, replaced, left)
    return results


def nodes(model, op_type):
    return [node for node in model.graph if node.op_type == op_type]


def profile_args(model, low=1, opt=4, high=16):
    """The flags a user passes for this model: every dynamic dimension low/opt/high, as --min/opt/max-shapes."""
    def shape(value, n):
        return tuple(d if isinstance(d, int) else n for d in value.shape)

    inputs = companion.model_inputs(model)
    return argparse.Namespace(**{f"{p}_shapes": {v.name: shape(v, n) for v in inputs}
                                 for p, n in (("min", low), ("opt", opt), ("max", high))},
                              min_tokens=1, opt_tokens=128, max_tokens=512)


# -- every RMSNorm of every route, replaced or listed ------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_every_rmsnorm_the_model_holds_is_replaced(rewrites, name):
    original, rewritten, replaced, left = rewrites[name]
    _, forms, count = EXPORTS[name]
    assert left == {}, left
    assert len(replaced) == count
    assert {r.form for r in replaced} == forms
    assert len(nodes(rewritten, sample.PLUGIN_NAME)) == count
    for op_type in companion.NORM_OPS | {"ReduceMean"}:
        assert not nodes(rewritten, op_type), op_type  # no norm, and no part of one, is left behind
    assert {r.epsilon for r in replaced} == {float(np.float32(1e-6))}  # transformers' rms_norm_eps for these


def test_gemmas_unfolded_1_plus_w_is_the_plugins_weight(rewrites):
    """do_constant_folding=False: the scale is an Add of the weight and 1, which TensorRT computes for the plugin."""
    original, rewritten, replaced, _ = rewrites["gemma_torchscript_opset18_unfolded"]
    for r in replaced:
        (plugin,) = [n for n in nodes(rewritten, sample.PLUGIN_NAME) if n.name == r.name]
        assert plugin.inputs[1].name == r.scale and plugin.inputs[1].producer().op_type == "Add"


def test_the_gemma_export_is_x_fp16_with_an_fp32_scale_and_the_cast_back_is_absorbed(rewrites):
    original, rewritten, replaced, _ = rewrites["gemma_dynamo_opset23"]
    assert {(r.dtype, r.scale_dtype, r.cast) for r in replaced} == {("float16", "float32", "absorbed")}
    casts = {n.outputs[0].name for n in nodes(original, "Cast")} - {n.outputs[0].name for n in nodes(rewritten, "Cast")}
    assert casts == {r.y for r in replaced}  # exactly the Casts back are gone; the plugin writes their outputs
    assert {n.outputs[0].name for n in nodes(rewritten, sample.PLUGIN_NAME)} == casts


@pytest.mark.parametrize("name", ["llama_dynamo_opset23", "genai_builder", "qwen3_dynamo_default_opset"])
def test_plugin_nodes_carry_the_original_nodes_names(rewrites, name):
    original, rewritten, replaced, _ = rewrites[name]
    plugins = {n.name for n in nodes(rewritten, sample.PLUGIN_NAME)}
    assert plugins == {r.name for r in replaced}
    assert plugins <= {n.name for n in original.graph}


def test_the_skip_norm_becomes_tensorrts_add_and_the_plugin_and_keeps_the_sum(rewrites):
    original, rewritten, replaced, _ = rewrites["genai_style_nodes"]
    (skip,) = [n for n in nodes(original, "SkipSimplifiedLayerNormalization") if len(n.outputs) == 4]
    (plugin,) = [n for n in nodes(rewritten, sample.PLUGIN_NAME) if n.name == skip.name]
    add = plugin.inputs[0].producer()
    assert add.op_type == "Add" and [v.name for v in add.inputs] == [v.name for v in skip.inputs[:2]]
    assert add.outputs[0].name == skip.outputs[3].name  # the next layer's residual is still the sum
    assert plugin.outputs[0].name == skip.outputs[0].name


@pytest.fixture(scope="session")
def builds(rewrites, exported, rtx_lib_dir, tmp_path_factory):
    """{name: (rewritten build, original build, watched)}: both models built by TensorRT-RTX from their files,
    with every replaced node's tensors also outputs, as the companion builds them."""
    def build(name):
        original, rewritten, replaced, _ = rewrites[name]
        profile = companion.input_profile(original, profile_args(original))
        watched = [t for r in replaced for t in (*r.x, r.y) if t not in profile]
        path = str(exported[name].with_name("rewritten.onnx"))
        companion.save_model(rewritten, path)
        shapes = {k: [list(s) for s in v] for k, v in profile.items()}
        return tuple(run_worker(rtx_lib_dir, dict(source="model", model_path=p, shapes=shapes, watched=watched))
                     for p in (path, str(exported[name]))) + (watched,)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(BUILT, pool.map(build, BUILT)))


@pytest.mark.parametrize("name", BUILT)
def test_tensorrt_rtx_builds_the_rewritten_model_with_the_plugin_and_the_original_without(builds, rewrites, name):
    rewritten, original, watched = builds[name]
    for build in (rewritten, original):
        assert build["parse_ok"], build.messages()
        assert build["build_ok"], build.messages()
        assert set(watched) <= {out for out, _ in build["outputs"]}
    replaced = rewrites[name][2]
    assert len(rewritten["configure_plugin"]) == len(replaced)  # every plugin node reached the builder
    assert {call["inputs"][0]["type"] for call in rewritten["configure_plugin"]} == \
        {TRT_TYPE[r.dtype] for r in replaced}
    assert original["configure_plugin"] == []


def test_the_external_data_model_is_built_from_its_file_beside_the_data(exported, builds):
    path = exported["llama_dynamo_opset23"]
    assert os.path.getsize(f"{path}.data") > 100_000  # the weights are there, not in the graph
    assert any(t.data_location == TensorProto.EXTERNAL
               for t in onnx.load(str(path), load_external_data=False).graph.initializer)
    assert builds["llama_dynamo_opset23"][0]["build_ok"]


# -- one attribute at a time: what is served, what is left and why ---------------------------------------


def rewrite_one(model):
    ir_model = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model))
    replaced, left = companion.rewrite_model(ir_model)
    return ir_model, replaced, left


@pytest.mark.parametrize("attrs", [dict(axis=-1), dict(axis=2), dict()])
def test_the_last_axis_is_served_whether_written_as_minus_one_as_rank_minus_one_or_left_out(attrs):
    _, replaced, left = rewrite_one(onnx_models.one_node_model(["n", 4, H], **attrs))
    assert left == {} and [r.name for r in replaced] == ["norm"]


def test_a_node_without_an_epsilon_attribute_gets_onnxs_default_1e_5():
    rewritten, replaced, _ = rewrite_one(onnx_models.one_node_model(["n", H]))
    assert replaced[0].epsilon == float(np.float32(1e-5))
    (plugin,) = nodes(rewritten, sample.PLUGIN_NAME)
    assert plugin.attributes["epsilon"].value == pytest.approx(1e-5, rel=1e-7)


def test_the_plugin_node_is_named_like_the_node_it_replaces():
    rewritten, _, _ = rewrite_one(onnx_models.one_node_model(["n", H], epsilon=1e-5))
    assert [n.name for n in nodes(rewritten, sample.PLUGIN_NAME)] == ["norm"]


@pytest.mark.parametrize("model_args, why", [
    (dict(x_shape=["n", 4, H], axis=3), "normalizes from axis 3"),  # rank 3: axis 3 is no axis at all
    (dict(x_shape=["n", 4, H], axis=1), "normalizes from axis 1"),
    (dict(x_shape=["n", 4, H], scale_shape=(4, H), axis=-2), "normalizes from axis -2"),
    (dict(x_shape=["n", H], stash_type=0), "stash_type is not 1"),
    (dict(x_shape=["n", "h"]), "last dimension of X is dynamic"),
    (dict(x_shape=[H]), "known rank of 2 or more"),
    (dict(x_shape=["n", H], x_type=TensorProto.DOUBLE), "X is DOUBLE"),
    (dict(x_shape=["n", H], epsilon=0.0), "epsilon 0 is not finite and > 0"),
    (dict(x_shape=["n", H], epsilon=-1e-5), "epsilon -1e-05 is not finite and > 0"),
])
def test_nodes_the_plugin_cannot_serve_are_left_with_the_reason(model_args, why):
    model = onnx_models.one_node_model(**model_args)
    rewritten, replaced, left = rewrite_one(model)
    assert replaced == []
    assert list(left) == ["norm"] and why in left["norm"], left
    assert [n.op_type for n in rewritten.graph] == ["RMSNormalization"]


@pytest.mark.parametrize("x_type, scale_type, cast", [
    (TensorProto.FLOAT16, TensorProto.FLOAT, "appended"), (TensorProto.FLOAT, TensorProto.BFLOAT16, "appended"),
    (TensorProto.BFLOAT16, TensorProto.BFLOAT16, "")])
def test_x_and_scale_of_any_pair_the_plugin_takes_are_served(x_type, scale_type, cast):
    """Without a Cast back, ONNX's Y has the scale's dtype: the plugin's Y (X's dtype) is cast to it."""
    rewritten, replaced, left = rewrite_one(onnx_models.one_node_model(["n", H], x_type=x_type, scale_type=scale_type))
    assert left == {} and replaced[0].cast == cast
    y = rewritten.graph.outputs[0]
    assert y.name == "Y" and y.producer().op_type == ("Cast" if cast else sample.PLUGIN_NAME)


def test_a_mean_of_squares_the_forms_do_not_cover_is_listed():
    """A decomposed chain whose statistics stay in float16 (no Cast to FP32) is left, and says why; a mean of
    squares in no known form (here its square root is missing) is listed too."""
    graph = helper.make_graph(
        [helper.make_node("Pow", ["X", "two"], ["sq"], name="pow"),
         helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="mean"),
         helper.make_node("Add", ["ms", "eps"], ["mse"], name="add"),
         helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
         helper.make_node("Div", ["X", "rms"], ["normalized"], name="div"),
         helper.make_node("Mul", ["normalized", "w"], ["Y"], name="scale"),
         helper.make_node("Pow", ["X", "two"], ["sq2"], name="pow2"),
         helper.make_node("ReduceMean", ["sq2", "axes"], ["Z"], name="mean_of_squares")],
        "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT16, ["n", H])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, ["n", H]),
         helper.make_tensor_value_info("Z", TensorProto.FLOAT16, ["n", 1])],
        initializer=[onnx.numpy_helper.from_array(np.array(v, t), n) for n, v, t in
                     (("two", 2.0, np.float16), ("axes", [-1], np.int64), ("eps", 1e-5, np.float16),
                      ("w", np.ones(H), np.float16))])
    _, replaced, left = rewrite_one(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    assert replaced == []
    assert "computes its statistics in float16" in left["scale"]
    assert "matches no form served" in left["mean_of_squares"]
    assert set(left) == {"scale", "mean_of_squares"}


# -- the profile: every dynamic dimension, from the flags -------------------------------------------------


def test_shapes_named_per_input_fix_every_dimension_and_inputs_sharing_a_name(rewrites):
    original = rewrites["llama_dynamo_opset23"][0]
    args = profile_args(original)
    del args.min_shapes["attention_mask"], args.opt_shapes["attention_mask"], args.max_shapes["attention_mask"]
    profile = companion.input_profile(original, args)
    assert profile == {"input_ids": ((1, 1), (4, 4), (16, 16)), "attention_mask": ((1, 1), (4, 4), (16, 16))}


def test_two_dynamic_dimensions_and_only_the_token_flags_are_refused_naming_the_second(rewrites):
    original = rewrites["genai_builder"][0]
    args = argparse.Namespace(min_shapes=None, opt_shapes=None, max_shapes=None, min_tokens=1, opt_tokens=2,
                              max_tokens=3)
    with pytest.raises(sample.UsageError, match="dimension 'sequence_length' is a second dynamic dimension "
                                                "besides 'batch_size'"):
        companion.input_profile(original, args)


def test_one_dynamic_dimension_takes_the_token_flags():
    model = ir.serde.deserialize_model(onnx_models.one_node_model(["n", 3, H]))
    args = argparse.Namespace(min_shapes=None, opt_shapes=None, max_shapes=None, min_tokens=2, opt_tokens=37,
                              max_tokens=300)
    assert companion.input_profile(model, args) == {"X": ((2, 3, H), (37, 3, H), (300, 3, H))}


@pytest.mark.parametrize("shapes, needle", [
    ({"input_idz": (1, 1)}, "the model has no input 'input_idz'"),
    ({"input_ids": (1, 1, 1)}, "input 'input_ids' has rank 2"),
])
def test_shapes_the_model_cannot_take_are_refused(rewrites, shapes, needle):
    original = rewrites["genai_builder"][0]
    args = argparse.Namespace(min_shapes=shapes, opt_shapes=shapes, max_shapes=shapes, min_tokens=1,
                              opt_tokens=1, max_tokens=1)
    with pytest.raises(sample.UsageError, match=needle):
        companion.input_profile(original, args)


def test_a_dimension_shared_by_two_inputs_must_get_one_size():
    graph = helper.make_graph([helper.make_node("Add", ["A", "B"], ["C"])], "two",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT16, ["n", 8]) for n in "AB"],
                              [helper.make_tensor_value_info("C", TensorProto.FLOAT16, ["n", 8])])
    model = ir.serde.deserialize_model(helper.make_model(graph))
    shapes = {"A": (4, 8), "B": (5, 8)}
    args = argparse.Namespace(min_shapes=shapes, opt_shapes=shapes, max_shapes=shapes, min_tokens=1, opt_tokens=1,
                              max_tokens=1)
    with pytest.raises(sample.UsageError, match=r"dimension 'n' is \(4, 4, 4\) in one input and \(5, 5, 5\) in 'B'"):
        companion.input_profile(model, args)


# -- inputs a model accepts ----------------------------------------------------------------------------


def test_token_ids_lie_in_the_vocabulary_and_masks_are_ones(rewrites):
    original = rewrites["genai_builder"][0]
    shapes = {"input_ids": (2, 300), "attention_mask": (2, 300), "past_key_values.0.key": (2, 1, 0, 32),
              "past_key_values.0.value": (2, 1, 0, 32), "past_key_values.1.key": (2, 1, 0, 32),
              "past_key_values.1.value": (2, 1, 0, 32)}
    values = companion.input_values(original, shapes, seed=0)
    ids = values["input_ids"].numpy()
    assert ids.min() >= 0 and ids.max() < onnx_models.VOCAB and len(np.unique(ids)) > onnx_models.VOCAB // 2
    assert values["attention_mask"].dtype == companion.torch.int64 and bool((values["attention_mask"] == 1).all())
    assert values["past_key_values.0.key"].dtype == companion.torch.float16


def test_positions_count_along_the_sequence_and_other_integer_inputs_are_refused():
    def int_input_model(name):
        graph = helper.make_graph([helper.make_node("Cast", [name], ["Y"], to=TensorProto.FLOAT)], "g",
                                  [helper.make_tensor_value_info(name, TensorProto.INT64, ["b", "s"])],
                                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", "s"])])
        return ir.serde.deserialize_model(helper.make_model(graph))

    positions = companion.input_values(int_input_model("position_ids"), {"position_ids": (2, 5)}, seed=0)
    assert positions["position_ids"].tolist() == [[0, 1, 2, 3, 4]] * 2
    with pytest.raises(sample.UsageError, match="model input 'step' is INT64 but neither token ids"):
        companion.input_values(int_input_model("step"), {"step": (2, 5)}, seed=0)


def test_a_position_input_without_dimensions_is_position_zero():
    graph = helper.make_graph([helper.make_node("Cast", ["position_ids"], ["Y"], to=TensorProto.FLOAT)], "g",
                              [helper.make_tensor_value_info("position_ids", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])])
    values = companion.input_values(ir.serde.deserialize_model(helper.make_model(graph)), {"position_ids": ()}, 0)
    assert values["position_ids"].shape == () and values["position_ids"].item() == 0


def test_a_skip_norms_bias_is_part_of_the_x_it_is_checked_against():
    """SkipSimplifiedLayerNormalization's optional bias (its fourth input) is added before the norm: the check's
    reference must add it too. X and skip zero, the bias not: the exact Y is the bias normalized, so a plugin Y one
    fp16 rounding away from TensorRT's is within the bound only if the bias is counted."""
    n = 4
    graph = helper.make_graph(
        [helper.make_node("SkipSimplifiedLayerNormalization", ["X", "S", "w", "b"], ["Y"], name="skip_norm",
                          domain="com.microsoft", epsilon=1e-6)], "g",
        [helper.make_tensor_value_info(v, TensorProto.FLOAT16, [n, H]) for v in ("X", "S")],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, [n, H])],
        initializer=[onnx.numpy_helper.from_array(np.ones(H, np.float16), "w"),
                     onnx.numpy_helper.from_array(np.linspace(-1, 1, H).astype(np.float16), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    _, (node,), left = rewrite_one(model)
    assert left == {} and node.x == ("X", "S", "b")
    bias = np.linspace(-1, 1, H).astype(np.float16).astype(np.float64)
    zeros = np.zeros((n, H))
    values = {"X": zeros, "S": zeros, "w": np.ones(H), "b": bias}
    theirs = {"Y": sample.rms_norm_reference(np.broadcast_to(bias, (n, H)), np.ones(H), 1e-6)}
    ulp = np.spacing(np.abs(theirs["Y"]).astype(np.float16)).astype(np.float64)
    ours = {"Y": theirs["Y"] + ulp}
    ok, diff = companion.check_replaced(ours, theirs, values, node)
    assert ok and diff > 0


def test_an_rmsnorm_inside_a_model_function_is_listed():
    """A mean of squares that no form serves, inside a model-local function (apply_to_model rewrites functions
    too), is listed like one in the main graph."""
    function = helper.make_function(
        "local", "MeanOfSquares", ["A"], ["B"],
        [helper.make_node("Mul", ["A", "A"], ["sq"], name="square_in_function"),
         helper.make_node("ReduceMean", ["sq"], ["B"], name="mean_in_function", axes=[-1])],
        opset_imports=[helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("MeanOfSquares", ["X"], ["Z"], name="call", domain="local")], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", H])],
                              [helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["n", 1])])
    model = helper.make_model(graph, functions=[function],
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    replaced, left = companion.rewrite_model(ir.serde.deserialize_model(model))
    assert replaced == [] and "matches no form served" in left["mean_in_function"]


def test_the_one_node_model_holds_the_samples_weights_in_every_dtype(tmp_path):
    """bf16 weights included: onnx-ir serializes a torch bf16 tensor only through its torch adapter."""
    for w_dtype in sample.WEIGHT_DTYPES:
        args = argparse.Namespace(hidden_dim=H, dtype="float16", weight_dtype=w_dtype, epsilon=1e-5, seed=3)
        path = str(tmp_path / f"{w_dtype}.onnx")
        ir.save(companion.one_node_model(args), path)
        saved = onnx.numpy_helper.to_array(onnx.load(path).graph.initializer[0])
        _, wanted = sample.make_inputs(1, H, "float16", 3, w_dtype)
        assert np.array_equal(saved.astype(np.float64), wanted.double().numpy())


@pytest.mark.parametrize("args, needle", [
    (["--seed", "-1"], "--seed must be in [0, 18446744073709551615], got -1"),
    (["--seed", str(2**64)], "--seed must be in [0, 18446744073709551615]"),
    (["--max-tokens", str(2**31)], "--max-tokens must be in [1, 2147483647]"),
    (["--hidden-dim", "32769"], "--hidden-dim must be in [1, 32768], got 32769"),
    (["--epsilon", "1e-50"], "--epsilon must be finite and > 0 in float32, got 1e-50"),
    (["--epsilon", "1e39"], "--epsilon must be finite and > 0 in float32"),
])
def test_flag_values_get_the_samples_ranges_in_one_sentence(args, needle):
    code, _, err = run_script(*args, script=COMPANION)
    assert code == EXIT_USAGE
    assert_one_sentence(err, needle)


# -- real sizes: a model over 2 GB is never loaded or serialized whole -----------------------------------


def test_a_model_over_2_gb_is_checked_rewritten_and_written_without_reading_its_weights(tmp_path):
    """The embedding table (2.5 GB, a sparse file) is never read: the whole run stays far below its size in
    memory, and the rewritten model refers to the same data file."""
    path, rows = onnx_models.huge_external_model(tmp_path)
    out = tmp_path / "huge_rmsnorm.onnx"
    code = (f"import resource, runpy, sys\nsys.argv = [{COMPANION!r}, {str(path)!r}, '--report-only', '-o', "
            f"{str(out)!r}]\ntry:\n    runpy.run_path({COMPANION!r}, run_name='__main__')\nfinally:\n"
            "    print('MAXRSS_MB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr
    assert "  norm: rms_normalization" in proc.stdout
    maxrss = int(proc.stdout.split("MAXRSS_MB")[1])
    assert maxrss < 1500, f"{maxrss} MB: the weights were read"
    written = onnx.load(str(out), load_external_data=False)
    (table,) = [t for t in written.graph.initializer if t.name == "embed.weight"]
    assert {e.key: e.value for e in table.external_data}["location"] == "huge.data"
    assert [n.op_type for n in written.graph.node] == ["Gather", sample.PLUGIN_NAME]
    assert sorted(os.listdir(tmp_path)) == ["huge.data", "huge.onnx", "huge_rmsnorm.onnx"]  # no partial file left


# -- the command line: the report first, on a CPU; one sentence and exit 2 for what a user can fix ---------


def test_the_report_runs_on_a_machine_without_a_gpu_and_writes_the_rewritten_model(exported, tmp_path):
    model = exported["genai_builder"]
    out = model.with_name("model_rmsnorm.onnx")
    code, stdout, err = run_script(str(model), "--report-only", "-o", str(out), script=COMPANION)
    assert code == 0, err
    assert f"Replaced by {sample.PLUGIN_NAME} (5):" in stdout and "Left to TensorRT (0):" in stdout
    assert "/model/layers.0/input_layernorm/LayerNorm: simplified_layer_normalization" in stdout
    written = companion.load_model(str(out))
    assert len(nodes(written, sample.PLUGIN_NAME)) == 5


def test_without_report_only_the_report_comes_before_the_gpu_check(exported):
    model = exported["llama_dynamo_opset23"]
    shapes = [f"--{p}-shapes=input_ids:1x{n},attention_mask:1x{n}" for p, n in (("min", 1), ("opt", 8), ("max", 64))]
    code, stdout, err = run_script(str(model), *shapes, script=COMPANION)
    assert code == EXIT_USAGE
    assert "Replaced by RmsNormPlugin (5):" in stdout
    assert_one_sentence(err, "no CUDA GPU")


def test_two_dynamic_dimensions_without_shapes_are_refused_after_the_report(exported):
    code, stdout, err = run_script(str(exported["llama_dynamo_opset23"]), script=COMPANION)
    assert code == EXIT_USAGE
    assert "Replaced by RmsNormPlugin" in stdout
    assert_one_sentence(err, "is a second dynamic dimension", "--min-shapes")


def test_o_outside_the_external_datas_directory_is_refused(exported, tmp_path):
    code, _, err = run_script(str(exported["llama_dynamo_opset23"]), "--report-only", "-o", str(tmp_path / "m.onnx"),
                              script=COMPANION)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "beside the model's external data")
    assert not os.path.exists(tmp_path / "m.onnx")


@pytest.mark.parametrize("args, needle", [
    (["MODEL", "--dtype", "bfloat16"], "--dtype applies to the one-node model, not to MODEL.onnx"),
    (["MODEL", "--hidden-dim", "64"], "--hidden-dim applies to the one-node model"),
    (["MODEL", "--hidden-dim", "0"], "--hidden-dim applies to the one-node model"),  # 0 is given, not absent
    (["MODEL", "--epsilon", "0"], "--epsilon applies to the one-node model"),
    (["-o", "x.onnx"], "-o applies to MODEL.onnx, which was not given"),
    (["--report-only"], "--report-only applies to MODEL.onnx"),
    (["--min-shapes", "X:1x64", "--opt-shapes", "X:1x64", "--max-shapes", "X:1x64"], "--min-shapes applies to MODEL"),
    (["MODEL", "--min-shapes", "input_ids:1x1"], "must name the same inputs"),
    (["MODEL", "--min-shapes", "input_ids:1xa"], "'input_ids:1xa' is not NAME:DIMxDIM"),
    (["/nonexistent/model.onnx"], "'/nonexistent/model.onnx' does not exist"),
    (["MODEL", "-o", "/nonexistent/dir/m.onnx"], "is not a writable directory"),
    (["MODEL", "-o", "MODEL"], "-o must not be MODEL.onnx itself"),
    (["--min-tokens", "9", "--opt-tokens", "3"], "--min-tokens <= --opt-tokens"),
])
def test_flags_a_run_cannot_use_get_one_sentence_before_any_heavy_import(tmp_path, args, needle):
    model = str(onnx_models.save(onnx_models.one_node_model(["n", H]), tmp_path / "m.onnx"))
    code, out, err = run_script(*[model if a == "MODEL" else a for a in args], prelude=REPORT_HEAVY_IMPORTS,
                                script=COMPANION)
    assert code == EXIT_USAGE
    assert_one_sentence(err, needle)
    assert heavy_imports(out) == "HEAVY []"


def test_a_file_that_is_not_onnx_gets_one_sentence(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("not a model\n")
    code, _, err = run_script(str(path), "--report-only", script=COMPANION)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "is not a valid ONNX model")


def test_a_model_without_an_rmsnorm_is_reported_then_refused_before_any_build(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["A"], ["B"])], "relu",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT16, ["n", 8])],
                              [helper.make_tensor_value_info("B", TensorProto.FLOAT16, ["n", 8])])
    path = onnx_models.save(helper.make_model(graph), tmp_path / "relu.onnx")
    code, out, err = run_script(str(path), script=COMPANION)
    assert code == EXIT_USAGE
    assert "Replaced by RmsNormPlugin (0):" in out
    assert_one_sentence(err, "replaces no RMSNorm")


def test_without_onnxscript_the_script_says_what_to_install():
    code, _, err = run_script(prelude="import sys; sys.modules['onnxscript'] = None", script=COMPANION)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "onnxscript is not installed", "pip install onnx onnx-ir onnxscript")


def test_help_documents_the_report_first_and_the_exit_codes():
    code, out, _ = run_script("--help", script=COMPANION)
    text = " ".join(out.split())
    assert code == 0
    assert "--report-only" in text and "no GPU or TensorRT needed" in text
    assert "0 every replaced node matched TensorRT's import, 1 one did not, 2 usage or environment error" in text


def test_the_report_is_the_same_in_process(rewrites, capsys):
    """print_report lists each replaced node with its form and each left one with its reason."""
    companion.print_report(*rewrites["gemma_dynamo_opset23"][2:])
    out = capsys.readouterr().out
    assert out.count("rms_normalization + Cast, X float16, scale float32, epsilon 1e-06, absorbing the Cast back") == 5


def test_no_weight_is_read_for_the_report(exported, monkeypatch):
    """The external tensors are never materialized: reading one here fails the test."""
    def refuse(self):
        raise AssertionError(f"external tensor {self.name} was read")

    monkeypatch.setattr(ir.ExternalTensor, "numpy", refuse)
    monkeypatch.setattr(ir.ExternalTensor, "tobytes", refuse)
    model = companion.load_model(str(exported["llama_dynamo_opset23"]))
    replaced, _ = companion.rewrite_model(model)
    assert len(replaced) == 5
