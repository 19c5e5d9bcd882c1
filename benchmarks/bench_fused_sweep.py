#!/usr/bin/env python3
"""The fused forms swept: time / best fused peer at every token count and LLM hidden size.

The decoder and quantized tables (bench_decoder.py, bench_quantized.py) time the shapes the plans
were tuned on; a model sits between them. This times one fused form against both fused peers at
tokens 1, 2, 4, ... 32768 by hidden sizes of real LLMs (bench_records.py: FUSED_SWEEP_TOKENS,
FUSED_SWEEP_HIDDENS), fp16 and bf16, one table a run:

* residual: S = X + R, Y = norm(S) * W in X's dtype; against FlashInfer's CuteDSL fused_add_rmsnorm
  (in place) and torch.compile's add-then-norm, the columns of bench_decoder.py;
* residual_fp8: S = X + R, Y_q = FP8 E4M3 of norm(S) * W / y_scale; against FlashInfer's
  fused_add_rmsnorm_quant and torch.compile's add, norm and quantize, the columns of
  bench_quantized.py.

The kernel under test comes from --kernel-file (default: the fused companion
rms_norm_fused_cutedsl.py at the repo root; a companion elsewhere is imported on the lesson beside
it, as benchmarks/kernel_files.py does), a module providing what the companion does:
compile_rms_norm(dtype, hidden, epsilon, *, residual=True, y_scale=...) returning a launcher called
as launcher(x, w, y, num_tokens, stream, r, s), and quantize_reference. The handoff to CuTe tensors
and Y's tolerance are this checkout's lesson's.

Every cell is timed twice, in one set of interleaved rounds: L2 cold, the graph cycling through
buffer sets 256 MB apart as the tables do (a decoder's GEMMs evict a norm's tensors between two
layers), and L2 warm, one set replayed call after call (an in-place peer then keeps its 2 tensors in
L2, the fused form its 4 if they fit). Every output is checked once before it is timed, as the
tables check it; an output off is timed all the same, marked *. Device time per call: CUDA-graph
replay timed with CUDA events, R rounds (--rounds); medians, and ratios as medians of per-round
ratios (bench_records.py). torch.compile compiles once per dtype and hidden size: token counts run
from the largest down, the token dimension marked dynamic, so one graph tuned at 32768 tokens serves
2-32768; one token gets a graph of its own (dynamo specializes sizes 0 and 1).

    python3 benchmarks/bench_fused_sweep.py residual [--kernel-file PATH] [--dtypes D,...]
        [--tokens T,...] [--hiddens H,...] [--rounds R] [--out-dir DIR] [--name NAME]
    python3 benchmarks/bench_fused_sweep.py residual_fp8 ...
    python3 benchmarks/plot_sweep.py DIR/sweep_residual.json   # DIR/sweep_residual_sweep.svg

A table is 640 cells (16 token counts x 10 hidden sizes x 2 dtypes x 2 L2 states) of 3 columns.
It took about 3 minutes on an H200 when graphs held at most 200 buffer sets; small shapes now
capture up to 16384 calls a graph, and a table took 6-7 minutes on an H100 (NOTES; the progress
lines print the times, per hidden size, compiles included). Results go to DIR/NAME.md (a grid of
ratios per dtype and L2 state, the summary: cells at or ahead, within 1 %, behind, the worst cells)
and DIR/NAME.json (one record a cell and L2 state, every column's rounds), default
./bench-results/sweep_FORM.*, rewritten after every hidden size, so an interrupted run keeps what
it timed.
"""

import argparse
import collections
import functools
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import bench_decoder  # noqa: E402
import bench_quantized  # noqa: E402
from bench_decoder import DTYPE_NAMES, buffer_sets, checked_calls, cycling  # noqa: E402
from bench_records import (FUSED_PEERS, FUSED_SWEEP_HIDDENS, FUSED_SWEEP_TOKENS,  # noqa: E402
                           L2_STATES, fused_record, interleaved_rounds, peer_ratio,
                           sweep_grid_lines, sweep_summary_lines)
from bench_rms_norm import graph_timer, out_dir, package_version, parse_list  # noqa: E402
from kernel_files import COMPANION_FILE, load_kernel  # noqa: E402

DEFAULT_KERNEL = ROOT / COMPANION_FILE
# What the sweep takes from the kernel's module, as bench_decoder.py and bench_quantized.py take it
# from the companion.
KERNEL_NAMES = ("compile_rms_norm", "quantize_reference")


def residual_columns(kernel, dtype, tokens, hidden, compiled, flashinfer, keep, inputs):
    """{column: (make, check)} of the residual form: bench_decoder.py's columns, checked on
    inputs, the first buffer set."""
    from rms_norm_plugin_cutedsl import Y_TOLERANCE

    makers = bench_decoder.column_makers(kernel, dtype, tokens, hidden, compiled, flashinfer, keep)
    check = bench_decoder.residual_check(*inputs, Y_TOLERANCE[dtype])
    return {name: (make, check) for name, make in makers.items()}


def residual_fp8_columns(kernel, dtype, tokens, hidden, compiled, flashinfer, keep, inputs):
    """{column: (make, check)} of the residual FP8 form: bench_quantized.py's columns of its
    table (b), checked on inputs, the first buffer set."""
    cell = bench_quantized.make_cell(kernel, dtype, tokens, hidden, {"residual": compiled},
                                     flashinfer)
    check = bench_quantized.form_check("residual", cell, inputs)
    return {name: (make, functools.partial(check, name))
            for name, make in bench_quantized.residual_makers(cell, keep).items()}


# One table of the sweep: the kernel's column and the bytes it moves per element of X (for the
# buffer sets), torch.compile's function, the loader of FlashInfer's peer and the columns.
SweepForm = collections.namedtuple(
    "SweepForm", "title kernel element_bytes function load_flashinfer columns titles")
FORMS = {
    "residual": SweepForm(
        "residual form, S = X + R, Y = norm(S) * W", "fused", 8, bench_decoder.add_then_norm,
        bench_decoder.load_flashinfer, residual_columns, bench_decoder.COLUMNS),
    "residual_fp8": SweepForm(
        "residual FP8 form, S = X + R, Y_q = FP8 of norm(S) * W / y_scale", "fp8",
        bench_quantized.FORM_ELEMENT_BYTES["residual"], bench_quantized.add_norm_quantize,
        bench_quantized.load_flashinfer, residual_fp8_columns,
        bench_quantized.FORMS["residual"][1]),
}
METHOD = ("Device time per call, CUDA-graph replay, median of {rounds} interleaved rounds; "
          "ratios are medians of per-round ratios. L2 cold: the graph cycles through buffer sets "
          "256 MB apart; L2 warm: one set, replayed call after call. Each cell: this kernel's "
          "time / the best fused peer's (the faster of FlashInfer and torch.compile), F or T "
          "naming that peer; *: an output checked and found off (see the notes). torch.compile: "
          "per dtype and hidden, one graph for 2 tokens and more (token count dynamic, tuned at "
          "the largest count), one for 1 token.")


def parse_counts(parser, flag, text):
    """A comma-separated flag value as positive integers, or a usage error naming the first that
    is not one."""
    counts = []
    for item in text.split(","):
        if not item.strip().isdigit() or int(item) < 1:
            parser.error(f"{flag}: {item.strip()!r} is not a positive integer")
        counts.append(int(item))
    return counts


def kernel_module(parser, path):
    """The kernel's module from its file, or a usage error: an import that fails, or a module
    without KERNEL_NAMES."""
    try:
        module = load_kernel(path, "sweep_kernel")
    except Exception as exc:  # the user's file: any error of its import is theirs to fix
        parser.error(f"--kernel-file {path} failed to import ({bench_quantized.failure_line(exc)})")
    missing = [name for name in KERNEL_NAMES if not hasattr(module, name)]
    if missing:
        parser.error(f"--kernel-file {path} lacks {', '.join(missing)} (the sweep calls the kernel "
                     "as the companion's is called)")
    return module


def arguments(argv=None):
    """(the parser, the parsed flags with the lists parsed and the results folder made); a bad flag
    exits 2 in one sentence, before any GPU work."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("form", choices=FORMS, help="the table: residual or residual_fp8")
    parser.add_argument("--kernel-file", type=pathlib.Path, default=DEFAULT_KERNEL,
                        help="the module of the kernel under test (default: "
                             "rms_norm_fused_cutedsl.py at the repo root)")
    parser.add_argument("--dtypes", default=",".join(DTYPE_NAMES), metavar="D,...",
                        help=f"comma-separated, from {', '.join(DTYPE_NAMES)} (default both)")
    parser.add_argument("--tokens", default=",".join(map(str, FUSED_SWEEP_TOKENS)), metavar="T,...",
                        help="token counts (default 1, 2, 4, ..., 32768)")
    parser.add_argument("--hiddens", default=",".join(map(str, FUSED_SWEEP_HIDDENS)),
                        metavar="H,...", help="hidden sizes (default: the sweep's, 512 to 16384)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved timing rounds per cell (default 3)")
    parser.add_argument("--out-dir", default="bench-results",
                        help="directory for NAME.md and NAME.json (default ./bench-results)")
    parser.add_argument("--name", default=None,
                        help="file name stem of the results (default sweep_FORM)")
    args = parser.parse_args(argv)
    args.dtypes = parse_list(parser, "--dtypes", args.dtypes, DTYPE_NAMES)
    args.tokens = sorted(set(parse_counts(parser, "--tokens", args.tokens)), reverse=True)
    args.hiddens = parse_counts(parser, "--hiddens", args.hiddens)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not args.kernel_file.is_file():
        parser.error(f"--kernel-file {args.kernel_file}: no such file")
    args.name = args.name or f"sweep_{args.form}"
    args.out_dir = out_dir(parser, args.out_dir)
    return parser, args


def time_cell(form_name, kernel, dtype, tokens, hidden, compiled, flashinfer, rounds):
    """One shape's records, L2 cold and L2 warm, and {column: why it failed} for the peers that
    did."""
    form = FORMS[form_name]
    tdt = getattr(torch, dtype)
    sets = [(torch.randn(tokens, hidden, device="cuda", dtype=tdt),
             torch.randn(tokens, hidden, device="cuda", dtype=tdt))
            for _ in range(buffer_sets(tokens, hidden, form.element_bytes))]
    if tokens > 1:  # dynamo specializes a size of 1 whatever the mark: one token compiles apart
        for tensor in (t for inputs in sets for t in inputs):
            torch._dynamo.mark_dynamic(tensor, 0)
    keep = [sets]
    columns = form.columns(kernel, dtype, tokens, hidden, compiled, flashinfer, keep, sets[0])
    names = (form.kernel, *FUSED_PEERS) if flashinfer else (form.kernel, "torch_compile")
    timers, wrong, failed = {}, {}, {}
    for name in names:
        make, check = columns[name]
        try:
            calls, wrong[name] = checked_calls(make, sets, check)
            timers[name, "cold"] = graph_timer(cycling(calls), tokens, hidden, len(calls))
            timers[name, "warm"] = graph_timer(calls[0], tokens, hidden)
        except Exception as exc:  # a peer that fails leaves its column empty, not the sweep
            if name == form.kernel:
                raise
            failed[name] = bench_quantized.failure_line(exc)
    times = interleaved_rounds(timers, rounds)
    records = []
    for l2 in L2_STATES:
        where = {"form": form_name, "dtype": dtype, "tokens": tokens, "hidden": hidden,
                 "l2": l2, "sets": len(sets) if l2 == "cold" else 1}
        state_times = {name: t for (name, state), t in times.items() if state == l2}
        records.append(fused_record(where, form.kernel, state_times, wrong))
    return records, failed


def save(path, text):
    """Write text to path through a file beside it, renamed into place: a run stopped while it
    writes leaves the last complete results."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def render(form_name, meta, rounds, flashinfer_why, records, notes) -> str:
    """The results as Markdown: meta's gpu, command, kernel, versions and date, a grid of ratios per
    dtype and L2 state, the summary and the notes."""
    lines = [f"# Fused sweep, {FORMS[form_name].title}: {meta['gpu']}", "",
             f"command: `{meta['command']}`  ", f"kernel: `{meta['kernel']}`  ",
             f"versions: {meta['versions']}  ", f"date: {meta['date']}", ""]
    if flashinfer_why:
        lines += [f"FlashInfer: {flashinfer_why}: not timed.", ""]
    lines += [METHOD.format(rounds=rounds), ""]
    for dtype in dict.fromkeys(rec["dtype"] for rec in records):
        for l2 in L2_STATES:
            lines += [f"## {dtype}, L2 {l2}", ""] + sweep_grid_lines(records, dtype, l2) + [""]
    lines += ["## Summary", ""] + [f"- {line}" for line in sweep_summary_lines(records)]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def cell_line(records) -> str:
    """A shape's progress line: its ratio to the best fused peer in each L2 state."""
    first = records[0]
    states = [f"{rec['l2']} {peer_ratio(rec):.3f} ({rec['best_fused_peer']})"
              if rec["best_fused_peer"] else f"{rec['l2']} -" for rec in records]
    return f"{first['dtype']} {first['tokens']}x{first['hidden']}: " + ", ".join(states)


def main():
    parser, args = arguments()
    kernel = kernel_module(parser, args.kernel_file)
    if not torch.cuda.is_available():
        parser.error("no CUDA GPU is visible: the sweep times kernels on one")
    form = FORMS[args.form]
    flashinfer, why = form.load_flashinfer()
    meta = {"gpu": torch.cuda.get_device_name(),
            "command": " ".join(["python3 benchmarks/bench_fused_sweep.py", *sys.argv[1:]]),
            "kernel": str(args.kernel_file),
            "versions": f"torch {torch.__version__}, "
                        f"cutlass-dsl {package_version('nvidia-cutlass-dsl')}, "
                        f"flashinfer {package_version('flashinfer-python')}",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    md_path, json_path = args.out_dir / f"{args.name}.md", args.out_dir / f"{args.name}.json"
    print(f"results will go to {md_path.resolve()} and .json", flush=True)
    records, notes = [], []
    started = time.perf_counter()
    for dtype in args.dtypes:
        for hidden in args.hiddens:
            hidden_started = time.perf_counter()
            graphs = counters["stats"]["unique_graphs"]
            # One compile per dtype and hidden: a fresh start, then the largest count first, so the
            # dynamic graph is tuned where the traffic is and serves every count down to 2.
            torch._dynamo.reset()
            compiled = torch.compile(form.function)
            for tokens in args.tokens:
                cell, failed = time_cell(args.form, kernel, dtype, tokens, hidden, compiled,
                                         flashinfer, args.rounds)
                records += cell
                where = f"at {dtype} {tokens}x{hidden}"
                notes += [f"{form.titles[name]} {where}: {why_not}; not timed"
                          for name, why_not in failed.items()]
                notes += [f"{form.titles[name]} {where}: {what}; timed, marked *"
                          for name, what in cell[0]["wrong"].items()]
                print(cell_line(cell), flush=True)
            save(md_path, render(args.form, meta, args.rounds, why, records, notes))
            save(json_path, json.dumps(records, indent=1) + "\n")
            spent = time.perf_counter() - hidden_started
            graphs = counters["stats"]["unique_graphs"] - graphs
            print(f"[{dtype} hidden {hidden}: {spent:.0f} s, compiles included, torch.compile "
                  f"graphs {graphs}; total {time.perf_counter() - started:.0f} s]", flush=True)
    for line in sweep_summary_lines(records):
        print(line)
    print(f"wrote {md_path} and {json_path}")
    if any(form.kernel in rec["wrong"] for rec in records):
        sys.exit("error: the kernel's output was wrong (see the notes)")


if __name__ == "__main__":
    main()
