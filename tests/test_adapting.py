"""CPU: the copy path README.md walks, end to end, for both worked examples
(tests/worked_examples.py).

Each patch is applied to a copy of the lesson as a reader would (`git apply`), and the copy is taken
through every step the lesson itself goes through without a GPU:

* the patch applies to the lesson as it is (the lesson and its worked examples cannot drift apart);
* the rule: every plan the copy makes fits its own register estimate, the further fit step the gated
  copy adds (Z a vector at a time) serves the rows where Z held does not fit, and the rows no step
  fits are refused in one sentence;
* `support/check_kernel.py COPY`, the full proof: the rule at every size, every distinct plan
  compiled on sm_90a (both targets by default), no spill; its one finding is the refusal above;
* the copy's plugin and creator build an engine with TensorRT-RTX through the ONNX parser, its new
  input included, and refuse a wrong dtype of it in the plugin's own sentence;
* the copy's CLI: --plans, a bad flag, a refused size and no GPU, each as the lesson's; with
  TensorRT and a GPU (marker trt), its whole run: build, run, check against NumPy.

tests/test_gpu_adapting.py runs the copies' launchers and plugins on a GPU. Cost on 2 idle cores:
each copy's check about 1.3 minutes (CI's quick pass of pairs; all nine, a user's run, about 6),
the rest about a minute.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, SAMPLE_PATH
from worked_examples import EXAMPLES, apply_patch, distinct_plans, import_copy

CHECK = ROOT / "support" / "check_kernel.py"
RTX_WORKER = ROOT / "tests" / "copy_rtx_worker.py"
MAX_HIDDEN = 32768
# Rows no fit step serves in either copy: fp32 rows of 16-byte vectors, 8 a thread over 1024
# threads, hold 32 registers of X, and at the store a vector of each of two more inputs (W and B,
# or W and Z): 26 + 32 + 4 + 4 = 66 registers, over the 64 a 1024-thread CTA leaves.
REFUSED_FP32 = [hidden for hidden in range(28673, MAX_HIDDEN + 1) if hidden % 4 == 0]


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """{example: the patched copy's path}, each in a folder of its own."""
    return {name: apply_patch(example, tmp_path_factory.mktemp(name))
            for name, example in EXAMPLES.items()}


@pytest.fixture(scope="module")
def modules(copies):
    """{example: the copy imported}."""
    return {name: import_copy(path, f"{name}_under_test") for name, path in copies.items()}


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_patch_applies_to_the_lesson_as_it_is(tmp_path, name):
    """git apply --check fails the moment the lesson's text drifts from its worked example."""
    example = EXAMPLES[name]
    (tmp_path / example.copy_name).write_text(SAMPLE_PATH.read_text())
    done = subprocess.run(["git", "apply", "--check", str(example.patch)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_patches_change_the_rules_inputs(modules):
    """The LayerNorm holds two column inputs and reduces twice; the gated norm holds a second row
    and has a fit step of its own, last."""
    layer_norm = modules["layer_norm"]
    assert (layer_norm.ROW_INPUTS, layer_norm.COLUMN_INPUTS, layer_norm.REDUCTIONS) == (1, 2, 2)
    gated = modules["gated"]
    assert (gated.ROW_INPUTS, gated.COLUMN_INPUTS, gated.REDUCTIONS) == (2, 1, 1)
    assert gated.FIT_STEPS == ({"weight_by_vector": True}, {"gate_by_vector": True})


@pytest.mark.parametrize("name, hidden, elem_bytes, weight_by_vector, gate_by_vector", [
    # The lesson holds W from Step 1 at 16384 fp16 (1024 threads x 2 vectors: 26 + 8 + 16 = 50 of
    # 64); with B as well it needs 66, so W and B move to the store.
    ("layer_norm", 16384, 2, True, None),
    ("layer_norm", 1024, 2, False, None),
    # Z counts at 4 bytes an element, as W. fp16 rows of 2 vectors a thread hold Z: 26 + X's 8
    # + Z's 16 + a vector of W 8 = 58 of 64; 3 vectors: 26 + 12 + 24 + 8 = 70, so Z comes a
    # vector at a time: 26 + 12 + 8 + 8 = 54.
    ("gated", 16384, 2, True, False),
    ("gated", 24576, 2, True, True),
    # With W first, Step 5 takes a thread's vectors whole and holds silu(z) beside z: 800 threads
    # x 2 vectors need 26 + 8 + 2 * 16 + 16 = 82 of 80, so W comes a vector at a time.
    ("gated", 12800, 2, True, False),
    # Odd rows of 1-element vectors, 18 a thread: 26 + 18 + 18 + 1 = 63; 19: 65, then 47.
    ("gated", 18431, 2, True, False),
    ("gated", 18433, 2, True, True),
    # fp32 rows of 4-element vectors, 5 a thread: 26 + 20 + 20 + 4 = 70; then 26 + 20 + 4 + 4 = 54.
    ("gated", 16388, 4, True, True),
    ("gated", 1024, 4, False, False),
])
def test_the_plans_follow_what_the_copy_holds(modules, name, hidden, elem_bytes, weight_by_vector,
                                              gate_by_vector):
    plan = modules[name].plan_kernel(hidden, elem_bytes)
    assert plan.weight_by_vector == weight_by_vector
    if gate_by_vector is not None:
        assert plan.gate_by_vector == gate_by_vector
    assert plan.registers_needed() <= plan.register_ceiling()


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_size_gets_a_plan_that_fits_or_one_sentence(modules, name):
    """Every 16-bit row has a plan within its estimate; fp32 rows are refused exactly where no fit
    step serves them (REFUSED_FP32), each in one sentence that names the row."""
    copy = modules[name]
    refused = {2: [], 4: []}
    for elem_bytes in refused:
        for hidden in range(1, MAX_HIDDEN + 1):
            try:
                plan = copy.plan_kernel(hidden, elem_bytes)
            except copy.PlanError as exc:
                assert str(exc).startswith(f"rows of {hidden} elements of {elem_bytes * 8} bits "
                                           "need 66 registers a thread even after every fitting "
                                           "step"), exc
                assert "\n" not in str(exc)
                refused[elem_bytes].append(hidden)
                continue
            assert plan.registers_needed() <= plan.register_ceiling(), plan
    assert refused == {2: [], 4: REFUSED_FP32}


def run_check(path):
    """`check_kernel.py COPY` on CI's pass: every size and distinct plan, fp16 and fp32 X with fp32
    W, on sm_90a alone (the tool's docstring says what all nine pairs and both targets cost; the
    lesson's own check in tests/test_check_kernel.py keeps sm_80 in CI)."""
    proc = subprocess.run([sys.executable, str(CHECK), str(path), "--pairs",
                           "float16/float32,float32/float32", "--arch", "sm_90a", "--jobs", "2"],
                          capture_output=True, text=True, timeout=1800)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("name, refused_tag, kinds", [
    ("layer_norm", "h28676b4v4t1024r1k8_wvector", ("_wfirst", "_wvector")),
    ("gated", "h28676b4v4t1024r1k8_wvector_zvector", ("_wfirst", "_wvector", "_wvector_zvector")),
])
def test_the_check_proves_every_size_of_the_copy(copies, modules, name, refused_tag, kinds):
    """`check_kernel.py COPY`: every distinct plan of the copy, fp16 and fp32 X with fp32 W,
    compiled on sm_90a, those of the gated copy's own plan field (Z a vector at a time)
    among them: none spills or fails to compile, every access is as wide as the plan's vectors. The
    check's one finding, its exit 1, is the rule refusing REFUSED_FP32 in one sentence."""
    code, out, err = run_check(copies[name])
    assert not err, err
    kernels = distinct_plans(modules[name])
    summary = [line for line in out.splitlines() if " kernels compiled, " in line]
    assert summary and summary[0].startswith(
        f"{kernels} kernels compiled, 0 failed to compile; 0 spill, 0 miss their launch bound, 0 "
        "have loads or stores narrower than expected; the rule: 1 finding;"), out[-3000:]
    _, _, findings = out.partition("What the rule does not fit:\n")
    assert findings.splitlines() == [
        f"the rule refuses 1024 sizes from 28676 to 32768 (float32 X, plain form, sm_90a): "
        f"at 28676, PlanError: rows of 28676 elements of 32 bits need 66 registers a thread even "
        f"after every fitting step, more than the 64 a CTA of 1024 threads leaves "
        f"({refused_tag})"], out[-3000:]
    tags = {row[4] for row in map(str.split, out.splitlines()) if row[:1] == ["sm_90a"]}
    assert {kind for kind in kinds if any(tag.endswith(kind) for tag in tags)} == set(kinds)
    assert code == 1


def run_rtx_build(lib_dir, spec):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib_dir),
                                                           env.get("LD_LIBRARY_PATH")]))
    proc = subprocess.run([sys.executable, str(RTX_WORKER), json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return (json.loads(lines[-1]) if lines else None), proc.stdout + proc.stderr


def rtx_specs(copies):
    """{(example, case): tests/copy_rtx_worker.py's spec}: each copy built for two dtype pairs,
    and with its new input of a dtype the plugin refuses; one worker process a build."""
    specs = {}
    for name, path in copies.items():
        example = EXAMPLES[name]
        for x, w in (("float16", "float32"), ("bfloat16", "float16")):
            inputs = {tensor: x if kind == "x" else w for tensor, kind in example.inputs.items()}
            specs[name, f"{x}/{w}"] = dict(copy=str(path), inputs=inputs, outputs={"Y": x})
    inputs = {"X": "float16", "W": "float32", "B": "float16"}
    specs["layer_norm", "B not W's dtype"] = dict(copy=str(copies["layer_norm"]), inputs=inputs,
                                                  outputs={"Y": "float16"})
    inputs = {"X": "float16", "Z": "bfloat16", "W": "float32"}
    specs["gated", "Z not X's dtype"] = dict(copy=str(copies["gated"]), inputs=inputs,
                                             outputs={"Y": "float16"})
    return specs


TRT_TYPE = {"float16": "DataType.HALF", "bfloat16": "DataType.BF16", "float32": "DataType.FLOAT"}


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("pair", ["float16/float32", "bfloat16/float16"])
def test_the_copys_plugin_builds_an_engine_with_its_new_input(copies, rtx_lib_dir, name, pair):
    """The parser finds the copy's creator by its own PLUGIN_NAME; the builder hands the plugin
    every input with its dtype and the profile of each row input; the engine stores the plugin's
    name and its epsilon."""
    spec = rtx_specs(copies)[name, pair]
    result, log = run_rtx_build(rtx_lib_dir, spec)
    assert result and result["parse_ok"] and result["build_ok"], log[-3000:]
    assert result["plugin_name_stored"] and result["epsilon_stored"], result
    call = result["configure_plugin"][-1]
    assert [kind for kind, _, _ in call["inputs"]] == [TRT_TYPE[d] for d in spec["inputs"].values()]
    for tensor, (_, low, high) in zip(spec["inputs"], call["inputs"]):
        rows = tensor not in EXAMPLES[name].columns
        assert (low, high) == (([1, 1024], [512, 1024]) if rows else ([1024], [1024])), call
    assert call["outputs"][0][0] == TRT_TYPE[spec["outputs"]["Y"]]


@pytest.mark.parametrize("name, case, message", [
    ("layer_norm", "B not W's dtype",
     "LayerNormPlugin: B must have W's dtype DataType.FLOAT, got DataType.HALF"),
    ("gated", "Z not X's dtype",
     "GatedRmsNormPlugin: Z must have X's dtype DataType.HALF, got DataType.BF16"),
])
def test_the_copys_plugin_refuses_its_new_input_of_another_dtype(copies, rtx_lib_dir, name, case,
                                                                 message):
    result, log = run_rtx_build(rtx_lib_dir, rtx_specs(copies)[name, case])
    assert result is not None and not result["build_ok"], log[-3000:]
    assert message in log, log[-3000:]


def run_copy(path, *args, env=None):
    proc = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                          cwd=path.parent, env=env, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("name, describe", [
    ("layer_norm", "1024 threads/row x 2 vectors of 8 x 16-bit, 1 row/CTA, X in registers, "
                   "W and B a vector at a time at the store"),
    ("gated", "1024 threads/row x 2 vectors of 8 x 16-bit, 1 row/CTA, X in registers, "
              "W a vector at a time at the store, Z in registers"),
])
def test_the_copys_plans_flag_prints_its_plan(copies, name, describe):
    code, out, err = run_copy(copies[name], "--plans", "--hidden-dim", "16384")
    assert (code, err) == (0, "")
    assert out.splitlines() == ["float16 hidden 16384, every GPU and token count:",
                                f"  {describe}"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_copy_without_a_gpu_says_so_in_one_sentence(copies, name):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    code, out, err = run_copy(copies[name], env=env)
    assert code == 2
    assert err == ("error: no CUDA GPU is visible; this sample needs an NVIDIA GPU of compute "
                   "capability 8.0 or newer\n")


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("argv, message", [
    (["--bias"], "error: unrecognized arguments: --bias (see --help)\n"),
    (["--dtype", "float32", "--hidden-dim", "32768"],
     "error: --hidden-dim 32768 is refused: rows of 32768 elements of 32 bits need 66 registers "
     "a thread even after every fitting step, more than the 64 a CTA of 1024 threads leaves "),
])
def test_the_copys_flag_errors_are_one_sentence_and_exit_2(modules, capsys, name, argv, message):
    copy = modules[name]
    parser = copy.make_parser("the copy")
    with pytest.raises(SystemExit) as exit_info:
        copy.validate_args(parser, parser.parse_args(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


@pytest.mark.trt
@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("flags", [(), ("--dtype", "bfloat16", "--weight-dtype", "float16",
                                        "--hidden-dim", "4100")])
def test_the_copy_runs_end_to_end_with_tensorrt(copies, name, flags):
    """The copy as a user runs it: the engine built by Polygraphy around its plugin, run at the
    profile's counts and checked against NumPy by its own run_and_check: exit 0."""
    code, out, err = run_copy(copies[name], *flags)
    assert code == 0 and out.rstrip().endswith("Inference result correct!"), out + err


def test_the_alignment_error_names_the_copys_plugin(tmp_path):
    """A copy that renames its plugin sees its own name when TensorRT hands it a misaligned
    buffer: the handoff names PLUGIN_NAME, not the lesson's name."""
    source = SAMPLE_PATH.read_text()
    assert source.count('PLUGIN_NAME = "RmsNormPlugin"') == 1
    path = tmp_path / "my_norm_cutedsl.py"
    path.write_text(source.replace('PLUGIN_NAME = "RmsNormPlugin"', 'PLUGIN_NAME = "MyNormPlugin"'))
    copy = import_copy(path, "my_norm_under_test")
    with pytest.raises(ValueError) as refusal:
        copy.cute_tensor_from_pointer(0x7F0000000008, (4, 1024), "float16", 0)
    assert str(refusal.value) == ("MyNormPlugin needs 16-byte aligned buffers, got address "
                                  "0x7f0000000008")
