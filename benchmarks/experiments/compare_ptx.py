#!/usr/bin/env python3
"""Compare this checkout's kernels with another checkout's as machine code, kernel by kernel,
without a GPU.

The one command behind "the kernel compiles to the same machine code as <commit>". Each side is one
file (benchmarks/kernel_files.py): by default this checkout's companion,
rms_norm_fused_cutedsl.py, against the other checkout's companion, or its sample where it has none
(a checkout from before the lesson/companion split); --new-file and --base-file name others. For
each case (target, X dtype, W dtype, hidden size, epsilon) and form (--forms: plain, residual, fp8,
residual_fp8), each side compiles both of its launchers with compile_rms_norm(..., keep_ptx=True):
the plugin's (plans_by_tokens=True, a kernel per plan of the token schedule) and the AOT flavor's
(plans_by_tokens=False, one kernel). Each PTX is cut into its kernels, paired in launch order, and a
pair is compared with the kernels' names replaced (a name carries the plan's tag, which a refactor
may spell differently). Where the PTX of a pair differs, ptxas -arch assembles each kernel and
nvdisasm -c lists its SASS; the pair is identical if the SASS, names replaced, is. A kernel that
only one side compiles, a launcher only one side refuses, or a kernel its launcher runs for other
token counts (where both sides have token_schedule) differs.

Cases: every --arch (default sm_90a and sm_80) with X float16, bfloat16 and float32 and W float32
at every --hidden size (default HIDDEN), plus W float16 and bfloat16 at those in MIXED_W_HIDDEN and
epsilon 1e-40 (below FLT_MIN: the kernel's plain rsqrt) at those in TINY_EPSILON_HIDDEN; every case
in every form (the FP8 forms need sm_89+: on sm_80 both sides refuse them, counted apart). It
prints a line per differing kernel, then "N of M kernels identical in PTX or SASS"; exit 0 if every
kernel is, 1 if any differs, 2 on a usage error. The cases run in a pool of --jobs processes.

    git worktree add /tmp/base <commit>          # or: git archive <commit> | tar x -C /tmp/base
    python3 benchmarks/experiments/compare_ptx.py /tmp/base [--forms plain,residual] \
        [--arch sm_90a sm_80] [--hidden 1024,4096] [--jobs 2]
    python3 benchmarks/experiments/compare_ptx.py --base-file /tmp/base/rms_norm_plugin_cutedsl.py

It needs ptxas (a CUDA toolkit, or PyPI's nvidia-cuda-nvcc) and nvdisasm (nvidia-cuda-nvdisasm) on
PATH for the pairs whose PTX differs; --ptx-only compares PTX alone (a pair whose PTX differs then
counts as differing).
"""

import argparse
import functools
import multiprocessing
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_rms_norm import parse_list  # noqa: E402
from kernel_files import (FORMS, add_side_arguments, load_kernel, missing_keywords,  # noqa: E402
                          side_files)

HIDDEN = (1, 7, 8, 64, 100, 256, 500, 512, 640, 768, 1000, 1024, 1152, 1472, 1536, 2048, 2056,
          2304, 2560, 3072, 4096, 4100, 4104, 5120, 6144, 6152, 7168, 8192, 8200, 9216, 10240,
          12288, 12800, 15360, 16384, 20000, 30720, 32768)
X_DTYPES = ("float16", "bfloat16", "float32")
MIXED_W_HIDDEN = (1000, 4096, 8192, 16384)  # W float16 and bfloat16 with every X dtype
TINY_EPSILON_HIDDEN = (1024, 4096, 16384)   # epsilon 1e-40, below FLT_MIN: the plain rsqrt
EPSILON, TINY_EPSILON = 1e-5, 1e-40
LAUNCHERS = {"plugin": True, "aot": False}  # launcher: compile_rms_norm's plans_by_tokens
ENTRY = re.compile(r"^\.visible \.entry (\w+)\(", re.M)

_SIDES = {}  # in each worker process: {"base": the base side's module, "new": the new side's}


def cases(archs, hidden):
    """(arch, X dtype, W dtype, hidden, epsilon) of every comparison: W float32 at every hidden
    size, mixed W and the tiny epsilon at those of MIXED_W_HIDDEN and TINY_EPSILON_HIDDEN among
    them."""
    out = [(a, d, "float32", h, EPSILON) for a in archs for d in X_DTYPES for h in hidden]
    out += [(a, d, w, h, EPSILON) for a in archs for d in X_DTYPES for w in ("float16", "bfloat16")
            for h in hidden if h in MIXED_W_HIDDEN]
    return out + [(a, d, "float32", h, TINY_EPSILON) for a in archs for d in X_DTYPES
                  for h in hidden if h in TINY_EPSILON_HIDDEN]


def kernels_of(ptx: str):
    """[(name, PTX of that kernel alone)]: the module's header (version, target, shared-memory
    declarations) and one .entry each, with every kernel name of the module replaced by KERNEL."""
    names = ENTRY.findall(ptx)
    starts = [m.start() for m in ENTRY.finditer(ptx)] + [len(ptx)]
    header = ptx[:starts[0]]
    return [(name, anonymous(header + ptx[a:b], names))
            for name, a, b in zip(names, starts, starts[1:])]


def anonymous(text: str, names) -> str:
    """text with each kernel name (and the names made from it: parameters, sections) replaced by
    KERNEL."""
    for name in sorted(names, key=len, reverse=True):
        text = text.replace(name, "KERNEL")
    return text


def sass_of(ptx: str, arch: str) -> str:
    """nvdisasm -c's listing of one kernel's PTX assembled by ptxas -arch, kernel names replaced."""
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = pathlib.Path(tmp, "k.ptx"), pathlib.Path(tmp, "k.cubin")
        src.write_text(ptx)
        subprocess.run(["ptxas", f"-arch={arch}", str(src), "-o", str(obj)], check=True,
                       capture_output=True)
        sass = subprocess.run(["nvdisasm", "-c", str(obj)], check=True, capture_output=True,
                              text=True).stdout
    return anonymous(sass, ENTRY.findall(ptx))


def load_sides(files: dict):
    """Worker initializer: import both sides' files, each under its own name."""
    for side, path in files.items():
        _SIDES[side] = load_kernel(path, f"compare_ptx_{side}")


def schedule_of(module, arch, dtype, hidden, plans_by_tokens, form):
    """[(plan tag, token counts)] of the launcher's kernels in launch order, or None where the
    module has no token_schedule (an older checkout)."""
    if not all(hasattr(module, f) for f in ("token_schedule", "plan_kernel", "is_sm90")):
        return None
    elem_bytes = module.DTYPES[dtype].bytes
    residual = FORMS[form].get("residual", False)
    if not plans_by_tokens:
        return [(str(module.plan_kernel(hidden, elem_bytes, sm90=False, residual=residual)),
                 ((None, None),))]
    schedule = module.token_schedule(hidden, elem_bytes, module.is_sm90(arch), residual,
                                     "y_scale" in FORMS[form])
    return [(str(plan), counts) for plan, counts in schedule]


def spans(counts) -> str:
    return ", ".join(f"{(fewer or 0) + 1}-{most}" if most else f"{(fewer or 0) + 1}+"
                     for fewer, most in counts)


def compare_launcher(case, form, launcher, sass: bool):
    """([(kernel, verdict)], whether both sides refuse the launcher) of one launcher of one form:
    verdict "ptx" or "sass" (identical there) or why the pair differs."""
    arch, dtype, w_dtype, hidden, epsilon = case
    plans_by_tokens = LAUNCHERS[launcher]
    kernels, refused = {}, {}
    for side, module in _SIDES.items():
        try:
            ptx = module.compile_rms_norm(dtype, hidden, epsilon, arch=arch, w_dtype=w_dtype,
                                          keep_ptx=True, plans_by_tokens=plans_by_tokens,
                                          **FORMS[form]).__ptx__
        except ValueError as exc:
            refused[side] = str(exc)
            continue
        kernels[side] = kernels_of(ptx)
    where = f"{form} form, {launcher} launcher"
    if len(refused) == 2:
        return [], True
    if refused:
        (side, why), = refused.items()
        return [(where, f"only the {side} side refuses it: {why}")], False
    schedules = {side: schedule_of(module, arch, dtype, hidden, plans_by_tokens, form)
                 for side, module in _SIDES.items()}
    base, new = kernels["base"], kernels["new"]
    verdicts = []
    for i in range(max(len(base), len(new))):
        label = f"{where} kernel {i + 1} of {len(new)}"
        if schedules["new"] and i < len(schedules["new"]):
            tag, counts = schedules["new"][i]
            label += f" ({tag}, tokens {spans(counts)})"
        base_counts, new_counts = (s[i][1] if s and i < len(s) else None
                                   for s in (schedules["base"], schedules["new"]))
        if i >= len(base) or i >= len(new):
            side = "new" if i >= len(base) else "base"
            verdicts.append((label, f"only the {side} side compiles it"))
        elif None not in (base_counts, new_counts) and base_counts != new_counts:
            verdicts.append((label, f"the base side runs it for tokens {spans(base_counts)}"))
        elif base[i][1] == new[i][1]:
            verdicts.append((label, "ptx"))
        elif not sass:
            verdicts.append((label, "PTX differs (SASS not compared: --ptx-only)"))
        elif sass_of(base[i][1], arch) == sass_of(new[i][1], arch):
            verdicts.append((label, "sass"))
        else:
            verdicts.append((label, "PTX and SASS differ"))
    return verdicts, False


def compare_case(case, forms, sass: bool):
    """([(kernel, verdict)], launchers both sides refuse) of one case in every form."""
    verdicts, both_refuse = [], 0
    for form in forms:
        for launcher in LAUNCHERS:
            found, refused = compare_launcher(case, form, launcher, sass)
            verdicts += found
            both_refuse += refused
    return verdicts, both_refuse


def hidden_sizes(text: str) -> list:
    """--hidden's comma-separated sizes; argparse turns the ValueError into a usage error."""
    return [int(h) for h in text.split(",")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_side_arguments(parser, "root of the other checkout (its companion, else its sample)")
    parser.add_argument("--forms", default=",".join(FORMS), metavar="F,...",
                        help=f"comma-separated, from {', '.join(FORMS)} (default all)")
    parser.add_argument("--arch", nargs="+", default=["sm_90a", "sm_80"],
                        help="targets (default sm_90a sm_80)")
    parser.add_argument("--hidden", type=hidden_sizes, default=list(HIDDEN), metavar="H,...",
                        help=f"comma-separated hidden sizes (default: the {len(HIDDEN)} of HIDDEN)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--ptx-only", action="store_true",
                        help="compare PTX only (no ptxas or nvdisasm needed)")
    # the default; older commands pass it
    parser.add_argument("--sass", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    files = side_files(parser, args, ROOT)
    forms = parse_list(parser, "--forms", args.forms, FORMS)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    missing = [tool for tool in ("ptxas", "nvdisasm") if shutil.which(tool) is None]
    if missing and not args.ptx_only:
        parser.error(f"{' and '.join(missing)} {'are' if len(missing) > 1 else 'is'} not on PATH "
                     "(pip install nvidia-cuda-nvcc nvidia-cuda-nvdisasm), or pass --ptx-only")
    load_sides(files)
    for side, module in _SIDES.items():
        lacks = missing_keywords(module, forms, also=("keep_ptx", "plans_by_tokens"))
        if lacks:
            parser.error(f"the {side} side's {files[side]} has no compile_rms_norm keyword "
                         f"{', '.join(lacks)}: compare a companion or a sample from before the "
                         "split")
    todo = cases(args.arch, args.hidden)
    print(f"comparing {files['base']} (base) with {files['new']} (new): {len(todo)} cases, "
          f"forms {', '.join(forms)}, both launchers each, "
          f"{'PTX' if args.ptx_only else 'PTX, then SASS where PTX differs'}", flush=True)
    started, compared, in_ptx, in_sass, differ, refused = time.perf_counter(), 0, 0, 0, 0, 0
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=load_sides, initargs=(files,)) as pool:
        compare = functools.partial(compare_case, forms=forms, sass=not args.ptx_only)
        for case, (verdicts, both_refuse) in zip(todo, pool.map(compare, todo)):
            compared, refused = compared + len(verdicts), refused + both_refuse
            arch, dtype, w_dtype, hidden, epsilon = case
            for kernel, verdict in verdicts:
                in_ptx += verdict == "ptx"
                in_sass += verdict == "sass"
                if verdict not in ("ptx", "sass"):
                    differ += 1
                    print(f"DIFFERENT {arch} X {dtype} W {w_dtype} hidden {hidden} epsilon "
                          f"{epsilon:g}, {kernel}: {verdict}", flush=True)
    both = f", {refused} launchers both sides refuse" if refused else ""
    print(f"{compared - differ} of {compared} kernels identical in PTX or SASS ({in_ptx} in PTX, "
          f"{in_sass} only in SASS; {len(todo)} cases{both}; "
          f"{time.perf_counter() - started:.0f} s)")
    sys.exit(1 if differ or not compared else 0)  # nothing compared supports no claim


if __name__ == "__main__":
    main()
