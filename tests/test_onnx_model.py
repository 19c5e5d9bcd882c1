"""CPU: --from-onnx MODEL.onnx: which nodes the plugin takes over, the profile, and both engines built.

The decoder-style model is exported by torch (tests/onnx_models.py); the
rewrite is rms_norm_onnx_model.rewrite_model; TensorRT-RTX (a real
TensorRT-family builder that runs on the CPU, see tests/rtx_build_worker.py)
parses and builds the rewritten model with the sample's plugin and the
original with its own RMSNormalization import. Running the two engines and
comparing them needs a GPU and TensorRT: test_trt_end_to_end.py.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx_models
import rms_norm_onnx_model as rewrite
import rms_norm_plugin_cutedsl as sample
from test_cli import EXIT_USAGE, assert_one_sentence, run_script
from test_rtx_build_contract import run_worker


@pytest.fixture(scope="module")
def decoder_path(tmp_path_factory):
    pytest.importorskip("onnxscript")  # torch's ONNX exporter needs it; requirements-test.txt has it
    path = tmp_path_factory.mktemp("decoder") / "decoder.onnx"
    onnx_models.export_decoder(path)
    return path


@pytest.fixture(scope="module")
def decoder(decoder_path):
    return rewrite.load_model(str(decoder_path))


def nodes(model, op_type):
    return [node for node in model.graph.node if node.op_type == op_type]


def attributes(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# -- the exported model, and what the rewrite makes of it ------------------------------------------


def test_the_exporter_writes_rms_normalization_with_fp16_scales(decoder):
    """The premise of the real-model tests: torch.nn.RMSNorm exports as ONNX's op, stash_type 1, last axis."""
    norms = nodes(decoder, "RMSNormalization")
    assert len(norms) == 2
    assert [attributes(n)["stash_type"] for n in norms] == [1, 1]
    types = rewrite.tensor_types(decoder)
    assert {types[n.input[1]][0] for n in norms} == {TensorProto.FLOAT16}
    assert types[norms[0].input[0]][1] == [onnx_models.BATCH, None, onnx_models.HIDDEN]


def test_both_norms_become_plugin_nodes_with_the_same_tensors_and_epsilon(decoder):
    rewritten, replaced, left = rewrite.rewrite_model(decoder)
    assert left == {}
    assert not nodes(rewritten, "RMSNormalization")
    plugins = nodes(rewritten, sample.PLUGIN_NAME)
    originals = nodes(decoder, "RMSNormalization")
    assert [(list(p.input), list(p.output)) for p in plugins] == [(list(o.input), list(o.output)) for o in originals]
    assert [attributes(p)["epsilon"] for p in plugins] == [np.float32(1e-5), np.float32(1e-6)]
    assert {(attributes(p)["plugin_version"], attributes(p)["plugin_namespace"]) for p in plugins} == \
        {(sample.PLUGIN_VERSION.encode(), sample.PLUGIN_NAMESPACE.encode())}
    assert [r.dtype for r in replaced] == ["float16", "float16"]
    # everything else is untouched, in order
    others = [n for n in decoder.graph.node if n.op_type != "RMSNormalization"]
    assert [n for n in rewritten.graph.node if n.op_type != sample.PLUGIN_NAME] == others


def test_the_sequence_dimension_takes_the_token_flags(decoder):
    shapes = rewrite.input_shapes(decoder, 1, 37, 512)
    batch, hidden = onnx_models.BATCH, onnx_models.HIDDEN
    assert shapes == {"x": ((batch, 1, hidden), (batch, 37, hidden), (batch, 512, hidden))}


@pytest.fixture(scope="module")
def decoder_builds(decoder, rtx_lib_dir, tmp_path_factory):
    """Both models as check_model builds them (every replaced node's tensors also outputs), built by RTX."""
    rewritten, replaced, _ = rewrite.rewrite_model(decoder)
    watched = [t for r in replaced for t in (r.x, r.y) if t != "x"]
    shapes = {name: [list(s) for s in lmh] for name, lmh in rewrite.input_shapes(decoder, 1, 128, 512).items()}
    folder = tmp_path_factory.mktemp("decoder_builds")
    builds = {}
    for name, model in (("rewritten", rewritten), ("original", decoder)):
        path = folder / f"{name}.onnx"
        path.write_bytes(rewrite.with_outputs(model, watched))
        builds[name] = run_worker(rtx_lib_dir, dict(source="model", model_path=str(path), shapes=shapes))
    return builds, watched


@pytest.mark.parametrize("name", ["rewritten", "original"])
def test_both_models_build_with_the_watched_tensors_as_outputs(decoder_builds, name):
    builds, watched = decoder_builds
    build = builds[name]
    assert build["parse_ok"], build.messages()
    assert build["build_ok"], build.messages()
    outputs = dict(build["outputs"])
    assert set(outputs) == {"rms_norm_1", *watched}
    assert set(outputs.values()) == {"DataType.HALF"}


def test_the_plugin_sees_rank_3_x_over_the_profile(decoder_builds):
    builds, _ = decoder_builds
    calls = builds["rewritten"]["configure_plugin"]
    assert calls, "the rewritten model's plugin nodes were never configured"
    batch, hidden = onnx_models.BATCH, onnx_models.HIDDEN
    for call in calls:
        x, w = call["inputs"]
        assert (x["min"], x["opt"], x["max"]) == ([batch, 1, hidden], [batch, 128, hidden], [batch, 512, hidden])
        assert w["min"] == [hidden] and (x["type"], w["type"]) == ("DataType.HALF", "DataType.HALF")
    assert builds["original"]["configure_plugin"] == [], "TensorRT's own import must not contain the plugin"


# -- nodes the plugin leaves to TensorRT, and models the flags cannot describe ------------------------

H = onnx_models.HIDDEN


@pytest.mark.parametrize("model_args, why", [
    (dict(x_shape=["n", 4, H], axis=1), "normalizes from axis 1"),
    (dict(x_shape=["n", H], stash_type=0), "stash_type is not 1"),
    (dict(x_shape=["n", "h"]), "last dimension of X is dynamic"),
    (dict(x_shape=[H], scale_shape=(H,)), "known rank of 2 or more"),
    (dict(x_shape=["n", H], scale_type=TensorProto.FLOAT), "X is float16 and scale float32"),
    (dict(x_shape=["n", 4, H], scale_shape=(4, H), axis=-2), "normalizes from axis -2"),
    (dict(x_shape=["n", H], x_type=TensorProto.DOUBLE), "X is DOUBLE"),
])
def test_nodes_the_plugin_cannot_serve_are_left_with_the_reason(model_args, why):
    model = onnx.shape_inference.infer_shapes(onnx_models.one_node_model(**model_args))
    rewritten, replaced, left = rewrite.rewrite_model(model)
    assert replaced == []
    assert list(left) == ["norm"] and why in left["norm"], left
    assert nodes(rewritten, "RMSNormalization") == nodes(model, "RMSNormalization")


@pytest.mark.parametrize("x_shape", [["n", H], ["n", 3, H], [1, "seq", H], ["b", "s", 2, H]])
def test_nodes_over_the_last_axis_of_any_rank_are_served(x_shape):
    model = onnx.shape_inference.infer_shapes(onnx_models.one_node_model(x_shape))
    _, replaced, left = rewrite.rewrite_model(model)
    assert left == {} and [r.name for r in replaced] == ["norm"]


def two_input_model(shape_a, shape_b):
    graph = helper.make_graph([helper.make_node("Add", ["A", "B"], ["C"])], "two",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT16, shape_a),
                               helper.make_tensor_value_info("B", TensorProto.FLOAT16, shape_b)],
                              [helper.make_tensor_value_info("C", TensorProto.FLOAT16, shape_a)])
    return helper.make_model(graph)


def test_one_dimension_name_shared_by_inputs_is_one_dynamic_dimension():
    shapes = rewrite.input_shapes(two_input_model(["n", 8], ["n", 8]), 2, 3, 4)
    assert shapes == {"A": ((2, 8), (3, 8), (4, 8)), "B": ((2, 8), (3, 8), (4, 8))}


@pytest.mark.parametrize("shape_a, shape_b, needle", [
    (["batch", "seq", 8], [1, 1, 8], "2 dynamic dimensions (batch, seq)"),
    (["n", 8], ["m", 8], "2 dynamic dimensions (m, n)"),
    ([None, 8], [None, 8], "2 dynamic dimensions (A[0], B[0])"),  # unnamed: nothing says they are equal
])
def test_models_the_token_flags_cannot_describe_are_refused(shape_a, shape_b, needle):
    with pytest.raises(sample.UsageError, match="describe one") as info:
        rewrite.input_shapes(two_input_model(shape_a, shape_b), 1, 2, 3)
    assert needle in str(info.value)


# -- the command line: one sentence and exit 2, before any build ----------------------------------------


def test_a_missing_model_is_refused_at_flag_parse_time():
    code, _, err = run_script("--from-onnx", "/nonexistent/model.onnx")
    assert code == EXIT_USAGE
    assert_one_sentence(err, "--from-onnx '/nonexistent/model.onnx' does not exist")


@pytest.mark.parametrize("flag", [["--engine", "x.engine"], ["--compare-builtin"]])
def test_flags_for_the_samples_own_model_are_refused_with_a_path(tmp_path, flag):
    path = onnx_models.save(onnx_models.one_node_model(["n", H]), tmp_path / "m.onnx")
    code, _, err = run_script("--from-onnx", str(path), *flag)
    assert code == EXIT_USAGE
    assert_one_sentence(err, flag[0], "not to --from-onnx MODEL.onnx")


def test_a_file_that_is_not_onnx_gets_one_sentence(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("not a model\n")
    code, _, err = run_script("--from-onnx", str(path))
    assert code == EXIT_USAGE
    assert_one_sentence(err, "is not a valid ONNX model")


def test_a_model_without_a_servable_node_is_refused_before_any_build(tmp_path):
    plain = onnx_models.save(two_input_model(["n", 8], ["n", 8]), tmp_path / "add.onnx")
    code, _, err = run_script("--from-onnx", str(plain))
    assert code == EXIT_USAGE
    assert_one_sentence(err, "replaces no node", "it has no RMSNormalization node")
    axis0 = onnx_models.save(onnx_models.one_node_model(["n", 4, H], axis=1), tmp_path / "axis.onnx")
    code, _, err = run_script("--from-onnx", str(axis0))
    assert code == EXIT_USAGE
    assert_one_sentence(err, "norm: it normalizes from axis 1")


def test_a_model_with_two_dynamic_dimensions_is_refused_before_any_build(tmp_path):
    path = onnx_models.save(onnx_models.one_node_model(["batch", "seq", H]), tmp_path / "two.onnx")
    code, out, err = run_script("--from-onnx", str(path))
    assert code == EXIT_USAGE
    assert_one_sentence(err, "2 dynamic dimensions (batch, seq)", "describe one")
    assert "no CUDA GPU" not in err  # refused before the environment check, not because of it
