"""CPU, in the Torch-TensorRT environment: the ops lowered by Torch-TensorRT's own code.

Run in the environment of requirements-torch-trt.txt (.ci/run's second step); in the main test
environment torch_tensorrt is absent and this module is not collected there.

Real code: torch.export, Torch-TensorRT's lowering, partitioning and TRTInterpreter
(torch-tensorrt-rtx 2.14.0, whose dynamo Python is the full 2.14.0 build's), TensorRT-RTX's
network for every layer but the plugin's, the converters of rms_norm_torch_op.py, TensorRT's own
``tensorrt.plugin`` (the tensorrt-cu12-bindings wheel, loaded as tests/test_aot_qdp.py loads it)
and the AOT flavor's QDP ops. Test doubles, each labelled where it is made:

* the GPU queries torch_tensorrt 2.14.0 makes at import and for its default settings
  (upstream PR pytorch/TensorRT#4504 removes them), answered as device 0 of SM 9.0 answers;
* the C++ part of ``tensorrt`` that ``tensorrt.plugin`` needs (tests/trt_qdp_double.py);
* ``add_plugin`` on the network, which TensorRT-RTX's network lacks (PluginLayerNetwork).

Where it stops: at the engine. TensorRT-RTX's network holds no plugin, and Torch-TensorRT's
engine is deserialized on a GPU; the plugin in a built engine is tested by the ``trt`` tests of
tests/test_torch_op_gpu.py, with full TensorRT on a GPU.
"""

import importlib.util
import sys

import numpy as np
import pytest
import torch

if importlib.util.find_spec("torch_tensorrt") is None:
    pytest.skip("torch_tensorrt is not installed; these tests run in the environment of "
                "requirements-torch-trt.txt", allow_module_level=True)

import rms_norm_aot_cutedsl as aot
import rms_norm_torch_op as op
import trt_qdp_double
from test_aot_qdp import bindings_wheels, build, f32_literal, load_tensorrt_plugin  # noqa: F401
from test_torch_op import NORMS, OPS, Forms, decoder

pytestmark = pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
ARCH = "sm_90a"
# The TensorRT torch-tensorrt 2.14.0 installs with (tensorrt-cu13 11.1.x): its tensorrt.plugin.
TENSORRT = "11.1.0.106"
EPS = 2.0**-15  # exact in float32; the PTX writes it as 0f38000000
EPS2 = 2.0**-10


@pytest.fixture(scope="module")
def torch_tensorrt():
    """torch_tensorrt, imported on a machine without a GPU."""
    with pytest.MonkeyPatch.context() as patch:
        if not torch.cuda.is_available():
            # TEST DOUBLE of two GPU queries (not Torch-TensorRT code): torch_tensorrt asks for
            # the GPU's compute capability at import and for the current device whenever it makes
            # default settings; pytorch/TensorRT#4504 makes both work without a GPU. Answered as
            # device 0 of an SM 9.0 GPU answers.
            patch.setattr(torch.cuda, "get_device_capability", lambda *args, **kwargs: (9, 0))
            patch.setattr(torch.cuda, "current_device", lambda: 0)
        import torch_tensorrt

        yield torch_tensorrt


@pytest.fixture(scope="module")
def qdp(torch_tensorrt, bindings_wheels):  # noqa: F811 (the imported fixture)
    """(double tensorrt, real tensorrt.plugin) with the converters registered for ARCH."""
    import tensorrt_rtx

    alias = sys.modules["tensorrt"]  # torch_tensorrt's alias of tensorrt_rtx
    trt = trt_qdp_double.make_tensorrt(TENSORRT)
    # The network's tensors are TensorRT-RTX's; tensorrt.plugin only checks their class.
    trt.ITensor = tensorrt_rtx.ITensor
    with pytest.MonkeyPatch.context() as patch:
        package = load_tensorrt_plugin(bindings_wheels(TENSORRT), trt, patch)
        patch.setattr(aot, "_REGISTERED", False)
        patch.setattr(op, "_CONVERTERS_REGISTERED", False)
        # TEST DOUBLE of one feature flag: this is the RTX build, which register_converters
        # refuses (tested below with the real flag); here PluginLayerNetwork gives its network
        # the add_plugin it lacks.
        features = torch_tensorrt.ENABLED_FEATURES._replace(tensorrt_rtx=False)
        patch.setattr(torch_tensorrt, "ENABLED_FEATURES", features)
        op.register_converters(ARCH)
        # Torch-TensorRT's own imports of tensorrt get TensorRT-RTX again; the converters'
        # `import tensorrt.plugin` gets the real package.
        patch.setitem(sys.modules, "tensorrt", alias)
        patch.setattr(alias, "plugin", package, raising=False)
        yield trt, package


class PluginLayerNetwork:
    """TEST DOUBLE of INetworkDefinition.add_plugin, on TensorRT-RTX's real network.

    TensorRT-RTX's network has no add_plugin. This one does what full TensorRT's does
    (python/src/infer/pyGraph.cpp, add_plugin_func): it calls the QDP op's creation function
    with STRICT_AOT where aot=True (STRICT_JIT otherwise) and adds a layer of the plugin it
    returns. It records each call, and its layer's outputs are real tensors of the network: a
    cast of the first input to the dtype the plugin gives each output (get_output_data_types),
    in that input's shape (the QDP ops' outputs have X's). Every other call is the real
    network's.
    """

    def __init__(self, network, trt):
        self._network = network
        self._trt = trt
        self.plugins = []

    def __getattr__(self, name):
        return getattr(self._network, name)

    def add_plugin(self, make, aot):
        request = self._trt.QuickPluginCreationRequest
        inputs, shape_inputs, plugin = make(request.STRICT_AOT if aot else request.STRICT_JIT)
        # Each DataType by name: the double's to the plugin, TensorRT-RTX's to the network.
        types = [getattr(self._trt.DataType, t.dtype.name) for t in inputs]
        output_types = plugin.get_output_data_types(types, [len(t.shape) for t in inputs])
        network_types = type(inputs[0].dtype)
        outputs = [self._network.add_cast(inputs[0], getattr(network_types, t.name)).get_output(0)
                   for t in output_types]
        layer = PluginLayer(outputs)
        self.plugins.append({"inputs": inputs, "plugin": plugin, "aot": aot, "layer": layer})
        return layer


class PluginLayer:
    """What add_plugin returns: a layer with a name and outputs (IPluginV3Layer's)."""

    def __init__(self, outputs):
        self.name = ""
        self._outputs = outputs

    @property
    def num_outputs(self):
        return len(self._outputs)

    def get_output(self, index):
        return self._outputs[index]


class NetworkBuilt(Exception):
    """Stops Torch-TensorRT after the network is made: the engine build needs a GPU."""


@pytest.fixture
def convert(qdp, torch_tensorrt, monkeypatch):
    """convert(module, example inputs, dynamic shapes, Torch-TensorRT Inputs): the
    PluginLayerNetwork that torch_tensorrt.dynamo.compile made of the module's one engine."""
    from torch_tensorrt.dynamo.conversion import TRTInterpreter

    trt, _ = qdp
    networks = []
    construct = TRTInterpreter._construct_trt_network_def

    def construct_then_stop(self):
        self.ctx.net = PluginLayerNetwork(self.ctx.net, trt)
        construct(self)
        networks.append(self.ctx.net)
        raise NetworkBuilt

    monkeypatch.setattr(TRTInterpreter, "_construct_trt_network_def", construct_then_stop)

    def run(module, args, dynamic_shapes, inputs):
        with torch.no_grad():
            exported = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
        with pytest.raises(NetworkBuilt):
            torch_tensorrt.dynamo.compile(exported, arg_inputs=inputs, min_block_size=1,
                                          offload_module_to_cpu=True)
        (network,) = networks
        return network

    return run


def rows(torch_tensorrt, hidden, dtype, opt=8, most=4096):
    return torch_tensorrt.Input(min_shape=(1, hidden), opt_shape=(opt, hidden),
                                max_shape=(most, hidden), dtype=dtype)


def test_register_converters_refuses_torch_tensorrt_rtx_in_one_sentence(torch_tensorrt,
                                                                        monkeypatch):
    monkeypatch.setattr(op, "_CONVERTERS_REGISTERED", False)
    assert torch_tensorrt.ENABLED_FEATURES.tensorrt_rtx
    with pytest.raises(op.UsageError, match=r"^torch-tensorrt-rtx cannot put a plugin into its "
                                            r"engines \(TensorRT-RTX has no plugin layer\); "):
        op.register_converters(ARCH)


def constant_values(network, tensor):
    """The weights of the constant layer whose output is `tensor`."""
    import tensorrt_rtx

    for index in range(network.num_layers):
        layer = network.get_layer(index)
        is_constant = layer.type == tensorrt_rtx.LayerType.CONSTANT
        if is_constant and layer.get_output(0).name == tensor.name:
            layer.__class__ = tensorrt_rtx.IConstantLayer  # how TensorRT's Python API downcasts
            return np.array(layer.weights)
    raise AssertionError(f"{tensor.name} is not a constant's output")


def test_the_converters_add_each_form_as_its_aot_plugin(convert, qdp, torch_tensorrt):
    trt, _ = qdp
    module = Forms(256, (EPS, EPS2))
    x = torch.randn(8, 256, dtype=torch.bfloat16)
    tokens = torch.export.Dim("tokens", min=1, max=4096)
    network = convert(module, (x, x.clone()), ({0: tokens}, {0: tokens}),
                      [rows(torch_tensorrt, 256, torch.bfloat16)] * 2)
    first, second = network.plugins
    assert [(p["plugin"].plugin_namespace, p["plugin"].plugin_name, p["aot"])
            for p in network.plugins] == [("rms_norm_cutedsl", "rms_norm", True),
                                          ("rms_norm_cutedsl", "add_rms_norm", True)]
    for call, epsilon in ((first, EPS), (second, EPS2)):
        (name, value), = call["plugin"].attrs.items()
        assert name == "epsilon" and value.dtype == np.float32 and value.tolist() == [epsilon]
        assert call["layer"].name.startswith(f"[{call['plugin'].plugin_namespace}.")

    x_in, w_in = first["inputs"]
    assert (x_in.name, tuple(x_in.shape), x_in.dtype.name) == ("x", (-1, 256), "BF16")
    assert (tuple(w_in.shape), w_in.dtype.name) == ((256,), "BF16")
    y_in, r_in, g_in = second["inputs"]
    assert y_in.name == first["layer"].get_output(0).name, "the first plugin's Y feeds the second"
    assert (r_in.name, tuple(r_in.shape), r_in.dtype.name) == ("r", (-1, 256), "BF16")
    assert (tuple(g_in.shape), g_in.dtype.name) == ((256,), "FLOAT")
    expected = 1.0 + module.g.detach().float().numpy()
    np.testing.assert_array_equal(constant_values(network, g_in), expected)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_the_plugin_the_converter_adds_embeds_ptx_with_the_graphs_epsilon(convert, qdp,
                                                                         torch_tensorrt, residual):
    """The plugin added for a node, driven through the build calls TensorRT makes
    (test_aot_qdp.build): its kernel is compiled for ARCH with the node's epsilon baked in."""
    trt, _ = qdp

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.rand(1024, dtype=torch.float16))

        def forward(self, x, r):
            if residual:
                return OPS.add_rms_norm(x, r, self.w, EPS)
            return OPS.rms_norm(x, self.w, EPS) + r

    x = torch.randn(8, 1024, dtype=torch.float16)
    tokens = torch.export.Dim("tokens", min=1, max=4096)
    network = convert(Norm(), (x, x.clone()), ({0: tokens}, {0: tokens}),
                      [rows(torch_tensorrt, 1024, torch.float16)] * 2)
    (call,) = network.plugins
    half = trt.DataType.HALF
    out_dims, _, _, _, (name, ptx) = build(trt, call["plugin"], 1024, half, w_type=half,
                                           residual=residual)
    assert len(out_dims) == 1 + residual
    ptx = ptx.decode()
    assert f".target {ARCH}" in ptx and f32_literal(EPS) in ptx
    assert ("_residual" in name) == residual


def test_the_fp8_forms_pass_epsilon_and_y_scale(convert, qdp, torch_tensorrt):
    class Fp8(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.rand(512))

        def forward(self, x, r):
            y = OPS.rms_norm_fp8(x, self.w, EPS, 0.375)
            y2, s = OPS.add_rms_norm_fp8(x, r, self.w, EPS2, 0.5)
            return y, y2, s

    x = torch.randn(8, 512, dtype=torch.float16)
    tokens = torch.export.Dim("tokens", min=1, max=4096)
    network = convert(Fp8(), (x, x.clone()), ({0: tokens}, {0: tokens}),
                      [rows(torch_tensorrt, 512, torch.float16)] * 2)
    found = [(p["plugin"].plugin_name, {k: v.tolist() for k, v in p["plugin"].attrs.items()},
              [network.plugins[i]["layer"].get_output(j).dtype.name
               for j in range(p["layer"].num_outputs)])
             for i, p in enumerate(network.plugins)]
    assert found == [("rms_norm_fp8", {"epsilon": [EPS], "y_scale": [0.375]}, ["FP8"]),
                     ("add_rms_norm_fp8", {"epsilon": [EPS2], "y_scale": [0.5]},
                      ["FP8", "HALF"])]


def in_engines(compiled) -> dict:
    """{"engine": calls of the ops in graphs Torch-TensorRT gives to TensorRT, "pytorch": the
    others}, from a dryrun's partitioned module."""
    found = {"engine": 0, "pytorch": 0}
    for name, module in compiled.named_modules():
        if isinstance(module, torch.fx.GraphModule):
            place = "engine" if name.startswith("_run_on_acc") else "pytorch"
            found[place] += sum(str(node.target).startswith("rms_norm_cutedsl.")
                                for node in module.graph.nodes)
    return found


@pytest.mark.parametrize("model", ["qwen3", "gemma3"])
def test_partitioning_puts_every_norm_of_a_swapped_decoder_into_the_engine(qdp, torch_tensorrt,
                                                                          model):
    """dryrun: Torch-TensorRT's partitioner, with the converters registered, no conversion."""
    swapped = decoder(model, torch.bfloat16)
    count = op.swap_rms_norms(swapped)
    ids = torch.randint(0, op.VOCAB, (1, 8))
    tokens = torch.export.Dim("tokens", min=1, max=1024)
    with torch.no_grad():
        exported = torch.export.export(swapped, (ids,), dynamic_shapes=({1: tokens},))
    ids_input = torch_tensorrt.Input(min_shape=(1, 1), opt_shape=(1, 8), max_shape=(1, 1024),
                                     dtype=torch.int64)
    compiled = torch_tensorrt.dynamo.compile(exported, arg_inputs=[ids_input], min_block_size=1,
                                             offload_module_to_cpu=True, dryrun=True)
    assert in_engines(compiled) == {"engine": NORMS[model], "pytorch": 0}
    assert count == NORMS[model]


def test_a_norm_of_a_symbolic_hidden_size_stays_in_pytorch(qdp, torch_tensorrt):
    """The kernel compiles the hidden size in: static_hidden refuses the node, which then runs
    on the op's CUDA function."""
    class Norm(torch.nn.Module):
        def forward(self, x, w):
            return OPS.rms_norm(x, w, EPS) * 2

    x = torch.randn(8, 64, dtype=torch.float16)
    hidden = torch.export.Dim("hidden", min=2, max=4096)
    dynamic = ({0: torch.export.Dim("tokens", max=100), 1: hidden}, {0: hidden})
    exported = torch.export.export(Norm(), (x, x[0].clone()), dynamic_shapes=dynamic)
    inputs = [torch_tensorrt.Input(min_shape=(1, 2), opt_shape=(8, 64), max_shape=(100, 4096),
                                   dtype=torch.float16),
              torch_tensorrt.Input(min_shape=(2,), opt_shape=(64,), max_shape=(4096,),
                                   dtype=torch.float16)]
    compiled = torch_tensorrt.dynamo.compile(exported, arg_inputs=inputs, min_block_size=1,
                                             offload_module_to_cpu=True, dryrun=True)
    assert in_engines(compiled) == {"engine": 0, "pytorch": 1}
