#!/usr/bin/env python3
"""Time this checkout's kernel against another checkout's, interleaved in one process on one GPU.

Each checkout's sample is imported from its own file (nothing is patched), both
kernels run on the same inputs, and every round times each shape with both,
alternating which goes first. The ratio new / base per shape is the median over
rounds, so clock drift between rounds cancels out. The shapes are bench_rms_norm.py's
parts (--only, default table,mid) or --shapes.

    git worktree add /tmp/base <commit>          # or: git archive <commit> | tar x -C /tmp/base
    python3 benchmarks/experiments/compare_checkouts.py /tmp/base [--rounds 5] [--only matrix,mid,sweep]
"""

import argparse
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from bench_records import SHAPE_PARTS, interleaved_rounds, shapes_of  # noqa: E402
from bench_rms_norm import DTYPE_NAMES, EPS, graph_timer, out_of_tolerance, parse_list, parse_shapes  # noqa: E402
from support.check_kernel import load_module  # noqa: E402

X_DTYPES = ("float16", "bfloat16", "float32")  # the sample's X/Y dtypes (its ACTIVATION_DTYPES)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=pathlib.Path, help="root of the other checkout")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="table,mid", help=f"comma-separated, from {', '.join(SHAPE_PARTS)}")
    parser.add_argument("--shapes", default=None, metavar="NxH,...", help="these shapes instead of --only's")
    parser.add_argument("--dtypes", default=",".join(DTYPE_NAMES), metavar="D,...",
                        help=f"comma-separated, from {', '.join(X_DTYPES)} (default: the benchmark's)")
    args = parser.parse_args()
    if not (args.base / "rms_norm_plugin_cutedsl.py").is_file():
        parser.error(f"{args.base} holds no rms_norm_plugin_cutedsl.py")
    if args.shapes:
        shapes = parse_shapes(args.shapes)
    else:
        shapes = shapes_of(parse_list(parser, "--only", args.only, SHAPE_PARTS))
    if shapes is None:
        parser.error(f"--shapes {args.shapes!r}: expected comma-separated TOKENSxHIDDEN, e.g. 4096x8192,1x1024")
    dtypes = parse_list(parser, "--dtypes", args.dtypes, X_DTYPES)
    samples = {"base": load_module(args.base.resolve() / "rms_norm_plugin_cutedsl.py", "sample_base"),
               "new": load_module(ROOT / "rms_norm_plugin_cutedsl.py", "sample_new")}
    print(f"| dtype | tokens x hidden | base us | new us | new / base (median of {args.rounds}) | max |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for dtype in dtypes:
        for tokens, hidden in shapes:
            x = torch.randn(tokens, hidden, device="cuda", dtype=getattr(torch, dtype))
            w = torch.rand(hidden, device="cuda") + 0.5
            ys = {name: torch.empty_like(x) for name in samples}
            calls = {}
            for name, s in samples.items():
                kernel = s.compile_rms_norm(dtype, hidden, EPS)
                args_ = (s.from_dlpack(x, assumed_align=16), s.from_dlpack(w, assumed_align=16),
                         s.from_dlpack(ys[name], assumed_align=16), tokens)
                calls[name] = lambda k=kernel, a=args_, s=s: k(
                    *a, s.cuda.CUstream(torch.cuda.current_stream().cuda_stream))
                calls[name]()
            torch.cuda.synchronize()
            if not torch.equal(ys["base"], ys["new"]):  # a retuned kernel may round differently, not wrongly
                tolerance = samples["new"].Y_TOLERANCE[dtype]
                bad = {name: out_of_tolerance(y, x, w, tolerance.rtol, tolerance.atol) for name, y in ys.items()}
                assert not any(bad.values()), f"outputs out of tolerance at {dtype} {tokens}x{hidden}: {bad}"
                print(f"outputs differ at {dtype} {tokens}x{hidden}, both within tolerance", flush=True)
            times = interleaved_rounds({name: graph_timer(calls[name], tokens, hidden) for name in samples},
                                       args.rounds)
            ratios = [n / b for n, b in zip(times["new"], times["base"])]
            ratio = statistics.median(ratios)
            worst = max(worst, ratio)
            print(f"| {dtype} | {tokens}x{hidden} | {statistics.median(times['base']):.2f} | "
                  f"{statistics.median(times['new']):.2f} | {ratio:.4f} | {max(ratios):.4f} |", flush=True)
    print(f"worst median ratio new / base: {worst:.4f}")


if __name__ == "__main__":
    main()
