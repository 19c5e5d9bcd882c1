"""support/torch_kernel.py builds its call from each module's own launcher, so the lesson, the fused
companion and a copy with other inputs all run through it.

CPU: the argument order it builds for each, and its refusals before any compile. GPU (marker gpu):
the lesson and the companion through rms_norm_torch and add_rms_norm_torch against NumPy (the
copies run through it in tests/test_gpu_adapting.py).
"""

import types

import pytest

import rms_norm_plugin_cutedsl as lesson
from conftest import FUSED_PATH
from support import torch_kernel
from support.sample_loader import import_file
from worked_examples import EXAMPLES, apply_patch, import_copy

RUN_TIME = [("num_tokens", False), ("stream", False)]


@pytest.fixture(scope="module")
def fused():
    return import_file(FUSED_PATH, "fused_for_torch_kernel")


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    return {name: import_copy(apply_patch(example, tmp_path_factory.mktemp(name)),
                              f"{name}_for_torch_kernel")
            for name, example in EXAMPLES.items()}


def test_the_arguments_follow_each_modules_launcher(fused, copies):
    """Tensors in the launcher's order, then num_tokens and the stream; the companion's R and S
    last and optional (its plain form leaves them out)."""
    assert torch_kernel.launcher_arguments(lesson) == [("X", False), ("W", False), ("Y", False),
                                                       *RUN_TIME]
    assert torch_kernel.launcher_arguments(fused) == [("X", False), ("W", False), ("Y", False),
                                                      *RUN_TIME, ("R", True), ("S", True)]
    assert torch_kernel.launcher_arguments(copies["layer_norm"]) == [
        ("X", False), ("W", False), ("B", False), ("Y", False), *RUN_TIME]
    assert torch_kernel.launcher_arguments(copies["gated"]) == [
        ("X", False), ("Z", False), ("W", False), ("Y", False), *RUN_TIME]


def test_a_module_without_one_launcher_is_refused():
    module = types.ModuleType("no_launcher")
    with pytest.raises(ValueError, match="no_launcher must define one launcher named \\*_launch, "
                                         "found 0"):
        torch_kernel.launcher_arguments(module)


def test_a_copys_own_input_is_checked_by_its_name(copies):
    """A bias of the wrong length is refused in one sentence naming it, before anything compiles."""
    import torch

    x = torch.zeros(4, 1024, dtype=torch.float16)
    inputs = {"X": x, "W": torch.ones(1024), "B": torch.ones(1000)}
    with pytest.raises(ValueError, match=r"^b must be \[hidden\] for x \[\.\.\., hidden\], got x "
                                         r"\(4, 1024\) and b \(1000,\)$"):
        torch_kernel.norm_torch(copies["layer_norm"], inputs)
    inputs = {"X": x, "Z": torch.zeros(4, 1024, dtype=torch.bfloat16), "W": torch.ones(1024)}
    with pytest.raises(ValueError, match="^z must have shape and dtype"):
        torch_kernel.norm_torch(copies["gated"], inputs)


def test_a_form_the_module_lacks_is_refused():
    """The lesson has no residual form: R given, it says so rather than leaving R out."""
    import torch

    x = torch.zeros(4, 1024, dtype=torch.float16)
    inputs = {"X": x, "R": x, "W": torch.ones(1024)}
    with pytest.raises(ValueError, match="rms_norm_plugin_cutedsl.compile_rms_norm has no "
                                         "residual form"):
        torch_kernel.compiled_launcher(lesson, inputs, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_the_lesson_and_the_companion_run_through_it(fused, dtype):
    import torch

    for module in (lesson, fused):
        x, w = lesson.make_inputs(37, 4096, dtype, seed=3)
        y = torch_kernel.rms_norm_torch(module, x.cuda(), w.cuda())
        ok, err = lesson.check_output(y.float().cpu().numpy(), x.float().numpy(),
                                      w.float().numpy(), 1e-5, dtype)
        assert ok, f"{module.__name__}: max error {err:.3e}"
    r = fused.make_residual(37, 4096, dtype, seed=3)
    y, s = torch_kernel.add_rms_norm_torch(fused, x.cuda(), r.cuda(), w.cuda())
    assert torch.equal(s.cpu(), fused.residual_reference(x, r))
    ok, err = lesson.check_output(y.float().cpu().numpy(), s.float().cpu().numpy(),
                                  w.float().numpy(), 1e-5, dtype)
    assert ok, f"residual form: max error {err:.3e}"
