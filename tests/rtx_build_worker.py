"""Build one engine around RmsNormPlugin with TensorRT-RTX on the CPU and report what happened.

Why TensorRT-RTX: full TensorRT cannot be installed on the CI machine (no GPU,
no TensorRT wheel), but TensorRT-RTX (``tensorrt_rtx``) is a TensorRT-family
builder whose Python bindings expose the same plugin API and whose builder
runs on the CPU. It is used here as a stand-in *builder*: the sample is
imported with ``tensorrt_rtx`` aliased as ``tensorrt``, so the sample's real
plugin and creator classes are driven by a real TensorRT-family engine
builder. Nothing here runs a kernel.

Run by tests/test_rtx_build_contract.py as a subprocess, because

* the ONNX parser dlopens the unversioned ``libtensorrt_rtx.so``, which the
  wheel lacks: the parent puts a directory holding a symlink
  ``libtensorrt_rtx.so -> libtensorrt_rtx.so.1`` on ``LD_LIBRARY_PATH``
  (without it the process dies with ``terminate called without an active
  exception``);
* exceptions raised in Python plugin methods are printed by the bindings to
  stderr (``[ERROR] Exception caught in <method>(): ...``), which the parent
  captures.

Usage:  python tests/rtx_build_worker.py '<json spec>'

Spec keys (all optional):
    dtype            "float16" (default), "bfloat16", "float32" or "int32": dtype of X and Y
    w_dtype          "float32" (default), "float16", "bfloat16" or "int32": dtype of W
    x_hidden         last dimension of X (default 1024); "dynamic": a named (runtime) dimension,
                     which the profile sets to w_hidden
    w_hidden         size of W (default 1024)
    x_rank           rank of X (default 2); extra middle dimensions are 2; rank 1 is X [hidden]
    epsilon          value of the node's 'epsilon' attribute (default 1e-5);
                     null leaves the attribute out; "nan"/"inf" are accepted
    epsilon_type     ONNX attribute type: "float" (default), "floats" (a list), "int", "float16_tensor" (a
                     one-element FLOAT16 tensor, which the parser hands over as a FLOAT16 field)
    profile          [min, opt, max] token counts for X (default [1, 128, 512])
    residual         true: the fused form, inputs X, R, W and outputs Y, S (the node's 'residual' attribute 1;
                     for "sample_onnx", onnx_network's residual=True)
    r_dtype          R's dtype in the residual form (default: X's)
    r_hidden         R's last dimension in the residual form (default: X's)
    model_path       for source "model": an ONNX file (plugin nodes are found through the registry), parsed
                     by path as rms_norm_onnx_model.build_engine does, so external data is read beside it
    shapes           for source "model": {input name: [min shape, opt shape, max shape]}
    watched          for source "model": tensors also marked as outputs (build_engine's `watched`)
    compute_capability  the engine's one target (default "SM80"; "SM89", RTX's first with FP8)
    buggy_serialize  true: replace get_fields_to_serialize by the classic bug (a
                     PluginField over a temporary array) plus allocator churn,
                     to show the engine-record check catches a dangling buffer
    source           where the network comes from:
                     "test_onnx" (default) the ONNX model written below, W an initializer;
                     "sample_onnx" the sample's own onnx_network (what --from-onnx parses): its model and its
                     strongly_typed request, parsed by TensorRT-RTX's own parser (see parse_with_rtx);
                     "companion_one_node" rms_norm_onnx_model.one_node_model: ONNX's RMSNormalization,
                     which TensorRT imports with its own layers (what the companion compares without a model);
                     "model" the ONNX file at model_path, built for `shapes`.
                     "companion_one_node" and "model" build a strongly typed network, as the sample does. (The
                     sample's plugin_network needs INetworkDefinition.add_plugin_v3, which TensorRT has and
                     TensorRT-RTX does not; it is covered by the `trt` tests.)

Prints exactly one line on stdout: a JSON object with
    parse_ok, parser_errors, strongly_typed (the parsed network's flag), stage_error (a TensorRTError the
    sample raised, as one sentence, else null), build_ok, engine_size, epsilon_record_found,
    epsilon_records (float32 values stored after each b"epsilon\\0" name),
    configure_plugin (per call: inputs/outputs with min/opt/max dims and type),
    logger_errors, outputs (the network's output names and dtypes), inputs (its inputs' names and
    dtypes).
Failures are reported in that object; the worker itself exits 0.
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
    dtype="float16", w_dtype="float32", x_hidden=1024, w_hidden=1024, x_rank=2, epsilon=1e-5, epsilon_type="float",
    profile=[1, 128, 512], buggy_serialize=False, source="test_onnx", model_path=None, shapes=None, watched=[],
    residual=False, r_dtype=None, r_hidden=None, compute_capability="SM80",
)


def load_sample_with_rtx():
    """Import the sample with tensorrt_rtx standing in as `tensorrt` (support.sample_loader.load_sample)."""
    import tensorrt_rtx

    sys.path.insert(0, str(TESTS_DIR.parent))
    from support.sample_loader import load_sample

    sys.modules["tensorrt"] = tensorrt_rtx  # for this whole process: the sample and this worker agree
    return tensorrt_rtx, load_sample(tensorrt_rtx, "rms_norm_plugin_cutedsl")


def epsilon_record(eps: float) -> bytes:
    """How a one-value FLOAT32 field named 'epsilon' is laid out in a TensorRT-RTX engine.

    b"epsilon\\0", u32 length (1), u32 PluginFieldType (FLOAT32 == 1), the float32 value.
    """
    return b"epsilon\0" + struct.pack("<IIf", 1, 1, np.float32(eps))


def stored_epsilons(engine: bytes) -> list:
    """The float32 after every b"epsilon\\0" that is followed by (length 1, FLOAT32)."""
    values, start = [], 0
    while (at := engine.find(b"epsilon\0", start)) >= 0:
        start = at + 1
        head = engine[at + 8: at + 20]
        if len(head) == 12:
            length, ftype, value = struct.unpack("<IIf", head)
            if (length, ftype) == (1, 1):
                values.append(value)
    return values


def write_onnx(path: str, spec: dict) -> None:
    """One RmsNormPlugin node: X (graph input) and W (initializer) -> Y; or X, R, W -> Y, S (residual)."""
    import onnx
    from onnx import TensorProto, helper

    elem = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16, "float32": TensorProto.FLOAT,
            "int32": TensorProto.INT32}
    hidden = "hidden" if spec["x_hidden"] == "dynamic" else spec["x_hidden"]
    x_shape = [hidden] if spec["x_rank"] == 1 else ["num_tokens"] + [2] * (spec["x_rank"] - 2) + [hidden]
    x = helper.make_tensor_value_info("X", elem[spec["dtype"]], x_shape)
    y = helper.make_tensor_value_info("Y", elem[spec["dtype"]], x_shape)
    if spec["w_dtype"] == "int32":
        values = [1] * spec["w_hidden"]
    else:  # make_tensor rounds them to W's type, bf16 included (which numpy lacks)
        values = np.linspace(0.5, 1.5, spec["w_hidden"]).tolist()
    w = helper.make_tensor("W", elem[spec["w_dtype"]], [spec["w_hidden"]], values)

    attrs = {"plugin_version": "1", "plugin_namespace": ""}
    eps = spec["epsilon"]
    if eps is not None:
        eps = float(eps)  # also turns "nan"/"inf" into floats
        attrs["epsilon"] = {"float": eps, "floats": [eps, eps], "int": int(eps) if math.isfinite(eps) else 1,
                            "float16_tensor": helper.make_tensor("epsilon", TensorProto.FLOAT16, [1], [eps])}[
            spec["epsilon_type"]]
    inputs, outputs = [x], [y]
    if spec["residual"]:
        attrs["residual"] = 1
        r_shape = x_shape[:-1] + [spec["r_hidden"] or hidden]
        inputs.append(helper.make_tensor_value_info("R", elem[spec["r_dtype"] or spec["dtype"]], r_shape))
        outputs.append(helper.make_tensor_value_info("S", elem[spec["dtype"]], x_shape))
    names = (["X", "R", "W"], ["Y", "S"]) if spec["residual"] else (["X", "W"], ["Y"])
    node = helper.make_node("RmsNormPlugin", *names, name="rms_norm", **attrs)
    graph = helper.make_graph([node], "rms_norm", inputs, outputs, initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def dims(d) -> list:
    return [int(v) for v in d]


def record_configure_plugin(sample, calls: list) -> None:
    """Wrap RmsNormPlugin.configure_plugin so every call is recorded; the real method still runs."""
    real = sample.RmsNormPlugin.configure_plugin

    def describe(descs):
        return [{"min": dims(d.min), "opt": dims(d.opt), "max": dims(d.max), "type": str(d.desc.type)} for d in descs]

    def configure_plugin(self, inp, out):
        calls.append({"inputs": describe(inp), "outputs": describe(out)})
        return real(self, inp, out)

    sample.RmsNormPlugin.configure_plugin = configure_plugin


def install_buggy_serialize(sample, trt) -> None:
    """The bug the engine-record check exists for: PluginField keeps only a pointer to a temporary."""

    def get_fields_to_serialize(self):
        fields = trt.PluginFieldCollection([
            trt.PluginField("epsilon", np.array([self.epsilon], dtype=np.float32), trt.PluginFieldType.FLOAT32)])
        junk = [np.full(1, 12345.0 + i, dtype=np.float32) for i in range(64)]  # reuse the freed memory
        del junk
        return fields

    sample.RmsNormPlugin.get_fields_to_serialize = get_fields_to_serialize


def parse_with_rtx(trt, logger, result: dict):
    """TEST DOUBLE of polygraphy.backend.trt.network_from_onnx_bytes, which the sample's onnx_network calls:
    Polygraphy refuses TensorRT-RTX (its create_network asks for EXPLICIT_BATCH, which RTX lacks), so this makes
    what Polygraphy's NetworkFromOnnxBytes makes (polygraphy/backend/trt/loader.py), with TensorRT-RTX's own API:
    a builder, a network, strongly typed only if asked, and a parser that has parsed the sample's bytes; like
    Polygraphy it raises when the parse fails (the sample turns that into its TensorRTError)."""

    def network_from_onnx_bytes(model_bytes, strongly_typed=None):
        builder = trt.Builder(logger)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
                                         if strongly_typed else 0)
        parser = trt.OnnxParser(network, logger)
        result["parse_ok"] = bool(parser.parse(model_bytes))
        result["parser_errors"] = [parser.get_error(i).desc() for i in range(parser.num_errors)]
        if not result["parse_ok"]:
            raise RuntimeError("the ONNX parser failed")  # Polygraphy: check_onnx_parser_errors
        return builder, network, parser

    return network_from_onnx_bytes


def build(spec: dict) -> dict:
    trt, sample = load_sample_with_rtx()
    result = {"parse_ok": False, "parser_errors": [], "build_ok": False, "engine_size": 0,
              "epsilon_record_found": False, "epsilon_records": [], "configure_plugin": [], "logger_errors": [],
              "outputs": [], "inputs": [], "strongly_typed": None, "stage_error": None}

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            if severity <= trt.ILogger.Severity.ERROR:
                result["logger_errors"].append(msg)

    logger = Logger()
    sample.register_creator()
    record_configure_plugin(sample, result["configure_plugin"])
    if spec["buggy_serialize"]:
        install_buggy_serialize(sample, trt)

    if spec["source"] == "sample_onnx":
        import polygraphy.backend.trt

        polygraphy.backend.trt.network_from_onnx_bytes = parse_with_rtx(trt, logger, result)
        try:
            builder, network, parser = sample.onnx_network(spec["x_hidden"], spec["dtype"], spec["epsilon"],
                                                           spec["w_dtype"], spec["residual"])
        except sample.TensorRTError as exc:
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
        elif spec["source"] == "companion_one_node":
            import argparse

            import onnx_ir
            import rms_norm_onnx_model as companion  # imports the sample bound to TensorRT-RTX above

            args = argparse.Namespace(hidden_dim=spec["x_hidden"], dtype=spec["dtype"], weight_dtype=spec["w_dtype"],
                                      epsilon=spec["epsilon"], seed=0)
            proto = onnx_ir.serde.serialize_model(companion.one_node_model(args))
            result["parse_ok"] = bool(parser.parse(proto.SerializeToString()))
    if spec["source"] != "sample_onnx":
        result["parser_errors"] = [parser.get_error(i).desc() for i in range(parser.num_errors)]
    if not result["parse_ok"]:
        return result
    result["strongly_typed"] = bool(network.get_flag(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
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
        profile.set_shape("X", [lo, *middle, hidden], [opt, *middle, hidden], [hi, *middle, hidden])
        if spec["residual"]:
            r_hidden = spec["r_hidden"] or hidden
            profile.set_shape("R", [lo, *middle, r_hidden], [opt, *middle, r_hidden], [hi, *middle, r_hidden])
    config.add_optimization_profile(profile)
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        return result

    engine = bytes(blob)
    result["build_ok"] = True
    result["engine_size"] = len(engine)
    if spec["epsilon"] is not None:
        result["epsilon_record_found"] = epsilon_record(float(spec["epsilon"])) in engine
    result["epsilon_records"] = stored_epsilons(engine)
    return result


def main(argv) -> int:
    spec = dict(DEFAULTS, **(json.loads(argv[1]) if len(argv) > 1 else {}))
    unknown = set(spec) - set(DEFAULTS)
    if unknown:
        raise SystemExit(f"unknown spec keys: {sorted(unknown)}")
    result = build(spec)
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
