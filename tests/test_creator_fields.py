"""CPU: the creator's field parsing and the plugin's serialized fields, with real TensorRT-family objects.

Full TensorRT cannot be installed on the CI machine; TensorRT-RTX's Python
bindings (``tensorrt_rtx``) provide the same PluginField,
PluginFieldCollection, PluginTensorDesc and DynamicPluginTensorDesc classes
and import without a GPU, so the sample is loaded with them as its
``tensorrt`` (fixture ``sample_rtx``). No engine is built here; see
test_rtx_build_contract.py for that.
"""

import gc
import math

import numpy as np
import pytest


@pytest.fixture(scope="module")
def trt():
    return pytest.importorskip("tensorrt_rtx")


def create(sample, trt, data, field_type="FLOAT32", phase="BUILD"):
    """Create the plugin through the creator from one field 'epsilon' holding ``data``, as TensorRT does.

    ``data`` stays referenced until create_plugin returns: trt.PluginField keeps
    only a pointer to the array, so a field built over a temporary would read
    freed memory.
    """
    fields = trt.PluginFieldCollection(
        [trt.PluginField("epsilon", data, getattr(trt.PluginFieldType, field_type))])
    return sample.RmsNormPluginCreator().create_plugin("rms_norm", fields, getattr(trt.TensorRTPhase, phase))


def create_from(sample, trt, fields):
    return sample.RmsNormPluginCreator().create_plugin("rms_norm", fields, trt.TensorRTPhase.BUILD)


def field_named(fields, name):
    (field,) = [f for f in fields if f.name == name]
    return field


def churn_allocator():
    """Free and reallocate lots of small numpy buffers, so a dangling pointer would read garbage."""
    gc.collect()
    for i in range(200):
        junk = [np.full(n, 12345.0 + i, dtype=np.float32) for n in (1, 2, 4, 16, 256)]
        del junk
    gc.collect()


# -- the creator -------------------------------------------------------------------------


def test_creator_advertises_every_field_with_its_type(sample_rtx, trt):
    """The ONNX parser converts a node's attributes to the types the creator lists."""
    creator = sample_rtx.RmsNormPluginCreator()
    assert (creator.name, creator.plugin_version, creator.plugin_namespace) == ("RmsNormPlugin", "1", "")
    fields = list(creator.field_names)
    assert [f.name for f in fields] == ["epsilon", "residual", "quantize", "y_scale"]
    float32, int32 = trt.PluginFieldType.FLOAT32, trt.PluginFieldType.INT32
    assert [f.type for f in fields] == [float32, int32, int32, float32]
    assert np.asarray(fields[1].data).tolist() == [0]


def epsilon_and_residual(trt, residual_data, residual_type="INT32"):
    """Both fields, and the arrays they point into (kept by the caller while TensorRT reads them)."""
    eps = np.array([1e-5], dtype=np.float32)
    fields = trt.PluginFieldCollection([
        trt.PluginField("epsilon", eps, trt.PluginFieldType.FLOAT32),
        trt.PluginField("residual", residual_data, getattr(trt.PluginFieldType, residual_type))])
    return fields, (eps, residual_data)


@pytest.mark.parametrize("value, outputs", [(0, 1), (1, 2)])
def test_the_residual_field_selects_the_form(sample_rtx, trt, value, outputs):
    fields, _arrays = epsilon_and_residual(trt, np.array([value], dtype=np.int32))
    plugin = create_from(sample_rtx, trt, fields)
    assert (plugin.residual, plugin.num_outputs) == (bool(value), outputs)
    assert np.asarray(field_named(plugin.get_fields_to_serialize(), "residual").data).tolist() == [value]


def test_fields_of_an_engine_saved_before_the_residual_field_make_the_plain_form(sample_rtx, trt):
    """An engine stores the fields it was built with: one saved by the first version holds epsilon alone."""
    plugin = create(sample_rtx, trt, np.array([1e-5], dtype=np.float32))
    assert (plugin.residual, plugin.num_outputs) == (False, 1)


@pytest.mark.parametrize("data, field_type, got", [
    (np.array([2], dtype=np.int32), "INT32", "values [2]"),
    (np.array([0, 1], dtype=np.int32), "INT32", "values [0, 1]"),
    (np.array([1.0], dtype=np.float32), "FLOAT32", "a PluginFieldType.FLOAT32 field"),
])
def test_a_residual_field_other_than_one_int32_0_or_1_is_refused(sample_rtx, trt, data, field_type, got):
    fields, _arrays = epsilon_and_residual(trt, data, field_type)
    with pytest.raises(ValueError) as info:
        create_from(sample_rtx, trt, fields)
    assert str(info.value) == ("RmsNormPlugin: field 'residual' must be one INT32 value, 0 (plain) or 1 "
                               f"(residual), got {got}")


@pytest.mark.parametrize("eps", [1e-5, 3.0517578e-05, 0.125, 1e-6])
@pytest.mark.parametrize("phase", ["BUILD", "RUNTIME"])
def test_valid_epsilon_becomes_the_plugins_float32_epsilon(sample_rtx, trt, eps, phase):
    plugin = create(sample_rtx, trt, np.array([eps], dtype=np.float32), phase=phase)
    assert plugin.epsilon == float(np.float32(eps))


NEEDS = "RmsNormPlugin: needs one FLOAT32 field 'epsilon' holding one value, got "


def test_missing_epsilon_is_refused(sample_rtx, trt):
    with pytest.raises(ValueError) as info:
        create_from(sample_rtx, trt, trt.PluginFieldCollection([]))
    assert str(info.value) == NEEDS + "fields []"


def test_misnamed_field_is_refused_as_missing_epsilon(sample_rtx, trt):
    data = np.array([1e-5], dtype=np.float32)
    fields = trt.PluginFieldCollection([trt.PluginField("eps", data, trt.PluginFieldType.FLOAT32)])
    with pytest.raises(ValueError) as info:
        create_from(sample_rtx, trt, fields)
    assert str(info.value) == NEEDS + "fields ['eps']"


# TensorRT's PluginField.data refuses to convert FLOAT16 and BF16 fields (pyPlugin.cpp: "No known conversion for
# returning data from PluginField"): the refusal must name the type without reading the data.
@pytest.mark.parametrize(
    "data, field_type",
    [
        (np.array([1], dtype=np.int32), "INT32"),
        (np.array([1e-5], dtype=np.float64), "FLOAT64"),
        (np.array([1e-5], dtype=np.float16), "FLOAT16"),
        (np.array([1e-5], dtype=np.float16), "BF16"),  # bf16's bits, 2 bytes each
    ],
)
def test_epsilon_of_another_field_type_is_refused(sample_rtx, trt, data, field_type):
    with pytest.raises(ValueError) as info:
        create(sample_rtx, trt, data, field_type)
    assert str(info.value) == NEEDS + f"a PluginFieldType.{field_type} field"


@pytest.mark.parametrize("eps", [math.nan, math.inf, -math.inf, 0.0, -1e-5, 1e-50])
def test_epsilon_that_is_not_finite_and_positive_in_float32_is_refused(sample_rtx, trt, eps):
    with pytest.raises(ValueError, match="'epsilon' must be finite and > 0"):  # 1e-50 rounds to 0 in float32
        create(sample_rtx, trt, np.array([eps], dtype=np.float32))


@pytest.mark.parametrize("values", [[1e-5, 1e-5], []])
def test_epsilon_with_other_than_one_value_is_refused(sample_rtx, trt, values):
    with pytest.raises(ValueError) as info:
        create(sample_rtx, trt, np.array(values, dtype=np.float32))
    assert str(info.value) == NEEDS + f"a PluginFieldType.FLOAT32 field of {len(values)} values"


# -- what the plugin serializes ----------------------------------------------------------


def arrays_behind(owner, field) -> list:
    """Names of ``owner``'s numpy arrays that ``field`` points into.

    trt.PluginField keeps only a pointer, and reading ``field.data`` copies from
    it: writing a sentinel into an array changes what the field reads exactly
    when the field points into that array. Deterministic, unlike waiting for the
    allocator to reuse freed memory.
    """
    found = []
    owned = []
    for name, value in vars(owner).items():
        if isinstance(value, tuple):  # a tuple of arrays, one per field
            owned += [(f"{name}[{i}]", item) for i, item in enumerate(value)]
        else:
            owned.append((name, value))
    for name, value in owned:
        if isinstance(value, np.ndarray) and value.size:
            before, saved = np.asarray(field.data).copy(), value.copy()
            value.view(np.uint8)[...] = 0x5A
            if not np.array_equal(np.asarray(field.data), before):
                found.append(name)
            value[...] = saved
    return found


def test_serialized_field_points_into_an_array_the_plugin_owns(sample_rtx, trt):
    """TensorRT reads the fields after get_fields_to_serialize returns: their memory must be the plugin's."""
    plugin = create(sample_rtx, trt, np.array([3.0517578e-05], dtype=np.float32))
    fields = list(plugin.get_fields_to_serialize())
    field = field_named(fields, "epsilon")
    assert field.type == trt.PluginFieldType.FLOAT32
    assert np.asarray(field.data).tolist() == [np.float32(3.0517578e-05)]
    for field in fields:
        assert len(arrays_behind(plugin, field)) == 1, f"field {field.name} does not point into the plugin's array"


def test_the_ownership_check_sees_a_field_over_a_temporary_array(sample_rtx, trt):
    """Guards the check above: a collection built over a temporary points into no array the plugin owns."""
    plugin = create(sample_rtx, trt, np.array([0.125], dtype=np.float32))
    temporary = trt.PluginFieldCollection(
        [trt.PluginField("epsilon", np.array([plugin.epsilon], np.float32), trt.PluginFieldType.FLOAT32)])
    assert arrays_behind(plugin, list(temporary)[0]) == []


def test_creator_field_names_point_into_an_array_the_creator_owns(sample_rtx, trt):
    creator = sample_rtx.RmsNormPluginCreator()
    for field in creator.field_names:
        assert len(arrays_behind(creator, field)) == 1


def test_serialized_fields_survive_the_collection_that_created_the_plugin(sample_rtx, trt):
    """The creator's input collection (and its array) may be freed before TensorRT serializes."""
    plugin = create(sample_rtx, trt, np.array([0.125], dtype=np.float32))
    churn_allocator()
    field = field_named(plugin.get_fields_to_serialize(), "epsilon")
    assert np.asarray(field.data, dtype=np.float32).tolist() == [0.125]


def test_clone_keeps_epsilon_and_the_form_and_serializes_them_on_its_own(sample_rtx, trt):
    fields, _arrays = epsilon_and_residual(trt, np.array([1], dtype=np.int32))
    plugin = create_from(sample_rtx, trt, fields)
    twin = plugin.clone()
    del plugin
    churn_allocator()
    assert (twin.epsilon, twin.residual) == (np.float32(1e-5), True)
    field = field_named(twin.get_fields_to_serialize(), "residual")
    assert np.asarray(field.data).tolist() == [1]
    for field in twin.get_fields_to_serialize():
        assert len(arrays_behind(twin, field)) == 1


# -- supports_format_combination with real descriptors ------------------------------------


def io_descs(trt, x_type, w_type, y_type, fmt="LINEAR"):
    """[X, W, Y] as the DynamicPluginTensorDesc list TensorRT passes at build time."""
    descs = []
    for dtype, dims in ((x_type, (-1, 1024)), (w_type, (1024,)), (y_type, (-1, 1024))):
        desc = trt.DynamicPluginTensorDesc()
        desc.desc.type = getattr(trt.DataType, dtype)
        desc.desc.format = getattr(trt.TensorFormat, fmt)
        desc.desc.dims = trt.Dims(dims)
        descs.append(desc)
    return descs


@pytest.fixture()
def plugin(sample_rtx, trt):
    return create(sample_rtx, trt, np.array([1e-5], dtype=np.float32))


@pytest.mark.parametrize("io_type", ["HALF", "BF16", "FLOAT"])
@pytest.mark.parametrize("w_type", ["FLOAT", "HALF", "BF16"])
def test_every_linear_x_w_combination_with_y_of_xs_type_is_accepted(plugin, trt, io_type, w_type):
    descs = io_descs(trt, io_type, w_type, io_type)
    assert [plugin.supports_format_combination(pos, descs, 2) for pos in range(3)] == [True, True, True]


@pytest.mark.parametrize(
    "x_type, w_type, y_type, refused_pos",
    [
        ("INT32", "FLOAT", "INT32", 0),   # integer activations
        ("INT8", "FLOAT", "INT8", 0),
        ("HALF", "INT32", "HALF", 1),     # integer weight
        ("FLOAT", "INT8", "FLOAT", 1),
        ("HALF", "FLOAT", "BF16", 2),     # Y's dtype differs from X's
        ("BF16", "FLOAT", "HALF", 2),
        ("FLOAT", "HALF", "HALF", 2),     # Y follows X, not W
        ("HALF", "FLOAT", "FLOAT", 2),
    ],
)
def test_other_dtype_combinations_are_refused(plugin, trt, x_type, w_type, y_type, refused_pos):
    descs = io_descs(trt, x_type, w_type, y_type)
    assert plugin.supports_format_combination(refused_pos, descs, 2) is False


def test_non_linear_formats_are_refused(plugin, trt):
    descs = io_descs(trt, "HALF", "FLOAT", "HALF", fmt="CHW2")
    assert [plugin.supports_format_combination(pos, descs, 2) for pos in range(3)] == [False, False, False]


# -- the residual form's five slots: X, R, W in; Y, S out ----------------------------------


def residual_descs(trt, types):
    descs = []
    for dtype, dims in zip(types, ((-1, 1024), (-1, 1024), (1024,), (-1, 1024), (-1, 1024))):
        desc = trt.DynamicPluginTensorDesc()
        desc.desc.type = getattr(trt.DataType, dtype)
        desc.desc.format = trt.TensorFormat.LINEAR
        desc.desc.dims = trt.Dims(dims)
        descs.append(desc)
    return descs


@pytest.fixture()
def residual_plugin(sample_rtx, trt):
    fields, _arrays = epsilon_and_residual(trt, np.array([1], dtype=np.int32))
    return create_from(sample_rtx, trt, fields)


@pytest.mark.parametrize("io_type", ["HALF", "BF16", "FLOAT"])
@pytest.mark.parametrize("w_type", ["FLOAT", "HALF", "BF16"])
def test_the_residual_form_takes_r_y_and_s_of_xs_dtype_and_w_of_any(residual_plugin, trt, io_type, w_type):
    descs = residual_descs(trt, (io_type, io_type, w_type, io_type, io_type))
    assert [residual_plugin.supports_format_combination(pos, descs, 3) for pos in range(5)] == [True] * 5
    types = [getattr(trt.DataType, t) for t in (io_type, io_type, w_type)]
    assert residual_plugin.get_output_data_types(types) == [types[0], types[0]]


@pytest.mark.parametrize("refused_pos", [1, 3, 4])
def test_the_residual_form_refuses_r_y_or_s_of_another_dtype(residual_plugin, trt, refused_pos):
    types = ["HALF", "HALF", "FLOAT", "HALF", "HALF"]
    types[refused_pos] = "BF16"
    descs = residual_descs(trt, types)
    assert residual_plugin.supports_format_combination(refused_pos, descs, 3) is False


def test_the_residual_form_refuses_r_of_another_dtype_at_the_network_definition(residual_plugin, trt):
    with pytest.raises(ValueError, match="R must have X's dtype"):
        residual_plugin.get_output_data_types([trt.DataType.HALF, trt.DataType.BF16, trt.DataType.FLOAT])
