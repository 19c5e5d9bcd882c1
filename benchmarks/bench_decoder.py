#!/usr/bin/env python3
"""The decoder table: the residual Add and the RMSNorm after it, fused, against the fused peers on
one GPU.

In a decoder layer the norm reads s = x + r, and s is the next residual. Timed at each shape and
dtype, every output checked once before it is timed (S bit for bit against torch's x + r, Y against
the float64 norm of S):

* fused: the fused companion's residual form (rms_norm_fused_cutedsl.py), one kernel reading X and R
  and writing S and Y;
* add + plain: torch's add writing S, then the companion's plain kernel reading it back (what the
  plugin costs where the Add stays TensorRT's own layer);
* FlashInfer: flashinfer.norm.kernels.fused_add_rmsnorm (CuteDSL; in place: R becomes S and X
  becomes Y, W in X's dtype);
* torch.compile: add-then-norm in one function, FP32 inside, returning (Y, S);
* floor: two copy_ calls moving the fused form's bytes (X into one buffer, R into another: 2 reads,
  2 writes).

Device time per call: CUDA-graph replay timed with CUDA events; R rounds (--rounds) each time every
column once in a rotating order; medians, and ratios as medians of per-round ratios
(bench_records.py). Each graph cycles through enough sets of X and R that a set comes back only
after 256 MB of other traffic: in a decoder the GEMMs between two norms evict its activations from
L2, and a loop over one set would keep an in-place peer's 2 tensors there while a 4-tensor form
falls out (benchmarks/NOTES.md).

    python3 benchmarks/bench_decoder.py [--shapes NxH,...] [--dtypes D,...] [--rounds R]
        [--out-dir DIR] [--name NAME]

Results go to DIR/NAME.md and DIR/NAME.json (default ./bench-results/decoder.*), rewritten after
every shape. The fused form at every token count 1-32768 by LLM hidden sizes, L2 cold and warm,
against the fused peers: `python3 benchmarks/bench_fused_sweep.py residual`.
"""

import argparse
import itertools
import json
import math
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench_records import fused_record, interleaved_rounds, peer_ratio  # noqa: E402
from bench_rms_norm import (current_stream, cute_tensors, graph_timer, out_dir,  # noqa: E402
                            package_version, parse_list, parse_shapes)

EPS = 1e-5
DTYPE_NAMES = ("float16", "bfloat16")
DECODER_TOKENS = (1, 128, 512, 4096, 16384)
DECODER_HIDDENS = (2048, 4096, 5120, 8192, 16384)
COLUMNS = {"fused": "fused (this)", "add_plain": "add + plain", "flashinfer": "FlashInfer fused",
           "torch_compile": "torch.compile fused", "floor": "floor (2 copies)"}
COLD_BYTES = 256 << 20  # bytes moved between two uses of a buffer set: 5x the H200's 50 MB L2
# Each set is one call captured in the graph, with buffers of its own: the cap bounds the memory
# and the capture at the smallest shapes.
MAX_BUFFER_SETS = 16384


def add_then_norm(x, r, w):
    """The decoder's step as torch.compile is given it: s in X's dtype, the norm of s in FP32, one
    cast."""
    s = x + r
    sf = s.float()
    y = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + EPS) * w
    return y.to(x.dtype), s


def norm_of(s, w):
    """The float64 RMSNorm of s with weight w."""
    sd = s.double()
    return sd * torch.rsqrt(sd.pow(2).mean(-1, keepdim=True) + EPS) * w.double()


def misses(y, s, x, r, w, tolerance) -> str:
    """'' if S is x + r bit for bit and Y within tolerance of the float64 norm of S, else what is
    off."""
    expected_s = x + r
    found = []
    if not torch.equal(s, expected_s):
        found.append(f"S differs from x + r at {int((s != expected_s).sum())} elements")
    ref = norm_of(expected_s, w)
    bad = int((~((y.double() - ref).abs() <= tolerance.atol + tolerance.rtol * ref.abs())).sum())
    if bad:
        found.append(f"{bad} elements of Y out of tolerance")
    return "; ".join(found)


def load_flashinfer():
    """FlashInfer's CuteDSL fused_add_rmsnorm, or (None, why not)."""
    try:
        from flashinfer.norm.kernels.fused_add_rmsnorm import fused_add_rmsnorm_cute
    except Exception as exc:  # another CuteDSL version can fail with more than ImportError
        return None, f"not importable ({type(exc).__name__}: {exc})"
    return fused_add_rmsnorm_cute, None


def buffer_sets(tokens, hidden, element_bytes=8) -> int:
    """How many sets of buffers one graph cycles through, a call each: enough that a call's inputs
    are not still in L2 from the last call on them (COLD_BYTES between two uses), as in a decoder,
    where the GEMMs between two norms evict them. element_bytes: what a call moves per element of X
    (8: the fused form's four 16-bit tensors). At most MAX_BUFFER_SETS: calls of under 16 KB (1 x
    512 fp16) come back to a set sooner."""
    call_bytes = element_bytes * tokens * hidden
    return max(1, min(MAX_BUFFER_SETS, math.ceil(COLD_BYTES / call_bytes)))


def cycling(calls):
    """One function calling calls[0], calls[1], ... in turn: a graph captured from it reads every
    set."""
    turn = itertools.cycle(calls)
    return lambda: next(turn)()


def column_makers(kernel, dtype, tokens, hidden, compiled, flashinfer, keep):
    """{column: make(x, r) -> (call, result)} at one shape and dtype: result() gives (Y, S, the W
    used) after a call, and is None for the floor, whose copies have nothing to check. kernel: the
    module whose compile_rms_norm makes the fused and plain launchers (the companion); compiled:
    add_then_norm compiled; flashinfer: FlashInfer's fused_add_rmsnorm or None (no column). keep
    gets every buffer a graph uses: it must live until the shape is timed, as a graph holds raw
    addresses only."""
    w = torch.rand(hidden, device="cuda") + 0.5
    w_lp = w.to(getattr(torch, dtype))
    keep.append((w, w_lp))
    fused = kernel.compile_rms_norm(dtype, hidden, EPS, residual=True)

    def fused_call(x, r):
        y, s = torch.empty_like(x), torch.empty_like(x)
        keep.append((y, s))
        fx, fw, fy, fr, fs = cute_tensors(x, w, y, r, s)
        return (lambda: fused(fx, fw, fy, tokens, current_stream(), fr, fs)), lambda: (y, s, w)

    def add_plain_call(x, r):
        # Compiled where the column is made: bench_fused_sweep.py leaves the column out.
        plain = kernel.compile_rms_norm(dtype, hidden, EPS)
        y, s = torch.empty_like(x), torch.empty_like(x)
        keep.append((y, s))
        ps, pw, py = cute_tensors(s, w, y)

        def call():
            torch.add(x, r, out=s)
            plain(ps, pw, py, tokens, current_stream())

        return call, lambda: (y, s, w)

    def flashinfer_call(x, r):
        xi, ri = x.clone(), r.clone()  # in place: R becomes S and X becomes Y
        keep.append((xi, ri))
        return (lambda: flashinfer(xi, ri, w_lp, EPS)), lambda: (xi, ri, w_lp)

    def torch_compile_call(x, r):
        # Only the last output is held, so that a graph replaying one set writes the same memory
        # call after call, as the other columns do (a graph cycling sets calls each set once).
        held = [None]
        keep.append(held)

        def call():
            held[0] = compiled(x, r, w)

        return call, lambda: (*held[0], w)

    def floor_call(x, r):
        y, s = torch.empty_like(x), torch.empty_like(x)
        keep.append((y, s))
        return (lambda: (s.copy_(x), y.copy_(r))), None

    makers = {"fused": fused_call, "add_plain": add_plain_call, "flashinfer": flashinfer_call,
              "torch_compile": torch_compile_call, "floor": floor_call}
    if flashinfer is None:
        del makers["flashinfer"]
    return makers


def checked_calls(make, sets, check):
    """One column's calls, one a buffer set, and what check(result) found off in the output of the
    first call, made before any of them is timed ('' if nothing)."""
    made = [make(*inputs) for inputs in sets]
    first, result = made[0]
    first()  # compiles where it has to, and gives the output checked
    torch.cuda.synchronize()
    return [call for call, _ in made], check(result)


def residual_check(x, r, tolerance):
    """check(result) of column_makers' columns on inputs x and r: misses of its Y and S."""

    def check(result):
        if result is None:
            return ""
        y, s, w = result()
        return misses(y, s, x, r, w, tolerance)

    return check


def shape_timers(kernel, dtype, tokens, hidden, flashinfer):
    """({column: timer}, {column: what its checked output got wrong}, the buffers the graphs use:
    they must live until the shape is timed, as a graph holds raw addresses only)."""
    from rms_norm_plugin_cutedsl import Y_TOLERANCE

    tdt = getattr(torch, dtype)
    sets = [(torch.randn(tokens, hidden, device="cuda", dtype=tdt),
             torch.randn(tokens, hidden, device="cuda", dtype=tdt))
            for _ in range(buffer_sets(tokens, hidden))]
    keep = [sets]
    torch._dynamo.reset()  # one compiled graph per shape (dynamic=False) without piling up guards
    compiled = torch.compile(add_then_norm, dynamic=False)
    makers = column_makers(kernel, dtype, tokens, hidden, compiled, flashinfer, keep)
    check = residual_check(*sets[0], Y_TOLERANCE[dtype])
    timers, wrong = {}, {}
    for name, make in makers.items():
        calls, wrong[name] = checked_calls(make, sets, check)
        timers[name] = graph_timer(cycling(calls), tokens, hidden, len(calls))
    return timers, wrong, keep


def table_parser(description, name):
    """The flags the table scripts share, with `name` the default file name stem."""
    parser = argparse.ArgumentParser(description=description)
    default_shapes = ",".join(f"{t}x{h}" for h in DECODER_HIDDENS for t in DECODER_TOKENS)
    parser.add_argument("--shapes", default=default_shapes, metavar="NxH,...",
                        help="tokens x hidden (default: 1, 128, 512, 4096, 16384 x 2048, 4096, "
                             "5120, 8192, 16384)")
    parser.add_argument("--dtypes", default=",".join(DTYPE_NAMES), metavar="D,...",
                        help=f"comma-separated, from {', '.join(DTYPE_NAMES)} (default both)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved timing rounds per shape (default 5)")
    parser.add_argument("--out-dir", default="bench-results",
                        help="directory for NAME.md and NAME.json (default ./bench-results)")
    parser.add_argument("--name", default=name,
                        help=f"file name stem of the results (default {name})")
    return parser


def table_args(parser, args):
    """(shapes, dtypes, results folder) from the flags the table scripts share; a bad one exits 2 in
    one sentence, before any GPU work."""
    shapes = parse_shapes(args.shapes)
    if shapes is None:
        parser.error(f"--shapes {args.shapes!r}: expected comma-separated TOKENSxHIDDEN, "
                     "e.g. 4096x8192,1x1024")
    dtypes = parse_list(parser, "--dtypes", args.dtypes, DTYPE_NAMES)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return shapes, dtypes, out_dir(parser, args.out_dir)


def main():
    parser = table_parser(__doc__.split("\n\n")[0], "decoder")
    args = parser.parse_args()
    shapes, dtypes, out = table_args(parser, args)

    import rms_norm_fused_cutedsl as fused

    flashinfer, why = load_flashinfer()
    command = "python3 benchmarks/bench_decoder.py " + " ".join(sys.argv[1:])
    lines, records, notes = [], [], []

    def emit(line=""):
        print(line, flush=True)
        lines.append(line)

    emit(f"# Decoder table (residual Add + RMSNorm): {torch.cuda.get_device_name()}")
    emit()
    emit(f"command: `{command.strip()}`  ")
    emit(f"versions: torch {torch.__version__}, "
         f"cutlass-dsl {package_version('nvidia-cutlass-dsl')}, "
         f"flashinfer {package_version('flashinfer-python')}  ")
    emit(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    emit()
    if why:
        emit(f"FlashInfer: {why}: not timed.")
        emit()
    emit("Device time per call in us, CUDA-graph replay cycling through buffer sets 256 MB "
         f"apart (inputs not in L2), median of {args.rounds} interleaved rounds; ratios are "
         "medians of per-round ratios. Best fused peer: the faster of FlashInfer and "
         "torch.compile. Floor: the fused form's bytes moved by two copy_ calls. *: output checked "
         "and found off (see the notes).")
    emit()
    header = ["dtype", "tokens x hidden", *COLUMNS.values(), "fused / best fused peer",
              "fused / add + plain", "fused / floor"]
    emit("| " + " | ".join(header) + " |")
    emit("|" + "---|" * len(header))
    for dtype in dtypes:
        for tokens, hidden in shapes:
            timers, wrong, keep = shape_timers(fused, dtype, tokens, hidden, flashinfer)
            times = interleaved_rounds(timers, args.rounds)
            del keep, timers
            notes += [f"{COLUMNS[name]} at {dtype} {tokens}x{hidden}: {what}; timed, marked *"
                      for name, what in wrong.items() if what]
            rec = fused_record({"dtype": dtype, "tokens": tokens, "hidden": hidden}, "fused",
                               times, wrong, against=("add_plain", "floor"))
            records.append(rec)
            best, ratios = rec["best_fused_peer"], rec["ratios"]
            cells = [dtype, f"{tokens}x{hidden}"]
            cells += [f"{rec['us'][name]:.2f}{'*' * (name in rec['wrong'])}"
                      if name in rec["us"] else "-" for name in COLUMNS]
            cells += [f"{ratios[best]:.3f} ({COLUMNS[best]})", f"{ratios['add_plain']:.3f}",
                      f"{ratios['floor']:.3f}"]
            emit("| " + " | ".join(cells) + " |")
            (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
            (out / f"{args.name}.json").write_text(json.dumps(records, indent=1) + "\n")
    behind = [rec for rec in records if peer_ratio(rec) > 1.0]
    summary = (f"fused at or ahead of the best fused peer in {len(records) - len(behind)} of "
               f"{len(records)} cells")
    if behind:
        summary += "; behind in " + ", ".join(
            f"{rec['dtype']} {rec['tokens']}x{rec['hidden']} ({peer_ratio(rec):.3f})"
            for rec in behind)
    emit()
    emit(summary)
    for note in notes:
        emit(f"- {note}")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / args.name}.md and .json")
    if any("fused" in rec["wrong"] for rec in records):
        sys.exit("error: the fused form's output was wrong (see above)")


if __name__ == "__main__":
    main()
