"""CPU: every name the TensorRT stand-in offers exists, spelled the same, on real TensorRT-family
bindings.

support/trt_standin.py is a labelled TEST DOUBLE used by the GPU tests in place
of ``tensorrt``. It is only trustworthy if the sample could not use a name
through it that real TensorRT lacks. Full TensorRT cannot be installed on the
CI machine, so TensorRT-RTX's Python bindings (``tensorrt_rtx``), which share
TensorRT's plugin API, are the reference.

The list of names is derived from the stand-in by introspection: adding a
name to the stand-in that the real bindings lack fails a test here.
"""

import enum
import importlib.util
import inspect
import pathlib

import numpy as np
import pytest

STANDIN_PATH = pathlib.Path(__file__).resolve().parents[1] / "support" / "trt_standin.py"


def load_standin():
    spec = importlib.util.spec_from_file_location("trt_standin_for_names", STANDIN_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def instance_attributes(cls) -> list:
    """Attributes a stand-in class sets on its instances (made with None for every required
    argument)."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    args = [None for p in params
            if p.default is inspect.Parameter.empty and p.kind == p.POSITIONAL_OR_KEYWORD]
    return sorted(name for name in vars(cls(*args)) if not name.startswith("_"))


def standin_names() -> list:
    """Dotted names, relative to the module, of everything public the stand-in offers.

    Module-level classes and functions; enum members; public methods and
    properties defined on each class; instance attributes of each class; and the
    public methods of the object get_plugin_registry() returns.
    """
    standin = load_standin()
    names = []
    for name, obj in vars(standin).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != standin.__name__:
            continue  # private, or imported (e.g. the enum module)
        names.append(name)
        if inspect.isclass(obj) and issubclass(obj, enum.Enum):
            names += [f"{name}.{member}" for member in obj.__members__]
        elif inspect.isclass(obj):
            names += [f"{name}.{m}" for m, v in vars(obj).items()
                      if not m.startswith("_") and (callable(v) or isinstance(v, property))]
            names += [f"{name}.{a}" for a in instance_attributes(obj)]
    registry = type(standin.get_plugin_registry())
    names += [f"get_plugin_registry().{m}" for m, v in vars(registry).items()
              if not m.startswith("_") and callable(v)]
    return names


NAMES = standin_names()


@pytest.fixture(scope="module")
def real_trt():
    return pytest.importorskip("tensorrt_rtx")


def resolve(module, dotted: str):
    """Follow a dotted name from `module`; `get_plugin_registry()` is called to reach the
    registry."""
    obj = module
    for part in dotted.split("."):
        if part == "get_plugin_registry()":
            obj = module.get_plugin_registry()
        else:
            obj = getattr(obj, part)
    return obj


def test_the_introspected_list_covers_what_the_sample_uses():
    """Guards the introspection itself: these are names the lesson, its fused companion (INT32
    fields, an FP8 Y, and deregister_creator to take the lesson's creator's place) and the GPU
    tests rely on."""
    expected = {
        "DataType.HALF", "DataType.BF16", "DataType.FLOAT", "DataType.FP8", "TensorFormat.LINEAR",
        "PluginFieldType.FLOAT32", "PluginFieldType.INT32", "TensorRTPhase.BUILD",
        "TensorRTPhase.RUNTIME",
        "IPluginV3", "IPluginV3OneCore", "IPluginV3OneBuild", "IPluginV3OneRuntime",
        "IPluginCreatorV3One",
        "IPluginV3OneBuild.get_workspace_size", "IPluginV3OneBuild.get_valid_tactics",
        "PluginField", "PluginField.name", "PluginField.data", "PluginField.type",
        "PluginFieldCollection", "PluginTensorDesc", "PluginTensorDesc.dims",
        "PluginTensorDesc.type", "PluginTensorDesc.format", "get_plugin_registry",
        "get_plugin_registry().register_creator", "get_plugin_registry().get_creator",
        "get_plugin_registry().deregister_creator",
    }
    assert expected <= set(NAMES), sorted(expected - set(NAMES))


@pytest.mark.parametrize("dotted", NAMES)
def test_standin_name_exists_on_tensorrt_rtx(real_trt, dotted):
    try:
        resolve(real_trt, dotted)
    except AttributeError:
        pytest.fail(f"trt_standin offers `{dotted}` but tensorrt_rtx has no such name")


# -- the stand-in's plugin fields behave as the real bindings' ------------------------------------


@pytest.fixture(params=["standin", "tensorrt_rtx"])
def fields_module(request):
    return load_standin() if request.param == "standin" else pytest.importorskip("tensorrt_rtx")


def test_field_data_is_a_new_float32_array_of_shape_n(fields_module):
    trt = fields_module
    buffer = np.array([0.5, 0.25], np.float32)
    field = trt.PluginField("epsilon", buffer, trt.PluginFieldType.FLOAT32)
    data = field.data
    assert isinstance(data, np.ndarray) and data.dtype == np.float32 and data.shape == (2,)
    data[0] = 7.0
    assert field.data.tolist() == [0.5, 0.25], "data is a copy, not a view"


def test_a_collection_points_at_the_callers_array(fields_module):
    """Both keep a pointer: a later write into the array shows through the collection's field."""
    trt = fields_module
    buffer = np.array([0.5], np.float32)
    field = trt.PluginField("epsilon", buffer, trt.PluginFieldType.FLOAT32)
    (field,) = list(trt.PluginFieldCollection([field]))
    buffer[0] = 0.125
    assert field.data.tolist() == [0.125]


def test_the_standin_refuses_to_read_a_field_whose_array_was_freed():
    """Real TensorRT reads freed memory here (the collection keeps no array alive); the stand-in
    raises."""
    trt = load_standin()
    (field,) = list(trt.PluginFieldCollection(
        [trt.PluginField("epsilon", np.array([0.5], np.float32), trt.PluginFieldType.FLOAT32)]))
    with pytest.raises(RuntimeError, match="freed"):
        field.data


def test_descriptor_dims_are_python_ints(fields_module):
    trt = fields_module
    if trt.__name__ == "tensorrt_rtx":
        desc = trt.PluginTensorDesc()
        desc.dims = trt.Dims((np.int64(37), 1024))
    else:
        desc = trt.PluginTensorDesc((np.int64(37), 1024))
    assert [type(d) for d in desc.dims] == [int, int] and tuple(desc.dims) == (37, 1024)


def test_a_plugin_without_workspace_or_tactic_methods_gets_the_bindings_defaults(fields_module):
    """The plugins leave out get_workspace_size and get_valid_tactics: the base class answers no
    workspace and no tactics, on the real bindings (pyPlugin.cpp's pluginDoc::getWorkspaceSizeV3
    and getValidTactics) and the stand-in alike."""
    trt = fields_module

    class Bare(trt.IPluginV3, trt.IPluginV3OneBuild):
        def __init__(self):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)

    bare = Bare()
    assert bare.get_workspace_size([], []) == 0
    assert bare.get_valid_tactics() == []


def test_the_registry_keeps_one_creator_a_key_and_deregisters_that_very_one(fields_module):
    """What the companion's register_creator relies on, on TensorRT-RTX's registry and the
    stand-in's alike: a second creator of a registered key is refused (False), deregister_creator
    of a creator not registered is False and leaves the registered one, and of the registered one
    True."""
    trt = fields_module

    class Creator(trt.IPluginCreatorV3One):
        def __init__(self):
            trt.IPluginCreatorV3One.__init__(self)
            self.name, self.plugin_version, self.plugin_namespace = "StandinRegistryProbe", "1", ""
            self.field_names = trt.PluginFieldCollection([])

    registry = trt.get_plugin_registry()
    key = ("StandinRegistryProbe", "1", "")
    first, second = Creator(), Creator()
    try:
        assert registry.register_creator(first, "") is True
        assert registry.register_creator(second, "") is False
        assert registry.get_creator(*key) is first
        assert registry.deregister_creator(second) is False
        assert registry.get_creator(*key) is first
        assert registry.deregister_creator(first) is True
        assert registry.get_creator(*key) is None
        assert registry.deregister_creator(first) is False
    finally:
        registry.deregister_creator(first)
