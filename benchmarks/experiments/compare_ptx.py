#!/usr/bin/env python3
"""Compare this checkout's kernels with another checkout's as machine code, kernel by kernel, without a GPU.

The one command behind "the kernel compiles to the same machine code as <commit>". For each case (target, X
dtype, W dtype, hidden size, epsilon) each checkout's sample compiles both of its launchers with
compile_rms_norm(..., keep_ptx=True): the plugin's (plans_by_tokens=True, a kernel per plan of the token
schedule) and the AOT flavor's (plans_by_tokens=False, one kernel). Each PTX is cut into its kernels, paired in
launch order, and a pair is compared with the kernels' names replaced (a name carries the plan's tag, which a
refactor may spell differently). Where the PTX of a pair differs, ptxas -arch assembles each kernel and
nvdisasm -c lists its SASS; the pair is identical if the SASS, names replaced, is. A kernel that only one
checkout compiles, a case only one of them refuses, or a kernel its launcher runs for other token counts
(where both samples have token_schedule) differs.

Cases: every --arch (default sm_90a and sm_80) with X float16, bfloat16 and float32 and W float32 at every
--hidden size (default HIDDEN), plus W float16 and bfloat16 at those in MIXED_W_HIDDEN and epsilon 1e-40
(below FLT_MIN: the kernel's plain rsqrt) at those in TINY_EPSILON_HIDDEN. It prints a line per differing
kernel, then "N of M kernels identical in PTX or SASS"; exit 0 if every kernel is, 1 if any differs, 2 on a
usage error. The cases run in a pool of --jobs processes.

    git worktree add /tmp/base <commit>          # or: git archive <commit> | tar x -C /tmp/base
    python3 benchmarks/experiments/compare_ptx.py /tmp/base [--arch sm_90a sm_80] [--hidden 1024,4096] [--jobs 2]

It needs ptxas (a CUDA toolkit, or PyPI's nvidia-cuda-nvcc) and nvdisasm (nvidia-cuda-nvdisasm) on PATH for the
pairs whose PTX differs; --ptx-only compares PTX alone (a pair whose PTX differs then counts as differing).
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

HIDDEN = (1, 7, 8, 64, 100, 256, 500, 512, 640, 768, 1000, 1024, 1152, 1472, 1536, 2048, 2056, 2304, 2560, 3072,
          4096, 4100, 4104, 5120, 6144, 6152, 7168, 8192, 8200, 9216, 10240, 12288, 12800, 15360, 16384, 20000,
          30720, 32768)
X_DTYPES = ("float16", "bfloat16", "float32")
MIXED_W_HIDDEN = (1000, 4096, 8192, 16384)  # W float16 and bfloat16 with every X dtype
TINY_EPSILON_HIDDEN = (1024, 4096, 16384)   # epsilon 1e-40, below FLT_MIN: the plain rsqrt
EPSILON, TINY_EPSILON = 1e-5, 1e-40
LAUNCHERS = {"plugin": True, "aot": False}  # launcher: compile_rms_norm's plans_by_tokens
ENTRY = re.compile(r"^\.visible \.entry (\w+)\(", re.M)

_SAMPLES = {}  # in each worker process: {"base": the other checkout's sample, "new": this checkout's}


def cases(archs, hidden):
    """(arch, X dtype, W dtype, hidden, epsilon) of every comparison: W float32 at every hidden size, mixed W and
    the tiny epsilon at those of MIXED_W_HIDDEN and TINY_EPSILON_HIDDEN among them."""
    out = [(a, d, "float32", h, EPSILON) for a in archs for d in X_DTYPES for h in hidden]
    out += [(a, d, w, h, EPSILON) for a in archs for d in X_DTYPES for w in ("float16", "bfloat16")
            for h in hidden if h in MIXED_W_HIDDEN]
    return out + [(a, d, "float32", h, TINY_EPSILON) for a in archs for d in X_DTYPES for h in hidden
                  if h in TINY_EPSILON_HIDDEN]


def kernels_of(ptx: str):
    """[(name, PTX of that kernel alone)]: the module's header (version, target, shared-memory declarations) and
    one .entry each, with every kernel name of the module replaced by KERNEL."""
    names = ENTRY.findall(ptx)
    starts = [m.start() for m in ENTRY.finditer(ptx)] + [len(ptx)]
    header = ptx[:starts[0]]
    return [(name, anonymous(header + ptx[a:b], names)) for name, a, b in zip(names, starts, starts[1:])]


def anonymous(text: str, names) -> str:
    """text with each kernel name (and the names made from it: parameters, sections) replaced by KERNEL."""
    for name in sorted(names, key=len, reverse=True):
        text = text.replace(name, "KERNEL")
    return text


def sass_of(ptx: str, arch: str) -> str:
    """nvdisasm -c's listing of one kernel's PTX assembled by ptxas -arch, kernel names replaced."""
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = pathlib.Path(tmp, "k.ptx"), pathlib.Path(tmp, "k.cubin")
        src.write_text(ptx)
        subprocess.run(["ptxas", f"-arch={arch}", str(src), "-o", str(obj)], check=True, capture_output=True)
        sass = subprocess.run(["nvdisasm", "-c", str(obj)], check=True, capture_output=True, text=True).stdout
    return anonymous(sass, ENTRY.findall(ptx))


def load_samples(base: pathlib.Path, new: pathlib.Path):
    """Worker initializer: import both checkouts' samples from their files, each under its own name."""
    from support.check_kernel import load_module

    _SAMPLES["base"] = load_module(base / "rms_norm_plugin_cutedsl.py", "sample_base")
    _SAMPLES["new"] = load_module(new / "rms_norm_plugin_cutedsl.py", "sample_new")


def schedule_of(sample, arch, dtype, hidden, plans_by_tokens):
    """[(plan tag, token counts)] of the launcher's kernels in launch order, or None where the sample has no
    token_schedule (an older checkout)."""
    if not all(hasattr(sample, f) for f in ("token_schedule", "plan_kernel", "is_sm90")):
        return None
    elem_bytes = sample.DTYPES[dtype].bytes
    if not plans_by_tokens:
        return [(str(sample.plan_kernel(hidden, elem_bytes, sm90=False)), ((None, None),))]
    schedule = sample.token_schedule(hidden, elem_bytes, sm90=sample.is_sm90(arch))
    return [(str(plan), counts) for plan, counts in schedule]


def spans(counts) -> str:
    return ", ".join(f"{(fewer or 0) + 1}-{most}" if most else f"{(fewer or 0) + 1}+" for fewer, most in counts)


def compare_case(case, sass: bool):
    """([(kernel, verdict)], launchers both samples refuse): verdict "ptx" or "sass" (identical there) or why the
    pair differs."""
    arch, dtype, w_dtype, hidden, epsilon = case
    verdicts, both_refuse = [], 0
    for launcher, plans_by_tokens in LAUNCHERS.items():
        kernels, refused = {}, {}
        for side, sample in _SAMPLES.items():
            try:
                ptx = sample.compile_rms_norm(dtype, hidden, epsilon, arch=arch, w_dtype=w_dtype, keep_ptx=True,
                                              plans_by_tokens=plans_by_tokens).__ptx__
            except ValueError as exc:
                refused[side] = str(exc)
                continue
            kernels[side] = kernels_of(ptx)
        if len(refused) == 2:
            both_refuse += 1
            continue
        if refused:
            (side, why), = refused.items()
            verdicts.append((f"{launcher} launcher", f"only the {side} sample refuses it: {why}"))
            continue
        schedules = {side: schedule_of(s, arch, dtype, hidden, plans_by_tokens) for side, s in _SAMPLES.items()}
        base, new = kernels["base"], kernels["new"]
        for i in range(max(len(base), len(new))):
            label = f"{launcher} launcher kernel {i + 1} of {len(new)}"
            if schedules["new"] and i < len(schedules["new"]):
                tag, counts = schedules["new"][i]
                label += f" ({tag}, tokens {spans(counts)})"
            base_counts, new_counts = (s[i][1] if s and i < len(s) else None for s in schedules.values())
            if i >= len(base) or i >= len(new):
                verdicts.append((label, f"only the {'new' if i >= len(base) else 'base'} sample compiles it"))
            elif None not in (base_counts, new_counts) and base_counts != new_counts:
                verdicts.append((label, f"the base sample runs it for tokens {spans(base_counts)}"))
            elif base[i][1] == new[i][1]:
                verdicts.append((label, "ptx"))
            elif not sass:
                verdicts.append((label, "PTX differs (SASS not compared: --ptx-only)"))
            elif sass_of(base[i][1], arch) == sass_of(new[i][1], arch):
                verdicts.append((label, "sass"))
            else:
                verdicts.append((label, "PTX and SASS differ"))
    return verdicts, both_refuse


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=pathlib.Path, help="root of the other checkout, where its sample is")
    parser.add_argument("--arch", nargs="+", default=["sm_90a", "sm_80"], help="targets (default sm_90a sm_80)")
    parser.add_argument("--hidden", type=lambda s: [int(h) for h in s.split(",")], default=list(HIDDEN),
                        metavar="H,...", help=f"comma-separated hidden sizes (default: the {len(HIDDEN)} of HIDDEN)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--ptx-only", action="store_true", help="compare PTX only (no ptxas or nvdisasm needed)")
    parser.add_argument("--sass", action="store_true", help=argparse.SUPPRESS)  # the default; older commands pass it
    args = parser.parse_args()
    if not (args.base / "rms_norm_plugin_cutedsl.py").is_file():
        parser.error(f"{args.base} holds no rms_norm_plugin_cutedsl.py")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    missing = [tool for tool in ("ptxas", "nvdisasm") if shutil.which(tool) is None]
    if missing and not args.ptx_only:
        parser.error(f"{' and '.join(missing)} {'are' if len(missing) > 1 else 'is'} not on PATH (pip install "
                     "nvidia-cuda-nvcc nvidia-cuda-nvdisasm), or pass --ptx-only")
    todo = cases(args.arch, args.hidden)
    print(f"comparing {args.base.resolve()} with {ROOT}: {len(todo)} cases, both launchers each, "
          f"{'PTX' if args.ptx_only else 'PTX, then SASS where PTX differs'}", flush=True)
    started, compared, in_ptx, in_sass, differ, refused = time.perf_counter(), 0, 0, 0, 0, 0
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"), initializer=load_samples,
                             initargs=(args.base.resolve(), ROOT)) as pool:
        compare = functools.partial(compare_case, sass=not args.ptx_only)
        for case, (verdicts, both_refuse) in zip(todo, pool.map(compare, todo)):
            compared, refused = compared + len(verdicts), refused + both_refuse
            arch, dtype, w_dtype, hidden, epsilon = case
            for kernel, verdict in verdicts:
                in_ptx += verdict == "ptx"
                in_sass += verdict == "sass"
                if verdict not in ("ptx", "sass"):
                    differ += 1
                    print(f"DIFFERENT {arch} X {dtype} W {w_dtype} hidden {hidden} epsilon {epsilon:g}, {kernel}: "
                          f"{verdict}", flush=True)
    print(f"{compared - differ} of {compared} kernels identical in PTX or SASS ({in_ptx} in PTX, {in_sass} only in "
          f"SASS; {len(todo)} cases" + (f", {refused} launchers both samples refuse" if refused else "")
          + f"; {time.perf_counter() - started:.0f} s)")
    sys.exit(1 if differ or not compared else 0)  # nothing compared supports no claim


if __name__ == "__main__":
    main()
