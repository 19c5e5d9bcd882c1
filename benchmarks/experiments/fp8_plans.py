#!/usr/bin/env python3
"""Time the companion's FP8 form's plans against FlashInfer's norm-and-quantize kernels at a few
shapes.

FlashInfer's rmsnorm_quant, or fused_add_rmsnorm_quant with --residual.

The FP8 form writes one byte per element of Y instead of two: at many tokens a row costs 3 bytes an
element (plain) or 7 (residual) instead of 4 or 8, so the plan the 16-bit table picked may not be
the fastest one. Each plan of the fused companion's kernel (rms_norm_fused_cutedsl.py;
time_plans.py's spec: tTkK[s][b][l][rR][qQ][cC][mM], or "own" for the schedule's plan at that
count) is compiled in the FP8 form and timed by CUDA-graph replay, cycling through L2-cold buffer
sets as benchmarks/bench_quantized.py does; the table gives medians over rounds of time /
FlashInfer.

    python3 benchmarks/experiments/fp8_plans.py --shapes 16384x4096 --plans own,t128k4,t64k8
"""

import argparse
import dataclasses
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "experiments"))

import torch  # noqa: E402

import rms_norm_fused_cutedsl as fused  # noqa: E402
from rms_norm_plugin_cutedsl import gpu_arch  # noqa: E402
from bench_decoder import EPS, buffer_sets, cycling  # noqa: E402
from bench_quantized import Y_SCALE, load_flashinfer  # noqa: E402
from bench_rms_norm import current_stream, cute_tensors, graph_timer, parse_shapes  # noqa: E402
from time_plans import compile_plan, parse_plan  # noqa: E402


def plan_of(spec, hidden, elem_bytes, tokens, residual):
    """The plan a spec names, in the form timed."""
    if spec == "own":
        return fused.plan_kernel(hidden, elem_bytes, tokens, True, residual)
    return dataclasses.replace(parse_plan(spec, hidden, elem_bytes), residual=residual)


def timers(dtype, tokens, hidden, specs, residual, flashinfer):
    """{column: timer} for the plans and FlashInfer at one shape, and the buffers they use."""
    tdt = getattr(torch, dtype)
    elem_bytes = fused.DTYPES[dtype].bytes
    w = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16).float()
    w_lp = w.to(tdt)
    scale = torch.tensor([Y_SCALE], device="cuda")
    sets = [(torch.randn(tokens, hidden, device="cuda", dtype=tdt),
             torch.randn(tokens, hidden, device="cuda", dtype=tdt))
            for _ in range(buffer_sets(tokens, hidden, 7 if residual else 3))]
    keep = [w, w_lp, scale, sets]
    out = {}
    for spec in specs:
        plan = plan_of(spec, hidden, elem_bytes, tokens, residual)
        launcher = compile_plan(plan, dtype, gpu_arch(), y_scale=Y_SCALE)
        keep.append(launcher)  # a graph replays its kernel: the module must stay loaded
        calls = []
        for x, r in sets:
            y = torch.empty_like(x, dtype=torch.float8_e4m3fn)
            s = torch.empty_like(x)
            keep.append((y, s))
            tensors = cute_tensors(x, w, y, r, s)
            extra = tensors[3:] if residual else []
            calls.append(lambda t=tensors, e=extra, f=launcher: f(*t[:3], tokens, current_stream(),
                                                                    *e))
        out[f"{spec} ({plan})"] = graph_timer(cycling(calls), tokens, hidden, len(calls))
    if flashinfer is not None:
        calls = []
        for x, r in sets:
            y = torch.empty_like(x, dtype=torch.float8_e4m3fn)
            ri = r.clone()
            keep.append((y, ri))
            if residual:
                peer = flashinfer["residual"]
                calls.append(lambda y=y, x=x, r=ri: peer(y, x, r, w_lp, scale, EPS))
            else:
                calls.append(lambda y=y, x=x: flashinfer["plain"](y, x, w_lp, scale, EPS))
        out["flashinfer"] = graph_timer(cycling(calls), tokens, hidden, len(calls))
    return out, keep


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", required=True, metavar="NxH,...")
    parser.add_argument("--plans", default="own", metavar="SPEC,...")
    parser.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16"))
    parser.add_argument("--residual", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    flashinfer, why = load_flashinfer()
    if why:
        print(f"FlashInfer: {why}")
    for tokens, hidden in parse_shapes(args.shapes):
        columns, _keep = timers(args.dtype, tokens, hidden, args.plans.split(","), args.residual,
                                flashinfer)
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
            print(f"{tokens}x{hidden} {args.dtype} {name}: {median:.2f} us{ratio}")


if __name__ == "__main__":
    main()
