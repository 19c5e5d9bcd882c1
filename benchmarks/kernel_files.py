"""Which file a benchmark or each side of an experiment's comparison loads, and how it is imported:
bench_fused_sweep.py's --kernel-file, compare_checkouts.py's and compare_ptx.py's sides.

A checkout from before the lesson/companion split (88ee3e6 and older) holds every form in its
sample, rms_norm_plugin_cutedsl.py; a later one holds them in its companion,
rms_norm_fused_cutedsl.py, which imports its own checkout's lesson. Both are called the same way:
compile_rms_norm(dtype, hidden, epsilon, arch, *, w_dtype, keep_ptx, plans_by_tokens, residual,
y_scale) and launcher(X, W, Y, num_tokens, stream[, R, S]).
"""

import inspect
import pathlib

from bench_quantized import Y_SCALE
from support.sample_loader import import_file, modules_as

LESSON_FILE = "rms_norm_plugin_cutedsl.py"
COMPANION_FILE = "rms_norm_fused_cutedsl.py"
# Each form as compile_rms_norm's keywords; y_scale as the quantized table's, whose FP8 check
# compare_checkouts.py uses.
FORMS = {"plain": {}, "residual": {"residual": True}, "fp8": {"y_scale": Y_SCALE},
         "residual_fp8": {"residual": True, "y_scale": Y_SCALE}}


def default_file(root: pathlib.Path) -> pathlib.Path:
    """The file that holds a checkout's fast forms: its companion, or its sample where it has
    none."""
    companion = root / COMPANION_FILE
    return companion if companion.is_file() else root / LESSON_FILE


def add_side_arguments(parser, base_help: str):
    """The flags that name the two files: BASE (a checkout's root), --base-file, --new-file."""
    parser.add_argument("base", type=pathlib.Path, nargs="?", help=base_help)
    parser.add_argument("--base-file", type=pathlib.Path,
                        help=f"the base side's file instead of BASE's ({COMPANION_FILE}, or "
                             f"{LESSON_FILE} in a checkout from before the split)")
    parser.add_argument("--new-file", type=pathlib.Path,
                        help=f"the new side's file (default: this checkout's {COMPANION_FILE})")


def side_files(parser, args, this_root: pathlib.Path) -> dict:
    """{"base": path, "new": path} from the flags of add_side_arguments, or a usage error."""
    if (args.base is None) == (args.base_file is None):
        parser.error("give the other checkout's root (BASE) or --base-file FILE, one of the two")
    if args.base is not None and not args.base.is_dir():
        parser.error(f"{args.base} is not a directory (BASE is the other checkout's root)")
    files = {"base": args.base_file or default_file(args.base),
             "new": args.new_file or this_root / COMPANION_FILE}
    for side, path in files.items():
        if not path.is_file():
            parser.error(f"the {side} side's file {path} does not exist")
    return {side: path.resolve() for side, path in files.items()}


def load_kernel(path, name: str):
    """Import the file at `path` as module `name`. A companion imports the lesson beside it (its
    own checkout's, loaded as name + "_lesson"), not the one on sys.path."""
    path = pathlib.Path(path)
    lesson_path = path.parent / LESSON_FILE
    if path.name == LESSON_FILE or not lesson_path.is_file():
        return import_file(path, name)
    lesson = import_file(lesson_path, f"{name}_lesson")
    with modules_as(rms_norm_plugin_cutedsl=lesson):
        return import_file(path, name)


def missing_keywords(module, forms, also=()) -> list:
    """The keywords of compile_rms_norm that `forms` and `also` need and the module's lacks."""
    needed = set(also)
    for form in forms:
        needed |= set(FORMS[form])
    compile_rms_norm = getattr(module, "compile_rms_norm", None)
    if compile_rms_norm is None:
        return sorted(needed)
    return sorted(needed - set(inspect.signature(compile_rms_norm).parameters))

