#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Build the plugin's engine once, save it, and load it on later runs; refuse an engine saved with
other flags.

What you will learn
-------------------
* What a TensorRT engine keeps of a Python plugin: its name, version, namespace and serialized
  fields, not its code. So the creator is registered before the engine is deserialized, and a C++
  program such as trtexec, which has no Python, cannot load it (rms_norm_aot_cutedsl.py embeds the
  kernel instead).
* What an engine does not record: what the plugin baked in (epsilon; the AOT flavor's PTX), or the
  flags it was built with. A record beside the engine (PATH.json) holds them with the engine's
  SHA-256, and is checked before the engine is loaded: a wrong one is refused in one sentence.
* How to save a pair of files that a concurrent run never sees half-written or mixed: each is
  written under a new name and renamed into place, and both renames happen under a lock a check
  takes too (save_engine).

It builds and loads through rms_norm_fused_cutedsl.py, whose creator serves every form under the
lesson's plugin name and version: so an engine of any form this script saved, before the lesson
and its fused companion were two files or since, loads here. It runs where they run (an NVIDIA GPU
of compute capability 8.0 or newer, TensorRT 10 or 11); --plans needs no GPU.

How to run it (as rms_norm_fused_cutedsl.py, with every flag of its, plus --engine)
------------------------------------------------------------------------------------
    python3 rms_norm_saved_engine.py --engine rms_norm.engine      # builds, saves, runs, checks
    python3 rms_norm_saved_engine.py --engine rms_norm.engine      # loads, runs, checks
    python3 rms_norm_saved_engine.py --engine add.engine --residual --y-scale 0.05  # a fused form
"""

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import sys

try:
    import rms_norm_fused_cutedsl as fused
    import rms_norm_plugin_cutedsl as lesson
except ImportError as exc:  # the lesson's ImportError names the missing pip package in one sentence
    if __name__ != "__main__":
        raise
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)


def engine_record(args, source: str, plugin: str) -> dict:
    """What shaped an engine: how it was built, the plugin it needs, every flag of the companion."""
    return {"source": source, "plugin": plugin, "dtype": args.dtype,
            "weight_dtype": args.weight_dtype, "hidden": args.hidden_dim,
            "profile": [args.min_tokens, args.opt_tokens, args.max_tokens],
            "epsilon": lesson.validate_epsilon(args.epsilon), "residual": args.residual,
            "y_scale": args.y_scale}


# Keys a record of an earlier version of this script lacks, with the value its engine was built
# with.
ADDED_KEYS = {"residual": False, "y_scale": None}
# The types a value may have where the form decides: y_scale is None but in the FP8 form.
FORM_TYPES = {"y_scale": (type(None), float)}


def temp_name(path: str) -> str:
    """A new name beside `path`, to write it under before it is renamed into place."""
    return f"{path}.{secrets.token_hex(4)}.tmp"


@contextlib.contextmanager
def pair_lock(path: str, mode: int):
    """Hold a lock (fcntl.LOCK_EX or LOCK_SH) on the directory of `path` and its record, where it
    takes one."""
    fd = None
    # NFS takes no exclusive lock on a directory: there the hash alone guards.
    with contextlib.suppress(OSError):
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        fcntl.flock(fd, mode)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # and with it the lock


def save_engine(path: str, data: bytes, record: dict):
    """Write the engine's bytes to `path` and its record, with their SHA-256, to `path`.json: each
    to a new file, then renamed into place, so neither is ever half-written, and a failed save
    leaves the old pair as it was."""
    text = json.dumps({**record, "sha256": hashlib.sha256(data).hexdigest()}, indent=1) + "\n"
    temps = {}
    try:
        for name, content in ((path, data), (path + ".json", text.encode())):
            temp = temp_name(name)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies
            temps[name] = temp
            with open(fd, "wb") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
        # One lock over both renames, a shared one over a check's two reads: it sees the old pair
        # or the new one.
        with pair_lock(path, fcntl.LOCK_EX):
            for name in (path, path + ".json"):
                os.replace(temps[name], name)
                del temps[name]
    except OSError as exc:
        raise lesson.UsageError(f"cannot save the engine to '{path}' ({exc.strerror})") from None
    finally:
        for temp in temps.values():  # what was not renamed into place
            with contextlib.suppress(OSError):
                os.unlink(temp)


def same_types(saved, value) -> bool:
    """Whether a value read from a record has the type of the one this script writes (a list: of
    each item)."""
    if type(value) is list:
        return (type(saved) is list and len(saved) == len(value)
                and all(map(same_types, saved, value)))
    return type(saved) is type(value)  # type, not isinstance: a bool is an int


def check_saved_engine(path: str, record: dict) -> bytes:
    """The engine's bytes, read once: UsageError unless `path`.json is their record and matches
    `record` (the current flags). Those bytes, not the file read again, are what load_engine
    deserializes."""
    record_path = path + ".json"
    redo = f"delete '{path}' and '{record_path}' to rebuild"
    try:
        with pair_lock(path, fcntl.LOCK_SH):  # the record and the engine of one save (save_engine)
            with open(record_path, "rb") as f:
                text = f.read()
            with open(path, "rb") as f:
                data = f.read()
    except FileNotFoundError as exc:
        if exc.filename != record_path:
            raise lesson.UsageError(f"cannot read '{exc.filename}' ({exc.strerror})") from None
        raise lesson.UsageError(f"engine '{path}' has no record '{record_path}' of the flags it "
                                f"was built with; {redo}") from None
    except OSError as exc:
        raise lesson.UsageError(f"cannot read '{exc.filename or path}' ({exc.strerror})") from None
    try:
        saved = json.loads(text)
    except ValueError as exc:
        raise lesson.UsageError(f"cannot read the engine record '{record_path}' ({exc}); "
                                f"{redo}") from None
    except RecursionError:  # nested deeper than json.loads can follow: not a record of ours either
        saved = None
    if isinstance(saved, dict):
        saved = {**ADDED_KEYS, **saved}  # a plain engine saved before the fused form still loads
    if not (isinstance(saved, dict) and set(saved) == set(record) | {"sha256"}
            and type(saved["sha256"]) is str
            and all(type(saved[key]) in FORM_TYPES[key] if key in FORM_TYPES
                    else same_types(saved[key], record[key]) for key in record)):
        raise lesson.UsageError(f"'{record_path}' is not an engine record written by this sample; "
                                f"{redo}")
    if hashlib.sha256(data).hexdigest() != saved["sha256"]:
        raise lesson.UsageError(f"engine '{path}' is not the engine its record '{record_path}' was "
                                f"written for; {redo}")
    differ = [key for key in record if saved[key] != record[key]]
    if differ:
        def show(values):
            return ", ".join(f"{key} {values[key]:g}" if key == "epsilon"
                             else f"{key} {values[key]}" for key in differ)
        raise lesson.UsageError(f"engine '{path}' was built for {show(saved)}, not {show(record)}; "
                                f"pass matching flags or {redo}")
    return data


def load_engine(data: bytes, path: str):
    """Deserialize the engine read from `path` (a Python plugin's creator must be registered
    first)."""
    from polygraphy.backend.trt import get_trt_logger

    engine = None
    if data:
        engine = lesson.trt.Runtime(get_trt_logger()).deserialize_cuda_engine(data)
    if engine is None:
        raise lesson.UsageError(f"cannot deserialize engine file '{path}': it is not an engine of "
                                "this TensorRT version and GPU, or it needs a plugin this process "
                                "has not registered; delete it to rebuild")
    return engine


def check_engine_flag(parser, args, record: dict):
    """Refuse, in one sentence before any build (and without a GPU), an --engine that is the wrong
    engine for these flags, or that could not be saved once built. The checked engine's bytes, or
    None if there is none yet."""
    path = args.engine
    if not os.path.basename(path):
        parser.error(f"--engine '{path}' does not name a file")
    if os.path.islink(path) and not os.path.exists(path):
        parser.error(f"--engine '{path}' is a dangling symbolic link (to '{os.readlink(path)}')")
    if os.path.exists(path):
        if not os.path.isfile(path):
            parser.error(f"--engine '{path}' exists but is not a file")
        try:
            return check_saved_engine(path, record)
        except lesson.UsageError as exc:
            parser.exit(lesson.EXIT_USAGE, f"error: {exc}\n")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(folder):
        parser.error(f"--engine '{path}': directory '{folder}' does not exist")
    if not os.path.isdir(folder):
        parser.error(f"--engine '{path}': '{folder}' is not a directory")
    if not os.access(folder, os.R_OK | os.W_OK | os.X_OK):  # R: the lock of save_engine opens it
        parser.error(f"--engine '{path}': directory '{folder}' is not writable and readable")
    record_path = path + ".json"
    if os.path.exists(record_path) and not os.path.isfile(record_path):
        parser.error(f"--engine '{path}': its record '{record_path}' exists but is not a file")
    # The longest of the names save_engine writes.
    longest = len(os.fsencode(os.path.basename(temp_name(record_path))))
    limit = os.pathconf(folder, "PC_NAME_MAX")
    if longest > limit:
        parser.error(f"--engine '{path}': the name is too long; with '.json' and a temporary "
                     f"suffix it takes {longest} bytes, and this file system allows {limit}")
    return None


def load_or_build(args, record: dict, build, data):
    """The engine of `data`, the bytes check_engine_flag checked, or if it found none, build(args),
    saved there."""
    if data is not None:
        with lesson.tensorrt_stage("engine load"):
            engine = load_engine(data, args.engine)
        print(f"Loaded engine from {args.engine}")
        return engine
    engine = build(args)
    save_engine(args.engine, engine.serialize(), record)
    print(f"Saved engine to {args.engine} and its record to {args.engine}.json")
    return engine


def main(argv=None) -> int:
    """Exit codes as the lesson's: 0 every run matched NumPy, 1 one did not, 2 usage, environment
    or TensorRT error."""
    parser = fused.make_parser("Build the plugin's engine and save it to --engine, or load it from "
                               "there if it exists (checked against PATH.json, the record of the "
                               "flags it was built with).")
    parser.add_argument("--engine", metavar="PATH", help="the engine file (needed unless --plans); "
                        "its record is PATH.json")
    args = fused.validate_args(parser, parser.parse_args(argv))
    if args.plans:
        return fused.main(args)
    if args.engine is None:
        parser.error("--engine PATH is required: the engine file to load, or to save once it is "
                     "built")
    source = "onnx" if args.from_onnx else "plugin"
    record = engine_record(args, source, f"{fused.PLUGIN_NAME} v{fused.PLUGIN_VERSION}")
    data = check_engine_flag(parser, args, record)

    def make_engine(args):
        # The engine holds the plugin's name and fields; the companion's creator serves every form.
        fused.register_creator()
        return load_or_build(args, record, fused.build_engine, data)

    return lesson.run(args, make_engine, fused.check_engine, fused.form_title(args))


if __name__ == "__main__":
    sys.exit(main())
