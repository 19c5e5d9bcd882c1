"""CPU: a step TensorRT refuses ends in exit 2 and one sentence naming the step, never a traceback.

TensorRT cannot run here, so the lesson's and the fused companion's main() and build_engine() get
doubles for the steps that need it (labelled below). They fail exactly as Polygraphy does when
TensorRT returns None: polygraphy.logger.G_LOGGER.critical(...) prints its line and raises
PolygraphyException (polygraphy/backend/trt/loader.py EngineBytesFromNetwork "Invalid Engine. ...";
runner.py TrtRunner.activate_impl "Invalid Context. ..."). The real Polygraphy does the raising.
"""

import sys
import types

import pytest

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as sample

G_LOGGER = pytest.importorskip("polygraphy.logger", reason="Polygraphy is not installed").G_LOGGER
BOTH_FILES = pytest.mark.parametrize("module", [sample, fused], ids=["lesson", "fused"])


def test_a_failure_inside_a_stage_becomes_one_sentence_naming_it():
    with pytest.raises(sample.TensorRTError) as info:
        with sample.tensorrt_stage("engine build"):
            G_LOGGER.critical("Invalid Engine. Please ensure the engine\nwas built correctly")
    message = str(info.value)
    assert message.startswith("TensorRT failed at the engine build stage (PolygraphyException: "
                              "Invalid Engine.")
    assert "'[E]' line in the log above" in message
    assert "\n" not in message


def test_a_usage_error_inside_a_stage_stays_itself():
    with pytest.raises(sample.UsageError, match="onnx"):
        with sample.tensorrt_stage("ONNX parse"):
            raise sample.UsageError("--from-onnx needs the onnx package")


def flags(module, *argv):
    parser = module.make_parser("test")
    return module.validate_args(parser, parser.parse_args(list(argv)))


@pytest.fixture
def no_gpu_check(monkeypatch):
    # double: there is no GPU here; the real check returns None on a usable one
    monkeypatch.setattr(sample, "check_environment", lambda: None)


def failing_build(*args):
    """Double of build_engine(args) and build_aot_engine (need TensorRT): fails at the engine
    build, as Polygraphy does."""
    with sample.tensorrt_stage("engine build"):
        G_LOGGER.critical("Invalid Engine. Please ensure the engine was built correctly")


@BOTH_FILES
def test_main_exits_2_when_the_build_fails(module, monkeypatch, capsys, no_gpu_check):
    monkeypatch.setattr(module, "build_engine", failing_build)
    assert module.main(flags(module)) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Inference result" not in out
    assert err.splitlines()[-1].startswith("error: TensorRT failed at the engine build stage")


@BOTH_FILES
def test_main_exits_2_when_the_execution_context_fails(module, monkeypatch, capsys, no_gpu_check):
    monkeypatch.setattr(module, "build_engine", lambda args: object())  # double: an engine

    def failing_run(*args):  # double of run_and_check: TrtRunner cannot create its context
        G_LOGGER.critical("Invalid Context. See error log for details.")

    monkeypatch.setattr(module, "run_and_check", failing_run)
    assert module.main(flags(module)) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Inference result" not in out
    assert err.splitlines()[-1].startswith("error: TensorRT failed at the execution context stage")


@BOTH_FILES
def test_a_mismatch_stays_exit_1(module, monkeypatch, capsys, no_gpu_check):
    monkeypatch.setattr(module, "build_engine", lambda args: object())  # double: an engine
    # double: a run that did not match
    monkeypatch.setattr(module, "run_and_check", lambda *args: False)
    assert module.main(flags(module)) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "Inference result incorrect!"


def test_a_usage_error_while_making_the_engine_is_one_sentence_and_exit_2(fused_standin,
                                                                          monkeypatch, capsys):
    """--from-onnx without the onnx package: the companion's real build_engine and onnx_network
    refuse before TensorRT is asked (bound to the labelled stand-in, whose registry takes its
    creator)."""
    lesson = fused_standin.lesson
    monkeypatch.setitem(sys.modules, "onnx", None)
    monkeypatch.setattr(lesson, "check_environment", lambda: None)  # double: no GPU here
    monkeypatch.setattr(lesson, "gpu_arch", lambda: "sm_90a")  # double: there is no GPU to ask
    assert fused_standin.main(flags(fused_standin, "--from-onnx")) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == ["error: --from-onnx needs the onnx package; install it with "
                                "`pip install onnx`"]
    assert "Inference result" not in out


def test_the_fp8_form_on_a_gpu_without_fp8_is_refused_before_the_network(monkeypatch, capsys,
                                                                         builders):
    """--y-scale on an sm_86 GPU: exit 2 and one sentence naming 8.9, before a network is made."""
    # Doubles: an A10 (compute capability 8.6) in place of this machine's missing GPU.
    monkeypatch.setattr(sample.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sample.torch.cuda, "get_device_capability", lambda *device: (8, 6))
    monkeypatch.setattr(sample.torch.cuda, "get_device_name", lambda *device: "NVIDIA A10")
    monkeypatch.setattr(sample, "require_tensorrt", lambda: None)  # double: TensorRT is not here
    assert fused.main(flags(fused, "--y-scale", "0.5")) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == ("error: the FP8 form (a y_scale) needs compute capability 8.9 or newer, "
                    "NVIDIA A10 has 8.6")
    assert builders == []


# -- build_engine: the flags to one network and one profile ---------------------------------------


class Network:
    """Double of a (builder, network) pair; build_engine only passes it on."""


class Plugin:
    """Double of the plugin plugin_network makes; the test checks it is alive during the build."""


@pytest.fixture
def builders(monkeypatch):
    """Doubles of the TensorRT steps both files' build_engine call, recording how they call them:
    each file's plugin_network (and the companion's onnx_network), the lesson's build_from_network
    and gpu_arch."""
    import weakref

    calls = []

    def plugin_network(*network_args):
        plugin = Plugin()
        calls.append(("plugin_network", network_args, weakref.ref(plugin)))
        return Network(), plugin

    def onnx_network(*network_args):
        calls.append(("onnx_network", network_args, None))
        return Network()

    def build_from_network(network, shapes):
        alive = [ref() is not None for name, _, ref in calls if ref is not None]
        calls.append(("build_from_network", (type(network), shapes), alive))
        return "engine"

    for module in (sample, fused):
        monkeypatch.setattr(module, "plugin_network", plugin_network)
    monkeypatch.setattr(fused, "onnx_network", onnx_network)
    monkeypatch.setattr(sample, "build_from_network", build_from_network)
    monkeypatch.setattr(sample, "gpu_arch", lambda: "sm_90a")
    return calls


PROFILE_FLAGS = ["--hidden-dim", "4096", "--dtype", "bfloat16", "--weight-dtype", "float16",
                 "--epsilon", "1e-3", "--min-tokens", "3", "--opt-tokens", "37", "--max-tokens",
                 "511", "--num-tokens", "100"]
PROFILE = ((3, 4096), (37, 4096), (511, 4096))


def test_the_lessons_build_engine_makes_its_network_with_the_flags_profile(builders, capsys):
    assert sample.build_engine(flags(sample, *PROFILE_FLAGS)) == "engine"
    (made, network_args, _), (built, (network_type, shapes), alive) = builders
    assert (made, built) == ("plugin_network", "build_from_network")
    assert network_args == (4096, "bfloat16", 1e-3, "float16")
    assert network_type is Network and shapes == {"X": PROFILE}
    assert alive == [True], "the plugin must be held until the build is done"
    # 4096 bf16: 512 vectors of 8, 2 a thread: 256 threads, a row a CTA; 26 + 8 + 16 registers.
    assert capsys.readouterr().out.splitlines() == [
        "every token count: 256 threads/row x 2 vectors of 8 x 16-bit, 1 row/CTA, X in registers, "
        "W first"]


@pytest.mark.parametrize("from_onnx", [False, True])
def test_the_companions_build_engine_makes_the_network_the_flags_ask_for(builders, capsys,
                                                                        from_onnx):
    argv = PROFILE_FLAGS + (["--from-onnx"] if from_onnx else [])
    assert fused.build_engine(flags(fused, *argv)) == "engine"
    (made, network_args, _), (built, (network_type, shapes), alive) = builders
    assert made == ("onnx_network" if from_onnx else "plugin_network")
    assert built == "build_from_network"
    assert network_args == (4096, "bfloat16", 1e-3, "float16", False, None)
    assert network_type is Network and shapes == {"X": PROFILE}
    if not from_onnx:
        assert alive == [True], "the plugin must be held until the build is done"


@pytest.mark.parametrize("from_onnx", [False, True])
def test_the_residual_flag_builds_the_fused_form_with_r_in_the_profile(builders, capsys,
                                                                      from_onnx):
    argv = ["--residual", "--min-tokens", "3", "--opt-tokens", "37", "--max-tokens", "511",
            "--num-tokens", "100"]
    fused.build_engine(flags(fused, *argv, *(["--from-onnx"] if from_onnx else [])))
    (_, network_args, _), (_, (_, shapes), _) = builders
    assert network_args[-2] is True
    assert shapes == {name: ((3, 1024), (37, 1024), (511, 1024)) for name in ("X", "R")}


@pytest.mark.parametrize("from_onnx", [False, True])
def test_the_y_scale_flag_builds_the_fp8_form_with_that_scale(builders, capsys, from_onnx):
    fused.build_engine(flags(fused, "--y-scale", "0.0375", *(["--from-onnx"] if from_onnx else [])))
    (_, network_args, _), _ = builders
    assert network_args[-1] == 0.0375


@pytest.mark.parametrize("arch, sm90", [("sm_90a", True), ("sm_86", False)])
def test_the_companions_build_engine_prints_the_schedule_for_the_gpus_family(builders,
                                                                            monkeypatch, capsys,
                                                                            arch, sm90):
    """What --plans lists for that family (at hidden 8192 the two differ: clusters and bulk copies
    need sm_90)."""
    monkeypatch.setattr(sample, "gpu_arch", lambda: arch)  # double: the GPU's compile target
    fused.build_engine(flags(fused, "--hidden-dim", "8192"))
    lines = {family: fused.schedule_lines(8192, 2, family) for family in (True, False)}
    assert lines[True] != lines[False]
    assert capsys.readouterr().out.splitlines() == lines[sm90]


def test_the_aot_main_exits_2_when_the_build_fails(monkeypatch, capsys, no_gpu_check):
    import rms_norm_aot_cutedsl as aot

    # Doubles: TensorRT cannot be imported here; the AOT main only asks for its
    # version and whether tensorrt.plugin has aot_impl before it builds.
    trt, trtp = types.ModuleType("tensorrt"), types.ModuleType("tensorrt.plugin")
    trt.__version__, trt.plugin, trtp.aot_impl = "11.4.0.106", trtp, object()
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "tensorrt.plugin", trtp)
    monkeypatch.setattr(aot, "build_aot_engine", failing_build)
    assert aot.main([]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("error: TensorRT failed at the engine build stage")


@pytest.mark.parametrize("engine", [False, True], ids=["build", "load"])
def test_the_aot_main_refuses_y_scale_on_a_gpu_without_fp8_before_tensorrt(monkeypatch, capsys,
                                                                           tmp_path, engine):
    """--y-scale on an sm_80 GPU: exit 2 and one sentence naming 8.9, before the AOT flavor asks
    TensorRT anything, whether the engine would be built or loaded."""
    import rms_norm_aot_cutedsl as aot

    def tensorrt_step(*args):  # double: any step past the check
        raise AssertionError("TensorRT was asked")

    # Doubles: an A100 (compute capability 8.0) in place of this machine's missing GPU.
    monkeypatch.setattr(sample.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sample.torch.cuda, "get_device_capability", lambda *device: (8, 0))
    monkeypatch.setattr(sample.torch.cuda, "get_device_name", lambda *device: "A100")
    monkeypatch.setattr(sample, "require_tensorrt", lambda: None)  # double: TensorRT is not here
    monkeypatch.setattr(aot, "check_aot_support", tensorrt_step)
    monkeypatch.setattr(aot, "build_aot_engine", tensorrt_step)
    argv = ["--y-scale", "0.5"] + (["--engine", str(tmp_path / "fp8.engine")] if engine else [])
    assert aot.main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: the FP8 form") and "8.9 or newer" in line
    assert line.endswith("A100 has 8.0")
