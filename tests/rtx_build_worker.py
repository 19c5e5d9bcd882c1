"""Build engines around RmsNormPlugin with TensorRT-RTX on the CPU and report what happened.

Why TensorRT-RTX: full TensorRT cannot be installed on the CI machine (no GPU, no TensorRT wheel),
but TensorRT-RTX (``tensorrt_rtx``) is a TensorRT-family builder whose Python bindings expose the
same plugin API and whose builder runs on the CPU. It is used here as a stand-in *builder*: the
lesson and its fused companion are imported with ``tensorrt_rtx`` aliased as ``tensorrt``, so their
real plugin and creator classes are driven by a real TensorRT-family engine builder. Nothing here
runs a kernel.

Run by tests/test_rtx_build_contract.py (and the ONNX companion's tests) as a subprocess, because

* the ONNX parser dlopens the unversioned ``libtensorrt_rtx.so``, which the wheel lacks: the parent
  puts a directory holding a symlink ``libtensorrt_rtx.so -> libtensorrt_rtx.so.1`` on
  ``LD_LIBRARY_PATH`` (without it the process dies with ``terminate called without an active
  exception``);
* exceptions raised in Python plugin methods are printed by the bindings to the process's stderr
  (``[ERROR] Exception caught in <method>(): ...``, std::cerr in pyPlugin.cpp), which the worker
  captures for each build by pointing file descriptor 2 at a file of its own while it runs.

One process builds many specs in turn: torch, CuteDSL and TensorRT-RTX are imported once (most of
what a build costs on the CPU). Between builds it puts back what a build changed: the registry's
creator and the plugin methods a spec replaces.

Usage:  python tests/rtx_build_worker.py '{"<name>": <spec>, ...}'

Spec keys (all optional):
    dtype            "float16" (default), "bfloat16", "float32" or "int32": dtype of X and Y
    w_dtype          "float32" (default), "float16", "bfloat16" or "int32": dtype of W
    x_hidden         last dimension of X (default 1024); "dynamic": a named (runtime) dimension,
                     which the profile sets to w_hidden
    w_hidden         size of W (default 1024)
    x_rank           rank of X (default 2); extra middle dimensions are 2; rank 1 is X [hidden]
    epsilon          value of the node's 'epsilon' attribute (default 1e-5);
                     null leaves the attribute out; "nan"/"inf" are accepted
    epsilon_type     ONNX attribute type: "float" (default), "floats" (a list), "int",
                     "float16_tensor" (a one-element FLOAT16 tensor, which the parser hands over as
                     a FLOAT16 field)
    profile          [min, opt, max] token counts for X (default [1, 128, 512])
    residual         true: the fused form, inputs X, R, W and outputs Y, S (the node's 'residual'
                     attribute 1; for "fused_onnx", onnx_network's residual=True)
    y_scale          a number: the FP8 form, Y in FP8 (the node's attributes quantize 1 and
                     y_scale; for "fused_onnx", onnx_network's y_scale); null (default): Y in X's
                     dtype
    r_dtype          R's dtype in the residual form (default: X's)
    r_hidden         R's last dimension in the residual form (default: X's)
    creator          whose register_creator() runs before the network is made: "fused" (default,
                     rms_norm_fused_cutedsl.py's, which serves every form, as
                     rms_norm_onnx_model.py registers it) or "lesson" (rms_norm_plugin_cutedsl.py's,
                     the plain form only)
    model_path       for source "model": an ONNX file (plugin nodes are found through the registry),
                     parsed by path as rms_norm_onnx_model.build_engine does, so external data is
                     read beside it
    shapes           for source "model": {input name: [min shape, opt shape, max shape]}
    watched          for source "model": tensors also marked as outputs (build_engine's `watched`)
    compute_capability  the engine's one target (default "SM80"; "SM89", RTX's first with FP8)
    buggy_serialize  true: replace get_fields_to_serialize by the classic bug (a PluginField over
                     a temporary array) plus allocator churn, to show the engine-record check
                     catches a dangling buffer
    source           where the network comes from:
                     "test_onnx" (default) the ONNX model written below, W an initializer;
                     "fused_onnx" the companion's own onnx_network (what its --from-onnx parses):
                     its model and its strongly_typed request, parsed by TensorRT-RTX's own parser
                     (see parse_with_rtx);
                     "onnx_model_one_node" rms_norm_onnx_model.one_node_model: ONNX's
                     RMSNormalization, which TensorRT imports with its own layers (what
                     rms_norm_onnx_model.py compares without a model);
                     "model" the ONNX file at model_path, built for `shapes`.
                     "onnx_model_one_node" and "model" build a strongly typed network, as the
                     lesson does. (The lesson's plugin_network needs
                     INetworkDefinition.add_plugin_v3, which TensorRT has and TensorRT-RTX does
                     not; it is covered by the `trt` tests.)

Prints one line on stdout per spec, as each build ends: a JSON object {"name": ..., "result": ...}
whose result holds
    parse_ok, parser_errors, strongly_typed (the parsed network's flag), stage_error (a
    TensorRTError the companion raised, as one sentence, else null), build_ok, engine_size,
    epsilon_record_found, epsilon_records (float32 values stored after each b"epsilon\\0" name),
    stored_fields ({field: values} of epsilon, residual, quantize and y_scale, read likewise),
    configure_plugin (per call: inputs/outputs with min/opt/max dims and type), logger_errors,
    outputs (the network's output names and dtypes), inputs (its inputs' names and dtypes), stderr
    (what the process printed to stderr during the build).
Failures are reported in those objects; the worker itself exits 0.
"""

import json
import math
import os
import pathlib
import struct
import sys
import tempfile

import numpy as np

TESTS_DIR = pathlib.Path(__file__).resolve().parent

DEFAULTS = dict(
    dtype="float16", w_dtype="float32", x_hidden=1024, w_hidden=1024, x_rank=2, epsilon=1e-5,
    epsilon_type="float", profile=[1, 128, 512], buggy_serialize=False, source="test_onnx",
    model_path=None, shapes=None, watched=[], residual=False, y_scale=None, r_dtype=None,
    r_hidden=None, compute_capability="SM80", creator="fused",
)


def load_with_rtx():
    """Import the lesson and the companion with tensorrt_rtx standing in as `tensorrt`
    (support.sample_loader), under their own names, as rms_norm_onnx_model.py imports them."""
    import tensorrt_rtx

    sys.path.insert(0, str(TESTS_DIR.parent))
    from support.sample_loader import load_fused, load_sample

    # For this whole process: every file and this worker agree.
    sys.modules["tensorrt"] = tensorrt_rtx
    lesson = load_sample(tensorrt_rtx, "rms_norm_plugin_cutedsl")
    return tensorrt_rtx, lesson, load_fused(tensorrt_rtx, "rms_norm_fused_cutedsl", lesson)


def epsilon_record(eps: float) -> bytes:
    """How a one-value FLOAT32 field named 'epsilon' is laid out in a TensorRT-RTX engine.

    b"epsilon\\0", u32 PluginFieldType (FLOAT32 == 1), u32 length (1), the float32 value.
    """
    return b"epsilon\0" + struct.pack("<IIf", 1, 1, np.float32(eps))


# The fields the plugins store, as a TensorRT-RTX engine lays each out after its name: (type as
# nvinfer1::PluginFieldType numbers it, how struct reads one value of it).
STORED_FIELDS = {"epsilon": (1, "f"), "residual": (5, "i"), "quantize": (5, "i"),
                 "y_scale": (1, "f")}


def stored_values(engine: bytes, name: str) -> list:
    """The value after every b"<name>\\0" that is followed by (the field's type, length 1)."""
    ftype, fmt = STORED_FIELDS[name]
    tag = name.encode() + b"\0"
    values, start = [], 0
    while (at := engine.find(tag, start)) >= 0:
        start = at + 1
        head = engine[at + len(tag): at + len(tag) + 12]
        if len(head) == 12:
            stored_type, length, value = struct.unpack("<II" + fmt, head)
            if (stored_type, length) == (ftype, 1):
                values.append(value)
    return values


def write_onnx(path: str, spec: dict) -> None:
    """One RmsNormPlugin node: X (graph input) and W (initializer) -> Y; or X, R, W -> Y, S
    (residual); Y in FP8 with a y_scale."""
    import onnx
    from onnx import TensorProto, helper

    elem = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
            "float32": TensorProto.FLOAT, "int32": TensorProto.INT32}
    hidden = "hidden" if spec["x_hidden"] == "dynamic" else spec["x_hidden"]
    x_shape = [hidden]
    if spec["x_rank"] > 1:
        x_shape = ["num_tokens"] + [2] * (spec["x_rank"] - 2) + [hidden]
    x = helper.make_tensor_value_info("X", elem[spec["dtype"]], x_shape)
    y_type = elem[spec["dtype"]] if spec["y_scale"] is None else TensorProto.FLOAT8E4M3FN
    y = helper.make_tensor_value_info("Y", y_type, x_shape)
    if spec["w_dtype"] == "int32":
        values = [1] * spec["w_hidden"]
    else:  # make_tensor rounds them to W's type, bf16 included (which numpy lacks)
        values = np.linspace(0.5, 1.5, spec["w_hidden"]).tolist()
    w = helper.make_tensor("W", elem[spec["w_dtype"]], [spec["w_hidden"]], values)

    attrs = {"plugin_version": "1", "plugin_namespace": ""}
    eps = spec["epsilon"]
    if eps is not None:
        eps = float(eps)  # also turns "nan"/"inf" into floats
        attrs["epsilon"] = {
            "float": eps, "floats": [eps, eps], "int": int(eps) if math.isfinite(eps) else 1,
            "float16_tensor": helper.make_tensor("epsilon", TensorProto.FLOAT16, [1], [eps]),
        }[spec["epsilon_type"]]
    if spec["y_scale"] is not None:
        attrs.update(quantize=1, y_scale=float(spec["y_scale"]))
    inputs, outputs = [x], [y]
    if spec["residual"]:
        attrs["residual"] = 1
        r_shape = x_shape[:-1] + [spec["r_hidden"] or hidden]
        r_type = elem[spec["r_dtype"] or spec["dtype"]]
        inputs.append(helper.make_tensor_value_info("R", r_type, r_shape))
        outputs.append(helper.make_tensor_value_info("S", elem[spec["dtype"]], x_shape))
    names = (["X", "R", "W"], ["Y", "S"]) if spec["residual"] else (["X", "W"], ["Y"])
    node = helper.make_node("RmsNormPlugin", *names, name="rms_norm", **attrs)
    graph = helper.make_graph([node], "rms_norm", inputs, outputs, initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def dims(d) -> list:
    return [int(v) for v in d]


def record_configure_plugin(plugin_class, calls: list) -> None:
    """Wrap configure_plugin, which both plugins inherit from the lesson's, so every call is
    recorded; the real method still runs."""
    real = plugin_class.configure_plugin

    def describe(descs):
        return [{"min": dims(d.min), "opt": dims(d.opt), "max": dims(d.max),
                 "type": str(d.desc.type)} for d in descs]

    def configure_plugin(self, inp, out):
        calls.append({"inputs": describe(inp), "outputs": describe(out)})
        return real(self, inp, out)

    plugin_class.configure_plugin = configure_plugin


def install_buggy_serialize(plugin_class, trt) -> None:
    """The bug the engine-record check exists for: PluginField keeps only a pointer to a
    temporary."""

    def get_fields_to_serialize(self):
        fields = trt.PluginFieldCollection([trt.PluginField(
            "epsilon", np.array([self.epsilon], dtype=np.float32), trt.PluginFieldType.FLOAT32)])
        junk = [np.full(1, 12345.0 + i, dtype=np.float32) for i in range(64)]  # reuse freed memory
        del junk
        return fields

    plugin_class.get_fields_to_serialize = get_fields_to_serialize


def parse_with_rtx(trt, logger, result: dict):
    """TEST DOUBLE of polygraphy.backend.trt.network_from_onnx_bytes, which the companion's
    onnx_network calls: Polygraphy refuses TensorRT-RTX (its create_network asks for EXPLICIT_BATCH,
    which RTX lacks), so this makes what Polygraphy's NetworkFromOnnxBytes makes
    (polygraphy/backend/trt/loader.py), with TensorRT-RTX's own API: a builder, a network, strongly
    typed only if asked, and a parser that has parsed the companion's bytes; like Polygraphy it
    raises when the parse fails (the companion turns that into the lesson's TensorRTError)."""

    def network_from_onnx_bytes(model_bytes, strongly_typed=None):
        builder = trt.Builder(logger)
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if strongly_typed else 0
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, logger)
        result["parse_ok"] = bool(parser.parse(model_bytes))
        result["parser_errors"] = [parser.get_error(i).desc() for i in range(parser.num_errors)]
        if not result["parse_ok"]:
            raise RuntimeError("the ONNX parser failed")  # Polygraphy: check_onnx_parser_errors
        return builder, network, parser

    return network_from_onnx_bytes


def clear_registry(trt, lesson) -> None:
    """Deregister whatever creator holds the plugin's key: the next spec registers its own."""
    registry = trt.get_plugin_registry()
    key = (lesson.PLUGIN_NAME, lesson.PLUGIN_VERSION, lesson.PLUGIN_NAMESPACE)
    while (registered := registry.get_creator(*key)) is not None:
        registry.deregister_creator(registered)


def build(trt, lesson, fused, spec: dict) -> dict:
    result = {"parse_ok": False, "parser_errors": [], "build_ok": False, "engine_size": 0,
              "epsilon_record_found": False, "epsilon_records": [], "configure_plugin": [],
              "logger_errors": [], "outputs": [], "inputs": [], "strongly_typed": None,
              "stage_error": None, "stored_fields": {}}

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            if severity <= trt.ILogger.Severity.ERROR:
                result["logger_errors"].append(msg)

    logger = Logger()
    {"lesson": lesson, "fused": fused}[spec["creator"]].register_creator()
    record_configure_plugin(lesson.RmsNormPlugin, result["configure_plugin"])
    if spec["buggy_serialize"]:
        install_buggy_serialize(lesson.RmsNormPlugin, trt)

    if spec["source"] == "fused_onnx":
        import polygraphy.backend.trt

        polygraphy.backend.trt.network_from_onnx_bytes = parse_with_rtx(trt, logger, result)
        try:
            builder, network, parser = fused.onnx_network(
                spec["x_hidden"], spec["dtype"], spec["epsilon"], spec["w_dtype"],
                spec["residual"], spec["y_scale"])
        except lesson.TensorRTError as exc:
            result["stage_error"] = str(exc)
            return result
    elif spec["source"] == "test_onnx":
        builder = trt.Builder(logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        with tempfile.TemporaryDirectory() as tmp:
            onnx_path = os.path.join(tmp, "rms_norm.onnx")
            write_onnx(onnx_path, spec)
            with open(onnx_path, "rb") as f:
                result["parse_ok"] = bool(parser.parse(f.read()))
    else:
        builder = trt.Builder(logger)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        parser = trt.OnnxParser(network, logger)
        if spec["source"] == "model":
            result["parse_ok"] = bool(parser.parse_from_file(spec["model_path"]))
            tensors = {layer.get_output(k).name: layer.get_output(k) for layer in network
                       for k in range(layer.num_outputs)}
            for name in spec["watched"]:
                if name in tensors and not tensors[name].is_network_output:
                    network.mark_output(tensors[name])
        elif spec["source"] == "onnx_model_one_node":
            import argparse

            import onnx_ir
            import rms_norm_onnx_model as onnx_model  # on the files bound to TensorRT-RTX above

            args = argparse.Namespace(hidden_dim=spec["x_hidden"], dtype=spec["dtype"],
                                      weight_dtype=spec["w_dtype"], epsilon=spec["epsilon"], seed=0)
            proto = onnx_ir.serde.serialize_model(onnx_model.one_node_model(args))
            result["parse_ok"] = bool(parser.parse(proto.SerializeToString()))
    if spec["source"] != "fused_onnx":
        result["parser_errors"] = [parser.get_error(i).desc() for i in range(parser.num_errors)]
    if not result["parse_ok"]:
        return result
    strongly_typed = network.get_flag(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    result["strongly_typed"] = bool(strongly_typed)
    result["outputs"] = [[network.get_output(i).name, str(network.get_output(i).dtype)]
                         for i in range(network.num_outputs)]
    result["inputs"] = [[network.get_input(i).name, str(network.get_input(i).dtype)]
                        for i in range(network.num_inputs)]

    config = builder.create_builder_config()
    # An explicit target: ComputeCapability.CURRENT needs a GPU and aborts the process without one.
    config.num_compute_capabilities = 1
    config.set_compute_capability(getattr(trt.ComputeCapability, spec["compute_capability"]), 0)
    profile = builder.create_optimization_profile()
    if spec["source"] == "model":
        for name, (low, opt, high) in spec["shapes"].items():
            profile.set_shape(name, low, opt, high)
    elif spec["x_rank"] == 1:
        profile.set_shape("X", *[[spec["w_hidden"]]] * 3)
    else:
        lo, opt, hi = spec["profile"]
        middle = [2] * (spec["x_rank"] - 2)
        hidden = spec["w_hidden"] if spec["x_hidden"] == "dynamic" else spec["x_hidden"]
        profile.set_shape("X", [lo, *middle, hidden], [opt, *middle, hidden],
                          [hi, *middle, hidden])
        if spec["residual"]:
            r_hidden = spec["r_hidden"] or hidden
            profile.set_shape("R", [lo, *middle, r_hidden], [opt, *middle, r_hidden],
                              [hi, *middle, r_hidden])
    config.add_optimization_profile(profile)
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        return result

    engine = bytes(blob)
    result["build_ok"] = True
    result["engine_size"] = len(engine)
    if spec["epsilon"] is not None:
        result["epsilon_record_found"] = epsilon_record(float(spec["epsilon"])) in engine
    result["epsilon_records"] = stored_values(engine, "epsilon")
    result["stored_fields"] = {name: stored_values(engine, name) for name in STORED_FIELDS}
    return result


def build_capturing_stderr(trt, lesson, fused, spec: dict) -> dict:
    """build(), with what the process prints to stderr meanwhile (the bindings' std::cerr too) in
    result["stderr"], and the registry and the plugin class as they were before."""
    replaced = {name: vars(lesson.RmsNormPlugin)[name]
                for name in ("configure_plugin", "get_fields_to_serialize")}
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        os.dup2(captured.fileno(), 2)
        try:
            result = build(trt, lesson, fused, spec)
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            for name, method in replaced.items():
                setattr(lesson.RmsNormPlugin, name, method)
            clear_registry(trt, lesson)
        captured.seek(0)
        result["stderr"] = captured.read().decode(errors="replace")
    return result


def main(argv) -> int:
    specs = {name: dict(DEFAULTS, **spec) for name, spec in json.loads(argv[1]).items()}
    for name, spec in specs.items():
        unknown = set(spec) - set(DEFAULTS)
        if unknown:
            raise SystemExit(f"{name}: unknown spec keys: {sorted(unknown)}")
    trt, lesson, fused = load_with_rtx()
    clear_registry(trt, lesson)
    for name, spec in specs.items():
        result = build_capturing_stderr(trt, lesson, fused, spec)
        print(json.dumps({"name": name, "result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
