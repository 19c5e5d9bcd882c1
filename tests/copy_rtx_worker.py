"""Build one engine around a copy's plugin with TensorRT-RTX on the CPU and report what happened.

A copy of the lesson (tests/fixtures/*.patch applied) is imported with ``tensorrt_rtx`` as its
``tensorrt``, its creator registered, and a one-node ONNX model of op type PLUGIN_NAME parsed by
TensorRT-RTX's own parser into a strongly typed network and built for one target, as
tests/rtx_build_worker.py does for the lesson (its docstring says why a process of its own and why
the ONNX parser: TensorRT-RTX's network has no add_plugin_v3). Nothing here runs a kernel.

Usage:  python tests/copy_rtx_worker.py '<json spec>'

Spec keys: copy (the copy's path), inputs ({name: dtype} in the plugin's order; W and a copy's
other column inputs are [hidden], every other input [num_tokens, hidden]), outputs ({name: dtype}),
hidden (default 1024), epsilon (default 1e-5), profile ([min, opt, max] token counts, default
[1, 128, 512]).

Prints one line on stdout: a JSON object with parse_ok, parser_errors, build_ok,
plugin_name_stored (the copy's PLUGIN_NAME in the engine), epsilon_stored (its float32 epsilon
field record in the engine), configure_plugin (per call: the inputs' and outputs' dtypes and
min/max dims). TensorRT's errors, and a Python exception in a plugin method, which the bindings
print, go to the output the parent reads.
"""

import json
import pathlib
import sys
import tempfile

from rtx_build_worker import epsilon_record

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULTS = dict(copy=None, inputs=None, outputs=None, hidden=1024, epsilon=1e-5,
                profile=[1, 128, 512])


def import_copy(path):
    """The copy, bound to TensorRT-RTX for this whole process."""
    import tensorrt_rtx

    sys.path.insert(0, str(ROOT))
    from support.sample_loader import import_file

    sys.modules["tensorrt"] = tensorrt_rtx
    return tensorrt_rtx, import_file(path, "copy_under_build")


def write_model(path, copy, spec):
    """A one-node model of op type copy.PLUGIN_NAME; the parser finds the registered creator."""
    import onnx
    from onnx import TensorProto, helper

    def value_info(name, dtype, shape):
        onnx_shape = ["num_tokens" if size == -1 else size for size in shape]
        return helper.make_tensor_value_info(name, getattr(TensorProto, copy.DTYPES[dtype].onnx),
                                             onnx_shape)

    inputs = copy.io_shapes(spec["hidden"], spec["inputs"])
    outputs = copy.io_shapes(spec["hidden"], spec["outputs"])
    node = helper.make_node(copy.PLUGIN_NAME, list(inputs), list(outputs), name="copy",
                            plugin_version=copy.PLUGIN_VERSION,
                            plugin_namespace=copy.PLUGIN_NAMESPACE, epsilon=spec["epsilon"])
    graph = helper.make_graph([node], "copy", [value_info(n, *io) for n, io in inputs.items()],
                              [value_info(n, *io) for n, io in outputs.items()])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return inputs


def build(spec: dict) -> dict:
    trt, copy = import_copy(spec["copy"])
    result = {"parse_ok": False, "parser_errors": [], "build_ok": False,
              "plugin_name_stored": False, "epsilon_stored": False, "configure_plugin": []}
    real_configure = copy.RmsNormPlugin.configure_plugin

    def configure_plugin(self, inp, out):
        """The copy's own method, its calls recorded."""
        def describe(descs):
            return [[str(d.desc.type), [int(v) for v in d.min], [int(v) for v in d.max]]
                    for d in descs]

        result["configure_plugin"].append({"inputs": describe(inp), "outputs": describe(out)})
        return real_configure(self, inp, out)

    copy.RmsNormPlugin.configure_plugin = configure_plugin
    copy.register_creator()
    logger = trt.Logger(trt.Logger.ERROR)  # TensorRT's errors go to the log the parent reads
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    with tempfile.TemporaryDirectory() as tmp:
        model = pathlib.Path(tmp, "copy.onnx")
        inputs = write_model(model, copy, spec)
        result["parse_ok"] = bool(parser.parse(model.read_bytes()))
    result["parser_errors"] = [parser.get_error(i).desc() for i in range(parser.num_errors)]
    if not result["parse_ok"]:
        return result
    config = builder.create_builder_config()
    # An explicit target: ComputeCapability.CURRENT needs a GPU.
    config.num_compute_capabilities = 1
    config.set_compute_capability(trt.ComputeCapability.SM80, 0)
    profile = builder.create_optimization_profile()
    low, opt, high = spec["profile"]
    for name, (_, shape) in inputs.items():
        if shape[0] == -1:  # a row input: num_tokens is dynamic
            profile.set_shape(name, (low, spec["hidden"]), (opt, spec["hidden"]),
                              (high, spec["hidden"]))
    config.add_optimization_profile(profile)
    blob = builder.build_serialized_network(network, config)  # None where the build failed
    engine = b"" if blob is None else bytes(blob)
    result.update(build_ok=blob is not None,
                  plugin_name_stored=copy.PLUGIN_NAME.encode() in engine,
                  epsilon_stored=epsilon_record(spec["epsilon"]) in engine)
    return result


if __name__ == "__main__":
    print(json.dumps(build(dict(DEFAULTS, **json.loads(sys.argv[1])))), flush=True)
