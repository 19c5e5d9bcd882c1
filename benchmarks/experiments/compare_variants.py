#!/usr/bin/env python3
"""Time the sample's kernel against the variants in variants.py on one GPU, interleaved.

For every shape: each variant is checked against a float64 reference (output
poisoned with NaN first), then copy_ and every variant are timed by CUDA-graph
replay (benchmarks/bench_rms_norm.py's time_device) in --rounds interleaved
rounds, so slow drift of the shared machine hits all of them alike. Printed:
median us and median (min-max) ratio to copy_. fp16 X/Y (--dtype bfloat16 for
bf16), fp32 W, eps 1e-5.

    python3 benchmarks/experiments/compare_variants.py                 # the NOTES.md table
    python3 benchmarks/experiments/compare_variants.py --once 4096x4096  # one launch each, for ncu
                                                   # (after two of torch.add(x, 0, out=y), a copy-shaped kernel)
    ... --rotate-mb 512   # no call finds the previous call's X in L2
    ... --pipeline        # each call between a producer of X and a consumer of Y
"""

import argparse
import math
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import cuda.bindings.driver as cuda  # noqa: E402
from cutlass.cute.runtime import from_dlpack  # noqa: E402

import variants  # noqa: E402
from bench_rms_norm import time_device, time_eager  # noqa: E402

s = variants.s
EPS = 1e-5
SHAPES = ["1x1024", "128x1024", "512x1024", "4096x100", "4096x1024", "2048x4096", "4096x4096", "8192x4096",
          "16384x4096", "4096x8192", "4096x16384", "32768x8192"]


def build(name, hidden, tokens, patched, dtype):
    """(callable(prep, stream), label) for one variant at one shape."""
    plan = s.plan_kernel(hidden)
    split = (plan.threads_per_row, plan.rows_per_cta, plan.vecs_per_thread)
    groups = (tokens + plan.rows_per_cta - 1) // plan.rows_per_cta
    if name == "base":
        k = s.compile_rms_norm(dtype, hidden, EPS)
        return lambda p, st: k(*p, tokens, st)
    if name in patched:
        k = patched[name].compile_rms_norm(dtype, hidden, EPS)
        return lambda p, st: k(*p, tokens, st)
    if name == "P":
        k = variants.compile_p(dtype, hidden, *split)
        return lambda p, st: k(*p, tokens, groups, st)
    if name.startswith("P-k"):  # persistent: k CTAs per SM
        per_sm = int(name[3:])
        grid = min(groups, per_sm * torch.cuda.get_device_properties(0).multi_processor_count)
        k = variants.compile_p(dtype, hidden, *split)
        return lambda p, st: k(*p, tokens, grid, st)
    if name.startswith("P-min"):  # ask ptxas for at least N CTAs per SM (nvvm.minctasm)
        k = variants.compile_p(dtype, hidden, *split, minb=int(name[5:]))
        return lambda p, st: k(*p, tokens, groups, st)
    if name.startswith("B"):  # B<threads per row>x<rows per CTA>[L: W after the reduction][m<N>: N CTAs/SM hint]
        m = re.fullmatch(r"B(\d+)x(\d+)(L?)(?:m(\d+))?(S?)", name)  # [S: X staged in shared memory]
        tpr, rpc = int(m[1]), int(m[2])
        k = variants.compile_split(dtype, hidden, tpr, rpc, not m[3], int(m[4] or 0), bool(m[5]))
        return lambda p, st: k(*p, tokens, st)
    if name == "S":
        k = variants.compile_s(dtype, hidden, *split)
        return lambda p, st: k(*p, tokens, st)
    raise SystemExit(f"unknown variant {name!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default="base,P,S,wfirst")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16", help="X and Y (W is fp32)")
    parser.add_argument("--once", metavar="NxH", help="launch every variant twice at this shape and exit (for ncu)")
    parser.add_argument("--rotate-mb", type=int, default=0,
                        help="cycle each timed call through enough X/Y pairs to touch this many MB, so no call finds "
                             "the previous call's X in L2 (0: one pair, as TensorRT's same-buffer calls would)")
    parser.add_argument("--pipeline", action="store_true",
                        help="time each call between a producer that writes X and a consumer that reads Y (both "
                             "torch.add copies), as inside a network; copy_ takes the middle place for the ratio")
    args = parser.parse_args()
    names = args.variants.split(",")
    loaders = {"wfirst": variants.load_w_first_sample, "chain": variants.load_chain_sample,
               "tree": variants.load_tree_sample, "xre": variants.load_reload_sample,
               "xre_wfirst": variants.load_reload_w_first_sample, "xpk": variants.load_repack_sample,
               "x64": variants.load_half_vector_sample, "regs": variants.load_registers_sample,
               "guard": variants.load_guarded_rsqrt_sample, "n0": variants.load_no_zero_sample,
               "s2": variants.load_chain2_sample, "t2": variants.load_tree2_sample}
    loaders.update({name: (lambda name=name: variants.load_cache_hint_sample(name)) for name in variants._CACHE_HINTS})
    patched = {name: loaders[name]() for name in names if name in loaders}
    shapes = [args.once] if args.once else args.shapes.split(",")
    print(f"# {torch.cuda.get_device_name()}; {args.dtype}; variants {names}; ratio = median time / median copy_ time "
          f"(min-max over {args.rounds} rounds)", flush=True)
    for shape in shapes:
        tokens, hidden = map(int, shape.split("x"))
        x = torch.randn(tokens, hidden, device="cuda", dtype=getattr(torch, args.dtype))
        w = torch.rand(hidden, device="cuda") + 0.5
        y = torch.empty_like(x)
        ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + EPS) * w.double()
        rtol, atol = s.TOLERANCE[args.dtype]
        prep = tuple(from_dlpack(t, assumed_align=16) for t in (x, w, y))
        pairs = [(x, y)] + [(torch.randn_like(x), torch.empty_like(y))
                            for _ in range(math.ceil(args.rotate_mb * 2**20 / (2 * x.nbytes)) - 1)]
        preps = [prep] + [(from_dlpack(a, assumed_align=16), prep[1], from_dlpack(b, assumed_align=16))
                          for a, b in pairs[1:]]
        fns = {}
        for name in names:
            if name == "add":  # reference point, not a variant: a copy-shaped elementwise kernel
                fns[name] = lambda: [torch.add(a, 0, out=b) for a, b in pairs]
                continue
            if name == "compile":  # reference point: torch.compile of the same formula, as in bench_rms_norm.py
                compiled = torch.compile(lambda x, w: (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True)
                                                                               + EPS) * w).to(x.dtype), dynamic=False)
                compiled(x, w)
                fns[name] = lambda compiled=compiled: [compiled(a, w) for a, _ in pairs]
                continue
            run = build(name, hidden, tokens, patched, args.dtype)
            y.fill_(float("nan"))
            run(prep, cuda.CUstream(torch.cuda.current_stream().cuda_stream))
            torch.cuda.synchronize()
            bad = ((y.double() - ref).abs() > atol + rtol * ref.abs()).sum().item() + y.isnan().sum().item()
            if bad:
                raise SystemExit(f"{name} is wrong at {shape}: {bad} elements out of tolerance")
            fns[name] = lambda run=run: [run(p, cuda.CUstream(torch.cuda.current_stream().cuda_stream)) for p in preps]
        if args.once:  # and a copy-shaped elementwise kernel to profile beside them
            for fn in [lambda: torch.add(x, 0, out=y)] * 2 + list(fns.values()):
                fn()
            torch.cuda.synchronize()
            return
        if args.pipeline:
            x_src, z = x.clone(), torch.empty_like(y)
            fns = {k: (lambda fn=fn: (torch.add(x_src, 0, out=x), fn(), torch.add(y, 0, out=z)))
                   for k, fn in fns.items()}
        times = {k: [] for k in fns}
        copies = []
        for _ in range(args.rounds):
            copy = lambda: [b.copy_(a) for a, b in pairs]  # noqa: E731
            if args.pipeline:
                copy = lambda: (torch.add(x_src, 0, out=x), y.copy_(x), torch.add(y, 0, out=z))  # noqa: E731
            copies.append(min(time_device(copy, tokens, hidden), time_eager(copy, tokens, hidden)) / len(pairs))
            for k, fn in fns.items():
                times[k].append(time_device(fn, tokens, hidden) / len(pairs))
        c = statistics.median(copies)
        cells = [f"{k} {statistics.median(v):.2f} ({statistics.median(v) / c:.3f}; {min(v) / c:.3f}-{max(v) / c:.3f})"
                 for k, v in times.items()]
        print(f"{shape}{f' ({len(pairs)} X/Y pairs)' if len(pairs) > 1 else ''}: copy_ {c:.2f} | " + " | ".join(cells),
              flush=True)


if __name__ == "__main__":
    main()
