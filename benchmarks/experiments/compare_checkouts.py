#!/usr/bin/env python3
"""Time this checkout's kernels against another checkout's, interleaved in one process on one GPU.

Each side is one file, imported from where it lies (nothing is patched;
benchmarks/kernel_files.py): by default this checkout's companion,
rms_norm_fused_cutedsl.py, against the other checkout's companion, or its sample where it has none
(a checkout from before the lesson/companion split); --new-file and --base-file name others. Each
form of --forms (plain, residual, fp8, residual_fp8; default all) runs on both sides on the same
inputs, and every output of both is checked before it is timed, as the tables check it: Y against
the float64 norm within the lesson's Y_TOLERANCE (bench_rms_norm.py), S = X + R bit for bit
(bench_decoder.py), an FP8 Y_q against the FP8 of the float64 norm, one rounding
(bench_quantized.py, y_scale 2^-6). Every round times each shape with both sides, alternating which
goes first (CUDA-graph replay of one buffer set, bench_rms_norm.py's timer); the ratio new / base
per shape is the median over rounds, so clock drift between rounds cancels out. The shapes are
bench_rms_norm.py's parts or the decoder table's (--only, default table,mid; "decoder" is
bench_decoder.py's 25 shapes) or --shapes.

    git worktree add /tmp/base <commit>          # or: git archive <commit> | tar x -C /tmp/base
    python3 benchmarks/experiments/compare_checkouts.py /tmp/base [--rounds 5] \
        [--only table,decoder] [--forms plain,residual] [--dtypes float16]
    python3 benchmarks/experiments/compare_checkouts.py \
        --base-file /tmp/base/rms_norm_plugin_cutedsl.py

It prints a Markdown table, a line per form with its worst ratio, and exits 1 if an output of
either side was off (timed all the same, marked *), 2 on a usage error.
"""

import argparse
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import cuda.bindings.driver as cuda  # noqa: E402
import torch  # noqa: E402
from cutlass.cute.runtime import from_dlpack  # noqa: E402

import bench_decoder  # noqa: E402
import bench_quantized  # noqa: E402
from bench_records import SHAPE_PARTS, interleaved_rounds, median_ratio  # noqa: E402
from bench_rms_norm import (DTYPE_NAMES, EPS, graph_timer, out_of_tolerance,  # noqa: E402
                            parse_list, parse_shapes)
from kernel_files import (FORMS, add_side_arguments, load_kernel, missing_keywords,  # noqa: E402
                          side_files)

X_DTYPES = ("float16", "bfloat16", "float32")  # the kernels' X/Y dtypes (ACTIVATION_DTYPES)
PARTS = {**SHAPE_PARTS, "decoder": [(tokens, hidden) for hidden in bench_decoder.DECODER_HIDDENS
                                    for tokens in bench_decoder.DECODER_TOKENS]}


def parse_args(argv=None):
    """(the flags, the shapes, the dtypes, the forms, {side: its file}); a user's error ends here
    in one sentence, before any GPU work."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_side_arguments(parser, "root of the other checkout (its companion, else its sample)")
    parser.add_argument("--forms", default=",".join(FORMS), metavar="F,...",
                        help=f"comma-separated, from {', '.join(FORMS)} (default all)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="table,mid",
                        help=f"comma-separated, from {', '.join(PARTS)}")
    parser.add_argument("--shapes", default=None, metavar="NxH,...",
                        help="these shapes instead of --only's")
    parser.add_argument("--dtypes", default=",".join(DTYPE_NAMES), metavar="D,...",
                        help=f"comma-separated, from {', '.join(X_DTYPES)} "
                             "(default: the benchmark's)")
    args = parser.parse_args(argv)
    files = side_files(parser, args, ROOT)
    forms = parse_list(parser, "--forms", args.forms, FORMS)
    if args.shapes:
        shapes = parse_shapes(args.shapes)
        if shapes is None:
            parser.error(f"--shapes {args.shapes!r}: expected comma-separated TOKENSxHIDDEN, "
                         "e.g. 4096x8192,1x1024")
    else:
        parts = parse_list(parser, "--only", args.only, PARTS)
        shapes = list(dict.fromkeys(shape for part in parts for shape in PARTS[part]))
    dtypes = parse_list(parser, "--dtypes", args.dtypes, X_DTYPES)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not torch.cuda.is_available():
        parser.error("no CUDA GPU is visible: the comparison times kernels on one")
    if any("y_scale" in FORMS[form] for form in forms):
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 9):
            parser.error(f"the FP8 forms need sm_89 or newer, this GPU is sm_{major}{minor}: "
                         "pass --forms plain,residual")
    return parser, args, shapes, dtypes, forms, files


def load_sides(parser, files, forms) -> dict:
    """{side: its module}, or a usage error for a file whose compile_rms_norm lacks a form."""
    sides = {side: load_kernel(path, f"compare_{side}") for side, path in files.items()}
    for side, module in sides.items():
        lacks = missing_keywords(module, forms)
        if lacks:
            parser.error(f"the {side} side's {files[side]} has no compile_rms_norm keyword "
                         f"{', '.join(lacks)}: compare a companion or a sample from before the "
                         "split, or pass --forms plain")
    return sides


def output_check(form, x, r, w, tolerance, quantize_reference):
    """check(y, s) -> what is off in one side's outputs of the form ('' if nothing)."""
    residual = "residual" in FORMS[form]
    expected_s = x + r if residual else None
    if "y_scale" in FORMS[form]:
        ref = bench_decoder.norm_of(x if expected_s is None else expected_s, w)
        return lambda y, s: bench_quantized.misses(
            (y, s) if residual else (y,), ref, expected_s, quantize_reference,
            bench_quantized.SINGLE_ROUNDING)
    if residual:
        return lambda y, s: bench_decoder.misses(y, s, x, r, w, tolerance)

    def check(y, s):
        bad = out_of_tolerance(y, x, w, tolerance.rtol, tolerance.atol)
        return f"{bad} elements of Y out of tolerance" if bad else ""

    return check


def side_timer(module, form, dtype, inputs, check):
    """(graph timer of one side's launcher on inputs (x, r, w), what its checked output got
    wrong, its outputs: Y, and S in a residual form): they must live until the shape is timed, as
    a graph holds raw addresses only."""
    x, r, w = inputs
    tokens, hidden = x.shape
    launcher = module.compile_rms_norm(dtype, hidden, EPS, **FORMS[form])
    y_dtype = bench_quantized.E4M3 if "y_scale" in FORMS[form] else x.dtype
    y, s = torch.empty(x.shape, device="cuda", dtype=y_dtype), torch.empty_like(x)
    tensors = [from_dlpack(t, assumed_align=16) for t in (x, w, y, r, s)]
    residual = "residual" in FORMS[form]
    extra = tensors[3:] if residual else []

    def launch():  # the stream is looked up at each call: the graph capture runs on its own
        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        launcher(*tensors[:3], tokens, stream, *extra)

    launch()
    torch.cuda.synchronize()
    return graph_timer(launch, tokens, hidden), check(y, s), (y, s) if residual else (y,)


def main(argv=None):
    parser, args, shapes, dtypes, forms, files = parse_args(argv)
    sides = load_sides(parser, files, forms)
    import rms_norm_plugin_cutedsl as lesson
    from rms_norm_fused_cutedsl import quantize_reference

    print(f"base: {files['base']}  \nnew: {files['new']}\n")
    print(f"| form | dtype | tokens x hidden | base us | new us | "
          f"new / base (median of {args.rounds}) | max | outputs |")
    print("|---|---|---|---|---|---|---|---|")
    worst, wrong = {}, []
    for form in forms:
        for dtype in dtypes:
            for tokens, hidden in shapes:
                tdt = getattr(torch, dtype)
                x = torch.randn(tokens, hidden, device="cuda", dtype=tdt)
                r = torch.randn(tokens, hidden, device="cuda", dtype=tdt)
                w = torch.rand(hidden, device="cuda") + 0.5
                check = output_check(form, x, r, w, lesson.Y_TOLERANCE[dtype], quantize_reference)
                cell = f"{form} {dtype} {tokens}x{hidden}"
                timers, off, outputs = {}, {}, {}
                for side, module in sides.items():
                    timers[side], off[side], outputs[side] = side_timer(module, form, dtype,
                                                                        (x, r, w), check)
                    if off[side]:
                        wrong.append(f"the {side} side at {cell}: {off[side]}")
                # bytes compared, so that NaN in the same places counts as the same
                same = all(torch.equal(b.view(torch.uint8), n.view(torch.uint8))
                           for b, n in zip(outputs["base"], outputs["new"]))
                times = interleaved_rounds(timers, args.rounds)
                ratio = median_ratio(times["new"], times["base"])
                most = max(n / b for n, b in zip(times["new"], times["base"]))
                if ratio > worst.get(form, (0.0, ""))[0]:
                    worst[form] = (ratio, cell)
                marks = {side: "*" if what else "" for side, what in off.items()}
                print(f"| {form} | {dtype} | {tokens}x{hidden} | "
                      f"{statistics.median(times['base']):.2f}{marks['base']} | "
                      f"{statistics.median(times['new']):.2f}{marks['new']} | {ratio:.4f} | "
                      f"{most:.4f} | {'identical' if same else 'differ, each checked'} |",
                      flush=True)
                del timers, outputs
    print()
    for form, (ratio, cell) in worst.items():
        print(f"worst median ratio new / base, {form} form: {ratio:.4f} ({cell})")
    for note in wrong:
        print(f"- {note}; timed, marked *")
    if wrong:
        sys.exit("error: an output was off (see the notes above)")


if __name__ == "__main__":
    main()
