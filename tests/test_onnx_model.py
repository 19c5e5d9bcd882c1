"""CPU: rms_norm_onnx_model.py on what exporters write: every RMSNorm replaced or listed, both
models built.

The models are real exporter output (tests/onnx_models.py: transformers decoders
through torch's dynamo exporter at opset 23 and at its default opset, the
TorchScript exporter, and onnxruntime-genai's builder), plus one-node models
that vary one attribute at a time. Each norm after a residual Add must be
fused with it and the others replaced alone, as counted from the original
graph; onnxruntime runs the rewritten model, the plugin's nodes as functions
of its contract, as it runs the original. TensorRT-RTX (a real TensorRT-family
builder that runs on the CPU, see tests/rtx_build_worker.py) parses each
rewritten model by path, with the fused companion's plugin, and the original with its
own importers. Running the two engines and comparing them needs a GPU and
TensorRT: test_trt_onnx_model.py.
"""

import argparse
import ctypes
import functools
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import onnx_models
import rms_norm_onnx_model as companion
import rms_norm_plugin_cutedsl as sample
from test_cli import (EXIT_USAGE, REPORT_HEAVY_IMPORTS, assert_one_sentence, heavy_imports,
                      run_script)
from test_rtx_build_contract import TRT_TYPE, build_in_parallel

COMPANION = companion.__file__
LAYERS = onnx_models.CONFIG["num_hidden_layers"]
H = onnx_models.HIDDEN

NORMS = 2 * LAYERS + 1  # two per layer and the final one
SKIP_NORMS = {"simplified_layer_normalization", "skip_simplified_layer_normalization_and_sum",
              "skip_simplified_layer_normalization"}


def dynamo(family, dtype, **options):
    """How torch.onnx.export(dynamo=True) exports `family` in `dtype` into a folder."""
    return lambda folder: onnx_models.export_dynamo(folder / "m.onnx", family, dtype, **options)


def torchscript(family, dtype, **options):
    """How the TorchScript exporter exports `family` in `dtype` into a folder."""
    return lambda folder: onnx_models.export_torchscript(folder / "m.onnx", family, dtype,
                                                         **options)


def genai_style(*options):
    """How onnx_models.genai_style_model is written into a folder."""
    return lambda folder: onnx_models.save(onnx_models.genai_style_model(*options),
                                           folder / "m.onnx")


# name -> (how it is made, the forms its RMSNorms take, how many: Qwen3 has a q and a k norm per
# layer besides).
EXPORTS = {
    "llama_dynamo_opset23": (dynamo("llama", "float16", external_data=True),
                             {"rms_normalization"}, NORMS),
    "gemma_dynamo_opset23": (dynamo("gemma", "float16"), {"rms_normalization + Cast"}, NORMS),
    "qwen3_dynamo_default_opset": (dynamo("qwen3", "bfloat16", opset=None),
                                   {"decomposed_after_cast"}, NORMS + 2 * LAYERS),
    "llama_torchscript_opset17": (torchscript("llama", "float16"),
                                  {"decomposed_after_cast"}, NORMS),
    "gemma_torchscript_opset17": (torchscript("gemma", "float32"),
                                  {"decomposed_after_cast", "decomposed_in_x_dtype"}, NORMS),
    "gemma_torchscript_opset18_unfolded": (
        torchscript("gemma", "float16", opset=18, fold=False),
        {"decomposed_after_cast + Cast", "decomposed_after_cast"}, NORMS),
    "genai_builder": (onnx_models.export_genai, SKIP_NORMS, NORMS),
    "genai_builder_tensorrt_rtx_target": (lambda folder: onnx_models.export_genai(folder,
                                                                                  "NvTensorRtRtx"),
                                          {"decomposed_after_cast"}, NORMS),
    "genai_style_nodes": (genai_style(), SKIP_NORMS, 3),
    "genai_style_nodes_fp32_bias": (genai_style(np.float32, True), SKIP_NORMS, 3),
    "mistral_dynamo_default_opset_fp32_int32_inputs": (
        dynamo("mistral", "float32", opset=None, index_dtype="int32"),
        {"decomposed_in_x_dtype"}, NORMS),
    "phi3_torchscript_opset17": (torchscript("phi3", "float16"), {"decomposed_after_cast"}, NORMS),
    "phi3_torchscript_opset17_symbolic_shapes": (
        lambda folder: onnx_models.with_symbolic_shapes(torchscript("phi3", "float16")(folder)),
        {"decomposed_after_cast"}, NORMS),
}
# The builder's models hold GroupQueryAttention, an onnxruntime op no TensorRT imports; the norms
# of its CUDA target are built from genai_style_nodes, which mirror them, and its TensorRT-RTX
# target's chain is the TorchScript exporter's.
BUILT = [name for name in EXPORTS if not name.startswith("genai_builder")]


@functools.cache
def export(basetemp, name: str):
    """The path of the model EXPORTS names, exported once per session (basetemp: the session's
    temporary directory) for every test module: test_onnx_fp8.py quantizes two of them."""
    folder = basetemp / f"export_{name}"
    folder.mkdir()
    make, _, _ = EXPORTS[name]
    return make(folder)


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """{name: path} of every model in EXPORTS."""
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime_genai")
    return {name: export(tmp_path_factory.getbasetemp(), name) for name in EXPORTS}


@pytest.fixture(scope="session")
def rewrites(exported):
    """{name: (original, rewritten, replaced, left)}, each model loaded twice and the second
    rewritten."""
    results = {}
    for name, path in exported.items():
        rewritten = companion.load_model(str(path))
        replaced, left = companion.rewrite_model(rewritten)
        results[name] = (companion.load_model(str(path)), rewritten, replaced, left)
    return results


def nodes(model, op_type):
    return [node for node in model.graph if node.op_type == op_type]


def profile_args(model, low=1, opt=4, high=16):
    """The flags a user passes for this model: every dynamic dimension low/opt/high, as
    --min/opt/max-shapes."""
    def shape(value, n):
        return tuple(d if isinstance(d, int) else n for d in value.shape)

    inputs = companion.model_inputs(model)
    return argparse.Namespace(**{f"{p}_shapes": {v.name: shape(v, n) for v in inputs}
                                 for p, n in (("min", low), ("opt", opt), ("max", high))},
                              min_tokens=1, opt_tokens=128, max_tokens=512)


# -- every RMSNorm of every route, replaced or listed ---------------------------------------------


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
    # transformers' rms_norm_eps for these
    assert {r.epsilon for r in replaced} == {float(np.float32(1e-6))}


def residual_norms(path) -> dict:
    """{"fused": n, "alone": n, "unproven": n}: the model's RMSNorms, counted from its graph alone.

    A norm is after a residual Add where its X is written by an Add of two computed tensors
    (neither an initializer nor a Constant's) whose inferred shapes are one known shape;
    "unproven" counts the alone norms whose Add has two such inputs of shapes ONNX's inference
    cannot prove equal. X is followed back through a Cast to the dtype it has, and, for a
    decomposed chain, through the chain's own Cast (one only the chain reads). A skip norm is
    after its own add where its input and skip have one known shape.
    """
    proto = onnx.load(str(path), load_external_data=False)
    graph = onnx.shape_inference.infer_shapes(proto, data_prop=True).graph
    producer = {name: node for node in graph.node for name in node.output}
    readers = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    constants = {t.name for t in graph.initializer} | {
        name for name, node in producer.items() if node.op_type == "Constant"}
    types = {v.name: v.type.tensor_type for v in (*graph.value_info, *graph.input, *graph.output)}
    types.update({t.name: onnx.TypeProto.Tensor(elem_type=t.data_type) for t in graph.initializer})

    def shape(name):
        tensor_type = types.get(name)
        if tensor_type is None or not tensor_type.HasField("shape"):
            return None
        dims = [d.dim_param or (d.dim_value if d.HasField("dim_value") else None)
                for d in tensor_type.shape.dim]
        return None if None in dims else dims

    def one_shape(a, b):
        return shape(a) is not None and shape(a) == shape(b)

    def passed_cast(name, chain):
        cast = producer.get(name)
        if cast is None or cast.op_type != "Cast":
            return None
        same_dtype = types[cast.input[0]].elem_type == types[name].elem_type
        return cast.input[0] if same_dtype or {n.name for n in readers[name]} <= chain else None

    counts = {"fused": 0, "alone": 0, "unproven": 0}
    for node in graph.node:
        if node.op_type == "SkipSimplifiedLayerNormalization":
            counts["fused" if one_shape(*node.input[:2]) else "alone"] += 1
            continue
        square = producer.get(node.input[0]) if node.op_type == "ReduceMean" else None
        if node.op_type in ("RMSNormalization", "SimplifiedLayerNormalization"):
            x, chain = node.input[0], set()  # the op reads X: only a Cast to X's dtype is passed
        elif square is not None and square.op_type in ("Pow", "Mul"):
            x = square.input[0]
            # The chain's readers of its statistics: the square and the product (or quotient)
            # by the inverse RMS.
            chain = {square.name} | {
                n.name for n in readers[x] if n.op_type in ("Mul", "Div") and n is not square}
        else:
            continue
        add = producer.get(passed_cast(x, chain) or x)
        computed = add is not None and add.op_type == "Add" and not set(add.input) & constants
        counts["fused" if computed and one_shape(*add.input) else "alone"] += 1
        counts["unproven"] += computed and not one_shape(*add.input)
    return counts


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_each_norm_after_a_residual_add_is_fused_and_the_others_stay_alone(exported, rewrites,
                                                                           name):
    """The counts come from the original graph (residual_norms), not from the rewrite; every
    route has both kinds: the first layer's norm reads the embedding, Qwen3's q and k norms a
    Reshape."""
    expected = residual_norms(exported[name])
    _, rewritten, replaced, left = rewrites[name]
    fused = [r for r in replaced if r.fused]
    alone = [r for r in replaced if not r.fused]
    assert (len(fused), len(alone), len(left)) == (expected["fused"], expected["alone"], 0)
    assert expected["fused"] >= 2 and expected["alone"] >= 1
    unproven = [r for r in alone if "not known to have one shape" in r.alone]
    assert len(unproven) == expected["unproven"]
    assert all(r.alone for r in alone) and not any(r.alone for r in fused)
    plugins = nodes(rewritten, sample.PLUGIN_NAME)
    assert sorted((len(n.inputs), len(n.outputs)) for n in plugins) == sorted(
        [(2, 1)] * len(alone) + [(3, 2)] * len(fused))
    for plugin in plugins:
        fused_form = plugin.attributes.get_int(companion.RESIDUAL_ATTRIBUTE, 0)
        assert fused_form == len(plugin.inputs) - 2


def test_shapes_onnx_cannot_prove_equal_keep_norms_alone_until_symbolic_inference_does(rewrites):
    """Phi-3's MLP slices its gate and up projections at a computed offset, where ONNX's shape
    inference loses the batch and sequence dimensions: two residual Adds cannot be proven to add
    one shape. onnxruntime's symbolic shape inference proves it, and then every one is fused."""
    plain, proven = (rewrites[name][2] for name in ("phi3_torchscript_opset17",
                                                    "phi3_torchscript_opset17_symbolic_shapes"))
    assert sum("not known to have one shape" in r.alone for r in plain) == 2
    assert sum(bool(r.fused) for r in proven) == sum(bool(r.fused) for r in plain) + 2 == 2 * LAYERS


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_every_reader_of_a_fused_add_reads_the_plugins_s(rewrites, name):
    """S replaces the Add's output for every other reader (the next residual Add, a Cast to the
    dtype it has): each node of the original that read the Add's output and is still in the graph
    reads the plugin's S, which carries the Add's output's name."""
    original, rewritten, replaced, _ = rewrites[name]
    producer = {v.name: (node, k) for node in rewritten.graph for k, v in enumerate(node.outputs)}
    kept = {node.name: node for node in rewritten.graph}
    for record in (r for r in replaced if r.fused and r.sum):
        plugin, index = producer[record.sum]
        assert (plugin.op_type, plugin.name, index) == (sample.PLUGIN_NAME, record.name, 1)
        assert plugin.inputs[0].name == record.x[0]  # R: the other part, or a skip plus its bias
        readers = [node.name for node in original.graph
                   if record.sum in (v.name for v in node.inputs if v)]
        for reader in (kept[n] for n in readers if n in kept and n != record.name):
            assert record.sum in (v.name for v in reader.inputs if v), reader.name


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_the_rewritten_model_passes_onnx_checker(exported, rewrites, name):
    """The plugin's schema (declare_schemas) takes both forms, [X, W] -> [Y] and
    [X, R, W] -> [Y, S]."""
    path = exported[name].with_name("rewritten_checked.onnx")
    companion.save_model(rewrites[name][1], str(path))
    onnx.checker.check_model(str(path))


def test_gemmas_unfolded_1_plus_w_is_the_plugins_weight(rewrites):
    """do_constant_folding=False: the scale is an Add of the weight and 1, which TensorRT computes
    for the plugin."""
    original, rewritten, replaced, _ = rewrites["gemma_torchscript_opset18_unfolded"]
    for r in replaced:
        (plugin,) = [n for n in nodes(rewritten, sample.PLUGIN_NAME) if n.name == r.name]
        assert plugin.inputs[-1].name == r.scale and plugin.inputs[-1].producer().op_type == "Add"


def test_the_gemma_export_is_x_fp16_with_an_fp32_scale_and_the_cast_back_is_absorbed(rewrites):
    original, rewritten, replaced, _ = rewrites["gemma_dynamo_opset23"]
    assert {(r.dtype, r.scale_dtype, r.cast) for r in replaced} == {
        ("float16", "float32", "absorbed")}
    casts = ({n.outputs[0].name for n in nodes(original, "Cast")}
             - {n.outputs[0].name for n in nodes(rewritten, "Cast")})
    # Exactly the Casts back are gone; the plugin writes their outputs.
    assert casts == {r.y for r in replaced}
    assert {n.outputs[0].name for n in nodes(rewritten, sample.PLUGIN_NAME)} == casts


@pytest.mark.parametrize("name", ["llama_dynamo_opset23", "genai_builder",
                                  "qwen3_dynamo_default_opset"])
def test_plugin_nodes_carry_the_original_nodes_names(rewrites, name):
    original, rewritten, replaced, _ = rewrites[name]
    plugins = {n.name for n in nodes(rewritten, sample.PLUGIN_NAME)}
    assert plugins == {r.name for r in replaced}
    assert plugins <= {n.name for n in original.graph}


def test_a_skip_norm_becomes_one_fused_node_whose_s_is_the_sum_it_wrote(rewrites):
    """The skip norm's input and skip are the fused node's X and R, its sum output (the next
    layer's residual) the node's S; the last skip norm writes no sum, and its S is still written,
    named, and read by nothing."""
    original, rewritten, replaced, _ = rewrites["genai_style_nodes"]
    plugins = {n.name: n for n in nodes(rewritten, sample.PLUGIN_NAME)}
    for skip in nodes(original, "SkipSimplifiedLayerNormalization"):
        plugin = plugins[skip.name]
        assert [v.name for v in plugin.inputs] == [v.name for v in skip.inputs[:3]]
        assert plugin.outputs[0].name == skip.outputs[0].name
        if len(skip.outputs) == 4:
            assert plugin.outputs[1].name == skip.outputs[3].name and plugin.outputs[1].uses()
        else:
            assert plugin.outputs[1].name and not plugin.outputs[1].uses()
    assert not nodes(rewritten, "Add")  # no add of TensorRT's: the plugin adds


def test_a_skip_norms_bias_is_added_to_the_skip_first_and_the_report_says_so(rewrites, capsys):
    """The fused node adds two tensors, so TensorRT adds the bias (the op's fourth input) to the
    skip first: S rounds skip + bias too, which onnxruntime's kernel does not, and the record's x
    keeps all three parts, so that the check's reference sums all three."""
    original, rewritten, replaced, _ = rewrites["genai_style_nodes_fp32_bias"]
    plugins = {n.name: n for n in nodes(rewritten, sample.PLUGIN_NAME)}
    for skip in nodes(original, "SkipSimplifiedLayerNormalization"):
        x, r, w = plugins[skip.name].inputs
        assert (x.name, w.name) == (skip.inputs[0].name, skip.inputs[2].name)
        assert r.producer().op_type == "Add"
        assert [v.name for v in r.producer().inputs] == [skip.inputs[1].name, skip.inputs[3].name]
        (record,) = [rec for rec in replaced if rec.name == skip.name]
        assert record.x == tuple(v.name for v in (skip.inputs[0], skip.inputs[1], skip.inputs[3]))
    companion.print_report(*rewrites["genai_style_nodes_fp32_bias"][2:])
    said = "TensorRT adds the bias to the skip first, so S also rounds"
    assert capsys.readouterr().out.count(said) == 2


def model_spec(model_path, shapes, watched, target="SM80") -> dict:
    """The worker's spec of a build of the ONNX file at model_path for the profile `shapes`,
    `watched` marked as outputs too, as build_engine builds it."""
    return dict(source="model", model_path=model_path, shapes=shapes, watched=watched,
                compute_capability=target)


def rtx_builds(lib_dir, specs: list) -> list:
    """The worker's report (a Build) of each spec, built by TensorRT-RTX in worker processes at once."""
    built = build_in_parallel(lib_dir, {str(i): spec for i, spec in enumerate(specs)})
    return [built[str(i)] for i in range(len(specs))]


@pytest.fixture(scope="session")
def builds(rewrites, exported, rtx_lib_dir):
    """{name: (rewritten build, original build, watched)}: both models built by TensorRT-RTX from
    their files, with every replaced node's tensors also outputs, as the companion builds them."""
    specs, watched = [], {}
    for name in BUILT:
        original, rewritten, replaced, _ = rewrites[name]
        profile = companion.input_profile(original, profile_args(original))
        watched[name] = [t for r in replaced for t in (*r.x, r.y, r.sum)
                         if t and t not in profile and t not in original.graph.initializers]
        path = str(exported[name].with_name("rewritten.onnx"))
        companion.save_model(rewritten, path)
        shapes = {k: [list(s) for s in v] for k, v in profile.items()}
        specs += [model_spec(p, shapes, watched[name]) for p in (path, str(exported[name]))]
    reports = rtx_builds(rtx_lib_dir, specs)
    return {name: (reports[2 * k], reports[2 * k + 1], watched[name])
            for k, name in enumerate(BUILT)}


@pytest.mark.parametrize("name", BUILT)
def test_tensorrt_rtx_builds_the_rewritten_model_with_the_plugin_and_the_original_without(
        builds, rewrites, name):
    rewritten, original, watched = builds[name]
    for build in (rewritten, original):
        assert build["parse_ok"], build.messages()
        assert build["build_ok"], build.messages()
        assert set(watched) <= {out for out, _ in build["outputs"]}
    replaced = rewrites[name][2]
    calls = rewritten["configure_plugin"]
    assert len(calls) == len(replaced)  # every plugin node reached the builder
    assert {call["inputs"][0]["type"] for call in calls} == {TRT_TYPE[r.dtype] for r in replaced}
    fused = [call for call in calls if len(call["inputs"]) == 3]
    assert len(fused) == sum(bool(r.fused) for r in replaced)  # the fused form: X, R, W; Y, S
    assert all(len(call["outputs"]) == 2 and call["inputs"][1]["type"] == call["inputs"][0]["type"]
               for call in fused)
    assert original["configure_plugin"] == []


def test_int32_inputs_reach_tensorrt_as_int32(builds):
    """The exported model's input_ids and attention_mask are INT32; both networks take them as
    INT32, the dtype the companion feeds (see test_an_int32_input_is_fed_as_int32_bytes)."""
    for build in builds["mistral_dynamo_default_opset_fp32_int32_inputs"][:2]:
        assert build["parse_ok"], build.messages()
        assert dict(build["inputs"]) == {"input_ids": "DataType.INT32",
                                         "attention_mask": "DataType.INT32"}


def test_the_external_data_model_is_built_from_its_file_beside_the_data(exported, builds):
    path = exported["llama_dynamo_opset23"]
    assert os.path.getsize(f"{path}.data") > 100_000  # the weights are there, not in the graph
    assert any(t.data_location == TensorProto.EXTERNAL
               for t in onnx.load(str(path), load_external_data=False).graph.initializer)
    assert builds["llama_dynamo_opset23"][0]["build_ok"]


# -- onnxruntime runs the rewritten model, the plugin's nodes as functions of its contract -------

# Routes whose fused sums onnxruntime computes as the graph rounds them: FP32. Its CPU provider
# runs an FP16 op that has no FP16 kernel in FP32 and drops the Cast pair between two such ops, so
# an FP16 tensor the graph rounds can reach the next op unrounded (while the tensor it reports is
# rounded), beyond any bound on the graph's own roundings.
ONNXRUNTIME_CHECKED = ["gemma_torchscript_opset17", "genai_style_nodes_fp32_bias",
                       "llama_torchscript_opset17",
                       "mistral_dynamo_default_opset_fp32_int32_inputs",
                       "phi3_torchscript_opset17_symbolic_shapes"]


def run_onnxruntime(model, feeds: dict) -> dict:
    """{output name: float64 array} of onnxruntime's CPU run of a ModelProto, its graph
    optimizations off (they would fuse the original's Add and norm into onnxruntime's skip op)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    outputs = session.get_outputs()
    names = [o.name for o in outputs]
    values = session.run(names, feeds)
    # onnxruntime hands an FP8 tensor over as its bytes (uint8): read them as E4M3FN.
    fp8 = ml_dtypes.float8_e4m3fn
    return {o.name: (value.view(fp8) if o.type == "tensor(float8e4m3fn)" else value)
            .astype(np.float64) for o, value in zip(outputs, values)}


@pytest.mark.parametrize("name", ONNXRUNTIME_CHECKED)
def test_onnxruntime_computes_the_rewritten_model_as_the_original(exported, rewrites, name):
    """Every replaced node's Y, and each fused node's S, within the companion's bounds of the
    original's (check_replaced, check_sum), and the logits within FP32 noise: S wired to the
    wrong readers would move them by their own size."""
    original, rewritten, replaced, _ = rewrites[name]
    assert {r.dtype for r in replaced if r.fused} == {"float32"}
    profile = companion.input_profile(original, profile_args(original, 2, 7, 9))
    shapes = {input_name: shapes[1] for input_name, shapes in profile.items()}
    feeds = {k: v.numpy() for k, v in companion.input_values(original, shapes, seed=0).items()}
    source = onnx.load(str(exported[name]))
    weights = {t.name: onnx.numpy_helper.to_array(t).astype(np.float64)
               for t in source.graph.initializer}
    watched = [t for r in replaced for t in (*r.x, r.scale, r.y, r.sum)
               if t and t not in weights and t not in feeds]
    source.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in watched)
    path = exported[name].with_name("rewritten_for_onnxruntime.onnx")
    companion.save_model(rewritten, str(path))
    runnable = onnx_models.runnable_by_onnxruntime(onnx.load(str(path)), watched)
    ours, theirs = run_onnxruntime(runnable, feeds), run_onnxruntime(source, feeds)
    values = {**weights, **{k: v.astype(np.float64) for k, v in feeds.items()}}
    for record in replaced:
        assert companion.check_replaced(ours, theirs, values, record)[0], record.name
        assert not record.sum or companion.check_sum(ours, theirs, values, record)[0], record.name
    logits = theirs["logits"]
    assert np.max(np.abs(ours["logits"] - logits)) <= 1e-4 * np.max(np.abs(logits))


# -- one attribute at a time: what is served, what is left and why --------------------------------


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
    # rank 3: axis 3 is no axis at all
    (dict(x_shape=["n", 4, H], axis=3), "normalizes from axis 3"),
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
    (TensorProto.FLOAT16, TensorProto.FLOAT, "appended"),
    (TensorProto.FLOAT, TensorProto.BFLOAT16, "appended"),
    (TensorProto.BFLOAT16, TensorProto.BFLOAT16, "")])
def test_x_and_scale_of_any_pair_the_plugin_takes_are_served(x_type, scale_type, cast):
    """Without a Cast back, ONNX's Y has the scale's dtype: the plugin's Y (X's dtype) is cast to
    it."""
    model = onnx_models.one_node_model(["n", H], x_type=x_type, scale_type=scale_type)
    rewritten, replaced, left = rewrite_one(model)
    assert left == {} and replaced[0].cast == cast
    y = rewritten.graph.outputs[0]
    assert y.name == "Y" and y.producer().op_type == ("Cast" if cast else sample.PLUGIN_NAME)


def test_a_mean_of_squares_the_forms_do_not_cover_is_listed():
    """A decomposed chain whose statistics stay in float16 (no Cast to FP32) is left, and says
    why; a mean of squares in no known form (here its square root is missing) is listed too."""
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
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    _, replaced, left = rewrite_one(model)
    assert replaced == []
    assert "computes its statistics in float16" in left["scale"]
    assert "matches no form served" in left["mean_of_squares"]
    assert set(left) == {"scale", "mean_of_squares"}


# -- which Add is fused: two activations of one shape and dtype ---------------------------------


def residual_model(b_shape=("n", H), b_kind="input", cast=None, cast_read_elsewhere=True,
                   dtype=TensorProto.FLOAT16):
    """S = A + B, then RMSNormalization of S (or of S cast to `cast`) and, as a decoder's next
    residual, A + S. B is a graph input of `b_shape`, an initializer ("initializer") or a Constant
    node's output ("constant")."""
    static = [d for d in b_shape if isinstance(d, int)]
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    b_value = np.linspace(-1, 1, int(np.prod(static))).astype(np_dtype)
    nodes = []
    if b_kind == "constant":
        nodes.append(helper.make_node("Constant", [], ["B"], value=onnx.numpy_helper.from_array(
            b_value.reshape(static), "B")))
    nodes += [helper.make_node("Add", ["A", "B"], ["sum"], name="residual_add"),
              helper.make_node("Add", ["A", "sum"], ["next"], name="next_residual")]
    x, norm_dtype, outputs = "sum", dtype, ["Y", "next"]
    if cast is not None:
        nodes.append(helper.make_node("Cast", ["sum"], ["sum_cast"], name="cast", to=cast))
        x, norm_dtype = "sum_cast", cast
        if cast_read_elsewhere:
            nodes.append(helper.make_node("Identity", ["sum_cast"], ["copy"], name="reader"))
            outputs.append("copy")
    nodes.append(helper.make_node("RMSNormalization", [x, "w"], ["Y"], name="norm", epsilon=1e-6))
    initializers = [onnx.numpy_helper.from_array(
        np.ones(H, helper.tensor_dtype_to_np_dtype(norm_dtype)), "w")]
    if b_kind == "initializer":
        initializers.append(onnx.numpy_helper.from_array(b_value, "B"))
    inputs = [helper.make_tensor_value_info("A", dtype, ["n", H])]
    if b_kind == "input":
        inputs.append(helper.make_tensor_value_info("B", dtype, list(b_shape)))
    graph = helper.make_graph(nodes, "residual", inputs, [
        helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None) for name in outputs],
        initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def skip_norm_model(nodes, inputs, outputs):
    """A graph of SkipSimplifiedLayerNormalization `nodes` (and others), its weight w all ones."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=[
        onnx.numpy_helper.from_array(np.ones(H, np.float16), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid("com.microsoft", 1)])


def test_an_add_of_two_activations_of_one_shape_is_fused_and_the_next_residual_reads_s():
    rewritten, (record,), left = rewrite_one(residual_model())
    assert left == {} and (record.x, record.sum, record.alone) == (("A", "B"), "sum", "")
    assert "with the Add residual_add" in record.fused
    assert not [n for n in rewritten.graph if n.name == "residual_add"]
    (plugin,) = nodes(rewritten, sample.PLUGIN_NAME)
    assert [v.name for v in plugin.inputs] == ["A", "B", "w"]
    assert [v.name for v in plugin.outputs] == ["Y", "sum"]
    (next_residual,) = [n for n in rewritten.graph if n.name == "next_residual"]
    assert next_residual.inputs[1] is plugin.outputs[1]
    onnx.checker.check_model(ir.serde.serialize_model(rewritten))  # also: S before its reader


@pytest.mark.parametrize("model_args, why", [
    (dict(b_shape=(H,), b_kind="initializer"), "the Add's input 'B' is a constant, not an"),
    (dict(b_shape=(4, H), b_kind="constant"), "the Add's input 'B' is a constant, not an"),
    (dict(b_shape=(1, H)), "the Add's inputs are not known to have one shape ([n,64] and [1,64]"),
    (dict(b_shape=("m", H)), "the Add's inputs are not known to have one shape ([n,64] and [m,64]"),
    (dict(b_shape=("n", 1, H)), "the Add's inputs differ in shape ([n,64] and [n,1,64])"),
    (dict(cast=TensorProto.FLOAT), "its X is not an Add of two activations (a Cast writes it)"),
])
def test_an_add_the_fused_form_cannot_take_leaves_the_norm_alone_and_says_why(model_args, why):
    """A bias (a constant, broadcast or not), a broadcast or unproven shape, or the sum cast to
    another dtype (the plugin's S has X's dtype, not the Add's): the norm is replaced alone and
    the Add stays."""
    rewritten, (record,), left = rewrite_one(residual_model(**model_args))
    assert left == {} and not record.fused and record.alone.startswith(why), record.alone
    assert [n.name for n in rewritten.graph if n.name == "residual_add"] == ["residual_add"]
    (plugin,) = nodes(rewritten, sample.PLUGIN_NAME)
    assert len(plugin.inputs) == 2 and len(plugin.outputs) == 1


@pytest.mark.parametrize("read_elsewhere", [True, False])
def test_a_cast_to_the_dtype_the_sum_has_is_passed_and_kept_only_where_read(read_elsewhere):
    """Gemma's FP32 TorchScript export casts its FP32 residual to FP32 before the norm: the Add
    is still fused, and the Cast stays, reading S, where another node reads it, else it goes."""
    model = residual_model(dtype=TensorProto.FLOAT, cast=TensorProto.FLOAT,
                           cast_read_elsewhere=read_elsewhere)
    rewritten, (record,), _ = rewrite_one(model)
    assert record.fused and record.x == ("A", "B") and record.sum == "sum"
    assert [c.inputs[0].name for c in nodes(rewritten, "Cast")] == ["sum"] * read_elsewhere
    onnx.checker.check_model(ir.serde.serialize_model(rewritten))


def test_a_skip_broadcast_over_its_input_is_added_by_tensorrt_and_the_norm_stays_alone():
    """onnxruntime's skip op may broadcast its skip over the input; the fused form takes R of X's
    shape, so TensorRT adds them and the plain form normalizes the sum (still the sum output)."""
    model = skip_norm_model(
        [helper.make_node("SkipSimplifiedLayerNormalization", ["X", "K", "w"], ["Y", "", "", "T"],
                          name="skip_norm", domain="com.microsoft", epsilon=1e-6)],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT16, ["n", 4, H]),
         helper.make_tensor_value_info("K", TensorProto.FLOAT16, [4, H])],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT16, ["n", 4, H]) for v in ("Y", "T")])
    rewritten, (record,), _ = rewrite_one(model)
    assert not record.fused and record.alone.startswith("its input and skip differ in shape")
    (plugin,) = nodes(rewritten, sample.PLUGIN_NAME)
    (add,) = nodes(rewritten, "Add")
    assert plugin.inputs[0] is add.outputs[0] and add.outputs[0].name == "T"


def test_the_unread_s_of_a_skip_norm_gets_a_name_no_other_value_has():
    model = skip_norm_model(
        [helper.make_node("Identity", ["X"], ["skip_norm/sum"], name="taken"),
         helper.make_node("SkipSimplifiedLayerNormalization", ["X", "K", "w"], ["Y"],
                          name="skip_norm", domain="com.microsoft", epsilon=1e-6)],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT16, ["n", H]) for v in ("X", "K")],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT16, ["n", H])
         for v in ("Y", "skip_norm/sum")])
    rewritten, (record,), _ = rewrite_one(model)
    (plugin,) = nodes(rewritten, sample.PLUGIN_NAME)
    assert record.fused and record.sum == "" and plugin.outputs[1].name == "skip_norm/sum_1"
    onnx.checker.check_model(ir.serde.serialize_model(rewritten))


# -- the profile: every dynamic dimension, from the flags -----------------------------------------


def test_shapes_named_per_input_fix_every_dimension_and_inputs_sharing_a_name(rewrites):
    original = rewrites["llama_dynamo_opset23"][0]
    args = profile_args(original)
    for shapes in (args.min_shapes, args.opt_shapes, args.max_shapes):
        del shapes["attention_mask"]
    profile = companion.input_profile(original, args)
    assert profile == {"input_ids": ((1, 1), (4, 4), (16, 16)),
                       "attention_mask": ((1, 1), (4, 4), (16, 16))}


def test_two_dynamic_dimensions_and_only_the_token_flags_are_refused_naming_the_second(rewrites):
    original = rewrites["genai_builder"][0]
    args = argparse.Namespace(min_shapes=None, opt_shapes=None, max_shapes=None, min_tokens=1,
                              opt_tokens=2, max_tokens=3)
    refusal = "dimension 'sequence_length' is a second dynamic dimension besides 'batch_size'"
    with pytest.raises(sample.UsageError, match=refusal):
        companion.input_profile(original, args)


def test_one_dynamic_dimension_takes_the_token_flags():
    model = ir.serde.deserialize_model(onnx_models.one_node_model(["n", 3, H]))
    args = argparse.Namespace(min_shapes=None, opt_shapes=None, max_shapes=None, min_tokens=2,
                              opt_tokens=37, max_tokens=300)
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
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["C"])], "two",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT16, ["n", 8]) for n in "AB"],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT16, ["n", 8])])
    model = ir.serde.deserialize_model(helper.make_model(graph))
    shapes = {"A": (4, 8), "B": (5, 8)}
    args = argparse.Namespace(min_shapes=shapes, opt_shapes=shapes, max_shapes=shapes, min_tokens=1,
                              opt_tokens=1, max_tokens=1)
    refusal = r"dimension 'n' is \(4, 4, 4\) in one input and \(5, 5, 5\) in 'B'"
    with pytest.raises(sample.UsageError, match=refusal):
        companion.input_profile(model, args)


# -- inputs a model accepts -----------------------------------------------------------------------


def test_token_ids_lie_in_the_vocabulary_and_masks_are_ones(rewrites):
    original = rewrites["genai_builder"][0]
    shapes = {"input_ids": (2, 300), "attention_mask": (2, 300),
              "past_key_values.0.key": (2, 1, 0, 32), "past_key_values.0.value": (2, 1, 0, 32),
              "past_key_values.1.key": (2, 1, 0, 32), "past_key_values.1.value": (2, 1, 0, 32)}
    values = companion.input_values(original, shapes, seed=0)
    ids = values["input_ids"].numpy()
    assert ids.min() >= 0 and ids.max() < onnx_models.VOCAB
    assert len(np.unique(ids)) > onnx_models.VOCAB // 2
    mask = values["attention_mask"]
    assert mask.dtype == companion.torch.int64 and bool((mask == 1).all())
    assert values["past_key_values.0.key"].dtype == companion.torch.float16


class EngineInputs:
    """What bind_inputs asks of an engine: the dtype it reads each input as, by TensorRT's name."""

    def __init__(self, dtypes: dict):
        self.dtypes = dtypes

    def get_tensor_dtype(self, name):
        return argparse.Namespace(name=self.dtypes[name])


class RecordedBindings:
    """An execution context that keeps the shape and address bound to each input."""

    def __init__(self):
        self.shapes, self.addresses = {}, {}

    def set_input_shape(self, name, shape):
        self.shapes[name] = shape

    def set_tensor_address(self, name, address):
        self.addresses[name] = address


def test_an_int32_input_is_fed_as_int32_bytes(exported):
    """The bytes at each bound address, read as TensorRT reads an INT32 input: token ids within the
    vocabulary and a mask of ones. Fed as int64, the mask would read 1, 0, 1, 0, ..."""
    path = exported["mistral_dynamo_default_opset_fp32_int32_inputs"]
    declared = {v.name: v.type.tensor_type.elem_type
                for v in onnx.load(str(path), load_external_data=False).graph.input}
    assert declared == {"input_ids": TensorProto.INT32, "attention_mask": TensorProto.INT32}
    shapes = {name: (2, 9) for name in declared}
    feeds = companion.input_values(companion.load_model(str(path)), shapes, seed=0)
    context = RecordedBindings()
    companion.bind_inputs(EngineInputs({name: "INT32" for name in declared}), context, feeds)
    assert context.shapes == shapes
    read = {name: np.ctypeslib.as_array((ctypes.c_int32 * 18).from_address(address)).reshape(2, 9)
            for name, address in context.addresses.items()}
    assert (read["attention_mask"] == 1).all()
    assert read["input_ids"].min() >= 0 and read["input_ids"].max() < onnx_models.VOCAB
    assert len(np.unique(read["input_ids"])) > 9  # ids, not a pattern of halves


def test_a_feed_of_another_dtype_than_the_engine_reads_is_refused():
    feeds = {"attention_mask": companion.torch.ones((2, 3), dtype=companion.torch.int64)}
    with pytest.raises(TypeError, match="'attention_mask' is torch.int64, but the engine reads it "
                                        "as INT32"):
        companion.bind_inputs(EngineInputs({"attention_mask": "INT32"}), RecordedBindings(), feeds)


def test_positions_count_along_the_sequence_and_other_integer_inputs_are_refused():
    def int_input_model(name):
        graph = helper.make_graph(
            [helper.make_node("Cast", [name], ["Y"], to=TensorProto.FLOAT)], "g",
            [helper.make_tensor_value_info(name, TensorProto.INT64, ["b", "s"])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", "s"])])
        return ir.serde.deserialize_model(helper.make_model(graph))

    positions = companion.input_values(int_input_model("position_ids"), {"position_ids": (2, 5)},
                                       seed=0)
    assert positions["position_ids"].tolist() == [[0, 1, 2, 3, 4]] * 2
    refusal = "model input 'step' is INT64 but neither token ids"
    with pytest.raises(sample.UsageError, match=refusal):
        companion.input_values(int_input_model("step"), {"step": (2, 5)}, seed=0)


def test_a_position_input_without_dimensions_is_position_zero():
    graph = helper.make_graph(
        [helper.make_node("Cast", ["position_ids"], ["Y"], to=TensorProto.FLOAT)], "g",
        [helper.make_tensor_value_info("position_ids", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])])
    model = ir.serde.deserialize_model(helper.make_model(graph))
    values = companion.input_values(model, {"position_ids": ()}, 0)
    assert values["position_ids"].shape == () and values["position_ids"].item() == 0


def test_a_skip_norms_bias_is_part_of_the_x_it_is_checked_against():
    """SkipSimplifiedLayerNormalization's optional bias (its fourth input) is added before the
    norm: the check's reference must add it too. X and skip zero, the bias not: the exact Y is the
    bias normalized, so a plugin Y one fp16 rounding away from TensorRT's is within the bound only
    if the bias is counted."""
    n = 4
    graph = helper.make_graph(
        [helper.make_node("SkipSimplifiedLayerNormalization", ["X", "S", "w", "b"], ["Y"],
                          name="skip_norm", domain="com.microsoft", epsilon=1e-6)], "g",
        [helper.make_tensor_value_info(v, TensorProto.FLOAT16, [n, H]) for v in ("X", "S")],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, [n, H])],
        initializer=[onnx.numpy_helper.from_array(np.ones(H, np.float16), "w"),
                     onnx.numpy_helper.from_array(np.linspace(-1, 1, H).astype(np.float16), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.microsoft", 1)])
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
    """A mean of squares that no form serves, inside a model-local function (apply_to_model
    rewrites functions too), is listed like one in the main graph."""
    function = helper.make_function(
        "local", "MeanOfSquares", ["A"], ["B"],
        [helper.make_node("Mul", ["A", "A"], ["sq"], name="square_in_function"),
         helper.make_node("ReduceMean", ["sq"], ["B"], name="mean_in_function", axes=[-1])],
        opset_imports=[helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("MeanOfSquares", ["X"], ["Z"], name="call", domain="local")], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", H])],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["n", 1])])
    model = helper.make_model(graph, functions=[function],
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("local", 1)])
    replaced, left = companion.rewrite_model(ir.serde.deserialize_model(model))
    assert replaced == [] and "matches no form served" in left["mean_in_function"]


def test_the_one_node_model_holds_the_samples_weights_in_every_dtype(tmp_path):
    """bf16 weights included: onnx-ir serializes a torch bf16 tensor only through its torch
    adapter."""
    for w_dtype in sample.WEIGHT_DTYPES:
        args = argparse.Namespace(hidden_dim=H, dtype="float16", weight_dtype=w_dtype,
                                  epsilon=1e-5, seed=3)
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
def test_flag_values_get_the_samples_ranges_in_one_sentence(capsys, args, needle):
    """main() as the script calls it (the tests below run the script itself)."""
    assert companion.main(companion.parse_args(args)) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, needle)


# -- real sizes: a model over 2 GB is never loaded or serialized whole ----------------------------


def test_a_model_over_2_gb_is_checked_rewritten_and_written_without_reading_its_weights(tmp_path):
    """The embedding table (2.5 GB, a sparse file) is never read: the whole run stays far below
    its size in memory, and the rewritten model refers to the same data file."""
    path, rows = onnx_models.huge_external_model(tmp_path)
    out = tmp_path / "huge_rmsnorm.onnx"
    argv = [COMPANION, str(path), "--report-only", "-o", str(out)]
    code = (f"import resource, runpy, sys\nsys.argv = {argv!r}\n"
            f"try:\n    runpy.run_path({COMPANION!r}, run_name='__main__')\nfinally:\n"
            "    print('MAXRSS_MB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr
    assert "  norm: rms_normalization" in proc.stdout
    maxrss = int(proc.stdout.split("MAXRSS_MB")[1])
    assert maxrss < 1500, f"{maxrss} MB: the weights were read"
    written = onnx.load(str(out), load_external_data=False)
    (table,) = [t for t in written.graph.initializer if t.name == "embed.weight"]
    assert {e.key: e.value for e in table.external_data}["location"] == "huge.data"
    assert [n.op_type for n in written.graph.node] == ["Gather", sample.PLUGIN_NAME]
    # No partial file left.
    assert sorted(os.listdir(tmp_path)) == ["huge.data", "huge.onnx", "huge_rmsnorm.onnx"]


# -- the command line: the report first, on a CPU; one sentence and exit 2 for what a user can fix -


def test_the_report_runs_on_a_machine_without_a_gpu_and_writes_the_rewritten_model(exported,
                                                                                   tmp_path):
    model = exported["genai_builder"]
    out = model.with_name("model_rmsnorm.onnx")
    code, stdout, err = run_script(str(model), "--report-only", "-o", str(out), script=COMPANION)
    assert code == 0, err
    assert f"Fused with their residual Add into {sample.PLUGIN_NAME} (4):" in stdout
    assert f"Replaced alone by {sample.PLUGIN_NAME} (1):" in stdout
    assert "Left to TensorRT (0):" in stdout
    assert "/model/layers.0/input_layernorm/LayerNorm: simplified_layer_normalization" in stdout
    written = companion.load_model(str(out))
    assert len(nodes(written, sample.PLUGIN_NAME)) == 5


def test_without_report_only_the_report_comes_before_the_gpu_check(exported):
    model = exported["llama_dynamo_opset23"]
    shapes = [f"--{p}-shapes=input_ids:1x{n},attention_mask:1x{n}"
              for p, n in (("min", 1), ("opt", 8), ("max", 64))]
    code, stdout, err = run_script(str(model), *shapes, script=COMPANION)
    assert code == EXIT_USAGE
    assert "Fused with their residual Add into RmsNormPlugin (4):" in stdout
    assert_one_sentence(err, "no CUDA GPU")


def test_two_dynamic_dimensions_without_shapes_are_refused_after_the_report(exported, capsys):
    args = companion.parse_args([str(exported["llama_dynamo_opset23"])])
    assert companion.main(args) == EXIT_USAGE
    stdout, err = capsys.readouterr()
    assert "Replaced alone by RmsNormPlugin" in stdout
    assert_one_sentence(err, "is a second dynamic dimension", "--min-shapes")


def test_o_outside_the_external_datas_directory_is_refused(exported, tmp_path, capsys):
    args = companion.parse_args([str(exported["llama_dynamo_opset23"]), "--report-only",
                                 "-o", str(tmp_path / "m.onnx")])
    assert companion.main(args) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, "beside the model's external data")
    assert not os.path.exists(tmp_path / "m.onnx")


@pytest.mark.parametrize("args, needle", [
    (["MODEL", "--dtype", "bfloat16"], "--dtype applies to the one-node model, not to MODEL.onnx"),
    (["MODEL", "--hidden-dim", "64"], "--hidden-dim applies to the one-node model"),
    # 0 is given, not absent
    (["MODEL", "--hidden-dim", "0"], "--hidden-dim applies to the one-node model"),
    (["MODEL", "--epsilon", "0"], "--epsilon applies to the one-node model"),
    (["-o", "x.onnx"], "-o applies to MODEL.onnx, which was not given"),
    (["--report-only"], "--report-only applies to MODEL.onnx"),
    (["--min-shapes", "X:1x64", "--opt-shapes", "X:1x64", "--max-shapes", "X:1x64"],
     "--min-shapes applies to MODEL"),
    (["MODEL", "--min-shapes", "input_ids:1x1"], "must name the same inputs"),
    (["MODEL", "--min-shapes", "input_ids:1xa"], "'input_ids:1xa' is not NAME:DIMxDIM"),
    (["/nonexistent/model.onnx"], "'/nonexistent/model.onnx' does not exist"),
    (["MODEL", "-o", "/nonexistent/dir/m.onnx"], "is not a writable directory"),
    (["MODEL", "-o", "MODEL"], "-o must not be MODEL.onnx itself"),
    (["--min-tokens", "9", "--opt-tokens", "3"], "--min-tokens <= --opt-tokens"),
])
def test_flags_a_run_cannot_use_get_one_sentence_before_any_heavy_import(tmp_path, args, needle):
    model = str(onnx_models.save(onnx_models.one_node_model(["n", H]), tmp_path / "m.onnx"))
    code, out, err = run_script(*[model if a == "MODEL" else a for a in args],
                                prelude=REPORT_HEAVY_IMPORTS, script=COMPANION)
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
    assert "Fused with their residual Add into RmsNormPlugin (0):" in out
    assert "Replaced alone by RmsNormPlugin (0):" in out
    assert_one_sentence(err, "replaces no RMSNorm")


def test_without_onnxscript_the_script_says_what_to_install():
    code, _, err = run_script(prelude="import sys; sys.modules['onnxscript'] = None",
                              script=COMPANION)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "onnxscript is not installed", "pip install onnx onnx-ir onnxscript")


def test_help_documents_the_report_first_and_the_exit_codes():
    code, out, _ = run_script("--help", script=COMPANION)
    text = " ".join(out.split())
    assert code == 0
    assert "--report-only" in text and "no GPU or TensorRT needed" in text
    assert ("0 every replaced node matched TensorRT's import, 1 one did not, 2 usage or "
            "environment error") in text


def test_the_report_is_the_same_in_process(rewrites, capsys):
    """print_report lists each replaced node with its form, fused with which Add or alone and why,
    and each left one with its reason."""
    companion.print_report(*rewrites["gemma_dynamo_opset23"][2:])
    out = capsys.readouterr().out
    assert out.count("rms_normalization + Cast, X float16, scale float32, epsilon 1e-06, "
                     "absorbing the Cast back") == 5
    fused, alone = out.split("Replaced alone by")
    assert fused.count("; with the Add node_add_") == 4 and "S replaces its output 'add_" in fused
    assert alone.count("; alone: its X is not an Add of two activations (a Mul writes it)") == 1


def test_no_weight_is_read_for_the_report(exported, monkeypatch):
    """The external tensors are never materialized: reading one here fails the test."""
    def refuse(self):
        raise AssertionError(f"external tensor {self.name} was read")

    monkeypatch.setattr(ir.ExternalTensor, "numpy", refuse)
    monkeypatch.setattr(ir.ExternalTensor, "tobytes", refuse)
    model = companion.load_model(str(exported["llama_dynamo_opset23"]))
    replaced, _ = companion.rewrite_model(model)
    assert len(replaced) == 5
