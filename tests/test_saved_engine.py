"""rms_norm_saved_engine.py: a saved engine is reused only with the flags that shaped it (the
PATH.json record), and every engine saved before the split still loads.

CPU: no TensorRT here, so the engine is stand-in bytes: the record logic reads only the file's bytes
(for their hash), never deserializes them. Every refusal comes in one sentence with exit code 2
before any build, and before the GPU check (there is no GPU here, so a refusal that came later
would say "no CUDA GPU"). The scripts' main() runs in-process, with labelled doubles for the steps
that need TensorRT or a GPU; a few refusals run as scripts too, to show each script checks first.
The script takes the fused companion's flags and builds and loads through the companion's creator,
which serves every form under the lesson's plugin name and version.

trt (marker): the script saves an engine, a later process loads it and gets the same output, and a
wrong engine file is refused in one sentence.
"""

import argparse
import errno
import hashlib
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import rms_norm_aot_cutedsl as aot
import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as sample
import rms_norm_saved_engine as saved
from test_cli import AOT_PATH, EXIT_USAGE, SAVED_PATH, assert_one_sentence, run_script

ENGINE_BYTES = b"stand-in engine bytes"
PLUGIN = "RmsNormPlugin v1"
REAL_LOAD_ENGINE = saved.load_engine  # the `steps` fixture replaces the module's


def flags(*argv):
    """The companion's flags, as the script takes them."""
    parser = fused.make_parser("test")
    return fused.validate_args(parser, parser.parse_args(list(argv)))


def record(*argv, source="plugin", plugin=PLUGIN):
    return saved.engine_record(flags(*argv), source, plugin)


@pytest.fixture
def saved_path(tmp_path):
    path = str(tmp_path / "rms.engine")
    saved.save_engine(path, ENGINE_BYTES, record())
    return path


# -- the record ------------------------------------------------------------------------------------


def test_the_same_flags_reuse_the_engine(saved_path):
    assert saved.check_saved_engine(saved_path, record()) == ENGINE_BYTES


def test_the_record_holds_every_flag_that_shapes_the_engine(saved_path):
    saved_record = json.load(open(saved_path + ".json"))
    assert saved_record == {"source": "plugin", "plugin": "RmsNormPlugin v1", "dtype": "float16",
                            "weight_dtype": "float32", "hidden": 1024,
                            "profile": [1, 128, 512], "epsilon": float(np.float32(1e-5)),
                            "residual": False, "y_scale": None,
                            "sha256": hashlib.sha256(ENGINE_BYTES).hexdigest()}


def test_a_record_written_before_the_residual_form_is_a_plain_engines(saved_path):
    """The first version's records have no "residual": their engines are the plain form and still
    load."""
    old = json.load(open(saved_path + ".json"))
    del old["residual"]
    with open(saved_path + ".json", "w") as f:
        json.dump(old, f)
    assert saved.check_saved_engine(saved_path, record()) == ENGINE_BYTES
    with pytest.raises(sample.UsageError, match="was built for residual False, not residual True"):
        saved.check_saved_engine(saved_path, record("--residual"))


@pytest.mark.parametrize("argv,source,shown", [
    (["--epsilon", "1e-3"], "plugin", "epsilon 1e-05, not epsilon 0.001"),
    (["--dtype", "bfloat16"], "plugin", "dtype float16, not dtype bfloat16"),
    (["--weight-dtype", "float16"], "plugin", "weight_dtype float32, not weight_dtype float16"),
    (["--hidden-dim", "4096"], "plugin", "hidden 1024, not hidden 4096"),
    (["--max-tokens", "1024"], "plugin", "profile [1, 128, 512], not profile [1, 128, 1024]"),
    (["--opt-tokens", "64"], "plugin", "profile [1, 128, 512], not profile [1, 64, 512]"),
    (["--residual"], "plugin", "residual False, not residual True"),
    (["--y-scale", "0.05"], "plugin", "y_scale None, not y_scale 0.05"),
    ([], "onnx", "source plugin, not source onnx"),
    ([], "aot", "source plugin, not source aot"),
])
def test_a_flag_that_differs_is_refused(saved_path, argv, source, shown):
    with pytest.raises(sample.UsageError, match="was built for") as info:
        saved.check_saved_engine(saved_path, record(*argv, source=source))
    assert shown in str(info.value)


def test_flags_that_do_not_shape_the_engine_are_not_recorded(saved_path):
    """The main run's token count and the seed pick inputs, not an engine: any value reuses it."""
    saved.check_saved_engine(saved_path, record("--num-tokens", "300", "--seed", "7"))


def test_an_epsilon_equal_in_float32_is_the_same_engine(saved_path):
    saved.check_saved_engine(saved_path, record("--epsilon", "1.0000000001e-5"))


def test_a_plugin_version_bump_is_refused(saved_path):
    wanted = {**record(), "plugin": "RmsNormPlugin v2"}
    with pytest.raises(sample.UsageError,
                       match="plugin RmsNormPlugin v1, not plugin RmsNormPlugin v2"):
        saved.check_saved_engine(saved_path, wanted)


def test_a_save_that_fails_is_one_sentence(tmp_path):
    """The directory was checked before the build; it may still be gone when the engine is saved."""
    with pytest.raises(sample.UsageError,
                       match="cannot save the engine to .*No such file or directory"):
        saved.save_engine(str(tmp_path / "gone" / "rms.engine"), ENGINE_BYTES, record())


def test_concurrent_saves_leave_the_old_pair_or_the_new_pair_never_a_mix(tmp_path):
    """Two runs saving different engines to one --engine, over and over, while two readers check
    it: each check finds a whole pair, either engine with its own record (the other's refused as
    "was built for"), and the last pair stands, with no temporary file left. Real threads and
    files; nothing is a double."""
    path = str(tmp_path / "rms.engine")
    pairs = [(bytes([n]) * (1 << 20), record("--hidden-dim", hidden))
             for n, hidden in ((1, "1024"), (2, "4096"))]
    saved.save_engine(path, *pairs[0])
    deadline = time.monotonic() + 3
    found, problems = [], []

    def guarded(step):
        def loop():
            try:
                while time.monotonic() < deadline and not problems:
                    step()
            except Exception as exc:  # noqa: BLE001 (reported by the assertion below)
                problems.append(repr(exc))
        return loop

    def check():
        try:
            data = saved.check_saved_engine(path, pairs[0][1])
        except sample.UsageError as exc:
            if "was built for hidden 4096, not hidden 1024" not in str(exc):
                problems.append(str(exc))  # a mixed or half-written pair
            found.append(2)
        else:
            if data == pairs[0][0]:
                found.append(1)
            else:
                problems.append("pair 1's record, other bytes")

    threads = [threading.Thread(target=guarded(lambda pair=pair: saved.save_engine(path, *pair)))
               for pair in pairs]
    threads += [threading.Thread(target=guarded(check)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == []
    assert set(found) == {1, 2}  # both writers' pairs were read while the other wrote
    final = json.load(open(path + ".json"))["hidden"]
    data, wanted = pairs[0] if final == 1024 else pairs[1]
    assert saved.check_saved_engine(path, wanted) == data
    assert sorted(os.listdir(tmp_path)) == ["rms.engine", "rms.engine.json"]


def test_a_save_that_fails_halfway_leaves_the_old_pair_and_no_temporary_file(tmp_path):
    """The file system refuses the new engine part-way (a file size limit, EFBIG, in a child
    process): the saved pair is still whole, and the partial file is gone."""
    path = tmp_path / "rms.engine"
    saved.save_engine(str(path), ENGINE_BYTES, record())
    worker = f"""
import resource, signal, sys
sys.path.insert(0, {str(SAVED_PATH.parent)!r})
import rms_norm_saved_engine as saved
# so that a write past the limit fails with EFBIG instead of killing the process
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
try:
    saved.save_engine(sys.argv[1], b"x" * 5000, {record()!r})
except saved.lesson.UsageError as exc:
    print(exc)
"""
    proc = subprocess.run([sys.executable, "-B", "-c", worker, str(path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"cannot save the engine to '{path}' (File too large)" in proc.stdout
    assert saved.check_saved_engine(str(path), record()) == ENGINE_BYTES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rms.engine", "rms.engine.json"]


def test_where_a_directory_takes_no_lock_the_pair_is_still_saved_and_checked(tmp_path,
                                                                            monkeypatch):
    """NFS emulates flock with byte-range locks, and an exclusive one needs a file open for
    writing, which a directory never is; flock then fails (EBADF), and the renames go ahead without
    the lock."""
    def flock(fd, mode):  # double: NFS's answer to an exclusive flock on a directory (flock(2))
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))

    monkeypatch.setattr(saved.fcntl, "flock", flock)
    path = str(tmp_path / "rms.engine")
    saved.save_engine(path, ENGINE_BYTES, record())
    assert saved.check_saved_engine(path, record()) == ENGINE_BYTES


def test_a_saved_pair_has_the_permissions_open_gives(tmp_path):
    """Written to new files first, yet readable as a plain open(path, "w") leaves them (not
    mkstemp's 0600)."""
    umask = os.umask(0o022)
    try:
        saved.save_engine(str(tmp_path / "rms.engine"), ENGINE_BYTES, record())
    finally:
        os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {"rms.engine": 0o644, "rms.engine.json": 0o644}


def test_an_engine_without_a_record_is_refused(tmp_path):
    path = tmp_path / "old.engine"
    path.write_bytes(ENGINE_BYTES)
    with pytest.raises(sample.UsageError, match="has no record"):
        saved.check_saved_engine(str(path), record())


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"dtype": "float16"}'])
def test_a_foreign_record_is_refused(saved_path, text):
    with open(saved_path + ".json", "w") as f:
        f.write(text)
    with pytest.raises(sample.UsageError, match="record"):
        saved.check_saved_engine(saved_path, record())


# Records a user could have edited, or another program written: each value of the wrong type, or a
# nesting deeper than json.load can follow (it raises RecursionError), is "not an engine record
# written by this sample".
TAMPERED_RECORDS = {
    "epsilon a string": {"epsilon": "1e-05"},    # the refusal formatted it with :g (ValueError)
    "epsilon null": {"epsilon": None},           # likewise (TypeError)
    "hidden a string": {"hidden": "1024"},       # "built for hidden 1024, not hidden 1024"
    "a profile entry a string": {"profile": [1, "128", 512]},
    "hidden a bool": {"hidden": True},
    "sha256 a number": {"sha256": 5},
    "y_scale a string": {"y_scale": "0.05"},     # None or a float, as the form decides
}


def tampered(path, change=None, text=None):
    """Rewrite `path`.json: the saved record with `change` applied (the engine's hash kept), or
    `text`."""
    if text is None:
        text = json.dumps({**json.load(open(path + ".json")), **change})
    with open(path + ".json", "w") as f:
        f.write(text)


DEEP_JSON = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("change", TAMPERED_RECORDS.values(), ids=TAMPERED_RECORDS)
def test_a_record_with_a_value_of_the_wrong_type_is_refused(saved_path, change):
    tampered(saved_path, change)
    with pytest.raises(sample.UsageError, match="is not an engine record written by this sample"):
        saved.check_saved_engine(saved_path, record())


@pytest.mark.parametrize("text", [DEEP_JSON, '{"profile": ' + DEEP_JSON + "}"],
                         ids=["deep list", "deep value"])
def test_a_record_nested_deeper_than_json_can_read_is_refused(saved_path, text):
    tampered(saved_path, text=text)
    with pytest.raises(sample.UsageError, match="is not an engine record written by this sample"):
        saved.check_saved_engine(saved_path, record())


def test_an_engine_replaced_after_its_record_was_written_is_refused(saved_path):
    with open(saved_path, "wb") as f:
        f.write(b"another engine")
    with pytest.raises(sample.UsageError, match="is not the engine its record"):
        saved.check_saved_engine(saved_path, record())


def test_an_empty_engine_file_is_refused_without_asking_tensorrt(tmp_path):
    """load_engine's own sentence; TensorRT (absent here) is never handed zero bytes."""
    pytest.importorskip("polygraphy")  # requirements-test.txt installs it; load_engine imports it
    path = tmp_path / "empty.engine"
    path.write_bytes(b"")
    with pytest.raises(sample.UsageError,
                       match=r"cannot deserialize engine file '.*empty\.engine'.*delete it"):
        saved.load_engine(path.read_bytes(), str(path))


# -- the scripts, as a user runs them: one sentence and exit 2, before the GPU check ---------------
# In-process: each script's main() with the `steps` doubles below, which record any step past the
# flags (the environment check first); two run as scripts too.


def exit_code(main, argv) -> int:
    """main(argv)'s exit code, returned by its run or raised by its parser."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.fixture
def no_gpu(monkeypatch):
    """TEST DOUBLE: torch sees no GPU, as on this machine, or under CUDA_VISIBLE_DEVICES="" where
    there is one: the real environment check stops the run there."""
    monkeypatch.setattr(sample.torch.cuda, "is_available", lambda: False)


SCRIPTS = [(SAVED_PATH, "plugin", PLUGIN), (AOT_PATH, "aot", aot.OP_NAME)]
MAINS = [(saved.main, "plugin", PLUGIN), (aot.main, "aot", aot.OP_NAME)]
SCRIPT_IDS = ["saved_engine", "aot"]


@pytest.mark.parametrize("script,source,plugin", SCRIPTS, ids=SCRIPT_IDS)
def test_the_scripts_refuse_a_different_epsilon_before_anything_else(tmp_path, script, source,
                                                                    plugin):
    path = str(tmp_path / "rms.engine")
    saved.save_engine(path, ENGINE_BYTES, saved.engine_record(flags(), source, plugin))
    code, out, err = run_script("--engine", path, "--epsilon", "1e-3", script=script)
    assert code == EXIT_USAGE
    assert_one_sentence(err, "was built for epsilon 1e-05, not epsilon 0.001")
    code, out, err = run_script("--engine", path, script=script)  # matching: on to the GPU check
    assert code == EXIT_USAGE
    assert_one_sentence(err, "no CUDA GPU")


@pytest.mark.parametrize("main,source,plugin", MAINS, ids=SCRIPT_IDS)
@pytest.mark.parametrize("problem", ["no record", "foreign record", "replaced engine"])
def test_the_scripts_refuse_an_engine_they_cannot_trust_before_anything_else(
        tmp_path, steps, capsys, main, source, plugin, problem):
    path = tmp_path / "rms.engine"
    saved.save_engine(str(path), ENGINE_BYTES, saved.engine_record(flags(), source, plugin))
    needle = {"no record": "has no record",
              "foreign record": "is not an engine record written by this sample",
              "replaced engine": "is not the engine its record"}[problem]
    if problem == "no record":
        (tmp_path / "rms.engine.json").unlink()
    elif problem == "foreign record":
        (tmp_path / "rms.engine.json").write_text('{"dtype": "float16"}')
    else:
        path.write_bytes(b"another engine")
    assert exit_code(main, ["--engine", str(path)]) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, needle,
                        f"delete '{path}' and '{path}.json' to rebuild")
    assert steps == []


@pytest.mark.parametrize("main,source,plugin", MAINS, ids=SCRIPT_IDS)
@pytest.mark.parametrize("change", ["epsilon a string", "epsilon null", "hidden a string", "deep"])
def test_the_scripts_refuse_a_tampered_record_in_one_sentence(tmp_path, steps, capsys, main,
                                                             source, plugin, change):
    """Not a traceback with exit 1: one sentence, exit 2, before the GPU check."""
    path = str(tmp_path / "rms.engine")
    saved.save_engine(path, ENGINE_BYTES, saved.engine_record(flags(), source, plugin))
    if change == "deep":
        tampered(path, text=DEEP_JSON)
    else:
        tampered(path, TAMPERED_RECORDS[change])
    assert exit_code(main, ["--engine", path]) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err,
                        f"'{path}.json' is not an engine record written by this sample",
                        f"delete '{path}' and '{path}.json' to rebuild")
    assert steps == []


def test_the_aot_script_refuses_a_python_plugin_engine(tmp_path, steps, capsys):
    path = str(tmp_path / "rms.engine")
    saved.save_engine(path, ENGINE_BYTES, record())
    assert exit_code(aot.main, ["--engine", path]) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err,
                        "built for source plugin, plugin RmsNormPlugin v1, not source aot")
    assert steps == []


@pytest.mark.parametrize("built, asked", [([], ["--residual"]), (["--residual"], [])],
                         ids=["plain", "fused"])
def test_the_aot_script_tells_the_fused_ops_engine_from_the_plain_ops(tmp_path, no_gpu, capsys,
                                                                     built, asked):
    """The record names the op the engine was built with: the plain op's is refused for
    --residual and the fused op's without it, both ops named, before the GPU check; with the flags
    it was built with, on to that check."""
    names = {False: (aot.OP_NAME, "False"), True: (aot.FUSED_OP_NAME, "True")}
    path = str(tmp_path / "rms.engine")
    saved.save_engine(path, ENGINE_BYTES,
                      record(*built, source="aot", plugin=names[bool(built)][0]))
    assert exit_code(aot.main, ["--engine", path, *asked]) == EXIT_USAGE
    (was, was_residual), (now, now_residual) = names[bool(built)], names[bool(asked)]
    assert_one_sentence(capsys.readouterr().err,
                        f"built for plugin {was}, residual {was_residual}, not plugin {now}, "
                        f"residual {now_residual}")
    assert exit_code(aot.main, ["--engine", path, *built]) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, "no CUDA GPU")


def test_the_script_refuses_an_aot_engine(tmp_path, steps, capsys):
    path = str(tmp_path / "rms.engine")
    saved.save_engine(path, ENGINE_BYTES, record(source="aot", plugin=aot.OP_NAME))
    assert exit_code(saved.main, ["--engine", path]) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, f"built for source aot, plugin {aot.OP_NAME}, "
                                                 f"not source plugin, plugin {PLUGIN}")
    assert steps == []


@pytest.mark.parametrize("saved_source, argv, shown", [
    ("plugin", ["--from-onnx"], "built for source plugin, not source onnx"),
    ("onnx", [], "built for source onnx, not source plugin"),
])
def test_the_script_keeps_the_onnx_parsers_engine_apart(tmp_path, steps, capsys, saved_source,
                                                        argv, shown):
    path = str(tmp_path / "rms.engine")
    saved.save_engine(path, ENGINE_BYTES, record(source=saved_source))
    assert exit_code(saved.main, ["--engine", path, *argv]) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, shown)
    assert steps == []


ENGINE_FLAG_PROBLEMS = [  # (the --engine path, the sentence), {tmp} the test's directory
    ("{tmp}/no/such/dir/x.engine",
     "--engine '{tmp}/no/such/dir/x.engine': directory '{tmp}/no/such/dir' does not exist"),
    ("{tmp}/a_file/x.engine",
     "--engine '{tmp}/a_file/x.engine': '{tmp}/a_file' is not a directory"),
    ("{tmp}", "--engine '{tmp}' exists but is not a file"),
    # the AOT script took '' as no --engine, and saved nothing
    ("", "--engine '' does not name a file"),
    ("{tmp}/new_dir/", "--engine '{tmp}/new_dir/' does not name a file"),
    ("{tmp}/dangling.engine",
     "--engine '{tmp}/dangling.engine' is a dangling symbolic link (to '{tmp}/nowhere')"),
    ("{tmp}/b.engine",
     "--engine '{tmp}/b.engine': its record '{tmp}/b.engine.json' exists but is not a file"),
]


@pytest.mark.parametrize("main", [saved.main, aot.main], ids=SCRIPT_IDS)
@pytest.mark.parametrize("engine, sentence", ENGINE_FLAG_PROBLEMS)
def test_an_engine_path_that_cannot_be_saved_to_is_refused_before_the_build(tmp_path, steps,
                                                                            capsys, main, engine,
                                                                            sentence):
    """Found before the build, not after it: the engine is saved only once it is built."""
    (tmp_path / "a_file").write_text("")
    (tmp_path / "dangling.engine").symlink_to(tmp_path / "nowhere")
    (tmp_path / "b.engine.json").mkdir()
    assert exit_code(main, ["--engine", engine.format(tmp=tmp_path)]) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, sentence.format(tmp=tmp_path))
    assert steps == []


def name_max(folder):
    return os.pathconf(folder, "PC_NAME_MAX")  # bytes in one name: 255 on most file systems


@pytest.mark.parametrize("main", [saved.main, aot.main], ids=SCRIPT_IDS)
@pytest.mark.parametrize("spare", [4, 17], ids=["the record's name", "the record's temporary name"])
def test_an_engine_name_too_long_for_its_record_is_refused_before_the_build(tmp_path, steps,
                                                                           capsys, main, spare):
    """NAME_MAX bytes in a name: an engine name that fits, but whose record's name, PATH.json (5
    bytes more), or that name's temporary one (18 more) does not, was found only when the built
    engine was saved."""
    path = str(tmp_path / ("e" * (name_max(tmp_path) - spare)))
    assert exit_code(main, ["--engine", path]) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, f"--engine '{path}': the name is too long",
                        f"this file system allows {name_max(tmp_path)}")
    assert steps == [] and list(tmp_path.iterdir()) == []


def test_the_longest_engine_name_accepted_is_saved(tmp_path, steps):
    """The check counts exactly the names save_engine writes: 18 bytes short of NAME_MAX is saved
    and checked."""
    path = str(tmp_path / ("e" * (name_max(tmp_path) - 18)))
    assert saved.main(["--engine", path]) == 0
    assert saved.check_saved_engine(path, record()) == ENGINE_BYTES


def test_an_engine_directory_that_is_not_writable_is_refused_before_the_build(tmp_path,
                                                                             monkeypatch, capsys):
    """In-process: the tests may run as root, for whom every directory is writable; os.access is
    the double."""
    # double: a directory this user cannot write
    monkeypatch.setattr(saved.os, "access", lambda path, mode: False)
    parser = fused.make_parser("test")
    parser.add_argument("--engine")
    args = fused.validate_args(parser, parser.parse_args(["--engine", str(tmp_path / "x.engine")]))
    with pytest.raises(SystemExit) as info:
        saved.check_engine_flag(parser, args, record())
    assert info.value.code == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, f"directory '{tmp_path}' is not writable")


def test_the_script_needs_an_engine_path(steps, capsys):
    assert exit_code(saved.main, []) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, "--engine PATH is required")
    assert steps == []


def test_the_script_checks_the_companions_flags_first(tmp_path, steps, capsys):
    argv = ["--engine", str(tmp_path / "no" / "x.engine"), "--num-tokens", "600"]
    assert exit_code(saved.main, argv) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, "--num-tokens 600 is outside the profile [1, 512]")
    assert exit_code(saved.main, ["--engine", str(tmp_path / "x.engine"), "--y-scale", "0"]) == 2
    assert_one_sentence(capsys.readouterr().err, "--y-scale must be finite and >= 2^-126")
    assert steps == []


@pytest.mark.parametrize("engine", [[], ["--engine", "rms.engine"]], ids=["without", "with"])
def test_the_scripts_plans_is_the_companions_and_touches_no_engine(tmp_path, monkeypatch, capsys,
                                                                  engine):
    monkeypatch.chdir(tmp_path)
    argv = ["--plans", "--hidden-dim", "8192", "--residual"]
    assert saved.main([*engine, *argv]) == 0
    out = capsys.readouterr().out
    parser = fused.make_parser("test")
    assert fused.main(fused.validate_args(parser, parser.parse_args(argv))) == 0
    assert out == capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


# -- main(), in-process: register, load or build, save ---------------------------------------------


class FakeEngine:
    """Double of a TensorRT engine: what load_or_build and the run touch of one."""

    def __init__(self, data=ENGINE_BYTES):
        self.data = data

    def serialize(self):
        return self.data


@pytest.fixture
def steps(monkeypatch):
    """Doubles for what needs a GPU or TensorRT (the environment check, the creators' registry, the
    build, the run, the deserialization), each recording itself; the record, the saving and the
    order of the steps are the script's own code. The run records the form it checks."""
    calls = []
    monkeypatch.setattr(sample, "check_environment", lambda: calls.append("check environment"))
    monkeypatch.setattr(fused, "register_creator",
                        lambda: calls.append("register the companion's creator"))
    monkeypatch.setattr(sample, "register_creator",
                        lambda: calls.append("register the lesson's creator"))

    def build_engine(args):
        calls.append("build")
        return FakeEngine()

    def load_engine(data, path):
        calls.append("load")
        return FakeEngine(data)

    def run_and_check(engine, token_counts, hidden, dtype, epsilon, seed, w_dtype, residual,
                      y_scale):
        calls.append(("run", engine.serialize(), residual, y_scale))
        return True

    monkeypatch.setattr(fused, "build_engine", build_engine)
    monkeypatch.setattr(saved, "load_engine", load_engine)
    monkeypatch.setattr(fused, "run_and_check", run_and_check)
    return calls


REGISTER = "register the companion's creator"


def test_the_first_run_builds_and_saves_and_the_next_loads(tmp_path, steps, capsys):
    path = str(tmp_path / "rms.engine")
    assert saved.main(["--engine", path, "--hidden-dim", "4096"]) == 0
    assert steps == ["check environment", REGISTER, "build", ("run", ENGINE_BYTES, False, None)]
    assert f"Saved engine to {path} and its record to {path}.json" in capsys.readouterr().out
    assert open(path, "rb").read() == ENGINE_BYTES
    saved.check_saved_engine(path, record("--hidden-dim", "4096"))  # this engine's, plugin v1

    steps.clear()
    assert saved.main(["--engine", path, "--hidden-dim", "4096"]) == 0
    # The creator is registered before the engine is deserialized: the engine holds only the
    # plugin's name and fields.
    assert steps == ["check environment", REGISTER, "load", ("run", ENGINE_BYTES, False, None)]
    assert f"Loaded engine from {path}" in capsys.readouterr().out


# What rms_norm_saved_engine.py wrote beside an engine before the lesson and the companion were two
# files (88ee3e6; the same keys since the FP8 form), written out by hand, for default flags and the
# form's; the oldest records lack "residual" and "y_scale" (ADDED_KEYS). The sha256 is added.
OLD_RECORD = {"source": "plugin", "plugin": "RmsNormPlugin v1", "dtype": "float16",
              "weight_dtype": "float32", "hidden": 1024, "profile": [1, 128, 512],
              "epsilon": 9.999999747378752e-06, "residual": False, "y_scale": None}
OLD_RECORDS = {  # name: (what the record says, the flags of that form, (residual, y_scale))
    "plain, before the residual form": ({"residual": "absent", "y_scale": "absent"}, [],
                                        (False, None)),
    "plain": ({}, [], (False, None)),
    "residual": ({"residual": True}, ["--residual"], (True, None)),
    "FP8": ({"y_scale": 0.05}, ["--y-scale", "0.05"], (False, 0.05)),
    "residual FP8": ({"residual": True, "y_scale": 0.05}, ["--residual", "--y-scale", "0.05"],
                     (True, 0.05)),
    "residual, ONNX parser": ({"source": "onnx", "residual": True}, ["--from-onnx", "--residual"],
                              (True, None)),
}


def write_old_pair(path: str, changes: dict):
    values = {key: value for key, value in {**OLD_RECORD, **changes}.items() if value != "absent"}
    with open(path, "wb") as f:
        f.write(ENGINE_BYTES)
    with open(path + ".json", "w") as f:
        json.dump({**values, "sha256": hashlib.sha256(ENGINE_BYTES).hexdigest()}, f, indent=1)


@pytest.mark.parametrize("name", OLD_RECORDS)
def test_an_engine_saved_before_the_split_loads_through_the_companions_creator(tmp_path, steps,
                                                                              capsys, name):
    """The record of each form passes with that form's flags; the companion's creator, which serves
    every form, is registered before the load, and the run checks that form."""
    changes, argv, form = OLD_RECORDS[name]
    path = str(tmp_path / "old.engine")
    write_old_pair(path, changes)
    assert saved.main(["--engine", path, *argv]) == 0, capsys.readouterr().err
    assert steps == ["check environment", REGISTER, "load", ("run", ENGINE_BYTES, *form)]


def test_an_engine_saved_before_the_split_is_refused_for_another_form(tmp_path, steps, capsys):
    write_old_pair(str(tmp_path / "old.engine"), OLD_RECORDS["residual FP8"][0])
    assert exit_code(saved.main, ["--engine", str(tmp_path / "old.engine")]) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, "was built for residual True, y_scale 0.05, not "
                                                 "residual False, y_scale None")
    assert steps == []


def test_other_flags_are_refused_before_the_environment_check_or_a_build(tmp_path, steps, capsys):
    path = str(tmp_path / "rms.engine")
    saved.save_engine(path, ENGINE_BYTES, record())
    with pytest.raises(SystemExit) as info:
        saved.main(["--engine", path, "--dtype", "bfloat16"])
    assert info.value.code == EXIT_USAGE
    assert steps == []
    assert_one_sentence(capsys.readouterr().err, "was built for dtype float16, not dtype bfloat16")


def test_a_failed_build_saves_nothing(tmp_path, steps, monkeypatch, capsys):
    """So the next run builds again instead of refusing a half-written engine."""
    def failing_build(args):  # double: TensorRT refuses the build, as Polygraphy reports it
        with sample.tensorrt_stage("engine build"):
            raise RuntimeError("Invalid Engine")

    monkeypatch.setattr(fused, "build_engine", failing_build)
    assert saved.main(["--engine", str(tmp_path / "rms.engine")]) == EXIT_USAGE
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().err.startswith("error: TensorRT failed at the engine build stage")


def test_an_engine_tensorrt_cannot_load_is_load_engines_sentence_and_exit_2(tmp_path, steps,
                                                                           monkeypatch, capsys):
    """The real load_engine inside run's 'engine load' stage: its UsageError reaches the user as it
    is."""
    pytest.importorskip("polygraphy")  # requirements-test.txt installs it; load_engine imports it
    monkeypatch.setattr(saved, "load_engine", REAL_LOAD_ENGINE)
    path = str(tmp_path / "rms.engine")
    # recorded, so it passes the record check; empty, so TensorRT is not asked
    saved.save_engine(path, b"", record())
    assert saved.main(["--engine", path]) == EXIT_USAGE
    assert_one_sentence(capsys.readouterr().err, f"cannot deserialize engine file '{path}'")
    assert "build" not in steps


class RuntimeDouble:
    """TEST DOUBLE of tensorrt.Runtime (TensorRT is absent here), as its binding is (NVIDIA/TensorRT
    python/src/infer/pyCore.cpp; TensorRT-RTX's has the same): Runtime(logger), and
    deserialize_cuda_engine(serialized_engine) returns an ICudaEngine, or None if the bytes are not
    one. This one keeps the bytes given."""

    def __init__(self, logger, given):
        self.given = given

    def deserialize_cuda_engine(self, serialized_engine):
        self.given.append(bytes(serialized_engine))
        return FakeEngine(bytes(serialized_engine))


@pytest.mark.parametrize("script", ["saved_engine", "aot"])
def test_the_engine_deserialized_is_the_engine_checked(tmp_path, steps, monkeypatch, script):
    """The bytes hashed against the record are the bytes handed to TensorRT: replaced on disk after
    the check (here while the creator is registered, or the AOT support checked), the file is not
    read again."""
    polygraphy_trt = pytest.importorskip("polygraphy.backend.trt")  # load_engine imports it
    given = []
    monkeypatch.setattr(saved, "load_engine", REAL_LOAD_ENGINE)
    monkeypatch.setattr(sample, "trt",
                        argparse.Namespace(Runtime=lambda logger: RuntimeDouble(logger, given)))
    # its own needs TensorRT
    monkeypatch.setattr(polygraphy_trt, "get_trt_logger", lambda: "logger double")
    path = tmp_path / "rms.engine"

    def swap():  # between the check and the load, another program replaces the engine
        steps.append("swap")
        path.write_bytes(b"unchecked engine bytes")

    if script == "aot":
        saved.save_engine(str(path), ENGINE_BYTES, record(source="aot", plugin=aot.OP_NAME))
        monkeypatch.setattr(aot, "check_aot_support", swap)  # double: its own needs TensorRT
        assert aot.main(["--engine", str(path)]) == 0
    else:
        saved.save_engine(str(path), ENGINE_BYTES, record())
        monkeypatch.setattr(fused, "register_creator", swap)
        assert saved.main(["--engine", str(path)]) == 0
    assert "swap" in steps
    assert given == [ENGINE_BYTES]
    assert steps[-1] == ("run", ENGINE_BYTES, False, None)


# -- real TensorRT: save, then load in another process ---------------------------------------------


def run_saved_engine_script(*args):
    proc = subprocess.run([sys.executable, str(SAVED_PATH), *args], capture_output=True, text=True,
                          timeout=900)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.trt
@pytest.mark.parametrize("form", [[], ["--from-onnx"], ["--residual", "--y-scale", "0.05"]],
                         ids=["plugin", "onnx", "residual-fp8"])
def test_the_script_saves_an_engine_and_a_later_run_loads_it(tmp_path, form):
    engine = str(tmp_path / "rms.engine")
    code, out, err = run_saved_engine_script("--engine", engine, *form)
    assert code == 0 and "Saved engine" in out and "Inference result correct!" in out, out + err
    code, out, err = run_saved_engine_script("--engine", engine, *form)
    assert code == 0 and "Loaded engine" in out and "Inference result correct!" in out, out + err
    code, _, err = run_saved_engine_script("--engine", engine, *form, "--hidden-dim", "4096")
    assert code == 2 and "was built for" in err


@pytest.mark.trt
def test_a_saved_engine_loads_in_a_fresh_process_and_matches_bit_for_bit(tmp_path):
    engine = tmp_path / "rms.engine"
    out_built, out_loaded = tmp_path / "built.npy", tmp_path / "loaded.npy"
    worker = f"""
import os, sys, numpy as np, torch
sys.path.insert(0, {str(SAVED_PATH.parent)!r})
import rms_norm_saved_engine as saved
lesson, fused = saved.lesson, saved.fused
path, out = sys.argv[1], sys.argv[2]
parser = fused.make_parser("worker")
args = fused.validate_args(parser, parser.parse_args([]))
record = saved.engine_record(args, "plugin", f"{{fused.PLUGIN_NAME}} v{{fused.PLUGIN_VERSION}}")
fused.register_creator()
if os.path.exists(path):
    engine = saved.load_engine(saved.check_saved_engine(path, record), path)
else:
    engine = fused.build_engine(args)
    saved.save_engine(path, engine.serialize(), record)
x, w = lesson.make_inputs(128, 1024, "float16", seed=5)
x, w = x.cuda(), w.cuda()
y = torch.full_like(x, float("nan"))
context = engine.create_execution_context()
context.set_input_shape("X", tuple(x.shape))
for name, tensor in (("X", x), ("W", w), ("Y", y)):
    context.set_tensor_address(name, tensor.data_ptr())
torch.cuda.synchronize()
assert context.execute_async_v3(torch.cuda.current_stream().cuda_stream)
torch.cuda.synchronize()
np.save(out, y.cpu().numpy().view(np.uint16))
"""
    for out in (out_built, out_loaded):  # the first process builds and saves, the second loads
        proc = subprocess.run([sys.executable, "-c", worker, str(engine), str(out)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(out_built), np.load(out_loaded))


@pytest.mark.trt
def test_a_file_that_is_not_an_engine_gives_one_sentence(tmp_path):
    bad = tmp_path / "bad.engine"  # saved with the default flags' record: TensorRT gets to read it
    saved.save_engine(str(bad), b"not an engine" * 100, record())
    code, out, err = run_saved_engine_script("--engine", str(bad))
    assert code == 2
    assert "cannot deserialize engine file" in err and "Traceback" not in err


@pytest.mark.trt
def test_loading_without_the_creator_registered_fails(tmp_path):
    """What the engine keeps of a Python plugin is its name and fields: without the creator nothing
    loads it."""
    engine = tmp_path / "rms.engine"
    assert run_saved_engine_script("--engine", str(engine))[0] == 0
    code = ("import tensorrt as trt, sys\n"
            "rt = trt.Runtime(trt.Logger(trt.Logger.ERROR))\n"
            f"data = open({str(engine)!r}, 'rb').read()\n"
            "sys.exit(0 if rt.deserialize_cuda_engine(data) is None else 1)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
