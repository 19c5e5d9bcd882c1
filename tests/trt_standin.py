"""TEST DOUBLE: a minimal stand-in for the ``tensorrt`` module, for GPU machines without TensorRT.

It is NOT TensorRT. It offers only the names rms_norm_plugin_cutedsl.py touches
at run time (plugin base classes, fields, dtypes, tensor descriptors, the
registry), so the GPU tests can drive the plugin's own methods exactly as
TensorRT calls them: TensorRT-shaped descriptors, raw device pointers and a
stream handle. tests/test_standin_names.py checks on the CPU that every name
offered here exists with the same spelling on real TensorRT-family bindings
(TensorRT-RTX).
"""

import enum


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    BF16 = 7


class TensorFormat(enum.IntEnum):
    LINEAR = 0


class PluginFieldType(enum.IntEnum):
    FLOAT32 = 1


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
    def __init__(self):
        pass


class IPluginV3OneRuntime:
    def __init__(self):
        pass


class IPluginCreatorV3One:
    def __init__(self):
        pass


class PluginField:
    def __init__(self, name, data, type):
        self.name, self.data, self.type = name, data, type


class PluginFieldCollection(list):
    pass


class PluginTensorDesc:
    """What enqueue/on_shape_change receive per tensor: dims, type, format."""

    def __init__(self, dims=(), type=DataType.FLOAT, format=TensorFormat.LINEAR):
        self.dims, self.type, self.format = tuple(dims), type, format


class _Registry:
    def __init__(self):
        self._creators = {}

    def register_creator(self, creator, plugin_namespace=""):
        key = (creator.name, creator.plugin_version, plugin_namespace)
        if key in self._creators:
            return False
        self._creators[key] = creator
        return True

    def get_creator(self, type, version, plugin_namespace=""):
        return self._creators.get((type, version, plugin_namespace))


_REGISTRY = _Registry()


def get_plugin_registry():
    return _REGISTRY
