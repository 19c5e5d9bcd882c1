"""CPU: a saved engine is reused only with the flags that shaped it (the PATH.json record).

No TensorRT here, so the engine is stand-in bytes: the record logic reads
only the file's bytes (for their hash), never deserializes them.
"""

import hashlib
import json

import numpy as np
import pytest

import rms_norm_plugin_cutedsl as sample
from conftest import SAMPLE_PATH
from test_cli import AOT_PATH, EXIT_USAGE, assert_one_sentence, run_script

ENGINE_BYTES = b"stand-in engine bytes"


def flags(*argv):
    return sample.parse_args(list(argv))


def record(*argv, source="plugin"):
    return sample.engine_record(flags(*argv), source, f"{sample.PLUGIN_NAME} v{sample.PLUGIN_VERSION}")


@pytest.fixture
def saved(tmp_path):
    path = str(tmp_path / "rms.engine")
    sample.save_engine(path, ENGINE_BYTES, record())
    return path


def test_the_same_flags_reuse_the_engine(saved):
    sample.check_saved_engine(saved, record())
    assert open(saved, "rb").read() == ENGINE_BYTES


def test_the_record_holds_every_flag_that_shapes_the_engine(saved):
    saved_record = json.load(open(saved + ".json"))
    assert saved_record == {"source": "plugin", "plugin": "RmsNormPlugin v1", "dtype": "float16",
                            "weight_dtype": "float32", "hidden": 1024,
                            "profile": [1, 128, 512], "epsilon": float(np.float32(1e-5)),
                            "sha256": hashlib.sha256(ENGINE_BYTES).hexdigest()}


@pytest.mark.parametrize("argv,source,shown", [
    (["--epsilon", "1e-3"], "plugin", "epsilon 1e-05, not epsilon 0.001"),
    (["--dtype", "bfloat16"], "plugin", "dtype float16, not dtype bfloat16"),
    (["--weight-dtype", "float16"], "plugin", "weight_dtype float32, not weight_dtype float16"),
    (["--hidden-dim", "4096"], "plugin", "hidden 1024, not hidden 4096"),
    (["--max-tokens", "1024"], "plugin", "profile [1, 128, 512], not profile [1, 128, 1024]"),
    (["--opt-tokens", "64"], "plugin", "profile [1, 128, 512], not profile [1, 64, 512]"),
    ([], "onnx", "source plugin, not source onnx"),
    ([], "aot", "source plugin, not source aot"),
])
def test_a_flag_that_differs_is_refused(saved, argv, source, shown):
    with pytest.raises(sample.UsageError, match="was built for") as info:
        sample.check_saved_engine(saved, record(*argv, source=source))
    assert shown in str(info.value)


def test_an_epsilon_equal_in_float32_is_the_same_engine(saved):
    sample.check_saved_engine(saved, record("--epsilon", "1.0000000001e-5"))


def test_a_plugin_version_bump_is_refused(saved):
    wanted = {**record(), "plugin": "RmsNormPlugin v2"}
    with pytest.raises(sample.UsageError, match="plugin RmsNormPlugin v1, not plugin RmsNormPlugin v2"):
        sample.check_saved_engine(saved, wanted)


def test_a_save_that_fails_is_one_sentence(tmp_path):
    """The directory was checked before the build; it may still be gone by the time the engine is saved."""
    with pytest.raises(sample.UsageError, match="cannot save the engine to .*No such file or directory"):
        sample.save_engine(str(tmp_path / "gone" / "rms.engine"), ENGINE_BYTES, record())


def test_an_engine_without_a_record_is_refused(tmp_path):
    path = tmp_path / "old.engine"
    path.write_bytes(ENGINE_BYTES)
    with pytest.raises(sample.UsageError, match="has no record"):
        sample.check_saved_engine(str(path), record())


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"dtype": "float16"}'])
def test_a_foreign_record_is_refused(saved, text):
    with open(saved + ".json", "w") as f:
        f.write(text)
    with pytest.raises(sample.UsageError, match="record"):
        sample.check_saved_engine(saved, record())


def test_an_engine_replaced_after_its_record_was_written_is_refused(saved):
    with open(saved, "wb") as f:
        f.write(b"another engine")
    with pytest.raises(sample.UsageError, match="is not the engine its record"):
        sample.check_saved_engine(saved, record())


@pytest.mark.parametrize("script,source", [(SAMPLE_PATH, "plugin"), (AOT_PATH, "aot")], ids=["plugin", "aot"])
def test_the_scripts_refuse_a_different_epsilon_before_anything_else(tmp_path, script, source):
    """Run as a user runs it: one sentence and exit 2, before the GPU check (there is no GPU here)."""
    path = str(tmp_path / "rms.engine")
    import rms_norm_aot_cutedsl as aot

    plugin = aot.OP_NAME if source == "aot" else "RmsNormPlugin v1"
    sample.save_engine(path, ENGINE_BYTES, sample.engine_record(flags(), source, plugin))
    code, out, err = run_script("--engine", path, "--epsilon", "1e-3", script=script)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "was built for epsilon 1e-05, not epsilon 0.001")
    code, out, err = run_script("--engine", path, script=script)  # matching flags: on to the GPU check
    assert code == EXIT_USAGE
    assert_one_sentence(err, "no CUDA GPU")


def test_the_aot_script_refuses_a_python_plugin_engine(tmp_path):
    path = str(tmp_path / "rms.engine")
    sample.save_engine(path, ENGINE_BYTES, record())
    code, _, err = run_script("--engine", path, script=AOT_PATH)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "built for source plugin, plugin RmsNormPlugin v1, not source aot")
