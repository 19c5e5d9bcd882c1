"""CPU: the scripts run as a user runs them, on a machine without a GPU or with bad flags.

The lesson (rms_norm_plugin_cutedsl.py) has the plain form's flags; its fused companion
(rms_norm_fused_cutedsl.py) adds --residual, --y-scale and --from-onnx. Every user error must end
in one sentence on stderr and the documented exit code (2), never a traceback. The scripts import
torch, CuteDSL and cupy first and parse their flags after them (the flag-checking lesson comes after
the plugin in the file), so a flag error comes after those imports; it must still come before any
GPU or TensorRT check: on this machine, which has no GPU, a bad flag is reported as the flag's
error, not as "no CUDA GPU". Each flag's refusal is checked in-process, with both files' parsers;
a few are checked on the scripts too, to show that each script checks its flags first.
"""

import argparse
import re
import subprocess
import sys

import pytest

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as sample
from conftest import FUSED_PATH, SAMPLE_PATH

EXIT_USAGE = 2
AOT_PATH = SAMPLE_PATH.parent / "rms_norm_aot_cutedsl.py"
SAVED_PATH = SAMPLE_PATH.parent / "rms_norm_saved_engine.py"
INT32_MAX = 2**31 - 1  # the kernel counts rows in an Int32
BOTH_FILES = pytest.mark.parametrize("module", [sample, fused], ids=["lesson", "fused"])


def run_script(*args, prelude=None, script=SAMPLE_PATH, python_flags=()):
    if prelude is None:
        cmd = [sys.executable, *python_flags, str(script), *args]
    else:  # run the file as __main__ after `prelude`, e.g. to hide a package
        code = f"{prelude}\nimport runpy, sys\nsys.argv = [{str(script)!r}, *{list(args)!r}]\n" \
               f"runpy.run_path({str(script)!r}, run_name='__main__')"
        cmd = [sys.executable, *python_flags, "-c", code]
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_sentence(stderr, *needles):
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


# What a script imported before it exited, printed by an atexit hook (runs after sys.exit): the
# lesson and its companions import these first; rms_norm_onnx_model.py checks its flags before
# them (tests/test_onnx_model.py).
HEAVY = ("torch", "cutlass", "cupy", "tensorrt", "numpy")
REPORT_HEAVY_IMPORTS = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('HEAVY', sorted({m.partition('.')[0] for m in sys.modules} & "
    f"{set(HEAVY)!r})))"
)


def heavy_imports(stdout):
    (line,) = [line for line in stdout.splitlines() if line.startswith("HEAVY ")]
    return line


def flags(module, *argv):
    """The flags `module`'s script would run with: its parser and its checks, in-process."""
    parser = module.make_parser("test")
    return module.validate_args(parser, parser.parse_args(list(argv)))


def refusal(module, capsys, *argv) -> str:
    """The one line `module`'s parser or checks print for these flags, once they exit 2."""
    with pytest.raises(SystemExit) as info:
        flags(module, *argv)
    assert info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert_one_sentence(err)
    return err.strip()


@pytest.mark.parametrize("script", [SAMPLE_PATH, FUSED_PATH], ids=["lesson", "fused"])
def test_without_a_gpu_the_script_says_so_and_exits_2(script):
    code, out, err = run_script(script=script)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "no CUDA GPU", "8.0")
    assert "Inference result" not in out


def test_without_a_gpu_the_aot_script_says_so_and_exits_2():
    code, _, err = run_script(script=AOT_PATH)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "no CUDA GPU")


# TEST DOUBLE for the GPU (there is none here): torch reports one of the given compute capability,
# so the environment check goes on past the GPU to what it checks next.
def fake_gpu(major, minor):
    return ("import torch\n"
            "torch.cuda.is_available = lambda: True\n"
            f"torch.cuda.get_device_capability = lambda device=None: ({major}, {minor})\n"
            "torch.cuda.get_device_name = lambda device=None: 'Fake GPU'\n")


def test_a_gpu_older_than_sm80_is_named_with_its_compute_capability():
    code, out, err = run_script(prelude=fake_gpu(7, 5))
    assert code == EXIT_USAGE
    assert_one_sentence(err, "Fake GPU has compute capability 7.5", "8.0 or newer")
    assert "Inference result" not in out


@pytest.mark.parametrize("script", [SAMPLE_PATH, FUSED_PATH, AOT_PATH],
                         ids=["lesson", "fused", "aot"])
def test_without_tensorrt_the_scripts_name_its_pip_package(script):
    """Past the GPU check, a missing TensorRT is one sentence naming the pip package to install
    (hidden, so that this holds where TensorRT is installed too)."""
    prelude = fake_gpu(9, 0) + "import sys; sys.modules['tensorrt'] = None\n"
    code, _, err = run_script(prelude=prelude, script=script)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "package tensorrt-cu12 (tensorrt-cu13 for CUDA 13) is not installed",
                        "pip install -r requirements.txt")


# (flags, the sentence's words): refused alike by both files.
BAD_FLAGS = [
    (["--num-tokens", "600"], "--num-tokens 600 is outside the profile [1, 512]"),
    (["--num-tokens", "0"], f"--num-tokens must be in [1, {INT32_MAX}], got 0"),
    (["--min-tokens", "200", "--opt-tokens", "100"], "--min-tokens <= --opt-tokens"),
    (["--opt-tokens", "600"], "--opt-tokens <= --max-tokens"),
    (["--min-tokens", "0"], f"--min-tokens must be in [1, {INT32_MAX}], got 0"),
    (["--max-tokens", str(INT32_MAX + 1)],
     f"--max-tokens must be in [1, {INT32_MAX}], got {INT32_MAX + 1}"),
    (["--seed", "-1"], "--seed must be in [0, "),
    (["--epsilon", "0"], "--epsilon"),
    (["--epsilon", "-1e-5"], "--epsilon"),
    (["--epsilon", "nan"], "--epsilon"),
    (["--epsilon", "inf"], "--epsilon"),
    (["--epsilon", "1e-50"], "--epsilon"),  # > 0 as a double, 0 in float32
    (["--epsilon", "1e39"], "--epsilon"),   # finite as a double, beyond float32
    (["--hidden-dim", "0"], "--hidden-dim must be in [1, 32768], got 0"),
    (["--hidden-dim", "40000"], "--hidden-dim must be in [1, 32768], got 40000"),
    (["--dtype", "float64"], "--dtype"),
    (["--weight-dtype", "float64"], "--weight-dtype"),
    (["--num-tokens", "many"], "--num-tokens"),
    # flags the sample had before its restructuring: their lessons are the companions' now
    (["--engine", "rms.engine"], "unrecognized arguments: --engine"),
    (["--compare-builtin"], "unrecognized arguments: --compare-builtin"),
]
# The fused forms and the ONNX parser are the companion's: the lesson does not know their flags.
LESSON_ONLY = [
    (["--residual"], "unrecognized arguments: --residual"),
    (["--y-scale", "0.05"], "unrecognized arguments: --y-scale 0.05"),
    (["--from-onnx"], "unrecognized arguments: --from-onnx"),
]
FUSED_ONLY = [
    (["--from-onnx", "model.onnx"], "unrecognized arguments: model.onnx"),  # a switch: no path
    (["--from-onnx", ""], "unrecognized arguments: "),  # an unset shell variable: refused
    (["--y-scale", "0"], "--y-scale must be finite and >= 2^-126"),
    (["--y-scale", "big"], "--y-scale"),
]


@pytest.mark.parametrize("module, argv, needle",
                         [(sample, *case) for case in BAD_FLAGS + LESSON_ONLY]
                         + [(fused, *case) for case in BAD_FLAGS + FUSED_ONLY],
                         ids=lambda value: getattr(value, "__name__", None))
def test_bad_flags_get_one_sentence_and_exit_2(capsys, module, argv, needle):
    assert needle in refusal(module, capsys, *argv)


@pytest.mark.parametrize("script, args, needle", [
    (SAMPLE_PATH, ["--num-tokens", "600"], "--num-tokens 600 is outside the profile [1, 512]"),
    (FUSED_PATH, ["--residual", "--y-scale", "nan"], "--y-scale must be finite"),
], ids=["lesson", "fused"])
def test_the_scripts_check_their_flags_before_the_gpu_check(script, args, needle):
    """Without these flags the same run stops at the GPU check (the first test above); with them it
    must stop at the flag, before that check and before the run's header. Each script's own
    checks (a value past its parser's), once: every flag's refusal is the in-process test's."""
    code, out, err = run_script(*args, script=script)
    assert code == EXIT_USAGE
    assert_one_sentence(err, needle)
    assert "no CUDA GPU" not in err and "RMSNorm " not in out


@BOTH_FILES
def test_a_hidden_size_the_rule_refuses_is_one_sentence_and_exit_2(module, capsys, monkeypatch):
    """The lesson's rule fits every row of one input in registers; a copy that holds a second row
    input (a gated norm's z: ROW_INPUTS = 2, as the lesson's comment says) cannot fit 32768 fp32
    values (8 vectors of 4 of each row input a thread, 26 + 64 + 4 = 94 registers even with W a
    vector at a time, over the 64 a 1024-thread CTA leaves): the rule refuses it, and the flag
    check says so before anything runs. 16384 fp32 values (4 vectors each, 26 + 32 + 16 = 74, under
    the 128 of a 512-thread CTA) still fit."""
    monkeypatch.setattr(sample, "ROW_INPUTS", 2)  # the copy's one change
    line = refusal(module, capsys, "--hidden-dim", "32768", "--dtype", "float32")
    assert line.startswith("error: --hidden-dim 32768 is refused: rows of 32768 elements of 32 "
                           "bits need 94 registers a thread"), line
    assert line.endswith("(see --help)")
    assert flags(module, "--hidden-dim", "16384", "--dtype", "float32")


@pytest.mark.parametrize("args,needle", BAD_FLAGS[:2] + [
    (["--from-onnx"],
     "--from-onnx builds the Python plugin's engine; this flavor builds its own AOT op")])
def test_the_aot_script_checks_the_same_flags(capsys, args, needle):
    """In-process: its main() exits at the flag, before its run starts."""
    import rms_norm_aot_cutedsl as aot

    with pytest.raises(SystemExit) as info:
        aot.main(args)
    assert info.value.code == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, needle)


# -- --plans: which kernel runs where ------------------------------------------------------------


@pytest.mark.parametrize("argv, plan", [
    # 8192 fp16: 16-byte vectors of 8, 1024 of them; 2 a thread (VECS_PER_THREAD) is 512 threads,
    # one row a CTA; 26 + 2 x 4 + 2 x 8 = 50 registers, under the 128 a 512-thread CTA leaves.
    (["--hidden-dim", "8192"], "float16 hidden 8192, every GPU and token count:\n"
     "  512 threads/row x 2 vectors of 8 x 16-bit, 1 row/CTA, X in registers, W first"),
    # 64 fp16: 8 vectors, 4 threads a row, rows side by side up to 128 threads (MIN_CTA_THREADS).
    (["--hidden-dim", "64"], "float16 hidden 64, every GPU and token count:\n"
     "  4 threads/row x 2 vectors of 8 x 16-bit, 32 rows/CTA, X in registers, W first"),
    # 32768 fp32: 8192 vectors of 4, 1024 threads (a CTA's most) of 8 each; X and W held need
    # 26 + 32 + 32 = 90 registers, over the 64 a 1024-thread CTA leaves: W a vector at a time, 62.
    (["--hidden-dim", "32768", "--dtype", "float32"], "float32 hidden 32768, every GPU and token "
     "count:\n  1024 threads/row x 8 vectors of 4 x 32-bit, 1 row/CTA, X in registers, "
     "W a vector at a time at the store"),
])
def test_the_lessons_plans_is_its_one_plan_for_every_gpu_and_count(capsys, argv, plan):
    assert sample.main(flags(sample, "--plans", *argv)) == 0
    assert capsys.readouterr().out == plan + "\n"


def test_the_lessons_script_prints_its_plan_without_a_gpu(capsys):
    code, out, err = run_script("--plans", "--hidden-dim", "8192")
    assert code == 0, err
    assert sample.main(flags(sample, "--plans", "--hidden-dim", "8192")) == 0
    assert out == capsys.readouterr().out


def plans_sections(stdout):
    """{section header: [(first, last or None, description), ...]} of a --plans listing."""
    sections, current = {}, None
    for line in stdout.splitlines():
        if not line.startswith("  "):
            current = sections.setdefault(line, [])
            continue
        spans, _, description = line.strip().partition(" tokens: ")
        for span in spans.split(", "):
            # "1-32", or "1025+": unbounded
            first, last = re.fullmatch(r"(\d+)(?:-(\d+)|\+)", span).groups()
            current.append((int(first), int(last) if last else None, description))
    return sections


@pytest.mark.parametrize("dtype, hidden", [("float16", 8192), ("float32", 1000),
                                           ("bfloat16", 32768)])
def test_the_companions_plans_lists_every_token_count_once_for_both_gpu_families(capsys, dtype,
                                                                                 hidden):
    assert fused.main(flags(fused, "--plans", "--dtype", dtype, "--hidden-dim", str(hidden))) == 0
    sections = plans_sections(capsys.readouterr().out)
    newer = f"{dtype} hidden {hidden}, sm_90 and newer:"
    older = f"{dtype} hidden {hidden}, sm_80 to sm_89:"
    assert list(sections) == [newer, older]
    bits = {"float16": 16, "bfloat16": 16, "float32": 32}[dtype]
    for header, spans in sections.items():
        spans.sort(key=lambda span: span[0])
        assert spans[0][0] == 1 and spans[-1][1] is None, (header, spans)  # 1 token, unbounded
        for (_, last, _), (first, _, _) in zip(spans, spans[1:]):
            assert first == last + 1, (header, spans)                       # no gap, no overlap
        pattern = rf"\d+ threads/row x \d+ vectors of \d+ x {bits}-bit, "
        assert all(re.match(pattern, d) for _, _, d in spans), spans
    assert not any("cluster" in d or "bulk" in d for _, _, d in sections[older])


def test_the_companions_script_plans_the_residual_form_with_residual():
    code, out, err = run_script("--plans", "--residual", "--hidden-dim", "16384", script=FUSED_PATH)
    assert code == 0, err
    assert "X and R in registers" in out
    assert "staged" not in out.split("sm_80")[0], "32 KB rows of X and R run no mid plan on sm_90"


def test_the_aot_script_plans_is_its_one_kernel_for_every_count():
    """Hand-derived from ROW_PLANS: a 16 KB row (8192 fp16) takes 4 vectors of 8 per thread, so
    1024 vectors need 256 threads, one row per CTA, X in registers; the AOT kernel is that plan
    without a cluster. As a script, without a GPU."""
    code, out, err = run_script("--plans", "--hidden-dim", "8192", script=AOT_PATH)
    assert code == 0, err
    assert out.splitlines() == ["every token count: 256 threads/row x 4 vectors of 8 x 16-bit, "
                                "1 row/CTA, X in registers, W first"]


@pytest.mark.parametrize("hidden, plain, residual", [
    (8192, "X in registers, W first", "X and R in registers, W first"),
    (12288, "X staged by cp.async, W late", "X and R in registers, W late")])
def test_the_aot_script_plans_the_residual_form_with_residual(capsys, hidden, plain, residual):
    """--residual was once ignored here: the plain plan printed, the plain op built. Hand-derived
    from ROW_PLANS: 8192 fp16 as above, X and R now both in registers (32 + 32 of W + 26
    registers, far under the ceiling). 12288 fp16 (24 KB rows) takes 8 vectors a thread, 192
    threads, W late, X staged; staging R too would need 48 KB and 24 bytes, more than TensorRT's
    AOT launch gets, so both rows stay in registers."""
    threads, vectors = {8192: (256, 4), 12288: (192, 8)}[hidden]
    prefix = (f"every token count: {threads} threads/row x {vectors} vectors of 8 x 16-bit, "
              "1 row/CTA, ")
    import rms_norm_aot_cutedsl as aot

    for argv, where in (([], plain), (["--residual"], residual)):
        assert aot.main(["--plans", "--hidden-dim", str(hidden), *argv]) == 0
        assert capsys.readouterr().out.splitlines() == [prefix + where]


@pytest.mark.parametrize("argv, shapes", [([], "X:64x4096"),
                                          (["--residual"], "X:64x4096,R:64x4096")])
def test_the_aot_scripts_trtexec_line_names_the_shape_of_every_row_input(argv, shapes):
    """trtexec refuses to run an engine with a dynamic input whose shape it is not given: the fused
    op's R too."""
    import rms_norm_aot_cutedsl as aot

    parser = fused.make_parser("test")
    parser.add_argument("--engine")  # as the AOT script's own parser
    args = fused.validate_args(parser, parser.parse_args(
        ["--num-tokens", "64", "--hidden-dim", "4096", "--engine", "a.engine", *argv]))
    assert aot.trtexec_command(args) == f"trtexec --loadEngine=a.engine --shapes={shapes}"


# -- a missing package, --help ---------------------------------------------------------------------
# The lesson names each package's pip name; each companion imports the lesson first and passes its
# sentence on: shown with the lesson's first import and its last.
MISSING = [("numpy", "numpy"), ("cuda", "cuda-python"), ("cupy", "cupy-cuda12x"),
           ("torch", "torch"), ("cutlass", "nvidia-cutlass-dsl")]
COMPANIONS = {"fused": FUSED_PATH, "aot": AOT_PATH, "saved_engine": SAVED_PATH}


@pytest.mark.parametrize("script, package, pip_name",
                         [(SAMPLE_PATH, *missing) for missing in MISSING]
                         + [(path, *MISSING[i]) for path in COMPANIONS.values() for i in (0, -1)],
                         ids=[f"lesson-{p}" for p, _ in MISSING]
                         + [f"{name}-{MISSING[i][0]}" for name in COMPANIONS for i in (0, -1)])
def test_missing_package_names_its_pip_package_and_exits_2(script, package, pip_name):
    code, _, err = run_script(prelude=f"import sys; sys.modules[{package!r}] = None", script=script)
    assert code == EXIT_USAGE
    assert_one_sentence(err, f"package {pip_name} ", "pip install -r requirements.txt")


def test_an_environment_without_site_packages_names_numpy_first():
    """python -S: only the standard library, as in a fresh virtual environment."""
    code, _, err = run_script(python_flags=["-S"])
    assert code == EXIT_USAGE
    assert_one_sentence(err, "package numpy ")


EXIT_CODES = "0 every run matched NumPy, 1 a run did not, 2 usage or environment error"


def test_help_documents_the_exit_codes():
    code, out, _ = run_script("--help")
    assert code == 0
    assert EXIT_CODES in " ".join(out.split())


def test_the_companions_help_documents_the_exit_codes_and_its_forms_flags():
    text = " ".join(fused.make_parser("test").format_help().split())
    assert EXIT_CODES in text
    assert {"--residual", "--y-scale", "--from-onnx"} <= set(re.findall(r"--[a-z-]+", text))


def test_from_onnx_without_onnx_installed_says_what_to_install(fused_standin, monkeypatch):
    """The companion bound to the labelled stand-in (TensorRT is absent here): its creator registers
    there, and the missing onnx package is one UsageError."""
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(fused_standin.lesson.UsageError, match="pip install onnx"):
        fused_standin.onnx_network(1024, "float16", 1e-5, "float32")


# -- run(): which counts, with which check ---------------------------------------------------------


@pytest.mark.parametrize(
    "num, lo, opt, hi, expected",
    [
        (128, 1, 128, 512, [128, 1, 512, 37]),   # README: "runs 128/1/512/37 tokens"
        (511, 3, 37, 511, [511, 3, 37]),         # 37 is in the profile; 511 is main run and max
        (150, 100, 150, 200, [150, 100, 200, 199]),  # 37 is outside: one below the max instead
        (64, 64, 64, 64, [64]),                  # a one-shape profile has no other count to run
    ],
)
def test_run_checks_the_main_run_the_profile_edges_and_an_odd_count(monkeypatch, capsys, num, lo,
                                                                    opt, hi, expected):
    args = flags(sample, "--num-tokens", str(num), "--min-tokens", str(lo), "--opt-tokens",
                 str(opt), "--max-tokens", str(hi))
    ran = []
    engine = object()  # double: an engine (TensorRT cannot build one here)
    monkeypatch.setattr(sample, "check_environment", lambda: None)  # double: there is no GPU here

    def check(made, token_counts, checked_args):  # double: records what run hands to the check
        assert made is engine and checked_args is args
        ran.append(list(token_counts))
        return True

    assert sample.run(args, lambda a: engine, check) == 0
    assert ran == [expected]
    assert capsys.readouterr().out.splitlines()[-1] == "Inference result correct!"


@BOTH_FILES
def test_validate_args_returns_the_flags_it_accepts(module):
    parser = module.make_parser("test")
    args = parser.parse_args(["--hidden-dim", "32768", "--seed", str(2**64 - 1),
                              "--epsilon", "1e-6"])
    assert module.validate_args(parser, args) is args
    assert isinstance(args, argparse.Namespace) and args.plans is False
    forms = {key: getattr(args, key, "absent") for key in ("from_onnx", "residual", "y_scale")}
    if module is sample:
        assert forms == {"from_onnx": "absent", "residual": "absent", "y_scale": "absent"}
    else:
        assert forms == {"from_onnx": False, "residual": False, "y_scale": None}


class EngineDouble:
    """Test double of TensorRT's ICudaEngine, the one call execute() makes of it
    (get_tensor_mode(name) -> TensorIOMode, NVIDIA/TensorRT python/src/infer/pyCore.cpp)."""

    def __init__(self, trt, inputs):
        self.trt, self.inputs = trt, inputs

    def get_tensor_mode(self, name):
        modes = self.trt.TensorIOMode
        return modes.INPUT if name in self.inputs else modes.OUTPUT


class ContextDouble:
    """Test double of TensorRT's IExecutionContext, the calls run_and_check makes (TensorRT's Python
    API: set_input_shape, set_tensor_address, execute_async_v3 return True on success; .engine is
    the engine it runs); it writes nothing to the outputs. It records which tensors are bound and
    which input shapes set."""

    def __init__(self, trt, inputs=("X", "R", "W")):
        self.engine = EngineDouble(trt, inputs)
        self.bound, self.shapes = [], {}

    def set_input_shape(self, name, shape):
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name, address):
        self.bound.append(name)
        return True

    def execute_async_v3(self, stream):
        return True


@pytest.fixture
def cpu_tensors(monkeypatch):
    """Doubles for the GPU run_and_check needs (there is none here): torch.Tensor.cuda keeps the
    CPU tensor, and the stream and synchronize do nothing."""
    import torch

    monkeypatch.setattr(torch.Tensor, "cuda", lambda self: self)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream",
                        lambda: argparse.Namespace(cuda_stream=0, synchronize=lambda: None))


def test_every_seed_a_run_uses_is_one_torch_takes(sample_rtx, cpu_tensors):
    """run_and_check draws each count's inputs from the --seed the flags accepted, up to 2**64 - 1,
    on CPU tensors here; the unwritten Y fails the check. The lesson is bound to TensorRT-RTX for
    its TensorIOMode."""
    import tensorrt_rtx

    args = flags(sample_rtx, "--seed", str(2**64 - 1))
    context = ContextDouble(tensorrt_rtx)
    engine = argparse.Namespace(create_execution_context=lambda: context)
    counts = [128, 1, 512, 37]
    assert sample_rtx.run_and_check(engine, counts, 8, "float16", 1e-5, args.seed) is False
    assert context.shapes == {"X": (37, 8)} and sorted(set(context.bound)) == ["W", "X", "Y"]


# Each integer flag's limits, written from what bounds them (not read from the sample's INT_FLAGS):
# the kernel's widest row, the Int32 the kernel counts rows in, torch's 64-bit generator seed.
# (flag, lowest, highest, others) where `others` keeps the rest of the flags consistent with the
# value tried.
LIMITS = [
    ("--hidden-dim", 1, 32768, []),
    ("--num-tokens", 1, INT32_MAX, ["--max-tokens", str(INT32_MAX)]),
    ("--min-tokens", 1, INT32_MAX, ["--opt-tokens", str(INT32_MAX), "--max-tokens", str(INT32_MAX),
                                    "--num-tokens", str(INT32_MAX)]),
    ("--opt-tokens", 1, INT32_MAX, ["--max-tokens", str(INT32_MAX)]),
    ("--max-tokens", 1, INT32_MAX, ["--opt-tokens", "1", "--num-tokens", "1"]),
    ("--seed", 0, 2**64 - 1, []),
]


@BOTH_FILES
@pytest.mark.parametrize("flag, lowest, highest, others", LIMITS,
                         ids=[limit[0] for limit in LIMITS])
def test_every_integer_flag_takes_its_limits_and_refuses_one_past_each(module, flag, lowest,
                                                                       highest, others):
    def outcome(value):
        try:
            flags(module, *others, flag, str(value))
        except SystemExit as exc:
            return exc.code
        return "accepted"

    assert outcome(lowest) == "accepted" and outcome(highest) == "accepted"
    assert outcome(lowest - 1) == EXIT_USAGE and outcome(highest + 1) == EXIT_USAGE


@pytest.mark.parametrize("epsilon, accepted", [
    ("1.4e-45", True),    # float32's smallest subnormal, 2**-149: positive in float32
    ("7e-46", False),     # rounds to 0 in float32
    ("3.4e38", True),     # under float32's largest, 3.4028235e38
    ("3.5e38", False),    # overflows float32 to inf
    ("0", False), ("-1e-5", False), ("nan", False), ("inf", False),
])
def test_epsilon_limits_are_float32s(epsilon, accepted):
    parser = sample.make_parser("test")
    args = parser.parse_args([f"--epsilon={epsilon}"])  # "-1e-5" after a space would read as a flag
    if accepted:
        assert sample.validate_args(parser, args) is args
    else:
        with pytest.raises(SystemExit) as info:
            sample.validate_args(parser, args)
        assert info.value.code == EXIT_USAGE


@pytest.mark.parametrize("y_scale, accepted", [
    ("1.1754944e-38", True),  # 2**-126, float32's smallest normal: 1 / y_scale is finite
    ("1e-39", False),         # a float32 subnormal
    ("3.4e38", True), ("3.5e38", False),
    ("0", False), ("-0.5", False), ("nan", False), ("inf", False),
])
def test_y_scale_limits_are_float32_normals_and_a_refusal_is_one_sentence(y_scale, accepted,
                                                                          capsys):
    parser = fused.make_parser("test")
    args = parser.parse_args([f"--y-scale={y_scale}"])
    if accepted:
        assert fused.validate_args(parser, args) is args
        return
    with pytest.raises(SystemExit) as info:
        fused.validate_args(parser, args)
    assert info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: --y-scale must be finite and >= 2^-126") and err.count("\n") == 1


def test_a_residual_run_binds_r_and_s_and_gives_r_the_shape_of_x(fused_rtx, cpu_tensors):
    import tensorrt_rtx

    context = ContextDouble(tensorrt_rtx)
    engine = argparse.Namespace(create_execution_context=lambda: context)
    ok = fused_rtx.run_and_check(engine, [37], 8, "float16", 1e-5, 0, residual=True)
    assert ok is False  # S and Y unwritten
    assert sorted(context.bound) == ["R", "S", "W", "X", "Y"]
    assert context.shapes == {"X": (37, 8), "R": (37, 8)}
