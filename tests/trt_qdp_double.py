"""TEST DOUBLE: the C++-backed part of ``tensorrt`` that TensorRT's ``tensorrt.plugin`` needs.

It is NOT TensorRT. ``tensorrt.plugin`` (pure Python, inside the
tensorrt-cu12-bindings wheel) imports ``tensorrt`` for enums, field and
descriptor structs, the plugin base classes and the symbolic-shape API, all of
which live in libnvinfer's pybind11 bindings. This module supplies exactly the
names that package's modules touch, each behaving as the binding it mirrors in
NVIDIA/TensorRT ``python/src/infer/pyPlugin.cpp`` (PluginField, DimsExprs,
IDimensionExpr, IExprBuilder, PluginTensorDesc, DynamicPluginTensorDesc,
ISymExpr, ISymExprs, KernelLaunchParams, the enums), ``pyTensorRT.cpp``
(PluginFieldCollection: ``py::bind_vector<std::vector<PluginField>>``) and
``pyFoundationalTypes.cpp`` (Dims, DataType); the enums and plugin fields are
those of support/trt_standin.py, which mirror the same sources. The plugin
registry returns what ``IPluginRegistry`` returns (``register_creator``: False
where a creator of that name, version and namespace is there already).
Everything else the tests call (``tensorrt.plugin`` itself, the AOT flavor's
functions) is the real code.

One addition has no counterpart in TensorRT: ``SymbolicDim`` stands for a
dimension TensorRT leaves symbolic (the token count), and ``Expr.evaluate``
computes an expression for a concrete value of it, so a test can read what a
symbolic grid size will be at run time.
"""

import enum
import operator
import types

import numpy as np

# Enums and plugin fields are the GPU stand-in's, which mirror the same bindings.
from support.trt_standin import (  # noqa: F401
    DataType, PluginField, PluginFieldCollection, PluginFieldType, TensorFormat, TensorRTPhase)


class DimensionOperation(enum.IntEnum):
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    SUB = 4
    EQUAL = 5
    LESS = 6
    FLOOR_DIV = 7
    CEIL_DIV = 8


class PluginArgType(enum.IntEnum):
    INT = 0


class PluginArgDataType(enum.IntEnum):
    INT8 = 0
    INT16 = 1
    INT32 = 2


class QuickPluginCreationRequest(enum.IntEnum):  # exists from TensorRT 10.9 (AOT plugins)
    UNKNOWN = 0
    PREFER_JIT = 1
    PREFER_AOT = 2
    STRICT_JIT = 3
    STRICT_AOT = 4


float32, float16, bfloat16, int32 = DataType.FLOAT, DataType.HALF, DataType.BF16, DataType.INT32
_NPTYPES = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT32: np.int32,
            DataType.INT8: np.int8}


def nptype(trt_type):
    return _NPTYPES[trt_type]


class Logger:
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    def __init__(self, min_severity=WARNING):
        self.min_severity = min_severity

    def log(self, severity, msg):
        pass


class Dims(tuple):
    """nvinfer1::Dims: indexes and iterates as Python ints."""

    MAX_DIMS = 8

    def __new__(cls, shape=()):
        return super().__new__(cls, (int(d) for d in shape))


class PluginTensorDesc:
    def __init__(self):
        self.dims = Dims()
        self.type = DataType.FLOAT
        self.format = TensorFormat.LINEAR
        self.scale = 1.0

    def __setattr__(self, name, value):
        super().__setattr__(name, Dims(value) if name == "dims" else value)


class DynamicPluginTensorDesc:
    def __init__(self):
        self.desc, self.min, self.opt, self.max = PluginTensorDesc(), Dims(), Dims(), Dims()


class ITensor:
    """A network tensor; tensorrt.plugin only checks isinstance."""


class IPluginV3:
    def __init__(self):
        pass


class IPluginV3QuickCore:
    def __init__(self):
        pass


class IPluginV3QuickBuild:
    def __init__(self):
        pass


class IPluginV3QuickRuntime:
    def __init__(self):
        pass


class IPluginV3QuickAOTBuild:
    def __init__(self):
        pass


class IPluginCreatorV3Quick:
    def __init__(self):
        pass


class _Registry:
    """The plugin registry returns the very Python creator object that was registered."""

    def __init__(self):
        self._creators = {}

    def register_creator(self, creator, namespace=""):
        """False, and the registry unchanged, where a creator of that key is there already."""
        key = (creator.name, creator.plugin_version, namespace)
        if key in self._creators:
            return False
        self._creators[key] = creator
        return True

    def get_creator(self, name, version, namespace=""):
        return self._creators.get((name, version, namespace))


class IDimensionExpr:
    """Base of every expression (the binding: is_constant, get_constant_value, is_size_tensor)."""

    def is_size_tensor(self):
        return False


class Expr(IDimensionExpr):
    """A constant, a symbolic dimension or an operation on two expressions."""

    _OPS = {
        DimensionOperation.SUM: operator.add,
        DimensionOperation.PROD: operator.mul,
        DimensionOperation.MAX: max,
        DimensionOperation.MIN: min,
        DimensionOperation.SUB: operator.sub,
        DimensionOperation.EQUAL: lambda a, b: int(a == b),
        DimensionOperation.LESS: lambda a, b: int(a < b),
        DimensionOperation.FLOOR_DIV: operator.floordiv,
        DimensionOperation.CEIL_DIV: lambda a, b: -(-a // b),
    }

    def __init__(self, value=None, op=None, args=()):
        self._value, self._op, self._args = value, op, args

    def is_constant(self):
        return self._value is not None

    def get_constant_value(self):
        if self._value is None:
            # TensorRT returns a meaningless value here; the double refuses it.
            raise ValueError("not a build-time constant")
        return self._value

    def evaluate(self, **symbols) -> int:
        """Not in TensorRT: the expression's value for concrete values of the symbolic
        dimensions."""
        if self._value is not None:
            return self._value
        if self._op is None:
            return symbols[self._name]
        a, b = (arg.evaluate(**symbols) for arg in self._args)
        return self._OPS[self._op](a, b)


class SymbolicDim(Expr):
    """Not in TensorRT: a dimension it leaves symbolic, such as the dynamic token count."""

    def __init__(self, name):
        super().__init__()
        self._name = name


class IExprBuilder:
    """constant() and operation(); TensorRT folds an operation on two constants into a constant."""

    def constant(self, value):
        return Expr(int(value))

    def operation(self, op, first, second):
        if first.is_constant() and second.is_constant():
            return Expr(Expr._OPS[op](first.get_constant_value(), second.get_constant_value()))
        return Expr(op=op, args=(first, second))


class DimsExprs(list):
    """DimsExprs(n) has n empty slots; DimsExprs(sequence) copies the expressions."""

    def __init__(self, arg=()):
        super().__init__([None] * arg if isinstance(arg, int) else arg)


class ISymExpr:
    def __init__(self):
        self.type = self.dtype = self.expr = None


class ISymExprs:
    """What get_launch_params fills with the extra kernel arguments."""

    def __init__(self):
        self.nbSymExprs = 0
        self._exprs = {}

    def __len__(self):
        return self.nbSymExprs

    def __setitem__(self, index, expr):
        if not 0 <= index < self.nbSymExprs:
            raise IndexError(index)
        self._exprs[index] = expr

    def __getitem__(self, index):
        return self._exprs[index]


class KernelLaunchParams:
    """IKernelLaunchParams: grid, block and shared memory, each an ISymExpr."""

    def __init__(self):
        self.grid_x = self.grid_y = self.grid_z = None
        self.block_x = self.block_y = self.block_z = None
        self.shared_mem = None


def make_tensorrt(version: str, aot: bool = True) -> types.ModuleType:
    """A fresh ``tensorrt`` double for one TensorRT version; ``aot=False`` leaves out what arrived
    in 10.9."""
    module = types.ModuleType("tensorrt", __doc__)
    module.__version__ = version
    for name, value in globals().items():
        not_tensorrt = name in ("make_tensorrt", "SymbolicDim", "Expr")
        if name.startswith("_") or not_tensorrt or isinstance(value, types.ModuleType):
            continue
        module.__dict__[name] = value
    if not aot:
        for name in ("QuickPluginCreationRequest", "IPluginV3QuickAOTBuild", "ISymExpr",
                     "ISymExprs", "KernelLaunchParams", "PluginArgType", "PluginArgDataType"):
            del module.__dict__[name]
    registry = _Registry()
    module.get_plugin_registry = lambda: registry
    return module
