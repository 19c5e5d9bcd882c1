"""TEST DOUBLE: a minimal stand-in for the ``tensorrt`` module, for GPU machines without TensorRT.

It is NOT TensorRT. It offers only the names rms_norm_plugin_cutedsl.py and
rms_norm_fused_cutedsl.py touch at run time (plugin base classes, fields,
dtypes, tensor descriptors, the registry, whose deregister_creator the fused
companion's register_creator calls to take the lesson's place), so the GPU
tests and the benchmarks can drive the plugins' own methods exactly as
TensorRT calls them: TensorRT-shaped descriptors, raw device pointers and a
stream handle. tests/test_standin_names.py checks on the
CPU that every name offered here exists with the same spelling on real
TensorRT-family bindings (TensorRT-RTX).

Each class behaves as the binding it mirrors in NVIDIA/TensorRT
``python/src/infer/pyPlugin.cpp`` (PluginField, PluginTensorDesc, the enums),
``python/src/pyTensorRT.cpp`` (PluginFieldCollection is
``py::bind_vector<std::vector<PluginField>>``) and
``python/src/infer/pyFoundationalTypes.cpp`` (Dims). In particular, a field
collection keeps only pointers: an array that nothing else references is
freed even while a collection points at it. TensorRT would then read freed
memory; this stand-in raises instead, so the mistake shows every time.
"""

import enum
import weakref

import numpy as np


class DataType(enum.IntEnum):  # nvinfer1::DataType values
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8
    INT4 = 9


class TensorFormat(enum.IntEnum):
    LINEAR = 0
    CHW2 = 1
    HWC8 = 2
    CHW4 = 3


class PluginFieldType(enum.IntEnum):  # nvinfer1::PluginFieldType values
    FLOAT16 = 0
    FLOAT32 = 1
    FLOAT64 = 2
    INT8 = 3
    INT16 = 4
    INT32 = 5
    CHAR = 6
    DIMS = 7
    UNKNOWN = 8
    BF16 = 9
    INT64 = 10


class TensorRTPhase(enum.IntEnum):
    BUILD = 0
    RUNTIME = 1


class IPluginV3:
    def __init__(self):
        pass


class IPluginV3OneCore:
    def __init__(self):
        pass


class IPluginV3OneBuild:
    """The two build methods a plugin may leave out, with the bindings' defaults (NVIDIA/TensorRT
    python/src/infer/pyPlugin.cpp): when TensorRT asks,
    PyIPluginV3OneBuildBaseImpl::getWorkspaceSize returns 0 and getNbTactics 0 where the Python
    class has no override, and the base methods Python sees (pluginDoc::getWorkspaceSizeV3,
    pluginDoc::getValidTactics) return 0 and []."""

    def __init__(self):
        pass

    def get_workspace_size(self, inp, out):
        return 0

    def get_valid_tactics(self):
        return []


class IPluginV3OneRuntime:
    def __init__(self):
        pass


class IPluginCreatorV3One:
    def __init__(self):
        pass


# The PluginField.data getter of pyPlugin.cpp: py::array(length, (T const*) data) for the field's
# type, i.e. a NEW 1-D array copied from the pointer.
_FIELD_DTYPES = {
    PluginFieldType.FLOAT32: np.float32, PluginFieldType.FLOAT64: np.float64,
    PluginFieldType.INT8: np.int8, PluginFieldType.INT16: np.int16,
    PluginFieldType.INT32: np.int32, PluginFieldType.INT64: np.int64,
    PluginFieldType.CHAR: np.int8, PluginFieldType.UNKNOWN: np.int8,
}


class PluginField:
    """(name, pointer to the buffer's first element, type, number of elements).

    Like the binding (``py::keep_alive<1, 3>``), the field object itself keeps its
    buffer alive; the structs a PluginFieldCollection holds do not.
    """

    def __init__(self, name="", data=None, type=PluginFieldType.UNKNOWN):
        self.name, self.type = name, type
        if isinstance(data, (bytes, bytearray)):
            self._buffer = np.frombuffer(data, np.uint8)
        else:
            self._buffer = np.asarray(data)
        self.size = int(self._buffer.size)  # the binding's `size`: number of elements, not bytes

    @property
    def data(self):
        return _copy_out(self._buffer, self.type)


def _copy_out(buffer, field_type):
    if field_type not in _FIELD_DTYPES:  # the binding raises for FLOAT16, BF16, DIMS, ...
        raise AttributeError("No known conversion for returning data from PluginField")
    return np.array(buffer.reshape(-1).view(np.uint8).view(_FIELD_DTYPES[field_type]))


class _FieldStruct:
    """One element of a PluginFieldCollection: the C struct, whose pointer keeps nothing alive."""

    def __init__(self, field: PluginField):
        self.name, self.type, self.size = field.name, field.type, field.size
        buffer = field._buffer
        owner = buffer
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        self._owner = weakref.ref(owner)
        start = buffer.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
        self._bytes = slice(start, start + buffer.nbytes)

    @property
    def data(self):
        owner = self._owner()
        if owner is None:
            raise RuntimeError(f"PluginField '{self.name}' points at a numpy array that has been "
                               "freed (TensorRT would read freed memory here)")
        return _copy_out(owner.reshape(-1).view(np.uint8)[self._bytes], self.type)


class PluginFieldCollection(list):
    """std::vector<PluginField>: built from fields, it copies their structs, not their buffers."""

    def __init__(self, fields=()):
        super().__init__(_FieldStruct(f) if isinstance(f, PluginField) else f for f in fields)


class PluginTensorDesc:
    """What enqueue/on_shape_change receive per tensor; dims index to Python ints, as trt.Dims
    does."""

    def __init__(self, dims=(), type=DataType.FLOAT, format=TensorFormat.LINEAR):
        self.dims, self.type, self.format = tuple(int(d) for d in dims or ()), type, format


class _Registry:
    """IPluginRegistry as pyPlugin.cpp binds it: register_creator returns False where a creator of
    the same name, version and namespace is registered; deregister_creator removes that very
    creator, True if it was registered, False if not (another creator of its key stays)."""

    def __init__(self):
        self._creators = {}

    def register_creator(self, creator, plugin_namespace=""):
        key = (creator.name, creator.plugin_version, plugin_namespace)
        if key in self._creators:
            return False
        self._creators[key] = creator
        return True

    def deregister_creator(self, creator):
        for key, registered in self._creators.items():
            if registered is creator:
                del self._creators[key]
                return True
        return False

    def get_creator(self, type, version, plugin_namespace=""):
        return self._creators.get((type, version, plugin_namespace))


_REGISTRY = _Registry()


def get_plugin_registry():
    return _REGISTRY
