"""CPU: the creators' field parsing and the plugins' serialized fields, with real TensorRT-family
objects.

Full TensorRT cannot be installed on the CI machine; TensorRT-RTX's Python bindings
(``tensorrt_rtx``) provide the same PluginField, PluginFieldCollection, PluginTensorDesc,
DynamicPluginTensorDesc classes and plugin registry and import without a GPU, so the lesson
(fixture ``sample_rtx``) and its fused companion (``fused_rtx``) are loaded with them as their
``tensorrt``. The lesson's creator makes the plain plugin from one field, epsilon, and refuses
fields that select a fused form; the companion's creator, registered in its place under the same
name and version, makes every form. No engine is built here; see test_rtx_build_contract.py.
"""

import gc
import math

import numpy as np
import pytest

PREFIX = "RmsNormPlugin: "
FIELD_TYPES = {np.float32: "FLOAT32", np.int32: "INT32", np.float64: "FLOAT64",
               np.float16: "FLOAT16"}


@pytest.fixture(scope="module")
def trt():
    return pytest.importorskip("tensorrt_rtx")


@pytest.fixture(params=["lesson", "fused"])
def creator(request, sample_rtx, fused_rtx):
    """Either creator: the parts both share (epsilon, the plain form) hold for each."""
    if request.param == "lesson":
        return sample_rtx.RmsNormPluginCreator()
    return fused_rtx.FusedRmsNormPluginCreator()


def collection(trt, values: dict, types: dict = None):
    """A PluginFieldCollection of {name: numpy array}, each field of its array's type unless
    `types` names another. The arrays must outlive the collection's use: a field keeps only a
    pointer."""
    types = types or {}
    return trt.PluginFieldCollection([
        trt.PluginField(name, data, getattr(trt.PluginFieldType,
                                            types.get(name, FIELD_TYPES[data.dtype.type])))
        for name, data in values.items()])


def create_from(creator, trt, fields, phase="BUILD"):
    """creator.create_plugin as TensorRT calls it, at a build or an engine load."""
    return creator.create_plugin("rms_norm", fields, getattr(trt.TensorRTPhase, phase))


def epsilon_only(creator, trt, data, field_type="FLOAT32", phase="BUILD"):
    """The plugin from one field 'epsilon' holding `data`, referenced until create_plugin
    returns."""
    fields = collection(trt, {"epsilon": data}, {"epsilon": field_type})
    return create_from(creator, trt, fields, phase)


def field_named(fields, name):
    (field,) = [f for f in fields if f.name == name]
    return field


def field_values(fields) -> dict:
    """{name: list of values} of a collection, read as TensorRT reads them to save an engine."""
    return {field.name: np.asarray(field.data).tolist() for field in fields}


def churn_allocator():
    """Free and reallocate lots of small numpy buffers, so a dangling pointer would read garbage."""
    gc.collect()
    for i in range(200):
        junk = [np.full(n, 12345.0 + i, dtype=np.float32) for n in (1, 2, 4, 16, 256)]
        del junk
    gc.collect()


# -- what each creator lists ---------------------------------------------------------------


def test_the_lessons_creator_lists_the_fields_it_reads_and_those_it_refuses(sample_rtx, fused_rtx):
    """The ONNX parser converts a node's attributes to the types the creator lists, and passes no
    other attribute: the lesson's creator lists the companion's fields too, so that a fused node
    reaches its create_plugin and is refused there (test_rtx_build_contract.py) rather than built
    as the plain form."""
    creator = sample_rtx.RmsNormPluginCreator()
    key = (creator.name, creator.plugin_version, creator.plugin_namespace)
    assert key == ("RmsNormPlugin", "1", "")
    listed = [(f.name, str(f.type)) for f in creator.field_names]
    companions = fused_rtx.FusedRmsNormPluginCreator().field_names
    assert listed == [(f.name, str(f.type)) for f in companions]


def test_the_companions_creator_lists_every_forms_field_with_its_type(fused_rtx, trt):
    creator = fused_rtx.FusedRmsNormPluginCreator()
    key = (creator.name, creator.plugin_version, creator.plugin_namespace)
    assert key == ("RmsNormPlugin", "1", "")
    fields = list(creator.field_names)
    assert [f.name for f in fields] == ["epsilon", "residual", "quantize", "y_scale"]
    float32, int32 = trt.PluginFieldType.FLOAT32, trt.PluginFieldType.INT32
    assert [f.type for f in fields] == [float32, int32, int32, float32]
    assert np.asarray(fields[1].data).tolist() == [0]


# -- engines saved before the split: which creator serves their fields ---------------------------
# The fields each version of the one-file sample stored in an engine (and the attributes its
# --from-onnx node had), written out by hand from its plugin_fields: epsilon alone before the
# residual form (b1944d1), then residual, then quantize and, in the FP8 form, y_scale (60a6a9b to
# 88ee3e6, the last commit before the split). (residual, y_scale) is the form they select.
EPS = np.float32(3.0517578e-05)
SCALE = np.float32(0.0375)
OLD_ENGINES = {
    "plain, before the residual form": ({"epsilon": [EPS]}, (False, None)),
    "plain, before the FP8 form": ({"epsilon": [EPS], "residual": [0]}, (False, None)),
    "plain, before the split": ({"epsilon": [EPS], "residual": [0], "quantize": [0]},
                                (False, None)),
    "residual, before the FP8 form": ({"epsilon": [EPS], "residual": [1]}, (True, None)),
    "residual, before the split": ({"epsilon": [EPS], "residual": [1], "quantize": [0]},
                                   (True, None)),
    "FP8": ({"epsilon": [EPS], "residual": [0], "quantize": [1], "y_scale": [SCALE]},
            (False, SCALE)),
    "residual FP8": ({"epsilon": [EPS], "residual": [1], "quantize": [1], "y_scale": [SCALE]},
                     (True, SCALE)),
}
PLAIN_ENGINES = [name for name, (_, form) in OLD_ENGINES.items() if form == (False, None)]
FUSED_ENGINES = [name for name in OLD_ENGINES if name not in PLAIN_ENGINES]


def old_engine_fields(trt, name):
    """(the collection an engine of that kind hands its creator, the arrays it points into)."""
    values, _ = OLD_ENGINES[name]
    arrays = {key: np.array(data, np.int32 if key in ("residual", "quantize") else np.float32)
              for key, data in values.items()}
    return collection(trt, arrays), arrays


@pytest.mark.parametrize("name", PLAIN_ENGINES)
@pytest.mark.parametrize("phase", ["BUILD", "RUNTIME"])
def test_the_lessons_creator_serves_every_plain_engine_saved_before(sample_rtx, trt, name, phase):
    """residual 0 and quantize 0, as plain engines stored them, select the plain form: served."""
    fields, _arrays = old_engine_fields(trt, name)
    plugin = create_from(sample_rtx.RmsNormPluginCreator(), trt, fields, phase)
    assert type(plugin) is sample_rtx.RmsNormPlugin
    assert (plugin.epsilon, plugin.num_outputs) == (EPS, 1)
    assert field_values(plugin.get_fields_to_serialize()) == {"epsilon": [EPS]}


@pytest.mark.parametrize("name", FUSED_ENGINES)
def test_the_lessons_creator_refuses_a_fused_engine_in_one_sentence_naming_the_companion(
        sample_rtx, trt, name):
    fields, _arrays = old_engine_fields(trt, name)
    with pytest.raises(ValueError) as info:
        create_from(sample_rtx.RmsNormPluginCreator(), trt, fields, "RUNTIME")
    field = "residual" if OLD_ENGINES[name][1][0] else "quantize"  # the first field set
    assert str(info.value) == (PREFIX + f"field '{field}' selects a form that "
                               "rms_norm_fused_cutedsl.py serves; call its register_creator() "
                               "before building or loading")


@pytest.mark.parametrize("name", OLD_ENGINES)
def test_the_companions_creator_serves_every_engine_saved_before(fused_rtx, trt, name):
    fields, _arrays = old_engine_fields(trt, name)
    plugin = create_from(fused_rtx.FusedRmsNormPluginCreator(), trt, fields, "RUNTIME")
    residual, y_scale = OLD_ENGINES[name][1]
    assert isinstance(plugin, fused_rtx.FusedRmsNormPlugin)
    assert (plugin.epsilon, plugin.residual, plugin.y_scale) == (EPS, residual, y_scale)
    assert plugin.num_outputs == 1 + residual
    # What it stores in an engine it saves: every field, this form's values.
    stored = field_values(plugin.get_fields_to_serialize())
    assert stored == {"epsilon": [EPS], "residual": [int(residual)],
                      "quantize": [int(y_scale is not None)],
                      **({} if y_scale is None else {"y_scale": [y_scale]})}


def test_each_creator_serves_the_fields_the_others_plain_plugin_stores(sample_rtx, fused_rtx, trt):
    """An engine the lesson builds loads where the companion's creator is registered, and a plain
    engine the companion builds loads where only the lesson's is."""
    eps = np.array([EPS], np.float32)
    lesson_plugin = epsilon_only(sample_rtx.RmsNormPluginCreator(), trt, eps)
    fused_plugin = epsilon_only(fused_rtx.FusedRmsNormPluginCreator(), trt, eps)
    loaded_by_fused = create_from(fused_rtx.FusedRmsNormPluginCreator(), trt,
                                  lesson_plugin.get_fields_to_serialize(), "RUNTIME")
    loaded_by_lesson = create_from(sample_rtx.RmsNormPluginCreator(), trt,
                                   fused_plugin.get_fields_to_serialize(), "RUNTIME")
    assert (loaded_by_fused.residual, loaded_by_fused.y_scale, loaded_by_fused.epsilon) == (
        False, None, EPS)
    assert (type(loaded_by_lesson), loaded_by_lesson.epsilon) == (sample_rtx.RmsNormPlugin, EPS)


# -- which creator TensorRT's registry holds -------------------------------------------------------


@pytest.fixture
def registry(trt, sample_rtx):
    """TensorRT-RTX's process-wide registry, without a creator of the plugin's key before and
    after."""
    registry = trt.get_plugin_registry()
    key = (sample_rtx.PLUGIN_NAME, sample_rtx.PLUGIN_VERSION, sample_rtx.PLUGIN_NAMESPACE)

    def clear():
        while (registered := registry.get_creator(*key)) is not None:
            assert registry.deregister_creator(registered)

    clear()
    yield lambda: registry.get_creator(*key)
    clear()


def test_registering_the_companion_after_the_lesson_replaces_the_lessons_creator(
        registry, sample_rtx, fused_rtx, trt):
    lesson_creator = sample_rtx.register_creator()
    assert type(lesson_creator) is sample_rtx.RmsNormPluginCreator
    fused_creator = fused_rtx.register_creator()
    assert type(fused_creator) is fused_rtx.FusedRmsNormPluginCreator
    assert registry() is fused_creator
    assert not trt.get_plugin_registry().deregister_creator(lesson_creator), "still registered"
    assert fused_rtx.register_creator() is fused_creator  # once is enough


def test_the_lessons_register_creator_leaves_a_registered_companion_creator(registry, sample_rtx,
                                                                            fused_rtx):
    """The lesson's register_creator serves a process that loaded the companion first (an engine of
    any form may load there); it returns the creator that is registered."""
    fused_creator = fused_rtx.register_creator()
    assert sample_rtx.register_creator() is fused_creator
    assert registry() is fused_creator


def test_the_lessons_register_creator_registers_its_own_where_none_is(registry, sample_rtx):
    assert registry() is None
    creator = sample_rtx.register_creator()
    assert type(creator) is sample_rtx.RmsNormPluginCreator and registry() is creator


# -- the fields of the residual form (the companion's creator) -------------------------------------


def epsilon_and_residual(trt, residual_data, residual_type="INT32"):
    """Both fields, and the arrays they point into (kept by the caller while TensorRT reads
    them)."""
    arrays = {"epsilon": np.array([1e-5], dtype=np.float32), "residual": residual_data}
    return collection(trt, arrays, {"residual": residual_type}), arrays


@pytest.fixture
def fused_creator(fused_rtx):
    return fused_rtx.FusedRmsNormPluginCreator()


@pytest.mark.parametrize("value, outputs", [(0, 1), (1, 2)])
def test_the_residual_field_selects_the_form(fused_creator, trt, value, outputs):
    fields, _arrays = epsilon_and_residual(trt, np.array([value], dtype=np.int32))
    plugin = create_from(fused_creator, trt, fields)
    assert (plugin.residual, plugin.num_outputs) == (bool(value), outputs)
    assert field_values(plugin.get_fields_to_serialize())["residual"] == [value]


@pytest.mark.parametrize("data, field_type, got", [
    (np.array([2], dtype=np.int32), "INT32", "values [2]"),
    (np.array([0, 1], dtype=np.int32), "INT32", "values [0, 1]"),
    (np.array([1.0], dtype=np.float32), "FLOAT32", "a PluginFieldType.FLOAT32 field"),
])
def test_a_residual_field_other_than_one_int32_0_or_1_is_refused(fused_creator, trt, data,
                                                                 field_type, got):
    fields, _arrays = epsilon_and_residual(trt, data, field_type)
    with pytest.raises(ValueError) as info:
        create_from(fused_creator, trt, fields)
    assert str(info.value) == (PREFIX + "field 'residual' must be one INT32 value, 0 (plain) or 1 "
                               f"(residual), got {got}")


# -- epsilon, which both creators read -------------------------------------------------------------


@pytest.mark.parametrize("eps", [1e-5, 3.0517578e-05, 0.125, 1e-6])
@pytest.mark.parametrize("phase", ["BUILD", "RUNTIME"])
def test_valid_epsilon_becomes_the_plugins_float32_epsilon(creator, trt, eps, phase):
    plugin = epsilon_only(creator, trt, np.array([eps], dtype=np.float32), phase=phase)
    assert plugin.epsilon == float(np.float32(eps))


NEEDS = PREFIX + "needs one FLOAT32 field 'epsilon' holding one value, got "


def test_missing_epsilon_is_refused(creator, trt):
    with pytest.raises(ValueError) as info:
        create_from(creator, trt, trt.PluginFieldCollection([]))
    assert str(info.value) == NEEDS + "fields []"


def test_misnamed_field_is_refused_as_missing_epsilon(creator, trt):
    data = np.array([1e-5], dtype=np.float32)
    fields = trt.PluginFieldCollection([trt.PluginField("eps", data, trt.PluginFieldType.FLOAT32)])
    with pytest.raises(ValueError) as info:
        create_from(creator, trt, fields)
    assert str(info.value) == NEEDS + "fields ['eps']"


# TensorRT's PluginField.data refuses to convert FLOAT16 and BF16 fields (pyPlugin.cpp: "No known
# conversion for returning data from PluginField"): the refusal must name the type without reading
# the data.
@pytest.mark.parametrize(
    "data, field_type",
    [
        (np.array([1], dtype=np.int32), "INT32"),
        (np.array([1e-5], dtype=np.float64), "FLOAT64"),
        (np.array([1e-5], dtype=np.float16), "FLOAT16"),
        (np.array([1e-5], dtype=np.float16), "BF16"),  # bf16's bits, 2 bytes each
    ],
)
def test_epsilon_of_another_field_type_is_refused(creator, trt, data, field_type):
    with pytest.raises(ValueError) as info:
        epsilon_only(creator, trt, data, field_type)
    assert str(info.value) == NEEDS + f"a PluginFieldType.{field_type} field"


@pytest.mark.parametrize("eps", [math.nan, math.inf, -math.inf, 0.0, -1e-5, 1e-50])
def test_epsilon_that_is_not_finite_and_positive_in_float32_is_refused(creator, trt, eps):
    # 1e-50 is 0 in float32
    with pytest.raises(ValueError, match="'epsilon' must be finite and > 0"):
        epsilon_only(creator, trt, np.array([eps], dtype=np.float32))


@pytest.mark.parametrize("values", [[1e-5, 1e-5], []])
def test_epsilon_with_other_than_one_value_is_refused(creator, trt, values):
    with pytest.raises(ValueError) as info:
        epsilon_only(creator, trt, np.array(values, dtype=np.float32))
    assert str(info.value) == NEEDS + f"a PluginFieldType.FLOAT32 field of {len(values)} values"


# -- what the plugins serialize --------------------------------------------------------------------


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


def test_serialized_fields_point_into_arrays_the_plugin_owns(creator, trt):
    """TensorRT reads the fields after get_fields_to_serialize returns: their memory must be the
    plugin's, the companion's extra fields included."""
    plugin = epsilon_only(creator, trt, np.array([3.0517578e-05], dtype=np.float32))
    fields = list(plugin.get_fields_to_serialize())
    field = field_named(fields, "epsilon")
    assert field.type == trt.PluginFieldType.FLOAT32
    assert np.asarray(field.data).tolist() == [np.float32(3.0517578e-05)]
    for field in fields:
        assert len(arrays_behind(plugin, field)) == 1, f"field {field.name} is not the plugin's"


def test_the_ownership_check_sees_a_field_over_a_temporary_array(sample_rtx, trt):
    """Guards the check above: a collection built over a temporary points into no array the plugin
    owns."""
    plugin = epsilon_only(sample_rtx.RmsNormPluginCreator(), trt, np.array([0.125], np.float32))
    temporary = trt.PluginFieldCollection([trt.PluginField(
        "epsilon", np.array([plugin.epsilon], np.float32), trt.PluginFieldType.FLOAT32)])
    assert arrays_behind(plugin, list(temporary)[0]) == []


def test_creator_field_names_point_into_arrays_the_creator_owns(creator):
    for field in creator.field_names:
        assert len(arrays_behind(creator, field)) == 1


def test_serialized_fields_survive_the_collection_that_created_the_plugin(creator, trt):
    """The creator's input collection (and its array) may be freed before TensorRT serializes."""
    plugin = epsilon_only(creator, trt, np.array([0.125], dtype=np.float32))
    churn_allocator()
    field = field_named(plugin.get_fields_to_serialize(), "epsilon")
    assert np.asarray(field.data, dtype=np.float32).tolist() == [0.125]


def test_the_lessons_clone_keeps_epsilon_and_serializes_it_on_its_own(sample_rtx, trt):
    plugin = epsilon_only(sample_rtx.RmsNormPluginCreator(), trt, np.array([0.125], np.float32))
    twin = plugin.clone()
    del plugin
    churn_allocator()
    assert (type(twin), twin.epsilon) == (sample_rtx.RmsNormPlugin, 0.125)
    (field,) = twin.get_fields_to_serialize()
    assert len(arrays_behind(twin, field)) == 1


def test_the_companions_clone_keeps_epsilon_and_the_form_and_serializes_them_on_its_own(
        fused_creator, trt):
    fields, _arrays = epsilon_and_residual(trt, np.array([1], dtype=np.int32))
    plugin = create_from(fused_creator, trt, fields)
    twin = plugin.clone()
    del plugin
    churn_allocator()
    assert (twin.epsilon, twin.residual) == (np.float32(1e-5), True)
    assert field_values(twin.get_fields_to_serialize())["residual"] == [1]
    for field in twin.get_fields_to_serialize():
        assert len(arrays_behind(twin, field)) == 1


# -- supports_format_combination with real descriptors ---------------------------------------------


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
def plugin(creator, trt):
    """The plain form, of either creator."""
    return epsilon_only(creator, trt, np.array([1e-5], dtype=np.float32))


@pytest.mark.parametrize("io_type", ["HALF", "BF16", "FLOAT"])
@pytest.mark.parametrize("w_type", ["FLOAT", "HALF", "BF16"])
def test_every_linear_x_w_combination_with_y_of_xs_type_is_accepted(plugin, trt, io_type, w_type):
    descs = io_descs(trt, io_type, w_type, io_type)
    assert [plugin.supports_format_combination(pos, descs, 2) for pos in range(3)] == [True] * 3


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
        ("HALF", "FLOAT", "FP8", 2),      # an FP8 Y is the FP8 form's
    ],
)
def test_other_dtype_combinations_are_refused(plugin, trt, x_type, w_type, y_type, refused_pos):
    descs = io_descs(trt, x_type, w_type, y_type)
    assert plugin.supports_format_combination(refused_pos, descs, 2) is False


def test_non_linear_formats_are_refused(plugin, trt):
    descs = io_descs(trt, "HALF", "FLOAT", "HALF", fmt="CHW2")
    assert [plugin.supports_format_combination(pos, descs, 2) for pos in range(3)] == [False] * 3


# -- the residual form's five slots: X, R, W in; Y, S out ------------------------------------------


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
def residual_plugin(fused_creator, trt):
    fields, _arrays = epsilon_and_residual(trt, np.array([1], dtype=np.int32))
    return create_from(fused_creator, trt, fields)


@pytest.mark.parametrize("io_type", ["HALF", "BF16", "FLOAT"])
@pytest.mark.parametrize("w_type", ["FLOAT", "HALF", "BF16"])
def test_the_residual_form_takes_r_y_and_s_of_xs_dtype_and_w_of_any(residual_plugin, trt, io_type,
                                                                    w_type):
    descs = residual_descs(trt, (io_type, io_type, w_type, io_type, io_type))
    accepted = [residual_plugin.supports_format_combination(pos, descs, 3) for pos in range(5)]
    assert accepted == [True] * 5
    types = [getattr(trt.DataType, t) for t in (io_type, io_type, w_type)]
    assert residual_plugin.get_output_data_types(types) == [types[0], types[0]]


@pytest.mark.parametrize("refused_pos", [1, 3, 4])
def test_the_residual_form_refuses_r_y_or_s_of_another_dtype(residual_plugin, trt, refused_pos):
    types = ["HALF", "HALF", "FLOAT", "HALF", "HALF"]
    types[refused_pos] = "BF16"
    descs = residual_descs(trt, types)
    assert residual_plugin.supports_format_combination(refused_pos, descs, 3) is False


def test_the_residual_form_refuses_r_of_another_dtype_at_the_network_definition(residual_plugin,
                                                                                trt):
    with pytest.raises(ValueError, match="R must have X's dtype"):
        residual_plugin.get_output_data_types(
            [trt.DataType.HALF, trt.DataType.BF16, trt.DataType.FLOAT])


# -- every method TensorRT calls says when, in one line --------------------------------------------
WHEN = ("Build time", "Run time", "Build and run time", "Called ")


def undated_methods(cls) -> list:
    """Methods `cls` itself defines that TensorRT (or its creator) calls, whose docstring is not one
    line saying when: public ones and __init__ (the others are the plugin's own helpers)."""
    undated = []
    for name, method in vars(cls).items():
        if not callable(method) or (name.startswith("_") and name != "__init__"):
            continue
        lines = (method.__doc__ or "").strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith(WHEN):
            undated.append(name)
    return undated


@pytest.mark.parametrize("name", ["lesson.RmsNormPlugin", "lesson.RmsNormPluginCreator",
                                  "fused.FusedRmsNormPlugin", "fused.FusedRmsNormPluginCreator"])
def test_every_method_tensorrt_calls_has_a_one_line_docstring_saying_when(sample_rtx, fused_rtx,
                                                                          name):
    module, _, cls = name.partition(".")
    assert undated_methods(getattr({"lesson": sample_rtx, "fused": fused_rtx}[module], cls)) == []


def test_the_docstring_check_sees_an_undated_or_long_docstring():
    class Plugin:
        def enqueue(self):
            """Launches the kernel."""

        def clone(self):
            """Build and run time: a copy.

            More.
            """

        def configure_plugin(self):
            """Build time: nothing."""

        def _helper(self):
            """Not TensorRT's."""

    assert undated_methods(Plugin) == ["enqueue", "clone"]
