#!/usr/bin/env python3
"""The companion's residual form's candidate plans for the mid token counts, timed against the mid
plan, fp16, sm_90.

The decoder table (bench_decoder.py) found the residual form behind at 512 tokens. This times, at
512 and 1024 tokens, the mid plan of the fused companion's kernel (rms_norm_fused_cutedsl.py: two
staged rows of X and R per CTA, in turn, as table_plan builds it) against one other candidate,
each plan compiled alone through compile_launcher and timed by CUDA-graph replay over 8 sets of
buffers (inputs not in L2, as in bench_decoder.py), in interleaved rounds:

    mid_one_row   the mid plan with one row per CTA and the line's launch bound of 2 CTAs/SM
    many          the many-token plan (what the table runs above the mid counts)
    few           the few-token plan (what it runs up to FEW_TOKENS)
    mid_no_bound  the mid plan without its launch bound
    cluster_2     the row over a cluster of 2 CTAs, W first

One candidate per process: a plan that faults on the GPU takes only its own run down.

    python3 benchmarks/experiments/residual_plans.py CANDIDATE HIDDEN[,HIDDEN...]
"""

import argparse
import dataclasses
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import rms_norm_fused_cutedsl as fused  # noqa: E402
from bench_decoder import cycling  # noqa: E402
from bench_records import interleaved_rounds, median_ratio  # noqa: E402
from bench_rms_norm import current_stream, cute_tensors, graph_timer  # noqa: E402
from time_plans import compile_plan  # noqa: E402

TOKENS = (512, 1024)
SETS = 8
CANDIDATES = ("mid_one_row", "many", "few", "mid_no_bound", "cluster_2")


def candidates(hidden, tokens):
    """{name: plan} for fp16 rows on sm_90, the residual form."""
    line = fused.row_plan(hidden, 2)
    # The mid plan as table_plan builds it (two staged rows in turn), whether or not the table
    # runs it.
    arrival = "bulk" if hidden * 2 > fused.BULK_ROW_BYTES else "cp.async"
    mid = fused.fit_registers(fused.split_row(
        hidden, 2, line.mid[1], line, arrival=arrival, rows_in_sequence=fused.ROWS_IN_SEQUENCE,
        residual=True), fused.FIT_STEPS)
    return {
        "mid": mid,
        "mid_one_row": fused.fit_registers(
            dataclasses.replace(mid, rows_in_sequence=1, min_ctas_per_sm=2), fused.FIT_STEPS),
        "many": fused.plan_kernel(hidden, 2, None, True, True),
        "few": fused.plan_kernel(hidden, 2, fused.FEW_TOKENS, True, True),
        "mid_no_bound": dataclasses.replace(mid, min_ctas_per_sm=0),
        "cluster_2": fused.fit_registers(
            fused.split_row(hidden, 2, 4, line, ctas=2, residual=True, early_weight=True),
            fused.FIT_STEPS),
    }


def timer(plan, tokens, hidden):
    """A graph timer of one plan's launcher cycling through SETS sets of buffers."""
    kernel = compile_plan(plan, "float16", "sm_90a")
    w = torch.rand(hidden, device="cuda") + 0.5
    calls, keep = [], [w]
    for _ in range(SETS):
        x, r = (torch.randn(tokens, hidden, device="cuda", dtype=torch.float16) for _ in range(2))
        y, s = torch.empty_like(x), torch.empty_like(x)
        keep.append((x, r, y, s))
        fx, fw, fy, fr, fs = cute_tensors(x, w, y, r, s)

        def call(fx=fx, fw=fw, fy=fy, fr=fr, fs=fs):
            kernel(fx, fw, fy, tokens, current_stream(), fr, fs)

        calls.append(call)
    return graph_timer(cycling(calls), tokens, hidden, len(calls)), keep


def hidden_sizes(text: str) -> list:
    """HIDDEN[,HIDDEN...]; argparse turns the ValueError into a usage error."""
    return [int(h) for h in text.split(",")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidate", choices=CANDIDATES, help="the plan timed against the mid plan")
    parser.add_argument("hiddens", type=hidden_sizes, metavar="HIDDEN[,HIDDEN...]")
    args = parser.parse_args()
    name = args.candidate
    for hidden in args.hiddens:
        for tokens in TOKENS:
            plans = candidates(hidden, tokens)
            timers, keep = {}, []
            for label in ("mid", name):
                timers[label], buffers = timer(plans[label], tokens, hidden)
                keep.append(buffers)
            times = interleaved_rounds(timers, 5)
            ratio = median_ratio(times[name], times["mid"])
            print(f"{tokens}x{hidden} {name} {plans[name]}: "
                  f"{statistics.median(times[name]):.2f} us, mid {plans['mid']}: "
                  f"{statistics.median(times['mid']):.2f} us, ratio {ratio:.3f}", flush=True)


if __name__ == "__main__":
    main()
