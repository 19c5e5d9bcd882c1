#!/usr/bin/env python3
"""Time the companion's fused forms' plans against FlashInfer's CuteDSL kernels at a few shapes.

The peers: with --residual, FlashInfer's fused_add_rmsnorm (Y in X's dtype; in place, R becomes S
and X becomes Y) or, with --fp8 too, fused_add_rmsnorm_quant; with --fp8 alone, rmsnorm_quant.

A table picks one plan per row size and token count; a fused form moves other bytes than the plain
norm (residual: 8 an element, read X and R, write S and Y; FP8: Y one byte an element), so the plan
that wins differs. Each plan of the fused companion's kernel (rms_norm_fused_cutedsl.py;
time_plans.py's spec: tTkK[s][b][l][rR][qQ][cC][mM], or "own" for the schedule's plan at that
count) is compiled in the form timed and run by CUDA-graph replay, cycling through L2-cold buffer
sets as bench_decoder.py does. Each plan's first output is checked before it is timed, as the
tables check it: a 16-bit Y against the float64 norm within the lesson's Y_TOLERANCE, an FP8 Y_q
against the FP8 of that norm (one rounding), S bit for bit. An output off is timed all the same,
marked *, and the script then exits 1. FlashInfer's output is not checked here; the tables
(bench_decoder.py, bench_quantized.py) check it. Each line gives a plan's median time over rounds
and the median of its per-round time / FlashInfer.

    python3 benchmarks/experiments/fused_plans.py --residual --shapes 512x4096 --plans own,t64k8s
    python3 benchmarks/experiments/fused_plans.py --fp8 --shapes 16384x4096 --plans own,t128k4
"""

import argparse
import dataclasses
import functools
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "experiments"))

import torch  # noqa: E402

import bench_decoder  # noqa: E402
import bench_quantized  # noqa: E402
import rms_norm_fused_cutedsl as fused  # noqa: E402
from rms_norm_plugin_cutedsl import Y_TOLERANCE, gpu_arch  # noqa: E402
from bench_decoder import EPS, buffer_sets, cycling  # noqa: E402
from bench_quantized import Y_SCALE  # noqa: E402
from bench_rms_norm import current_stream, cute_tensors, graph_timer, parse_shapes  # noqa: E402
from time_plans import compile_plan, parse_plan  # noqa: E402


def plan_of(spec, hidden, elem_bytes, tokens, residual):
    """The plan a spec names, in the form timed."""
    if spec == "own":
        return fused.plan_kernel(hidden, elem_bytes, tokens, True, residual)
    return dataclasses.replace(parse_plan(spec, hidden, elem_bytes), residual=residual)


@functools.lru_cache(maxsize=None)
def launcher_of(plan, dtype, fp8):
    """One plan compiled alone; it serves every token count, so shapes of one hidden size share
    it (a graph replays its kernel: the cache also keeps the module loaded)."""
    return compile_plan(plan, dtype, gpu_arch(), y_scale=Y_SCALE if fp8 else None)


def load_peer(fp8, residual):
    """FlashInfer's kernel for the form timed, and why not where it is missing."""
    if not fp8:
        return bench_decoder.load_flashinfer()
    kernels, why = bench_quantized.load_flashinfer()
    return (kernels["residual" if residual else "plain"] if kernels else None), why


def peer_call(peer, fp8, residual, x, r, w_lp, scale, keep):
    """One call of FlashInfer's kernel on fresh copies of the inputs it writes in place."""
    if not fp8:
        xi, ri = x.clone(), r.clone()
        keep.append((xi, ri))
        return lambda: peer(xi, ri, w_lp, EPS)
    y = torch.empty_like(x, dtype=torch.float8_e4m3fn)
    ri = r.clone()
    keep.append((y, ri))
    if residual:
        return lambda: peer(y, x, ri, w_lp, scale, EPS)
    return lambda: peer(y, x, w_lp, scale, EPS)


def output_misses(args, y, s, x, r, w) -> str:
    """What a plan's first output got wrong ('' if nothing): bench_decoder.py's check of a 16-bit
    Y, bench_quantized.py's of an FP8 Y_q."""
    if not args.fp8:
        return bench_decoder.misses(y, s, x, r, w, Y_TOLERANCE[args.dtype])
    expected_s = x + r if args.residual else None
    ref = bench_decoder.norm_of(x if expected_s is None else expected_s, w)
    outputs = (y, s) if args.residual else (y,)
    return bench_quantized.misses(outputs, ref, expected_s, fused.quantize_reference,
                                  bench_quantized.SINGLE_ROUNDING)


def timers(args, tokens, hidden, peer):
    """{column: timer} for the plans and FlashInfer at one shape, and the buffers they use."""
    dtype, fp8, residual = args.dtype, args.fp8, args.residual
    tdt = getattr(torch, dtype)
    elem_bytes = fused.DTYPES[dtype].bytes
    w = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16).float()
    w_lp = w.to(tdt)
    scale = torch.tensor([Y_SCALE], device="cuda")
    moved = (7 if residual else 3) if fp8 else 8
    sets = [(torch.randn(tokens, hidden, device="cuda", dtype=tdt),
             torch.randn(tokens, hidden, device="cuda", dtype=tdt))
            for _ in range(buffer_sets(tokens, hidden, moved))]
    keep = [w, w_lp, scale, sets]
    out = {}
    for spec in args.plans:
        plan = plan_of(spec, hidden, elem_bytes, tokens, residual)
        launcher = launcher_of(plan, dtype, fp8)
        calls, outputs = [], []
        for x, r in sets:
            y = torch.empty_like(x, dtype=torch.float8_e4m3fn if fp8 else tdt)
            s = torch.empty_like(x)
            outputs.append((y, s))
            tensors = cute_tensors(x, w, y, r, s)
            extra = tensors[3:] if residual else []
            calls.append(lambda t=tensors, e=extra, f=launcher: f(*t[:3], tokens, current_stream(),
                                                                    *e))
        keep.append(outputs)
        calls[0]()
        torch.cuda.synchronize()
        off = output_misses(args, *outputs[0], *sets[0], w)
        out[f"{spec} ({plan}){' *' if off else ''}"] = graph_timer(cycling(calls), tokens, hidden,
                                                                    len(calls))
    if peer is not None:
        calls = [peer_call(peer, fp8, residual, x, r, w_lp, scale, keep) for x, r in sets]
        out["flashinfer"] = graph_timer(cycling(calls), tokens, hidden, len(calls))
    return out, keep


def arguments(argv=None):
    """The command line, checked before any GPU work: a user's error ends here (exit 2)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", required=True, metavar="NxH,...")
    parser.add_argument("--plans", default="own", metavar="SPEC,...")
    parser.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16"))
    parser.add_argument("--residual", action="store_true", help="the residual form")
    parser.add_argument("--fp8", action="store_true", help="Y as FP8 E4M3")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if not (args.residual or args.fp8):
        parser.error("the plain 16-bit form's plans are timed by time_plans.py --plans")
    args.shapes = parse_shapes(args.shapes)
    if args.shapes is None:
        parser.error("--shapes takes TOKENSxHIDDEN,...")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    args.plans = args.plans.split(",")
    elem_bytes = fused.DTYPES[args.dtype].bytes
    try:
        for tokens, hidden in args.shapes:
            for spec in args.plans:
                plan_of(spec, hidden, elem_bytes, tokens, args.residual)
    except ValueError as exc:
        parser.error(str(exc))
    if not torch.cuda.is_available():
        parser.error("no CUDA GPU is visible: the plans are timed on one")
    return args


def main():
    args = arguments()
    peer, why = load_peer(args.fp8, args.residual)
    if why:
        print(f"FlashInfer: {why}")
    off = False
    for tokens, hidden in args.shapes:
        columns, _keep = timers(args, tokens, hidden, peer)
        off = off or any(name.endswith(" *") for name in columns)
        times = {name: [] for name in columns}
        for i in range(args.rounds):
            names = list(columns)
            for name in names[i % len(names):] + names[:i % len(names)]:
                times[name].append(columns[name]())
        base = times.get("flashinfer")
        for name, values in times.items():
            ratio = ""
            if base:
                ratios = [v / b for v, b in zip(values, base)]
                ratio = f"  / FlashInfer {statistics.median(ratios):.3f}"
            median = statistics.median(values)
            print(f"{tokens}x{hidden} {args.dtype} {name}: {median:.2f} us{ratio}", flush=True)
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
