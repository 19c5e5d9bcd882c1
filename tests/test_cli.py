"""CPU: the scripts run as a user runs them, on a machine without a GPU or with bad flags.

Every user error must end in one sentence on stderr and the documented exit
code (2), never a traceback. The sample imports torch, CuteDSL and cupy first
and parses its flags after them (the flag-checking lesson comes after the
plugin in the file), so a flag error no longer comes before those imports; it
must still come before any GPU or TensorRT check: on this machine, which has
no GPU, a bad flag is reported as the flag's error, not as "no CUDA GPU".
"""

import argparse
import re
import subprocess
import sys

import pytest

from conftest import SAMPLE_PATH

EXIT_USAGE = 2
AOT_PATH = SAMPLE_PATH.parent / "rms_norm_aot_cutedsl.py"
SAVED_PATH = SAMPLE_PATH.parent / "rms_norm_saved_engine.py"
INT32_MAX = 2**31 - 1  # the kernel counts rows in an Int32


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


# What a script imported before it exited, printed by an atexit hook (runs after sys.exit). The sample imports
# these first now; rms_norm_onnx_model.py still checks its flags before them (tests/test_onnx_model.py).
HEAVY = ("torch", "cutlass", "cupy", "tensorrt", "numpy")
REPORT_HEAVY_IMPORTS = (
    "import atexit, sys\n"
    f"atexit.register(lambda: print('HEAVY', sorted({{m.partition('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))"
)


def heavy_imports(stdout):
    (line,) = [line for line in stdout.splitlines() if line.startswith("HEAVY ")]
    return line


def test_without_a_gpu_the_script_says_so_and_exits_2():
    code, out, err = run_script()
    assert code == EXIT_USAGE
    assert_one_sentence(err, "no CUDA GPU", "8.0")
    assert "Inference result" not in out


def test_without_a_gpu_the_aot_script_says_so_and_exits_2():
    code, _, err = run_script(script=AOT_PATH)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "no CUDA GPU")


# TEST DOUBLE for the GPU (there is none here): torch reports one of the given compute capability, so the
# environment check goes on past the GPU to what it checks next.
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


@pytest.mark.parametrize("script", [SAMPLE_PATH, AOT_PATH], ids=["plugin", "aot"])
def test_without_tensorrt_the_scripts_name_its_pip_package(script):
    """Past the GPU check, a missing TensorRT is one sentence naming the pip package to install (hidden, so that
    this holds where TensorRT is installed too)."""
    code, _, err = run_script(prelude=fake_gpu(9, 0) + "import sys; sys.modules['tensorrt'] = None\n", script=script)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "package tensorrt-cu12 (tensorrt-cu13 for CUDA 13) is not installed",
                        "pip install -r requirements.txt")


BAD_FLAGS = [
    (["--num-tokens", "600"], "--num-tokens 600 is outside the profile [1, 512]"),
    (["--num-tokens", "0"], f"--num-tokens must be in [1, {INT32_MAX}], got 0"),
    (["--min-tokens", "200", "--opt-tokens", "100"], "--min-tokens <= --opt-tokens"),
    (["--opt-tokens", "600"], "--opt-tokens <= --max-tokens"),
    (["--min-tokens", "0"], f"--min-tokens must be in [1, {INT32_MAX}], got 0"),
    (["--max-tokens", str(INT32_MAX + 1)], f"--max-tokens must be in [1, {INT32_MAX}], got {INT32_MAX + 1}"),
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
    (["--from-onnx", "model.onnx"], "unrecognized arguments: model.onnx"),  # a plain switch: no model path
    (["--from-onnx", ""], "unrecognized arguments: "),                 # an unset shell variable: refused, not ignored
]


@pytest.mark.parametrize("args,needle", BAD_FLAGS)
def test_bad_flags_get_one_sentence_and_exit_2_before_the_gpu_check(args, needle):
    """Without these flags the same run stops at the GPU check (the first test above); with them it must stop at
    the flag, before that check and before the run's header."""
    code, out, err = run_script(*args)
    assert code == EXIT_USAGE
    assert_one_sentence(err, needle)
    assert "no CUDA GPU" not in err and "RMSNorm " not in out


@pytest.mark.parametrize("args,needle", BAD_FLAGS[:2] + [
    (["--from-onnx"], "--from-onnx builds the Python plugin's engine; this flavor builds its own AOT op")])
def test_the_aot_script_checks_the_same_flags(args, needle):
    code, out, err = run_script(*args, script=AOT_PATH)
    assert code == EXIT_USAGE
    assert_one_sentence(err, needle)
    assert "no CUDA GPU" not in err


def plans_sections(stdout):
    """{section header: [(first, last or None, description), ...]} of a --plans listing."""
    sections, current = {}, None
    for line in stdout.splitlines():
        if not line.startswith("  "):
            current = sections.setdefault(line, [])
            continue
        spans, _, description = line.strip().partition(" tokens: ")
        for span in spans.split(", "):
            first, last = re.fullmatch(r"(\d+)(?:-(\d+)|\+)", span).groups()  # "1-32", or "1025+": unbounded
            current.append((int(first), int(last) if last else None, description))
    return sections


@pytest.mark.parametrize("dtype, hidden", [("float16", 8192), ("float32", 1000), ("bfloat16", 32768)])
def test_plans_lists_every_token_count_once_for_both_gpu_families_without_a_gpu(dtype, hidden):
    code, out, err = run_script("--plans", "--dtype", dtype, "--hidden-dim", str(hidden))
    assert code == 0, err
    sections = plans_sections(out)
    assert list(sections) == [f"{dtype} hidden {hidden}, sm_90 and newer:", f"{dtype} hidden {hidden}, sm_80 to sm_89:"]
    bits = {"float16": 16, "bfloat16": 16, "float32": 32}[dtype]
    for header, spans in sections.items():
        spans.sort(key=lambda span: span[0])
        assert spans[0][0] == 1 and spans[-1][1] is None, (header, spans)  # from one token, unbounded
        for (_, last, _), (first, _, _) in zip(spans, spans[1:]):
            assert first == last + 1, (header, spans)                       # no gap, no overlap
        assert all(re.match(rf"\d+ threads/row x \d+ vectors of \d+ x {bits}-bit, ", d) for _, _, d in spans), spans
    assert not any("cluster" in d or "bulk" in d for _, _, d in sections[f"{dtype} hidden {hidden}, sm_80 to sm_89:"])


def test_the_aot_script_plans_is_its_one_kernel_for_every_count():
    """Hand-derived from ROW_PLANS: a 16 KB row (8192 fp16) takes 4 vectors of 8 per thread, so 1024 vectors need
    256 threads, one row per CTA, X in registers; the AOT kernel is that plan without a cluster."""
    code, out, err = run_script("--plans", "--hidden-dim", "8192", script=AOT_PATH)
    assert code == 0, err
    assert out.splitlines() == ["every token count: 256 threads/row x 4 vectors of 8 x 16-bit, 1 row/CTA, "
                                "X in registers, W first"]


@pytest.mark.parametrize("hidden, plain, residual", [
    (8192, "X in registers, W first", "X and R in registers, W first"),
    (12288, "X staged by cp.async, W late", "X and R in registers, W late")])
def test_the_aot_script_plans_the_residual_form_with_residual(hidden, plain, residual):
    """--residual was once ignored here: the plain plan printed, the plain op built. Hand-derived from ROW_PLANS:
    8192 fp16 as above, X and R now both in registers (32 + 32 of W + 26 registers, far under the ceiling).
    12288 fp16 (24 KB rows) takes 8 vectors a thread, 192 threads, W late, X staged; staging R too would need 48 KB
    and 24 bytes, more than TensorRT's AOT launch gets, so both rows stay in registers."""
    threads, vectors = {8192: (256, 4), 12288: (192, 8)}[hidden]
    prefix = f"every token count: {threads} threads/row x {vectors} vectors of 8 x 16-bit, 1 row/CTA, "
    for flags, where in (([], plain), (["--residual"], residual)):
        code, out, err = run_script("--plans", "--hidden-dim", str(hidden), *flags, script=AOT_PATH)
        assert code == 0, err
        assert out.splitlines() == [prefix + where]


@pytest.mark.parametrize("flags, shapes", [([], "X:64x4096"), (["--residual"], "X:64x4096,R:64x4096")])
def test_the_aot_scripts_trtexec_line_names_the_shape_of_every_row_input(flags, shapes):
    """trtexec refuses to run an engine with a dynamic input whose shape it is not given: the fused op's R too."""
    import rms_norm_aot_cutedsl as aot
    import rms_norm_plugin_cutedsl as sample

    parser = sample.make_parser("test")
    parser.add_argument("--engine")  # as the AOT script's own parser
    args = sample.validate_args(parser, parser.parse_args(["--num-tokens", "64", "--hidden-dim", "4096",
                                                           "--engine", "a.engine", *flags]))
    assert aot.trtexec_command(args) == f"trtexec --loadEngine=a.engine --shapes={shapes}"


@pytest.mark.parametrize("package,pip_name", [
    ("numpy", "numpy"), ("cuda", "cuda-python"), ("cupy", "cupy-cuda12x"), ("torch", "torch"),
    ("cutlass", "nvidia-cutlass-dsl"),
])
@pytest.mark.parametrize("script", [SAMPLE_PATH, AOT_PATH, SAVED_PATH], ids=["plugin", "aot", "saved_engine"])
def test_missing_package_names_its_pip_package_and_exits_2(package, pip_name, script):
    code, _, err = run_script(prelude=f"import sys; sys.modules[{package!r}] = None", script=script)
    assert code == EXIT_USAGE
    assert_one_sentence(err, f"package {pip_name} ", "pip install -r requirements.txt")


def test_an_environment_without_site_packages_names_numpy_first():
    """python -S: only the standard library, as in a fresh virtual environment."""
    code, _, err = run_script(python_flags=["-S"])
    assert code == EXIT_USAGE
    assert_one_sentence(err, "package numpy ")


def test_help_documents_the_exit_codes():
    code, out, _ = run_script("--help")
    assert code == 0
    assert "0 every run matched NumPy, 1 a run did not, 2 usage or environment error" in " ".join(out.split())


def test_from_onnx_without_onnx_installed_says_what_to_install(monkeypatch):
    import sys as _sys

    import rms_norm_plugin_cutedsl as sample

    monkeypatch.setitem(_sys.modules, "onnx", None)
    with pytest.raises(sample.UsageError, match="pip install onnx"):
        sample.onnx_network(1024, "float16", 1e-5, "float32")


@pytest.mark.parametrize(
    "num, lo, opt, hi, expected",
    [
        (128, 1, 128, 512, [128, 1, 512, 37]),   # README: "runs 128/1/512/37 tokens"
        (511, 3, 37, 511, [511, 3, 37]),         # 37 is in the profile; 511 is both main run and max
        (150, 100, 150, 200, [150, 100, 200, 199]),  # 37 is outside: one below the max instead
        (64, 64, 64, 64, [64]),                  # a one-shape profile has no other count to run
    ],
)
def test_run_checks_the_main_run_the_profile_edges_and_an_odd_count(monkeypatch, capsys, num, lo, opt, hi, expected):
    import rms_norm_plugin_cutedsl as sample

    parser = sample.make_parser("test")
    args = sample.validate_args(parser, parser.parse_args(
        ["--num-tokens", str(num), "--min-tokens", str(lo), "--opt-tokens", str(opt), "--max-tokens", str(hi)]))
    ran = []
    engine = object()  # double: an engine (TensorRT cannot build one here)
    monkeypatch.setattr(sample, "check_environment", lambda: None)  # double: there is no GPU here

    def run_and_check(made, token_counts, *rest):  # double: records what run hands to the real check
        assert made is engine
        ran.append(list(token_counts))
        return True

    monkeypatch.setattr(sample, "run_and_check", run_and_check)
    assert sample.run(args, lambda a: engine) == 0
    assert ran == [expected]
    assert capsys.readouterr().out.splitlines()[-1] == "Inference result correct!"


def test_validate_args_returns_the_flags_it_accepts():
    import rms_norm_plugin_cutedsl as sample

    parser = sample.make_parser("test")
    args = parser.parse_args(["--hidden-dim", "32768", "--seed", str(2**64 - 1), "--epsilon", "1e-6"])
    assert sample.validate_args(parser, args) is args
    assert isinstance(args, argparse.Namespace) and args.from_onnx is False and args.plans is False


class ContextDouble:
    """Test double of TensorRT's IExecutionContext, the four calls run_and_check makes (TensorRT's Python API:
    set_input_shape, set_tensor_address, execute_async_v3 return True on success); it writes nothing to Y."""

    def set_input_shape(self, name, shape):
        return True

    def set_tensor_address(self, name, address):
        return True

    def execute_async_v3(self, stream):
        return True


def test_every_seed_a_run_uses_is_one_torch_takes(monkeypatch):
    """run_and_check draws each count's inputs from the --seed the flags accepted, up to 2**64 - 1, on CPU tensors
    here (no GPU): torch.Tensor.cuda and the stream are replaced; the unwritten Y fails the check."""
    import torch

    import rms_norm_plugin_cutedsl as sample

    parser = sample.make_parser("test")
    args = sample.validate_args(parser, parser.parse_args(["--seed", str(2**64 - 1)]))
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self: self)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: argparse.Namespace(cuda_stream=0, synchronize=lambda: None))
    engine = argparse.Namespace(create_execution_context=ContextDouble)
    assert sample.run_and_check(engine, [128, 1, 512, 37], 8, "float16", 1e-5, args.seed) is False


# Each integer flag's limits, written from what bounds them (not read from the sample's INT_FLAGS): the kernel's
# widest row, the Int32 the kernel counts rows in, torch's 64-bit generator seed. (flag, lowest, highest, others)
# where `others` keeps the rest of the flags consistent with the value tried.
LIMITS = [
    ("--hidden-dim", 1, 32768, []),
    ("--num-tokens", 1, INT32_MAX, ["--max-tokens", str(INT32_MAX)]),
    ("--min-tokens", 1, INT32_MAX, ["--opt-tokens", str(INT32_MAX), "--max-tokens", str(INT32_MAX),
                                    "--num-tokens", str(INT32_MAX)]),
    ("--opt-tokens", 1, INT32_MAX, ["--max-tokens", str(INT32_MAX)]),
    ("--max-tokens", 1, INT32_MAX, ["--opt-tokens", "1", "--num-tokens", "1"]),
    ("--seed", 0, 2**64 - 1, []),
]


@pytest.mark.parametrize("flag, lowest, highest, others", LIMITS, ids=[limit[0] for limit in LIMITS])
def test_every_integer_flag_takes_its_limits_and_refuses_one_past_each(flag, lowest, highest, others):
    import rms_norm_plugin_cutedsl as sample

    def outcome(value):
        parser = sample.make_parser("test")
        args = parser.parse_args([*others, flag, str(value)])
        try:
            sample.validate_args(parser, args)
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
    import rms_norm_plugin_cutedsl as sample

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
def test_y_scale_limits_are_float32_normals_and_a_refusal_is_one_sentence(y_scale, accepted, capsys):
    import rms_norm_plugin_cutedsl as sample

    parser = sample.make_parser("test")
    args = parser.parse_args([f"--y-scale={y_scale}"])
    if accepted:
        assert sample.validate_args(parser, args) is args
        return
    with pytest.raises(SystemExit) as info:
        sample.validate_args(parser, args)
    assert info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: --y-scale must be finite and >= 2^-126") and err.count("\n") == 1


class RecordingContext(ContextDouble):
    """ContextDouble that records which tensors run_and_check binds and which input shapes it sets."""

    def __init__(self):
        self.bound, self.shapes = [], {}

    def set_input_shape(self, name, shape):
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name, address):
        self.bound.append(name)
        return True


def test_a_residual_run_binds_r_and_s_and_gives_r_the_shape_of_x(monkeypatch):
    import torch

    import rms_norm_plugin_cutedsl as sample

    monkeypatch.setattr(torch.Tensor, "cuda", lambda self: self)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: argparse.Namespace(cuda_stream=0, synchronize=lambda: None))
    context = RecordingContext()
    engine = argparse.Namespace(create_execution_context=lambda: context)
    assert sample.run_and_check(engine, [37], 8, "float16", 1e-5, 0, residual=True) is False  # S, Y unwritten
    assert sorted(context.bound) == ["R", "S", "W", "X", "Y"]
    assert context.shapes == {"X": (37, 8), "R": (37, 8)}


def test_plans_with_residual_print_the_residual_forms_plans():
    out = subprocess.run([sys.executable, str(SAMPLE_PATH), "--plans", "--residual", "--hidden-dim", "16384"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "X and R in registers" in out.stdout
    assert "staged" not in out.stdout.split("sm_80")[0], "32 KB rows of X and R run no mid plan on sm_90"
