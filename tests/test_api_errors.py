"""CPU: the lesson's and the fused companion's Python API refuse what they cannot serve in one
sentence, before any compilation or launch.

An engineer who imports the lesson or rms_norm_fused_cutedsl.py (the other companions, a notebook,
their own model's build script) calls compile_rms_norm, plan_kernel, the handoff and the plugin
classes directly; a wrong argument must come back as one ValueError, TypeError or ImportError that
names what is wrong and what is allowed, never as an error from deep inside CuteDSL, the enum
module or the CUDA driver. Each limit is tested on both sides, in both files.
"""

import subprocess
import sys

import numpy as np
import pytest

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as sample
from conftest import ROOT, SAMPLE_PATH

ARCH_REFUSAL = "arch must be a CuteDSL compile target"
BOTH_FILES = pytest.mark.parametrize("module", [sample, fused], ids=["lesson", "fused"])


@BOTH_FILES
@pytest.mark.parametrize("arch", ["sm_75", "banana", "sm_90x", "90", "sm_"])
def test_an_unknown_compile_target_is_one_value_error(module, arch):
    with pytest.raises(ValueError, match=ARCH_REFUSAL) as info:
        module.compile_rms_norm("float16", 1024, arch=arch)
    assert repr(arch) in str(info.value)


@BOTH_FILES
@pytest.mark.parametrize("arch", [90, 9.0])
def test_a_compile_target_that_is_not_a_string_is_one_value_error(module, arch):
    with pytest.raises(ValueError, match=ARCH_REFUSAL):
        module.compile_rms_norm("float16", 1024, arch=arch)


@pytest.mark.parametrize("arch, sm90", [("sm_80", False), ("sm_89", False), ("sm_90", True),
                                        ("sm_90a", True), ("sm_100a", True), ("sm_120", True)])
def test_the_targets_cutedsl_knows_are_accepted(arch, sm90):
    assert fused.is_sm90(arch) is sm90


@BOTH_FILES
@pytest.mark.parametrize("hidden", [1024.5, 1024.0, True, "1024", None])
def test_a_hidden_size_that_is_not_an_integer_is_one_type_error(module, hidden):
    with pytest.raises(TypeError, match="hidden must be an integer"):
        module.plan_kernel(hidden, 2)


@BOTH_FILES
@pytest.mark.parametrize("elem_bytes", [1, 3, 8, 2.0, True])
def test_an_element_size_other_than_2_or_4_bytes_is_one_value_error(module, elem_bytes):
    with pytest.raises(ValueError, match="elem_bytes 2 or 4"):
        module.plan_kernel(1024, elem_bytes)


@BOTH_FILES
def test_a_numpy_integer_hidden_size_is_an_integer(module):
    assert module.plan_kernel(np.int64(1024), 2) == module.plan_kernel(1024, 2)


@BOTH_FILES
@pytest.mark.parametrize("hidden, ok", [(0, False), (1, True), (sample.MAX_HIDDEN, True),
                                        (sample.MAX_HIDDEN + 1, False)])
def test_hidden_limits_on_both_sides(module, hidden, ok):
    if ok:
        assert module.plan_kernel(hidden, 2).hidden == hidden
    else:
        refusal = (rf"hidden must be in \[1, {sample.MAX_HIDDEN}\] and elem_bytes 2 or 4, "
                   f"got {hidden} and 2")
        with pytest.raises(ValueError, match=refusal):
            module.plan_kernel(hidden, 2)


@pytest.mark.parametrize("offset", [1, 2, 4, 8, 12])
def test_a_pointer_off_the_16_byte_grid_is_refused_before_any_cuda_call(offset):
    """The kernel is compiled for 16-byte aligned X, W and Y (128-bit accesses): 8 bytes are not
    enough."""
    with pytest.raises(ValueError, match="16-byte aligned buffers"):
        sample.cute_tensor_from_pointer(0x7F0000000000 + offset, (1, 1024), "float16", 0)


# Each call in one process (importing torch and CuteDSL once): one line per call, as it ended.
WITHOUT_TENSORRT = """
import sys
sys.modules["tensorrt"] = None
sys.path.insert(0, {root!r})
import rms_norm_plugin_cutedsl as sample
import rms_norm_fused_cutedsl as fused
for call in {calls!r}:
    try:
        eval(call)
    except ImportError as exc:
        print(type(exc).__name__, exc.name, "|", exc)
    else:
        print("no error")
"""
WITHOUT_TENSORRT_CALLS = [
    "sample.RmsNormPlugin()", "sample.RmsNormPlugin(1e-6)", "sample.RmsNormPluginCreator()",
    "sample.register_creator()", "fused.FusedRmsNormPlugin()",
    "fused.FusedRmsNormPlugin(1e-6, True, 0.5)", "fused.FusedRmsNormPluginCreator()",
    "fused.register_creator()",
]


def test_the_plugin_half_without_tensorrt_is_one_import_error_naming_the_package():
    """Both files import without TensorRT (the kernel half runs); making a plugin or a creator, or
    registering one, is one ImportError naming TensorRT's pip package."""
    code = WITHOUT_TENSORRT.format(root=str(SAMPLE_PATH.parent), calls=WITHOUT_TENSORRT_CALLS)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == len(WITHOUT_TENSORRT_CALLS), proc.stdout
    for call, line in zip(WITHOUT_TENSORRT_CALLS, lines):
        kind, name, _, message = line.split(" ", 3)
        assert (kind, name) == ("ModuleNotFoundError", "tensorrt"), (call, line)
        assert "the package tensorrt-cu12" in message, (call, message)
        assert "pip install -r requirements.txt" in message, (call, message)


def test_rms_norm_torch_refuses_a_weight_of_the_wrong_length():
    import torch

    from support.torch_kernel import rms_norm_torch

    refusal = (r"w must be \[hidden\] for x \[\.\.\., hidden\], got x \(4, 1024\) and "
               r"w \(1000,\)")
    with pytest.raises(ValueError, match=refusal):
        rms_norm_torch(sample, torch.zeros(4, 1024, dtype=torch.float16), torch.ones(1000))


def test_rms_norm_torch_refuses_cpu_tensors():
    import torch

    from support.torch_kernel import rms_norm_torch

    with pytest.raises(ValueError, match="must be CUDA tensors on one device, got cpu, cpu, cpu"):
        rms_norm_torch(sample, torch.zeros(4, 1024, dtype=torch.float16), torch.ones(1024))


def test_rms_norm_torch_refuses_an_out_of_another_shape():
    import torch

    from support.torch_kernel import rms_norm_torch

    x = torch.zeros(4, 1024, dtype=torch.float16)
    with pytest.raises(ValueError, match="out must have shape and dtype"):
        rms_norm_torch(sample, x, torch.ones(1024), out=torch.zeros(4, 1024, dtype=torch.float32))


@pytest.mark.parametrize("venv", [".venv", ".venv-test"])
def test_the_virtual_environments_the_readme_creates_are_git_ignored(venv):
    readme = (ROOT / "README.md").read_text()
    assert f"python3 -m venv {venv} " in readme or f"python3 -m venv {venv}\n" in readme
    proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", f"{venv}/bin/python"],
                          cwd=ROOT)
    assert proc.returncode == 0, (f"{venv}/ is not in .gitignore: `git add .` would commit a whole "
                                  "environment")
