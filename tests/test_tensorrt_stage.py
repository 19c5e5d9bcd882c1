"""CPU: a step TensorRT refuses ends in exit 2 and one sentence naming the step, never a traceback.

TensorRT cannot run here, so main() gets doubles for the steps that need it
(labelled below). They fail exactly as Polygraphy does when TensorRT returns
None: polygraphy.logger.G_LOGGER.critical(...) prints its line and raises
PolygraphyException (polygraphy/backend/trt/loader.py EngineBytesFromNetwork
"Invalid Engine. ..."; runner.py TrtRunner.activate_impl "Invalid Context. ...").
The real Polygraphy does the raising.
"""

import sys
import types

import pytest

import rms_norm_plugin_cutedsl as sample

G_LOGGER = pytest.importorskip("polygraphy.logger", reason="Polygraphy is not installed").G_LOGGER


def test_a_failure_inside_a_stage_becomes_one_sentence_naming_it():
    with pytest.raises(sample.TensorRTError) as info:
        with sample.tensorrt_stage("engine build"):
            G_LOGGER.critical("Invalid Engine. Please ensure the engine\nwas built correctly")
    message = str(info.value)
    assert message.startswith("TensorRT failed at the engine build stage (PolygraphyException: Invalid Engine.")
    assert "'[E]' line in the log above" in message
    assert "\n" not in message


def test_a_usage_error_inside_a_stage_stays_itself():
    with pytest.raises(sample.UsageError, match="onnx"):
        with sample.tensorrt_stage("ONNX parse"):
            raise sample.UsageError("--from-onnx needs the onnx package")


@pytest.fixture
def no_gpu_check(monkeypatch):
    # double: there is no GPU here; returns what the real check returns on an H200
    monkeypatch.setattr(sample, "check_environment", lambda: "sm_90a")


def failing_build(*args, source="plugin", w_dtype="float32"):
    """Double of build_engine (needs TensorRT): fails at the engine build, as Polygraphy does."""
    with sample.tensorrt_stage("engine build"):
        G_LOGGER.critical("Invalid Engine. Please ensure the engine was built correctly")


def test_main_exits_2_when_the_build_fails(monkeypatch, capsys, no_gpu_check):
    monkeypatch.setattr(sample, "build_engine", failing_build)
    assert sample.main(sample.parse_args([])) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Inference result" not in out
    assert err.splitlines()[-1].startswith("error: TensorRT failed at the engine build stage")


def test_main_exits_2_when_the_execution_context_fails(monkeypatch, capsys, no_gpu_check):
    monkeypatch.setattr(sample, "build_engine", lambda *args, source, w_dtype: object())  # double: an engine

    def failing_run(*args):  # double of run_and_check: TrtRunner cannot create its context
        G_LOGGER.critical("Invalid Context. See error log for details.")

    monkeypatch.setattr(sample, "run_and_check", failing_run)
    assert sample.main(sample.parse_args([])) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Inference result" not in out
    assert err.splitlines()[-1].startswith("error: TensorRT failed at the execution context stage")


def test_a_mismatch_stays_exit_1(monkeypatch, capsys, no_gpu_check):
    monkeypatch.setattr(sample, "build_engine", lambda *args, source, w_dtype: object())  # double: an engine
    monkeypatch.setattr(sample, "run_and_check", lambda *args: False)  # double: a run that did not match
    assert sample.main(sample.parse_args([])) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "Inference result incorrect!"


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
