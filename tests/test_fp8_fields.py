"""CPU: the FP8 form's fields (quantize, y_scale) and its format table, with real TensorRT-family
objects.

The FP8 form is rms_norm_fused_cutedsl.py's: as in test_creator_fields.py, the companion is
loaded on the lesson with TensorRT-RTX's Python bindings as their ``tensorrt`` (fixture
``fused_rtx``), and its creator makes the plugins; the lesson's creator refuses the FP8 fields
(test_creator_fields.py). A GPU without FP8 conversions (below compute capability 8.9) cannot exist
on this machine: the tests that need one replace torch's two device queries, labelled where they
do."""

import math

import numpy as np
import pytest

from test_creator_fields import (PREFIX, arrays_behind, create_from, field_named, io_descs,
                                 residual_descs)


@pytest.fixture(scope="module")
def trt():
    return pytest.importorskip("tensorrt_rtx")


@pytest.fixture
def creator(fused_rtx):
    return fused_rtx.FusedRmsNormPluginCreator()


def fields_of(trt, quantize=None, y_scale=None, residual=0, quantize_type="INT32",
              scale_type="FLOAT32"):
    """epsilon, residual, and quantize / y_scale where given; and the arrays they point into."""
    arrays = {"epsilon": (np.array([1e-5], np.float32), "FLOAT32"),
              "residual": (np.array([residual], np.int32), "INT32")}
    if quantize is not None:
        dtype = np.int32 if quantize_type == "INT32" else np.float32
        arrays["quantize"] = (np.array(quantize, dtype), quantize_type)
    if y_scale is not None:
        dtype = {"FLOAT32": np.float32, "FLOAT16": np.float16, "INT32": np.int32}[scale_type]
        arrays["y_scale"] = (np.array(y_scale, dtype), scale_type)
    fields = trt.PluginFieldCollection([
        trt.PluginField(name, data, getattr(trt.PluginFieldType, kind))
        for name, (data, kind) in arrays.items()])
    return fields, arrays


def test_quantize_1_with_a_y_scale_makes_the_fp8_form_and_serializes_both(creator, trt):
    fields, _arrays = fields_of(trt, [1], [0.0375])
    plugin = create_from(creator, trt, fields)
    assert plugin.y_scale == float(np.float32(0.0375))
    stored = list(plugin.get_fields_to_serialize())
    assert np.asarray(field_named(stored, "quantize").data).tolist() == [1]
    assert np.asarray(field_named(stored, "y_scale").data).tolist() == [np.float32(0.0375)]
    twin = plugin.clone()
    del plugin
    for field in twin.get_fields_to_serialize():  # the clone's fields point into its own arrays
        assert len(arrays_behind(twin, field)) == 1
    assert twin.y_scale == float(np.float32(0.0375))


@pytest.mark.parametrize("quantize", [None, [0]])
def test_without_quantize_1_y_keeps_xs_dtype_and_no_y_scale_is_stored(creator, trt, quantize):
    fields, _arrays = fields_of(trt, quantize)
    plugin = create_from(creator, trt, fields)
    assert plugin.y_scale is None
    stored = {field.name for field in plugin.get_fields_to_serialize()}
    assert stored == {"epsilon", "residual", "quantize"}
    types = [trt.DataType.BF16, trt.DataType.FLOAT]
    assert plugin.get_output_data_types(types) == [trt.DataType.BF16]


@pytest.mark.parametrize("y_scale, scale_type, got", [
    (None, "FLOAT32", "none"),  # the scale is missing
    ([0.5, 0.25], "FLOAT32", "2 values"),
    ([0.5], "FLOAT16", "a PluginFieldType.FLOAT16 field"),
    ([1], "INT32", "a PluginFieldType.INT32 field"),
])
def test_quantize_1_without_one_float32_y_scale_is_refused(creator, trt, y_scale, scale_type,
                                                           got):
    fields, _arrays = fields_of(trt, [1], y_scale, scale_type=scale_type)
    with pytest.raises(ValueError) as info:
        create_from(creator, trt, fields)
    assert str(info.value) == (PREFIX + "quantize 1 (FP8 Y) needs one FLOAT32 field 'y_scale', "
                               f"got {got}")


@pytest.mark.parametrize("y_scale", [0.0, -0.5, math.inf, -math.inf, math.nan, 1e-39])
def test_a_y_scale_that_is_not_finite_positive_and_normal_is_refused(creator, trt, y_scale):
    """1e-39 is a float32 subnormal: 1 / y_scale would overflow to inf."""
    fields, _arrays = fields_of(trt, [1], [y_scale])
    with pytest.raises(ValueError) as info:
        create_from(creator, trt, fields)
    message = str(info.value)
    assert message.startswith(PREFIX + "field 'y_scale' must be finite and >= 2^-126"), message
    assert "\n" not in message


@pytest.mark.parametrize("quantize", [None, [0]])
def test_a_y_scale_without_quantize_1_is_refused_rather_than_ignored(creator, trt, quantize):
    fields, _arrays = fields_of(trt, quantize, [0.5])
    with pytest.raises(ValueError) as info:
        create_from(creator, trt, fields)
    assert str(info.value) == (PREFIX + "field 'y_scale' is given but 'quantize' is not 1, "
                               "so Y would not be scaled")


@pytest.mark.parametrize("quantize, quantize_type, got", [
    ([2], "INT32", "[2]"), ([0, 1], "INT32", "[0, 1]"), ([1.0], "FLOAT32", "[1.0]")])
def test_a_quantize_field_other_than_one_int32_0_or_1_is_refused(creator, trt, quantize,
                                                                  quantize_type, got):
    fields, _arrays = fields_of(trt, quantize, [0.5], quantize_type=quantize_type)
    with pytest.raises(ValueError) as info:
        create_from(creator, trt, fields)
    assert str(info.value) == (PREFIX + "field 'quantize' must be one INT32 value, 0 (Y in X's "
                               f"dtype) or 1 (Y in FP8), got {got}")


# -- the format table ----------------------------------------------------------------------


@pytest.fixture()
def fp8_plugin(creator, trt):
    fields, _arrays = fields_of(trt, [1], [0.05])
    return create_from(creator, trt, fields)


@pytest.fixture()
def fp8_residual_plugin(creator, trt):
    fields, _arrays = fields_of(trt, [1], [0.05], residual=1)
    return create_from(creator, trt, fields)


@pytest.mark.parametrize("io_type", ["HALF", "BF16", "FLOAT"])
def test_the_fp8_form_declares_y_fp8_and_nothing_else(fp8_plugin, trt, io_type):
    """No visible GPU (here, or a TensorRT-RTX build on the CPU): the FP8 row is declared."""
    descs = io_descs(trt, io_type, "FLOAT", "FP8")
    assert [fp8_plugin.supports_format_combination(pos, descs, 2) for pos in range(3)] == [True] * 3
    descs = io_descs(trt, io_type, "FLOAT", io_type)
    assert fp8_plugin.supports_format_combination(2, descs, 2) is False
    types = [getattr(trt.DataType, io_type), trt.DataType.FLOAT]
    assert fp8_plugin.get_output_data_types(types) == [trt.DataType.FP8]


def test_the_plain_form_does_not_declare_an_fp8_y(creator, trt):
    fields, _arrays = fields_of(trt)
    plugin = create_from(creator, trt, fields)
    descs = io_descs(trt, "HALF", "FLOAT", "FP8")
    assert plugin.supports_format_combination(2, descs, 2) is False


def test_the_residual_fp8_form_stores_y_in_fp8_and_s_in_xs_dtype(fp8_residual_plugin, trt):
    plugin = fp8_residual_plugin
    descs = residual_descs(trt, ("BF16", "BF16", "FLOAT", "FP8", "BF16"))
    assert [plugin.supports_format_combination(pos, descs, 3) for pos in range(5)] == [True] * 5
    descs = residual_descs(trt, ("BF16", "BF16", "FLOAT", "FP8", "FP8"))
    assert plugin.supports_format_combination(4, descs, 3) is False
    types = [trt.DataType.BF16, trt.DataType.BF16, trt.DataType.FLOAT]
    assert plugin.get_output_data_types(types) == [trt.DataType.FP8, trt.DataType.BF16]


def a_gpu_of(monkeypatch, module, capability, name):
    """TEST DOUBLE: torch reports a GPU of this compute capability (none exists on this machine)."""
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(module.torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(module.torch.cuda, "get_device_name", lambda *a: name)


def test_below_sm89_the_fp8_form_is_refused_at_build_time_in_one_sentence(
        fp8_plugin, fused_rtx, trt, monkeypatch):
    a_gpu_of(monkeypatch, fused_rtx, (8, 6), "NVIDIA A10")
    descs = io_descs(trt, "HALF", "FLOAT", "FP8")
    assert fp8_plugin.supports_format_combination(2, descs, 2) is False
    with pytest.raises(ValueError) as info:
        fp8_plugin.get_output_data_types([trt.DataType.HALF, trt.DataType.FLOAT])
    assert str(info.value) == (PREFIX + "the FP8 form (a y_scale) needs compute capability 8.9 "
                               "or newer, NVIDIA A10 has 8.6")


def test_from_sm89_the_fp8_form_is_declared(fp8_plugin, fused_rtx, trt, monkeypatch):
    a_gpu_of(monkeypatch, fused_rtx, (8, 9), "NVIDIA L4")
    descs = io_descs(trt, "HALF", "FLOAT", "FP8")
    assert fp8_plugin.supports_format_combination(2, descs, 2) is True


def test_the_launcher_refuses_an_fp8_form_for_a_target_without_fp8(fused_rtx):
    with pytest.raises(ValueError) as info:
        fused_rtx.compile_rms_norm("float16", 1024, arch="sm_86", y_scale=0.5)
    assert str(info.value) == "the FP8 form needs sm_89 or newer (FP8 conversions), got sm_86"


@pytest.mark.parametrize("quantize, field", [([1], "quantize"), (None, "y_scale")])
def test_the_lessons_creator_refuses_an_fp8_field_naming_the_companion(sample_rtx, trt, quantize,
                                                                       field):
    """Its plain plugin has no FP8 Y: a node or an engine that asks for one is sent to the
    companion in one sentence, whichever FP8 field it sets."""
    fields, _arrays = fields_of(trt, quantize, [0.5])
    with pytest.raises(ValueError) as info:
        create_from(sample_rtx.RmsNormPluginCreator(), trt, fields)
    assert str(info.value) == (PREFIX + f"field '{field}' selects a form that "
                               "rms_norm_fused_cutedsl.py serves; call its register_creator() "
                               "before building or loading")
