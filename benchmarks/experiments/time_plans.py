#!/usr/bin/env python3
"""Time hand-written plans of the sample's kernel against the plan it picks and copy_; or count their registers.

The sample's kernel runs as it is, launched by the sample's launch_kernel: only the KernelPlan it receives differs. A
plan is written tTkK plus flags, e.g. t96k2 or t160k4sl:

    T threads per row, K vectors per thread,
    s  X staged in shared memory (needs 16-byte vectors),   l  W loaded after the reduction,
    b  (with s) each row copied in by one cp.async.bulk, counted in by an mbarrier (sm_90+),
    rR R rows per CTA (default: enough rows for 128 threads),
    qQ each of them Q rows in sequence (staged plans: all Q requested up front, each normalized once it is in),
    cC each row split over a cluster of C CTAs of T / C threads (X in registers, one row per CTA),
    mM ask ptxas for at least M CTAs per SM (the plan's launch bound: it sets ptxas's register budget).

    python3 benchmarks/experiments/time_plans.py --shapes 4096x1536,512x1536 --plans t96k2,t128k2 [--rounds 5]
    python3 benchmarks/experiments/time_plans.py --registers --hidden 1024 --plans t64k2,t64k2lm16   # no GPU

Timing: each round times copy_, the sample's own plan and every plan once, in a rotating order (CUDA-graph
replay, bench_rms_norm.py's timers); the table gives medians over rounds of time / copy_ and time / own plan.
--compile adds torch.compile (the benchmark's formula) to every round and a time / torch.compile column.
--registers compiles for sm_90a and prints what ptxas -v reports (registers, spills) and the CTAs per SM, and,
where nvdisasm is on PATH, how many global loads the SASS issues after a thread first waits for loaded data.
"""

import argparse
import pathlib
import re
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import rms_norm_plugin_cutedsl as sample  # noqa: E402
from support.check_kernel import compile_plan, ctas_per_sm, launch_shared_memory, ptxas_report  # noqa: E402

SPEC = re.compile(r"t(\d+)k(\d+)(s?)(b?)(l?)(?:r(\d+))?(?:q(\d+))?(?:c(\d+))?(?:m(\d+))?$")


def parse_plan(spec: str, hidden: int, elem_bytes: int):
    """The KernelPlan a spec such as t160k4sl names; ValueError if it cannot cover the row."""
    match = SPEC.match(spec)
    if not match:
        raise ValueError(f"plan {spec!r} is not of the form tTkK[s][b][l][rR][qQ][cC][mM]")
    threads, vecs, staged, bulk, late, rows, sequence, cluster, min_ctas = match.groups()
    threads, vecs = int(threads), int(vecs)
    own = sample.plan_kernel(hidden, elem_bytes)
    if threads > sample.WARP_THREADS and threads % sample.WARP_THREADS:
        raise ValueError(f"plan {spec!r}: a row of more than one warp takes whole warps (the sum of Step 3)")
    if threads * vecs * own.vec < hidden:
        raise ValueError(f"plan {spec!r} covers {threads * vecs * own.vec} elements, the row has {hidden}")
    if staged and own.vec * elem_bytes != sample.VECTOR_BYTES:
        raise ValueError(f"plan {spec!r} stages X, but hidden {hidden} gives {own.vec * elem_bytes}-byte vectors")
    if sequence and not staged:
        raise ValueError(f"plan {spec!r} puts rows in sequence, which needs s (X staged)")
    if bulk and not staged:
        raise ValueError(f"plan {spec!r} copies rows in bulk, which needs s (X staged)")
    if cluster and (staged or (rows and int(rows) != 1) or threads % (sample.WARP_THREADS * int(cluster))):
        raise ValueError(f"plan {spec!r} splits a row over a cluster: X in registers, one row per CTA, whole warps")
    rows = int(rows) if rows else 1 if cluster else max(1, 128 // threads)
    arrival = "bulk" if bulk else "cp.async" if staged else "registers"
    return sample.KernelPlan(hidden, elem_bytes, own.vec, threads, rows, vecs, arrival, early_weight=not late,
                             rows_in_sequence=int(sequence or 1), cluster_ctas=int(cluster or 1),
                             min_ctas_per_sm=int(min_ctas or 0))


def print_registers(args):
    for dtype in args.dtypes:
        for hidden in args.hidden:
            elem_bytes = sample.DTYPES[dtype].bytes
            own = sample.plan_kernel(hidden, elem_bytes)
            cases = [("own plan", own)] + [(spec, parse_plan(spec, hidden, elem_bytes)) for spec in args.plans]
            for name, plan in cases:
                compiled = compile_plan(sample, dtype, plan)
                registers, spills, late, loads = ptxas_report(compiled.__ptx__)
                ctas = ctas_per_sm(plan.cta_threads, registers, launch_shared_memory(compiled))
                order = f", {late} of {loads} global loads after the first wait for data" if loads is not None else ""
                print(f"{dtype} hidden {hidden} {name:>12} ({plan}): {registers} registers, {spills} bytes spilled, "
                      f"{ctas} CTAs of {plan.cta_threads} threads per SM{order}")


def time_shapes(args):
    import torch

    from bench_records import interleaved_rounds, median_ratio
    from bench_rms_norm import checked_cute_timer, graph_timer, torch_reference

    arch, compiled = sample.gpu_arch(), {}
    ratios = "/ copy_ | / own plan" + (" | / torch.compile" if args.compile else "")
    print(f"| dtype | tokens x hidden | plan | us | {ratios} (median of {args.rounds} rounds) |")
    print("|---" * (6 + args.compile) + "|")
    for dtype in args.dtypes:
        names = sample.DTYPES[dtype]
        for tokens, hidden in args.shapes:
            x = torch.randn(tokens, hidden, device="cuda", dtype=getattr(torch, names.torch))
            w = torch.rand(hidden, device="cuda") + 0.5
            y_copy = torch.empty_like(x)
            calls = {"copy_": lambda: y_copy.copy_(x), "own plan": sample.compile_rms_norm(dtype, hidden)}
            if args.compile:
                inductor = torch.compile(torch_reference, dynamic=False)
                calls["torch.compile"] = lambda: inductor(x, w)
            plans = {"own plan": str(sample.plan_kernel(hidden, names.bytes, tokens, sm90=sample.is_sm90(arch)))}
            for spec in args.plans:
                plan = parse_plan(spec, hidden, names.bytes)
                if (dtype, plan) not in compiled:  # one compilation serves every token count
                    compiled[dtype, plan] = compile_plan(sample, dtype, plan, arch)
                calls[spec], plans[spec] = compiled[dtype, plan], str(plan)
            timers, outputs = {}, {}
            for name, call in calls.items():
                if name in ("copy_", "torch.compile"):
                    timers[name] = graph_timer(call, tokens, hidden)
                    continue
                outputs[name] = torch.empty_like(x)  # every plan writes its own y, kept until the shape is timed
                timers[name] = checked_cute_timer(name, call, x, w, outputs[name], dtype)
            rounds = interleaved_rounds(timers, args.rounds)
            for name, times in rounds.items():
                print(f"| {dtype} | {tokens}x{hidden} | {name} {plans.get(name, '')} | {statistics.median(times):.2f} "
                      f"| {median_ratio(times, rounds['copy_']):.3f} | {median_ratio(times, rounds['own plan']):.3f} |"
                      + (f" {median_ratio(times, rounds['torch.compile']):.3f} |" if args.compile else ""),
                      flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=lambda s: s.split(","), required=True, help="comma-separated plan specs")
    parser.add_argument("--shapes", type=lambda s: [tuple(map(int, p.split("x"))) for p in s.split(",")],
                        default=[], help="TOKENSxHIDDEN,... to time")
    parser.add_argument("--hidden", type=lambda s: [int(h) for h in s.split(",")], default=[],
                        help="hidden sizes for --registers")
    parser.add_argument("--dtypes", type=lambda s: s.split(","), default=["float16"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--registers", action="store_true", help="ptxas register counts instead of timing")
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile (the benchmark's formula) in the same rounds, with a ratio column")
    args = parser.parse_args()
    try:
        for hidden in args.hidden + [h for _, h in args.shapes]:
            for dtype in args.dtypes:
                for spec in args.plans:
                    parse_plan(spec, hidden, sample.DTYPES[dtype].bytes)
    except (ValueError, KeyError) as exc:
        parser.error(str(exc))
    print_registers(args) if args.registers else time_shapes(args)


if __name__ == "__main__":
    main()
