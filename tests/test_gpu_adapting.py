"""GPU: both worked examples (tests/worked_examples.py) computed by their own kernels, against
float64 references written apart from them.

* The copy's launcher, run through support/torch_kernel.py (which builds the call from the copy's
  own launcher: X, W, B or X, Z, W), at row lengths that give every kind of plan the copies make:
  short rows sharing a CTA, ragged rows, 8-, 4- and 2-byte vectors, W (and B) or Z a vector at a
  time at the store; one row, an odd count, many.
* The copy's plugin as TensorRT drives it, its enqueue handed raw pointers and a stream, with the
  labelled stand-in for `tensorrt` (support/trt_standin.py), as tests/test_gpu_plugin.py drives the
  lesson's.
"""

import numpy as np
import pytest

from support.torch_kernel import norm_torch
from worked_examples import EXAMPLES, apply_patch, import_copy, reference, within_tolerance

pytestmark = pytest.mark.gpu

EPSILON = 1e-5
TOKENS = (1, 37, 512)
# Per element size, row lengths of each kind of plan (see the copies' --plans).
HIDDEN = {
    2: (1, 100, 777, 1024, 1536, 4100, 8192, 16384, 18433, 24576, 24584, 32767, 32768),
    4: (1, 100, 777, 1024, 4096, 4098, 16388, 28672, 32766, 32767),
}
TRT_TYPE = {"float16": "HALF", "bfloat16": "BF16", "float32": "FLOAT"}


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """{example: the copy imported}."""
    return {name: import_copy(apply_patch(example, tmp_path_factory.mktemp(name)),
                              f"{name}_on_gpu")
            for name, example in EXAMPLES.items()}


def make_inputs(copy, name, num_tokens, hidden, dtype, w_dtype, seed):
    """The copy's own make_inputs by name, on the GPU."""
    tensors = copy.make_inputs(num_tokens, hidden, dtype, seed, w_dtype)
    return {tensor: t.cuda() for tensor, t in zip(EXAMPLES[name].inputs, tensors)}


def checked(name, y, inputs, dtype):
    """(elements out of tolerance, max error) of Y against the float64 reference."""
    on_cpu = {tensor: t.float().cpu().numpy() for tensor, t in inputs.items()}
    ref = reference(name, on_cpu, EPSILON)
    return within_tolerance(name, y.float().cpu().numpy(), ref, on_cpu, dtype)


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("dtype, w_dtype", [("float16", "float32"), ("bfloat16", "bfloat16"),
                                            ("float32", "float32"), ("float32", "float16")])
def test_the_copys_launcher_at_every_kind_of_plan(copies, name, dtype, w_dtype):
    import torch

    copy = copies[name]
    for hidden in HIDDEN[copy.DTYPES[dtype].bytes]:
        for num_tokens in TOKENS:
            inputs = make_inputs(copy, name, num_tokens, hidden, dtype, w_dtype, seed=hidden)
            y = torch.full_like(inputs["X"], float("nan"))
            norm_torch(copy, inputs, EPSILON, out=y)
            torch.cuda.synchronize()
            bad, err = checked(name, y, inputs, dtype)
            plan = copy.plan_kernel(hidden, copy.DTYPES[dtype].bytes)
            assert bad == 0, f"{num_tokens} x {hidden} ({plan}): {bad} out, max error {err:.3e}"


def test_the_refused_rows_are_refused_before_any_gpu_work(copies):
    """fp32 rows no fit step serves: the launcher is never compiled for them."""
    import torch

    for name, copy in copies.items():
        inputs = make_inputs(copy, name, 4, 32768, "float32", "float32", seed=0)
        with pytest.raises(copy.PlanError, match="rows of 32768 elements of 32 bits need 66"):
            norm_torch(copy, inputs, EPSILON, out=torch.empty_like(inputs["X"]))


def context_plugin(copy, trt):
    """What TensorRT does when it loads an engine: creator -> plugin -> a context's clone."""
    epsilon = np.array([EPSILON], np.float32)  # held until create_plugin returns
    fields = trt.PluginFieldCollection([trt.PluginField("epsilon", epsilon,
                                                        trt.PluginFieldType.FLOAT32)])
    plugin = copy.RmsNormPluginCreator().create_plugin("copy", fields, trt.TensorRTPhase.RUNTIME)
    return plugin.attach_to_context(None)


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("dtype, w_dtype", [("float16", "float32"), ("bfloat16", "float16"),
                                            ("float32", "bfloat16")])
def test_the_copys_plugin_enqueue_on_tensorrts_stream(tmp_path, name, dtype, w_dtype):
    """The plugin's own methods as TensorRT calls them: descriptors of every input in the plugin's
    order, on_shape_change, then enqueue with raw addresses on another stream, at the profile's
    min, opt and max."""
    import torch

    from support import trt_standin as trt

    example = EXAMPLES[name]
    copy = import_copy(apply_patch(example, tmp_path), f"{name}_with_standin", trt)
    plugin = context_plugin(copy, trt)
    stream = torch.cuda.Stream()
    hidden = 4096
    for num_tokens in (1, 128, 512):
        inputs = make_inputs(copy, name, num_tokens, hidden, dtype, w_dtype, seed=num_tokens)
        y = torch.full_like(inputs["X"], float("nan"))
        descs = [trt.PluginTensorDesc(tuple(t.shape), getattr(trt.DataType, TRT_TYPE[kind]))
                 for t, kind in zip(inputs.values(),
                                    (dtype if k == "x" else w_dtype
                                     for k in example.inputs.values()))]
        y_desc = [trt.PluginTensorDesc(tuple(y.shape), getattr(trt.DataType, TRT_TYPE[dtype]))]
        torch.cuda.synchronize()
        plugin.on_shape_change(descs, y_desc)
        plugin.enqueue(descs, y_desc, [t.data_ptr() for t in inputs.values()], [y.data_ptr()], 0,
                       stream.cuda_stream)
        stream.synchronize()
        bad, err = checked(name, y, inputs, dtype)
        assert bad == 0, f"{num_tokens} tokens: {bad} out of tolerance, max error {err:.3e}"
