#!/usr/bin/env python3
"""Time a copy of the lesson against the lesson, or plans of the companion's kernel against its own;
or count their registers.

A copy (--copy FILE): a copy of the lesson, rms_norm_plugin_cutedsl.py, e.g. a LayerNorm made from
it, against the lesson. For each shape and dtype, each launcher runs whole, with the one plan its
own plan_kernel gives the row, on the inputs its own make_inputs makes (a copy with a bias takes X,
W and B). The script calls only the hooks every copy keeps: compile_launcher, plan_kernel,
gpu_arch, make_inputs, DTYPES and DEFAULT_EPSILON. Each launcher's Y starts as NaN and must come
out finite: the copy's math is its own, so that is all that is checked. The table gives, per shape
and dtype, medians over rounds of copy / copy_, lesson / copy_ and copy / lesson. --registers (no
GPU needed) lists the copy's plan and the lesson's.

    python3 benchmarks/experiments/time_plans.py --copy my_layer_norm.py --shapes 4096x4096,1x8192
    python3 benchmarks/experiments/time_plans.py --registers --copy my_layer_norm.py --hidden 4096

Plans (--plans): the fused companion's kernel (rms_norm_fused_cutedsl.py) runs as it is, launched
by its launch_kernel: only the FusedPlan it receives differs. A plan is written tTkK plus flags,
e.g. t96k2 or t160k4sl:

    T threads per row, K vectors per thread,
    s  X staged in shared memory (needs 16-byte vectors),   l  W loaded after the reduction,
    b  (with s) each row copied in by one cp.async.bulk, counted in by an mbarrier (sm_90+),
    rR R rows per CTA (default: enough rows for 128 threads),
    qQ each of them Q rows in sequence (staged plans: all Q requested up front, each normalized
       once it is in),
    cC each row split over a cluster of C CTAs of T / C threads (X in registers, one row per CTA),
    mM ask ptxas for at least M CTAs per SM (the plan's launch bound: it sets ptxas's register
       budget).

    python3 benchmarks/experiments/time_plans.py --shapes 4096x1536,512x1536 --plans t96k2,t128k2
    python3 benchmarks/experiments/time_plans.py --registers --hidden 1024 --plans t64k2,t64k2lm16

Timing: each round times copy_, the lesson and the copy, or copy_, the companion's own plan and
every plan, once each in a rotating order (CUDA-graph replay, bench_rms_norm.py's timers), for
--rounds rounds (default 5) and each of --dtypes (default float16). The plans' table gives medians
over rounds of time / copy_ and time / own plan; --compile adds torch.compile (the benchmark's
formula) to their rounds and a time / torch.compile column. --registers compiles for sm_90a and prints what
ptxas -v reports (registers, spills) and the CTAs per SM, and, where nvdisasm is on PATH, how many
global loads the SASS issues after a thread first waits for loaded data.
"""

import argparse
import importlib.machinery
import importlib.util
import math
import pathlib
import re
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# The lesson first: a package it lacks is then named in its one sentence
import rms_norm_plugin_cutedsl as lesson  # noqa: E402
import rms_norm_fused_cutedsl as fused  # noqa: E402

import cuda.bindings.driver as cuda  # noqa: E402
import torch  # noqa: E402
from cutlass.cute.runtime import from_dlpack  # noqa: E402

from bench_records import interleaved_rounds, median_ratio  # noqa: E402
from bench_rms_norm import (  # noqa: E402
    checked_cute_timer, graph_timer, parse_shapes, torch_reference,
)
from support.check_kernel import ctas_per_sm, launch_shared_memory, ptxas_report  # noqa: E402

# All a copy is timed through, on the copy and the lesson alike: the lesson's other names change.
HOOKS = ("compile_launcher", "plan_kernel", "gpu_arch", "make_inputs", "DTYPES", "DEFAULT_EPSILON")
W_DTYPE = "float32"  # W's dtype in a copy's runs: the hooks' default, which every copy serves
SEED = 0  # the copy and the lesson draw their inputs from one seed
ALIGN = 16  # the bytes of alignment compile_launcher's tensors promise its kernels
REGISTERS_ARCH = "sm_90a"  # --registers compiles for it, no GPU needed

SPEC = re.compile(r"t(\d+)k(\d+)(s?)(b?)(l?)(?:r(\d+))?(?:q(\d+))?(?:c(\d+))?(?:m(\d+))?$")


def parse_plan(spec: str, hidden: int, elem_bytes: int):
    """The companion's FusedPlan a spec such as t160k4sl names; ValueError if it cannot cover the
    row."""
    match = SPEC.match(spec)
    if not match:
        raise ValueError(f"plan {spec!r} is not of the form tTkK[s][b][l][rR][qQ][cC][mM]")
    threads, vecs, staged, bulk, late, rows, sequence, cluster, min_ctas = match.groups()
    threads, vecs = int(threads), int(vecs)
    own = fused.plan_kernel(hidden, elem_bytes)
    if threads > lesson.WARP_THREADS and threads % lesson.WARP_THREADS:
        raise ValueError(f"plan {spec!r}: a row of more than one warp takes whole warps "
                         "(the sum of Step 3)")
    if threads * vecs * own.vec < hidden:
        raise ValueError(f"plan {spec!r} covers {threads * vecs * own.vec} elements, "
                         f"the row has {hidden}")
    if staged and own.vec * elem_bytes != lesson.VECTOR_BYTES:
        raise ValueError(f"plan {spec!r} stages X, but hidden {hidden} gives "
                         f"{own.vec * elem_bytes}-byte vectors")
    if sequence and not staged:
        raise ValueError(f"plan {spec!r} puts rows in sequence, which needs s (X staged)")
    if bulk and not staged:
        raise ValueError(f"plan {spec!r} copies rows in bulk, which needs s (X staged)")
    if cluster and (staged or (rows and int(rows) != 1)
                    or threads % (lesson.WARP_THREADS * int(cluster))):
        raise ValueError(f"plan {spec!r} splits a row over a cluster: X in registers, "
                         "one row per CTA, whole warps")
    rows = int(rows) if rows else 1 if cluster else max(1, 128 // threads)
    arrival = "bulk" if bulk else "cp.async" if staged else "registers"
    return fused.FusedPlan(
        hidden=hidden,
        elem_bytes=elem_bytes,
        vec=own.vec,
        threads_per_row=threads,
        rows_per_cta=rows,
        vecs_per_thread=vecs,
        arrival=arrival,
        early_weight=not late,
        rows_in_sequence=int(sequence or 1),
        cluster_ctas=int(cluster or 1),
        min_ctas_per_sm=int(min_ctas or 0),
    )


def compile_plan(plan, dtype: str, arch: str, y_scale: float | None = None):
    """One plan of the companion's kernel compiled alone, serving every token count, its PTX kept;
    y_scale: in the FP8 form."""
    schedule = ((plan, ((None, None),)),)
    return fused.compile_launcher(schedule, dtype, W_DTYPE, lesson.DEFAULT_EPSILON, arch,
                                  keep_ptx=True, y_scale=y_scale)


def register_report(compiled, plan):
    """What ptxas makes of one plan's kernel, compiled alone for sm_90a with its PTX kept."""
    registers, spills, late, loads = ptxas_report(compiled.__ptx__)
    ctas = ctas_per_sm(plan.cta_threads, registers, launch_shared_memory(compiled))
    order = (f", {late} of {loads} global loads after the first wait for data" if loads is not None
             else "")
    return (f"{registers} registers, {spills} bytes spilled, "
            f"{ctas} CTAs of {plan.cta_threads} threads per SM{order}")


def print_registers(args):
    """--registers --plans: the companion's own plan for many tokens and each spec's."""
    for dtype in args.dtypes:
        for hidden in args.hidden:
            elem_bytes = fused.DTYPES[dtype].bytes
            own = fused.plan_kernel(hidden, elem_bytes)
            cases = [("own plan", own)]
            cases += [(spec, parse_plan(spec, hidden, elem_bytes)) for spec in args.plans]
            for name, plan in cases:
                compiled = compile_plan(plan, dtype, REGISTERS_ARCH)
                print(f"{dtype} hidden {hidden} {name:>12} ({plan}): "
                      f"{register_report(compiled, plan)}")


def print_plan_registers(args, modules, plans):
    """--registers --copy: the copy's plan and the lesson's, each compiled by its own module."""
    for dtype in args.dtypes:
        for hidden in args.hidden:
            for name, module in modules.items():
                plan = plans[name, dtype, hidden]
                compiled = module.compile_launcher(plan, dtype, W_DTYPE, module.DEFAULT_EPSILON,
                                                   REGISTERS_ARCH, keep_ptx=True)
                print(f"{dtype} hidden {hidden} {name:>6} ({plan}): "
                      f"{register_report(compiled, plan)}", flush=True)


def time_shapes(args):
    arch, compiled = lesson.gpu_arch(), {}
    ratios = "/ copy_ | / own plan" + (" | / torch.compile" if args.compile else "")
    print(f"| dtype | tokens x hidden | plan | us | {ratios} (median of {args.rounds} rounds) |")
    print("|---" * (6 + args.compile) + "|")
    for dtype in args.dtypes:
        names = fused.DTYPES[dtype]
        for tokens, hidden in args.shapes:
            x = torch.randn(tokens, hidden, device="cuda", dtype=getattr(torch, names.torch))
            w = torch.rand(hidden, device="cuda") + 0.5
            y_copy = torch.empty_like(x)
            calls = {"copy_": lambda: y_copy.copy_(x),
                     "own plan": fused.compile_rms_norm(dtype, hidden)}
            if args.compile:
                inductor = torch.compile(torch_reference, dynamic=False)
                calls["torch.compile"] = lambda: inductor(x, w)
            own = fused.plan_kernel(hidden, names.bytes, tokens, sm90=fused.is_sm90(arch))
            plans = {"own plan": str(own)}
            for spec in args.plans:
                plan = parse_plan(spec, hidden, names.bytes)
                if (dtype, plan) not in compiled:  # one compilation serves every token count
                    compiled[dtype, plan] = compile_plan(plan, dtype, arch)
                calls[spec], plans[spec] = compiled[dtype, plan], str(plan)
            timers, outputs = {}, {}
            for name, call in calls.items():
                if name in ("copy_", "torch.compile"):
                    timers[name] = graph_timer(call, tokens, hidden)
                    continue
                # every plan writes its own y, kept until the shape is timed
                outputs[name] = torch.empty_like(x)
                timers[name] = checked_cute_timer(name, call, x, w, outputs[name], dtype)
            rounds = interleaved_rounds(timers, args.rounds)
            bases = ["copy_", "own plan"] + (["torch.compile"] if args.compile else [])
            for name, times in rounds.items():
                ratios = "".join(f" {median_ratio(times, rounds[base]):.3f} |" for base in bases)
                print(f"| {dtype} | {tokens}x{hidden} | {name} {plans.get(name, '')} | "
                      f"{statistics.median(times):.2f} |{ratios}", flush=True)


def launch_timer(compiled, tensors, where):
    """A graph_timer of a compiled launcher on `tensors` (its inputs, then Y), after one launch
    that must leave Y finite: Y starts as NaN, so an element left unwritten shows. The caller keeps
    `tensors` alive until the shape is timed: a CuTe tensor from from_dlpack does not, and a graph
    replayed on a tensor freed since writes to memory a later capture handed back
    (benchmarks/NOTES.md, "A harness bug first")."""
    cute_tensors = [from_dlpack(t, assumed_align=ALIGN) for t in tensors]
    tokens, hidden = tensors[-1].shape

    def launch():  # the stream is looked up at each call: the graph capture runs on its own
        compiled(*cute_tensors, tokens, cuda.CUstream(torch.cuda.current_stream().cuda_stream))

    launch()
    torch.cuda.synchronize()
    bad = int((~torch.isfinite(tensors[-1])).sum())
    if bad:
        sys.exit(f"error: {where}: {bad} of {tensors[-1].numel()} outputs are NaN or infinite "
                 "(left unwritten, or the math overflowed)")
    return graph_timer(launch, tokens, hidden)


def time_copy(args, modules, plans, arch):
    """--copy: the copy's launcher against the lesson's, each run whole, with copy_ as the floor."""
    launchers = {}
    for (name, dtype, hidden), plan in plans.items():  # one serves every token count
        module = modules[name]
        launchers[name, dtype, hidden] = module.compile_launcher(
            plan, dtype, W_DTYPE, module.DEFAULT_EPSILON, arch)
    print(f"copy: {modules['copy'].__file__}; medians of {args.rounds} per-round time ratios")
    print("| tokens x hidden | dtype | copy / copy_ | lesson / copy_ | copy / lesson |")
    print("|---" * 5 + "|")
    for dtype in args.dtypes:
        for tokens, hidden in args.shapes:
            keep, timers = [], {}  # every tensor of the shape, alive until it is timed
            for name, module in modules.items():
                inputs = module.make_inputs(tokens, hidden, dtype, SEED, w_dtype=W_DTYPE)
                tensors = [t.cuda() for t in inputs]
                tensors.append(torch.full_like(tensors[0], math.nan))  # Y, shaped like X
                keep += tensors
                timers[name] = launch_timer(launchers[name, dtype, hidden], tensors,
                                            f"the {name} at {dtype} {tokens}x{hidden}")
            floor = torch.empty_like(keep[0])
            keep.append(floor)
            timers["copy_"] = graph_timer(lambda: floor.copy_(keep[0]), tokens, hidden)
            rounds = interleaved_rounds(timers, args.rounds)
            ratios = [median_ratio(rounds[a], rounds[b])
                      for a, b in (("copy", "copy_"), ("lesson", "copy_"), ("copy", "lesson"))]
            cells = " | ".join(f"{r:.3f}" for r in ratios)
            print(f"| {tokens}x{hidden} | {dtype} | {cells} |", flush=True)


def refuse(message):
    """A user's error: one sentence on stderr and exit 2, before any GPU work."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def load_copy(path):
    """The copy of the lesson at `path` as a module (its main() does not run), or a refusal."""
    if not pathlib.Path(path).is_file():
        refuse(f"--copy {path} is not a file")
    name = "copy_under_test"
    # An explicit loader, as a copy's file name need not end in .py
    loader = importlib.machinery.SourceFileLoader(name, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        loader.exec_module(module)
    except Exception as exc:  # whatever a user's file raises as it runs: one sentence
        detail = " ".join(str(exc).split())  # a message of several lines in one
        refuse(f"--copy {path} failed to import ({type(exc).__name__}: {detail})")
    missing = [hook for hook in HOOKS if not hasattr(module, hook)]
    if missing:
        refuse(f"--copy {path} lacks {', '.join(missing)}: a copy keeps the lesson's "
               f"{', '.join(HOOKS)}")
    return module


def parse_args(argv=None):
    """The flags, checked, with --copy's file loaded as args.copy; a user's error ends here."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copy", metavar="FILE",
                        help="a copy of rms_norm_plugin_cutedsl.py, timed whole against the lesson")
    parser.add_argument("--plans", type=lambda s: s.split(","),
                        help="comma-separated plan specs of the companion's kernel")
    parser.add_argument("--shapes", default="", metavar="NxH,...", help="TOKENSxHIDDEN,... to time")
    parser.add_argument("--hidden", type=lambda s: [int(h) for h in s.split(",")], default=[],
                        help="hidden sizes for --registers")
    parser.add_argument("--dtypes", type=lambda s: s.split(","), default=["float16"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--registers", action="store_true",
                        help="ptxas register counts instead of timing")
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile (the benchmark's formula) in the rounds "
                             "of --plans, with a ratio column")
    args = parser.parse_args(argv)
    if (args.copy is None) == (args.plans is None):
        refuse("give exactly one of --plans (plans of the companion's kernel) and --copy FILE")
    shapes = parse_shapes(args.shapes) if args.shapes else []
    if shapes is None:
        refuse(f"--shapes {args.shapes!r}: expected comma-separated TOKENSxHIDDEN, "
               "e.g. 4096x8192,1x1024")
    args.shapes = shapes
    if args.registers and not args.hidden:
        refuse("--registers needs --hidden H,... (the hidden sizes to compile)")
    if not args.registers and not args.shapes:
        refuse("timing needs --shapes TOKENSxHIDDEN,... (the shapes to time)")
    if args.rounds < 1:
        refuse(f"--rounds must be at least 1, got {args.rounds}")
    if args.copy is not None and args.compile:
        refuse("--compile times torch.compile's RMSNorm, which a copy need not compute: "
               "drop it with --copy")
    modules = [("the lesson", lesson)]
    if args.copy is not None:
        args.copy = load_copy(args.copy)
        modules.append((f"the copy {args.copy.__file__}", args.copy))
    for who, module in modules:
        for dtype in args.dtypes:
            if dtype not in module.DTYPES:
                refuse(f"--dtypes: {who} has no dtype {dtype!r} "
                       f"(it has {', '.join(module.DTYPES)})")
    try:
        for hidden in args.hidden + [h for _, h in args.shapes]:
            for dtype in args.dtypes:
                for spec in args.plans or ():
                    parse_plan(spec, hidden, fused.DTYPES[dtype].bytes)
    except ValueError as exc:
        refuse(str(exc))
    return args


def find_plans(modules, dtypes, hiddens):
    """{(name, dtype, hidden): module `name`'s plan for the row}, or a refusal of a hidden size
    that a module's plan_kernel refuses."""
    plans = {}
    for name, module in modules.items():
        for dtype in dtypes:
            for hidden in hiddens:
                try:
                    plan = module.plan_kernel(hidden, module.DTYPES[dtype].bytes)
                except ValueError as exc:
                    refuse(f"the {name} cannot serve hidden {hidden} in {dtype}: {exc}")
                plans[name, dtype, hidden] = plan
    return plans


def main(argv=None):
    args = parse_args(argv)
    if not args.registers and not torch.cuda.is_available():
        refuse("timing needs a CUDA GPU, and torch finds none (--registers needs none)")
    if args.copy is None and args.registers:
        print_registers(args)
    elif args.copy is None:
        time_shapes(args)
    else:
        modules = {"copy": args.copy, "lesson": lesson}
        hiddens = sorted(set(args.hidden if args.registers else [h for _, h in args.shapes]))
        plans = find_plans(modules, args.dtypes, hiddens)
        if args.registers:
            print_plan_registers(args, modules, plans)
        else:
            time_copy(args, modules, plans, lesson.gpu_arch())


if __name__ == "__main__":
    main()
