"""The adapting path README.md walks: a LayerNorm with a bias made from a copy of the sample.

tests/fixtures/layer_norm_bias.patch is the change README.md describes: a third input B held
like W, a second reduction (the mean, then the variance), and the rule's two inputs
COLUMN_INPUTS and REDUCTIONS set to 2. Here it is applied to a copy of the sample, as a reader
would (`git apply`), and the copy is taken through the same steps as the README:

* CPU: the patch still applies (the sample and its worked example cannot drift apart); the
  plans follow what the copy holds (W and B move after the reduction where the sample's plan
  would not fit them); and `support/check_kernel.py COPY --all-sizes --forms plain` exits 0, no kernel of the
  copy spilling on sm_80 or sm_90a.
* GPU: the copy's launcher against a float64 LayerNorm at every plan of its schedule.
"""

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from support.sample_loader import ROOT, SAMPLE_PATH

PATCH = ROOT / "tests" / "fixtures" / "layer_norm_bias.patch"
COPY_NAME = "layer_norm_cutedsl.py"


def apply_patch(directory: pathlib.Path) -> pathlib.Path:
    """The sample copied into directory and the fixture applied to it, as the README does."""
    copy = directory / COPY_NAME
    shutil.copyfile(SAMPLE_PATH, copy)
    subprocess.run(["git", "apply", str(PATCH)], cwd=directory, check=True,
                   capture_output=True, text=True)
    return copy


def import_copy(path: pathlib.Path, name: str):
    """Import the patched copy from its file (its main() does not run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def copy_path(tmp_path_factory):
    return apply_patch(tmp_path_factory.mktemp("adapted"))


@pytest.fixture(scope="module")
def layer_norm(copy_path):
    return import_copy(copy_path, "layer_norm_under_test")


def test_the_fixture_applies_to_the_sample_as_it_is(tmp_path):
    """git apply --check fails the moment the sample's text drifts from its worked example."""
    shutil.copyfile(SAMPLE_PATH, tmp_path / COPY_NAME)
    done = subprocess.run(["git", "apply", "--check", str(PATCH)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_fixture_changes_what_the_readme_says_it_changes():
    """Two inputs of the rule, a third kernel argument, a second reduction per row."""
    added = [line[1:] for line in PATCH.read_text().splitlines()
             if line.startswith("+") and not line.startswith("+++")]
    assert "COLUMN_INPUTS = 2  # per-column inputs held like W (a LayerNorm's bias: 2)" in added
    assert "REDUCTIONS = 2  # row sums per row: x^2 (a LayerNorm's mean and variance: 2)" in added
    assert "    b_ptr: cute.Pointer," in added
    assert any("2 * i + 1" in line for line in added)


@pytest.mark.parametrize("hidden,elem_bytes,tokens", [
    (1024, 2, None),   # the 2 KB line's plan, under its launch bound of 8 CTAs/SM
    (16384, 2, 512),   # the mid plan of 512 threads, under MID_BOUND's 2 CTAs/SM
])
def test_the_plans_follow_what_the_copy_holds(layer_norm, sample_standin, hidden, elem_bytes,
                                              tokens):
    """Where the sample holds W through the reduction under a launch bound, the copy holds W
    and B as well, which the bound's registers do not fit: the rule moves them after the
    reduction and keeps the bound (occupancy), changing nothing else."""
    mine = sample_standin.plan_kernel(hidden, elem_bytes, tokens)
    theirs = layer_norm.plan_kernel(hidden, elem_bytes, tokens)
    assert mine.early_weight and mine.min_ctas_per_sm > 0
    assert not theirs.early_weight
    assert theirs.min_ctas_per_sm == mine.min_ctas_per_sm
    regs = layer_norm.registers_needed(theirs)
    assert regs <= layer_norm.register_ceiling(theirs)


def test_the_check_command_passes_the_copy(copy_path):
    """The README's one command on the copy: every plan of the plain form (the one the patch adapts)
    of every row class, every dtype pair, sm_80 and sm_90a, no spill and every launch bound met."""
    command = [sys.executable, str(ROOT / "support" / "check_kernel.py"), str(copy_path),
               "--all-sizes", "--forms", "plain"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def layer_norm_case(layer_norm, dtype, hidden, num_tokens):
    """(y, reference, ulp-scaled tolerance) of the copy's launcher on seeded inputs."""
    import torch
    from cutlass.cute.runtime import from_dlpack

    launcher = layer_norm.compile_launcher(
        layer_norm.token_schedule(hidden, layer_norm.DTYPES[dtype].bytes,
                                  layer_norm.is_sm90(layer_norm.gpu_arch())),
        dtype, "float32", layer_norm.DEFAULT_EPSILON, layer_norm.gpu_arch())
    x, w, b = layer_norm.make_inputs(num_tokens, hidden, dtype, seed=num_tokens)
    tensors = [t.cuda() for t in (x, w, b)]
    y = torch.full_like(tensors[0], float("nan"))
    stream = torch.cuda.current_stream()
    cute_tensors = [from_dlpack(t, assumed_align=16) for t in (*tensors, y)]
    launcher(*cute_tensors, num_tokens, layer_norm.cuda.CUstream(stream.cuda_stream))
    torch.cuda.synchronize()
    ref = layer_norm.layer_norm_reference(x.float().numpy(), w.float().numpy(),
                                          b.float().numpy(), layer_norm.DEFAULT_EPSILON)
    return y.float().cpu().numpy(), ref


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("hidden", [100, 1000, 1024, 1536, 4096, 5120, 8192, 16384, 32768])
def test_the_copy_computes_a_layer_norm_at_every_plan(layer_norm, dtype, hidden):
    """At the last count of each range the schedule gives (and one row), Y is within two ulps of
    the float64 LayerNorm: FP32 sums and one rounding at the store, as in the sample."""
    import torch

    sm90 = layer_norm.is_sm90(layer_norm.gpu_arch())
    elem_bytes = layer_norm.DTYPES[dtype].bytes
    counts = {1}
    for _, ranges in layer_norm.token_schedule(hidden, elem_bytes, sm90):
        counts.update(most or 4100 for _, most in ranges)
    eps = 2.0 ** -18 if dtype == "float32" else torch.finfo(getattr(torch, dtype)).eps
    for num_tokens in sorted(counts):
        y, ref = layer_norm_case(layer_norm, dtype, hidden, num_tokens)
        bound = 1e-5 + 2 * eps * np.abs(ref)
        bad = int(np.sum(~(np.abs(y - ref) <= bound)))
        assert bad == 0, f"{dtype} {num_tokens}x{hidden}: {bad} elements out of tolerance"
