"""CPU: the plugins' build-time contract, checked by a real TensorRT-family builder.

Full TensorRT cannot be installed on the CI machine, so TensorRT-RTX (``tensorrt_rtx``, whose
builder runs without a GPU) stands in as the builder: tests/rtx_build_worker.py imports the lesson
and its fused companion with ``tensorrt_rtx`` as their ``tensorrt``, registers one of their
creators, parses a one-node ONNX model whose op is RmsNormPlugin, builds a serialized engine for
SM80 (SM89 for an FP8 Y) and reports back in one JSON line a build. A few worker processes, each
building its share in turn, run in parallel once per session; the tests below read the results.

What is checked, with the lesson's creator (the plain plugin):
* every X x W dtype combination (X and Y fp16, bf16 or fp32; W fp32, fp16 or bf16) builds with
  those types; the optimization profile reaches configure_plugin;
* the engine stores epsilon, alone, as the exact float32 the user asked for. A plugin that
  serializes from a temporary array stores garbage only once the freed memory is reused (the
  planted variant below forces that); the deterministic ownership check is
  test_creator_fields.py's (the field points into an array the plugin owns);
* a dynamic or out-of-range hidden size is refused by get_output_shapes;
* unsupported inputs (an int32 X or W among them) and bad epsilon attributes are refused with the
  plugin's own message, and never crash the process;
* a node of a fused form (residual, FP8 Y) is refused with a sentence naming the companion.
With the companion's creator (every form, registered in the lesson's place):
* the plain form builds and stores all its fields; the residual form's X, R, W -> Y, S and the FP8
  form's Y build with their dtypes and store their fields; an R unlike X is refused;
* the companion's own onnx_network (what its --from-onnx builds) reaches the plugin through the
  parser in a strongly typed network, and a parse that fails is its "ONNX parse" stage in one
  sentence (Polygraphy refuses TensorRT-RTX, so the worker parses the companion's bytes with RTX's
  own API; see parse_with_rtx).
"""

import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

WORKER = pathlib.Path(__file__).resolve().parent / "rtx_build_worker.py"
HIDDEN = 1024
SMALL_EPS = 3.0517578e-05   # 2**-15: not the default, and exact in float32
ROUND_EPS = 0.125
Y_SCALE = 0.0375
# TensorRT's name for each dtype, as the bindings print it.
TRT_TYPE = {"float16": "DataType.HALF", "bfloat16": "DataType.BF16", "float32": "DataType.FLOAT"}
# The nine X x W combinations the plugin serves; Y has X's dtype.
COMBINATIONS = [(x, w) for x in ("float16", "bfloat16", "float32")
                for w in ("float32", "float16", "bfloat16")]
LESSON = dict(creator="lesson")

# name -> worker spec (see rtx_build_worker.py); every one is built once per session.
BUILDS = {
    # the lesson's plugin
    **{f"x_{x}_w_{w}": dict(LESSON, dtype=x, w_dtype=w,
                            epsilon=ROUND_EPS if x == "bfloat16" else SMALL_EPS)
       for x, w in COMBINATIONS},
    "odd_profile": dict(LESSON, dtype="float16", profile=[3, 37, 511]),
    "x_int32": dict(LESSON, dtype="int32"),
    "w_int32": dict(LESSON, w_dtype="int32"),
    "hidden_mismatch": dict(LESSON, x_hidden=1024, w_hidden=512),
    "x_rank3": dict(LESSON, x_rank=3),
    "x_rank1": dict(LESSON, x_rank=1),
    "hidden_dynamic": dict(LESSON, x_hidden="dynamic", w_hidden=1024),
    "hidden_too_large": dict(LESSON, x_hidden=32776, w_hidden=32776),
    "epsilon_missing": dict(LESSON, epsilon=None),
    "epsilon_zero": dict(LESSON, epsilon=0.0),
    "epsilon_negative": dict(LESSON, epsilon=-1e-5),
    "epsilon_nan": dict(LESSON, epsilon="nan"),
    "epsilon_int": dict(LESSON, epsilon=1, epsilon_type="int"),
    "epsilon_two_values": dict(LESSON, epsilon=1e-5, epsilon_type="floats"),
    "epsilon_float16_tensor": dict(LESSON, epsilon=1e-5, epsilon_type="float16_tensor"),
    "buggy_serialize": dict(LESSON, epsilon=SMALL_EPS, buggy_serialize=True),
    "lesson_residual_node": dict(LESSON, residual=True),
    "lesson_fp8_node": dict(LESSON, y_scale=Y_SCALE, compute_capability="SM89"),
    # the companion's plugin, every form
    "fused_plain": dict(dtype="float16", epsilon=SMALL_EPS),
    **{f"residual_x_{x}_w_{w}": dict(residual=True, dtype=x, w_dtype=w, epsilon=SMALL_EPS)
       for x, w in [("float16", "float32"), ("bfloat16", "bfloat16"), ("float32", "float16")]},
    "residual_odd_profile": dict(residual=True, profile=[3, 37, 511]),
    "residual_r_of_another_dtype": dict(residual=True, dtype="float16", r_dtype="bfloat16"),
    "residual_r_of_another_hidden": dict(residual=True, r_hidden=512),
    "fp8_x_bfloat16": dict(dtype="bfloat16", y_scale=Y_SCALE, epsilon=SMALL_EPS,
                           compute_capability="SM89"),
    # what the companion's --from-onnx parses
    "fused_onnx_fp16": dict(source="fused_onnx", dtype="float16", epsilon=SMALL_EPS),
    "fused_onnx_bf16": dict(source="fused_onnx", dtype="bfloat16", epsilon=ROUND_EPS),
    "fused_onnx_fp16_w_fp16": dict(source="fused_onnx", dtype="float16", w_dtype="float16",
                                   epsilon=SMALL_EPS),
    "fused_onnx_fp32_w_bf16": dict(source="fused_onnx", dtype="float32", w_dtype="bfloat16",
                                   epsilon=SMALL_EPS),
    "fused_onnx_epsilon_zero": dict(source="fused_onnx", epsilon=0.0),  # what the flags refuse
    "fused_onnx_residual": dict(source="fused_onnx", residual=True, dtype="bfloat16",
                                epsilon=ROUND_EPS),
    "fused_onnx_residual_fp8": dict(source="fused_onnx", residual=True, y_scale=Y_SCALE,
                                    dtype="float16", epsilon=SMALL_EPS, compute_capability="SM89"),
    # the one-node ONNX RMSNormalization model rms_norm_onnx_model.py compares with
    "builtin_fp16": dict(source="onnx_model_one_node", dtype="float16"),
    "builtin_bf16": dict(source="onnx_model_one_node", dtype="bfloat16"),
    "builtin_fp32_w_fp16": dict(source="onnx_model_one_node", dtype="float32", w_dtype="float16"),
}


class Build:
    """One build: the exit code of its worker process, its result (None if the worker printed none
    for it), and what the process printed to stderr during the build (all the worker printed, if
    there is no result)."""

    def __init__(self, proc: subprocess.CompletedProcess, result):
        self.returncode = proc.returncode
        self.result = result
        self.stdout = proc.stdout
        self.stderr = proc.stderr if result is None else result["stderr"]

    def __getitem__(self, key):
        assert self.result is not None, (f"the worker printed no result:\n{self.stdout}\n"
                                         f"{self.stderr}")
        return self.result[key]

    def messages(self) -> str:
        """Everything TensorRT and the plugin said about a failure: stderr, parser and logger
        errors."""
        return "\n".join([self.stderr, *self["parser_errors"], *self["logger_errors"]])

    def configure_inputs(self):
        """(min, opt, max) per input, as configure_plugin saw them in its last call."""
        calls = self["configure_plugin"]
        assert calls, "configure_plugin was never called"
        return [(tuple(i["min"]), tuple(i["opt"]), tuple(i["max"])) for i in calls[-1]["inputs"]]


def run_workers(lib_dir, specs: dict) -> dict:
    """{name: Build} of `specs` ({name: spec}), built in turn by one worker process."""
    env = dict(os.environ)
    paths = [str(lib_dir), env.get("LD_LIBRARY_PATH")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, paths))
    proc = subprocess.run([sys.executable, str(WORKER), json.dumps(specs)], env=env,
                          capture_output=True, text=True, timeout=900)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            printed = json.loads(line)
            results[printed["name"]] = printed["result"]
    return {name: Build(proc, results.get(name)) for name in specs}


def build_in_parallel(lib_dir, specs: dict) -> dict:
    """{name: Build} of `specs` ({name: spec}, names strings), shared among worker processes, one a
    CPU, that run at once."""
    workers = max(2, os.cpu_count() or 2)
    names = sorted(specs)
    shares = [{name: specs[name] for name in names[i::workers]} for i in range(workers)]
    built = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for share in pool.map(lambda share: run_workers(lib_dir, share), shares):
            built.update(share)
    return built


@pytest.fixture(scope="session")
def builds(rtx_lib_dir):
    """Every configuration in BUILDS, built once a session."""
    return build_in_parallel(rtx_lib_dir, BUILDS)


# -- the lesson's plugin: engines that must build ----------------------------------------------


@pytest.mark.parametrize("x_dtype, w_dtype", COMBINATIONS)
def test_engine_builds_for_every_dtype_combination_and_stores_the_exact_epsilon(builds, x_dtype,
                                                                                w_dtype):
    build = builds[f"x_{x_dtype}_w_{w_dtype}"]
    eps = ROUND_EPS if x_dtype == "bfloat16" else SMALL_EPS
    assert build["parse_ok"], build.messages()
    assert build["build_ok"], build.messages()
    assert build["engine_size"] > 0
    # b"epsilon\0" + u32 FLOAT32 + u32 1 + float32(eps): fails if the field's buffer dangled.
    assert build["epsilon_record_found"], f"stored epsilons: {build['epsilon_records']}"
    assert build["epsilon_records"] == [float(np.float32(eps))]
    x, w = build.configure_inputs()
    assert x == ((1, HIDDEN), (128, HIDDEN), (512, HIDDEN))
    assert w == ((HIDDEN,), (HIDDEN,), (HIDDEN,))
    call = build["configure_plugin"][-1]
    assert [i["type"] for i in call["inputs"]] == [TRT_TYPE[x_dtype], TRT_TYPE[w_dtype]]
    assert [o["type"] for o in call["outputs"]] == [TRT_TYPE[x_dtype]]


def test_the_lessons_engine_stores_epsilon_alone(builds):
    """Its plugin has one field: an engine it builds loads where either creator is registered."""
    stored = builds["x_float16_w_float32"]["stored_fields"]
    assert stored == {"epsilon": [float(np.float32(SMALL_EPS))], "residual": [], "quantize": [],
                      "y_scale": []}


def test_profile_edges_reach_configure_plugin(builds):
    build = builds["odd_profile"]
    assert build["build_ok"], build.messages()
    x, _ = build.configure_inputs()
    assert x == ((3, HIDDEN), (37, HIDDEN), (511, HIDDEN))


def test_engine_record_check_catches_a_dangling_field_buffer(builds):
    """Serializing from a temporary array (the bug the record check exists for) stores garbage."""
    build = builds["buggy_serialize"]
    assert build["build_ok"], build.messages()
    assert not build["epsilon_record_found"], "a dangling field buffer went unnoticed"
    assert build["epsilon_records"] != [float(np.float32(SMALL_EPS))]


def test_x_of_rank_3_builds_and_the_plugin_sees_every_dimension(builds):
    """[num_tokens, 2, hidden]: the plugin takes any rank >= 2 (enqueue multiplies the leading
    dimensions)."""
    build = builds["x_rank3"]
    assert build["build_ok"], build.messages()
    x, _ = build.configure_inputs()
    assert x == ((1, 2, HIDDEN), (128, 2, HIDDEN), (512, 2, HIDDEN))


# -- inputs and attributes that must be refused ---------------------------------------------------


@pytest.mark.parametrize(
    "name, message",
    [
        ("x_int32", "X must be float16, bfloat16 or float32, got DataType.INT32"),
        ("w_int32", "W must be float32, float16 or bfloat16, got DataType.INT32"),
        ("hidden_mismatch", "X hidden 1024 != W size 512"),
        ("x_rank1", "expects X [..., hidden] of rank 2 or more"),
        ("hidden_dynamic", "the hidden dimension of X must be static"),
        ("hidden_too_large", "hidden must be in [1, 32768], got 32776"),
    ],
)
def test_unsupported_inputs_are_refused_with_the_plugins_message(builds, name, message):
    build = builds[name]
    assert not (build["parse_ok"] and build["build_ok"])
    assert message in build.messages()


NEEDS = "RmsNormPlugin: needs one FLOAT32 field 'epsilon' holding one value, got "


@pytest.mark.parametrize(
    "name, message",
    [
        # the parser passes plugin_version and plugin_namespace to no one
        ("epsilon_missing", NEEDS + "fields []"),
        ("epsilon_zero", "field 'epsilon' must be finite and > 0"),
        ("epsilon_negative", "field 'epsilon' must be finite and > 0"),
        ("epsilon_nan", "field 'epsilon' must be finite and > 0"),
        ("epsilon_int", NEEDS + "a PluginFieldType.INT32 field"),
        ("epsilon_two_values", NEEDS + "a PluginFieldType.FLOAT32 field of 2 values"),
        # A FLOAT16 tensor attribute reaches create_plugin as a FLOAT16 field, whose .data the
        # bindings cannot convert (test_creator_fields.py shows the same without a parser): the
        # message must not read it.
        ("epsilon_float16_tensor", NEEDS + "a PluginFieldType.FLOAT16 field"),
    ],
)
def test_bad_epsilon_attribute_fails_the_parse(builds, name, message):
    build = builds[name]
    assert not build["parse_ok"]
    assert build["parser_errors"]
    assert message in build.stderr


@pytest.mark.parametrize("name, field", [("lesson_residual_node", "residual"),
                                         ("lesson_fp8_node", "quantize")])
def test_the_lessons_creator_refuses_a_fused_node_naming_the_companion(builds, name, field):
    """A node of a fused form where only the lesson's creator is registered: the parse fails, and
    the plugin's sentence says which file serves it."""
    build = builds[name]
    assert not build["parse_ok"]
    assert (f"RmsNormPlugin: field '{field}' selects a form that rms_norm_fused_cutedsl.py serves; "
            "call its register_creator() before building or loading") in build.stderr


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_builder_never_crashes_the_process(builds, name):
    """Failures come back as a result, not as an abort: exit code 0 and a JSON result each."""
    build = builds[name]
    assert build.returncode == 0, build.stderr[-4000:]
    assert build.result is not None


# -- the companion's plugin, every form ------------------------------------------------------------


def test_the_companions_plain_form_builds_and_stores_every_field(builds):
    build = builds["fused_plain"]
    assert build["build_ok"], build.messages()
    assert build["outputs"] == [["Y", TRT_TYPE["float16"]]]
    assert build["stored_fields"] == {"epsilon": [float(np.float32(SMALL_EPS))], "residual": [0],
                                      "quantize": [0], "y_scale": []}


@pytest.mark.parametrize("name", [name for name in BUILDS if name.startswith("residual_x_")])
def test_the_residual_form_builds_with_r_y_and_s_of_xs_dtype(builds, name):
    spec = BUILDS[name]
    build = builds[name]
    assert build["parse_ok"], build.messages()
    assert build["build_ok"], build.messages()
    assert build["stored_fields"] == {"epsilon": [float(np.float32(SMALL_EPS))], "residual": [1],
                                      "quantize": [0], "y_scale": []}
    x, r, w = build.configure_inputs()
    assert x == r == ((1, HIDDEN), (128, HIDDEN), (512, HIDDEN))
    assert w == ((HIDDEN,),) * 3
    call = build["configure_plugin"][-1]
    x_type = TRT_TYPE[spec["dtype"]]
    assert [i["type"] for i in call["inputs"]] == [x_type, x_type, TRT_TYPE[spec["w_dtype"]]]
    assert [o["type"] for o in call["outputs"]] == [x_type, x_type]
    assert build["outputs"] == [["Y", x_type], ["S", x_type]]


def test_the_residual_forms_profile_reaches_both_row_inputs(builds):
    build = builds["residual_odd_profile"]
    assert build["build_ok"], build.messages()
    x, r, _ = build.configure_inputs()
    assert x == r == ((3, HIDDEN), (37, HIDDEN), (511, HIDDEN))


@pytest.mark.parametrize("name, message", [
    ("residual_r_of_another_dtype", "R must have X's dtype DataType.HALF, got DataType.BF16"),
    ("residual_r_of_another_hidden",
     "expects X [..., hidden] of rank 2 or more, R of its shape and W [hidden]"),
])
def test_an_r_unlike_x_is_refused_with_the_plugins_message(builds, name, message):
    build = builds[name]
    assert not (build["parse_ok"] and build["build_ok"])
    assert message in build.messages()


def test_the_fp8_form_builds_for_sm89_with_y_in_fp8_and_stores_its_scale(builds):
    build = builds["fp8_x_bfloat16"]
    assert build["build_ok"], build.messages()
    assert build["outputs"] == [["Y", "DataType.FP8"]]
    call = build["configure_plugin"][-1]
    assert [o["type"] for o in call["outputs"]] == ["DataType.FP8"]
    assert build["stored_fields"] == {"epsilon": [float(np.float32(SMALL_EPS))], "residual": [0],
                                      "quantize": [1], "y_scale": [float(np.float32(Y_SCALE))]}


# -- the companion's ONNX model (--from-onnx) and the ONNX companion's built-in-layer composition --


@pytest.mark.parametrize("name", ["fused_onnx_fp16", "fused_onnx_bf16", "fused_onnx_fp16_w_fp16",
                                  "fused_onnx_fp32_w_bf16"])
def test_the_companions_onnx_model_reaches_the_plugin_through_the_parser(builds, name):
    build = builds[name]
    assert build["parse_ok"], build.messages()
    assert build["build_ok"], build.messages()
    assert build["stage_error"] is None
    assert build["strongly_typed"], "the companion asks Polygraphy for a strongly typed network"
    assert build["epsilon_record_found"], build["epsilon_records"]
    x, w = build.configure_inputs()
    assert x == ((1, HIDDEN), (128, HIDDEN), (512, HIDDEN))
    assert w == ((HIDDEN,),) * 3
    spec = BUILDS[name]
    inputs = [i["type"] for i in build["configure_plugin"][-1]["inputs"]]
    assert inputs == [TRT_TYPE[spec["dtype"]], TRT_TYPE[spec.get("w_dtype", "float32")]]


def test_a_parse_of_the_companions_model_that_fails_is_the_onnx_parse_stage_in_one_sentence(
        builds):
    """onnx_network runs the parse inside the lesson's tensorrt_stage("ONNX parse"): the plugin's
    refusal reaches the user as a TensorRTError, and the plugin's own sentence is in TensorRT's
    log."""
    build = builds["fused_onnx_epsilon_zero"]
    assert not build["parse_ok"]
    error = build["stage_error"]
    assert error.startswith("TensorRT failed at the ONNX parse stage"), error
    assert "\n" not in error
    assert "field 'epsilon' must be finite and > 0" in build.stderr


@pytest.mark.parametrize("name, outputs", [
    ("fused_onnx_residual", [["Y", "DataType.BF16"], ["S", "DataType.BF16"]]),
    ("fused_onnx_residual_fp8", [["Y", "DataType.FP8"], ["S", "DataType.HALF"]]),
])
def test_the_companions_fused_onnx_models_reach_the_plugin_through_the_parser(builds, name,
                                                                            outputs):
    """What --from-onnx --residual (and --y-scale) parses: the node's attributes become the
    plugin's fields, and its outputs have the form's dtypes."""
    build = builds[name]
    assert build["parse_ok"], build.messages()
    assert build["build_ok"], build.messages()
    assert build["strongly_typed"]
    assert build["outputs"] == outputs
    assert len(build["configure_plugin"][-1]["inputs"]) == 3


@pytest.mark.parametrize("name", ["builtin_fp16", "builtin_bf16", "builtin_fp32_w_fp16"])
def test_tensorrt_imports_the_onnx_rms_normalization_node_and_builds(builds, name):
    """rms_norm_onnx_model.py's one-node model, as TensorRT builds it for the comparison: the parser
    imports the opset-23 op itself (no plugin involved), and the Cast back to X's dtype where the
    scale's differs."""
    build = builds[name]
    assert build["parse_ok"], build.messages()
    assert build["build_ok"], build.messages()
    assert build["engine_size"] > 0
    # the plugin engine's bindings: Y in X's dtype
    assert build["outputs"] == [["Y", TRT_TYPE[BUILDS[name]["dtype"]]]]
    assert build["configure_plugin"] == [], "the comparison engine must not contain the plugin"
