"""ONNX models for the --from-onnx tests: a decoder-style block exported by torch, and one-node models.

The decoder is made by torch.onnx.export (the dynamo exporter, which needs
onnxscript) at opset 23, where torch.nn.RMSNorm becomes ONNX's own
RMSNormalization: the model a user exports, not one written to suit the
rewrite. The one-node models, written with onnx.helper, vary one attribute at
a time to show which nodes the plugin leaves to TensorRT.
"""

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

HIDDEN = 64
BATCH = 2  # static; the sequence length is the model's one dynamic dimension


class Decoder(torch.nn.Module):
    """X -> RMSNorm -> Linear (a MatMul) -> residual add -> RMSNorm, fp16 weights."""

    def __init__(self, hidden=HIDDEN):
        super().__init__()
        self.norm_in = torch.nn.RMSNorm(hidden, eps=1e-5)
        self.proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.norm_out = torch.nn.RMSNorm(hidden, eps=1e-6)

    def forward(self, x):
        return self.norm_out(x + self.proj(self.norm_in(x)))


def export_decoder(path, dtype=torch.float16, seed=0):
    """Export Decoder with random weights (the two norms' scales differ) to `path`; returns the module."""
    torch.manual_seed(seed)
    module = Decoder().to(dtype).eval()
    with torch.no_grad():
        module.norm_in.weight.uniform_(0.5, 1.5)
        module.norm_out.weight.uniform_(-1.0, 1.0)
    x = torch.randn(BATCH, 5, HIDDEN, dtype=dtype)
    seq = torch.export.Dim("seq", min=1, max=4096)
    program = torch.onnx.export(module, (x,), None, opset_version=23, dynamo=True,
                                dynamic_shapes=({1: seq},), verbose=False)
    program.save(str(path))
    return module


def one_node_model(x_shape, scale_shape=(HIDDEN,), x_type=TensorProto.FLOAT16, scale_type=None, **attrs):
    """One RMSNormalization node, X a graph input, scale an initializer; attrs override the defaults."""
    scale_type = x_type if scale_type is None else scale_type
    scale = numpy_helper.from_array(np.linspace(0.5, 1.5, int(np.prod(scale_shape))).reshape(scale_shape).astype(
        helper.tensor_dtype_to_np_dtype(scale_type)), "scale")
    node = helper.make_node("RMSNormalization", ["X", "scale"], ["Y"], name="norm",
                            **{"axis": -1, "epsilon": 1e-5, "stash_type": 1, **attrs})
    graph = helper.make_graph([node], "one_norm", [helper.make_tensor_value_info("X", x_type, list(x_shape))],
                              [helper.make_tensor_value_info("Y", scale_type, list(x_shape))], initializer=[scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    return model


def save(model, path):
    onnx.save(model, str(path))
    return path
