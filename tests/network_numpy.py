"""Evaluate a TensorRT INetworkDefinition with NumPy, layer by layer, on the CPU.

TensorRT-RTX builds networks without a GPU but cannot run them; this walks the
layers a network holds (through the real bindings' ILayer and its subclasses)
and computes each one with NumPy in the layer's own dtype, so what a network
computes can be checked where no engine can run. Only the layer kinds the
sample's built-in RMSNorm may use are known; any other kind fails loudly.
"""

import numpy as np
import torch


def _cast(trt, value, to_type):
    if to_type == trt.DataType.BF16:  # NumPy has no bfloat16: round through torch, keep float32 carriers
        return torch.from_numpy(np.ascontiguousarray(value, np.float32)).to(torch.bfloat16).float().numpy()
    return value.astype({trt.DataType.FLOAT: np.float32, trt.DataType.HALF: np.float16}[to_type])


def evaluate(trt, network, feeds: dict) -> dict:
    """{output name: array} for `feeds` {input name: array} (bf16 inputs as float32 arrays of bf16 values)."""
    ew, un, red = trt.ElementWiseOperation, trt.UnaryOperation, trt.ReduceOperation
    elementwise = {ew.SUM: np.add, ew.SUB: np.subtract, ew.PROD: np.multiply, ew.DIV: np.divide,
                   ew.MAX: np.maximum, ew.MIN: np.minimum, ew.POW: np.power}
    unary = {un.SQRT: np.sqrt, un.RECIP: np.reciprocal, un.EXP: np.exp, un.LOG: np.log, un.ABS: np.abs,
             un.NEG: np.negative}
    reduce = {red.SUM: np.sum, red.AVG: np.mean, red.MAX: np.max, red.MIN: np.min, red.PROD: np.prod}
    kinds = {trt.LayerType.CAST: trt.ICastLayer, trt.LayerType.ELEMENTWISE: trt.IElementWiseLayer,
             trt.LayerType.UNARY: trt.IUnaryLayer, trt.LayerType.REDUCE: trt.IReduceLayer,
             trt.LayerType.CONSTANT: trt.IConstantLayer, trt.LayerType.SHUFFLE: trt.IShuffleLayer}
    values = dict(feeds)
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type not in kinds:
            raise NotImplementedError(f"no NumPy evaluation for {layer.type}")
        layer.__class__ = kinds[layer.type]  # the bindings' way to reach a layer's own attributes
        ins = [values[layer.get_input(j).name] for j in range(layer.num_inputs)]
        if layer.type == trt.LayerType.CAST:
            out = _cast(trt, ins[0], layer.to_type)
        elif layer.type == trt.LayerType.ELEMENTWISE:
            out = elementwise[layer.op](ins[0], ins[1])
        elif layer.type == trt.LayerType.UNARY:
            out = unary[layer.op](ins[0])
        elif layer.type == trt.LayerType.REDUCE:
            axes = tuple(a for a in range(ins[0].ndim) if layer.axes >> a & 1)
            out = reduce[layer.op](ins[0], axis=axes, keepdims=layer.keep_dims).astype(ins[0].dtype)
        elif layer.type == trt.LayerType.CONSTANT:
            out = np.asarray(layer.weights).reshape(tuple(layer.shape))  # the bindings return an ndarray
        else:  # SHUFFLE: only a reshape (no transposes) is expected
            assert tuple(layer.first_transpose)[:ins[0].ndim] == tuple(range(ins[0].ndim)), "transpose"
            assert tuple(layer.second_transpose)[:len(layer.reshape_dims)] == tuple(range(len(layer.reshape_dims)))
            out = ins[0].reshape(tuple(layer.reshape_dims))
        values[layer.get_output(0).name] = out
    return {network.get_output(i).name: values[network.get_output(i).name] for i in range(network.num_outputs)}
