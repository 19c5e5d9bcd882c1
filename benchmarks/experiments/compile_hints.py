#!/usr/bin/env python3
"""Time torch.compile's RMSNorm with its cache-eviction hints removed one at a time, beside copy_
and the fused companion's kernel.

For long rows inductor generates a kernel that reads each row twice: the sum of squares loads X
with eviction_policy='evict_last', the output loop loads X again ('evict_first') and W
('evict_last'). This script takes the module inductor writes for one shape (run_and_get_code),
deletes hints from its source by pattern, loads each edit with PyCodeCache.load and times every
variant in interleaved rounds with bench_rms_norm.py's timers. --one-pass adds a Triton kernel
that reads X once (the whole row in registers, as the companion (rms_norm_fused_cutedsl.py) holds
it) with each combination of hints. benchmarks/NOTES.md, eighth pass, has what it showed on the
H200. copy_ is timed by graph replay only (bench_rms_norm.py keeps the faster of that and eager
launches), which on the H200 ran slow at 32768 x 8192: there, read the column against
torch.compile.

    python3 benchmarks/experiments/compile_hints.py --shapes 16384x12288,32768x8192 \
        [--dtypes float16] [--one-pass]
"""

import argparse
import pathlib
import re
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import rms_norm_fused_cutedsl as fused  # noqa: E402
from bench_records import interleaved_rounds, median_ratio  # noqa: E402
from bench_rms_norm import (DTYPE_NAMES, EPS, graph_timer, parse_list, parse_shapes,  # noqa: E402
                            prepared_call, torch_reference)

# Hints deleted from inductor's source: (policies, and the pointer whose loads lose them, None for
# all). In its kernel in_ptr0 is X and in_ptr1 is W, the order of the compiled function's
# arguments.
EDITS = {
    "no hints": (("evict_first", "evict_last"), None),
    "no evict_first": (("evict_first",), None),
    "no evict_last": (("evict_last",), None),
    "no evict_last on X": (("evict_last",), "in_ptr0"),
    "no evict_last on W": (("evict_last",), "in_ptr1"),
}


def drop_hints(source, policies, pointer):
    """The source without its eviction_policy arguments naming these policies, on pointer's loads
    only if given."""
    hint = re.compile(r",\s*eviction_policy='(?:%s)'" % "|".join(policies))
    return "\n".join(hint.sub("", line) if pointer is None or f"{pointer} +" in line else line
                     for line in source.split("\n"))


def one_pass_kernels():
    """{name: launch(x, w, y)} for a Triton RMSNorm that reads X once, per combination of hints."""
    import triton
    import triton.language as tl

    @triton.jit
    def rms_norm_one_pass(X, W, Y, H: tl.constexpr, BLOCK: tl.constexpr, eps: tl.constexpr,
                          X_POLICY: tl.constexpr, W_POLICY: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < H
        x = tl.load(X + row * H + cols, mask=mask, other=0.0, eviction_policy=X_POLICY)
        x = x.to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0, eviction_policy=W_POLICY)
        rstd = tl.rsqrt(tl.sum(x * x, 0) / H + eps)
        tl.store(Y + row * H + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)

    def launcher(x_policy, w_policy):
        def launch(x, w, y):
            tokens, hidden = x.shape
            rms_norm_one_pass[(tokens,)](x, w, y, hidden, triton.next_power_of_2(hidden), EPS,
                                         x_policy, w_policy, num_warps=16)
        return launch

    return {f"one pass, X {xp or 'default'}, W {wp or 'default'}": launcher(xp, wp)
            for xp in ("", "evict_last", "evict_first") for wp in ("", "evict_last")}


def time_shape(dtype, tokens, hidden, one_pass, rounds):
    from torch._inductor.codecache import PyCodeCache
    from torch._inductor.utils import run_and_get_code

    x = torch.randn(tokens, hidden, device="cuda", dtype=getattr(torch, dtype))
    w = torch.rand(hidden, device="cuda") + 0.5
    torch._dynamo.reset()  # one compiled graph per shape
    compiled = torch.compile(torch_reference, dynamic=False)
    y_ref, sources = run_and_get_code(compiled, x, w)
    keep = [torch.empty_like(x)]  # every output a graph writes stays alive until the shape is timed
    timers = {"copy_": graph_timer(lambda: keep[0].copy_(x), tokens, hidden),
              "torch.compile": graph_timer(lambda: compiled(x, w), tokens, hidden)}
    for name, (policies, pointer) in EDITS.items():
        source = drop_hints(sources[0], policies, pointer)
        if source == sources[0]:
            print(f"{dtype} {tokens}x{hidden}: {name}: inductor's kernel has no such hint",
                  file=sys.stderr)
            continue
        module = PyCodeCache.load(source)
        module.call([x, w])  # compiles outside the capture
        timers[name] = graph_timer(lambda m=module: m.call([x, w]), tokens, hidden)
    launches = one_pass_kernels() if one_pass else {}
    kernel = fused.compile_rms_norm(dtype, hidden, EPS)
    launches["the companion"] = lambda x_, w_, y_: prepared_call(kernel, x_, w_, y_)()
    for name, launch in launches.items():
        y = torch.empty_like(x)
        keep.append(y)
        launch(x, w, y)
        torch.cuda.synchronize()
        torch.testing.assert_close(y.float(), y_ref.float(), rtol=1e-2, atol=1e-2)
        timers[name] = graph_timer(lambda f=launch, y=y: f(x, w, y), tokens, hidden)
    times = interleaved_rounds(timers, rounds)
    for name, per_round in times.items():
        to_copy, to_compile = (median_ratio(per_round, times[base])
                               for base in ("copy_", "torch.compile"))
        print(f"| {dtype} | {tokens}x{hidden} | {name} | {statistics.median(per_round):.2f} | "
              f"{to_copy:.3f} | {to_compile:.3f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", required=True, metavar="NxH,...", help="the shapes to time")
    parser.add_argument("--dtypes", default="float16", metavar="D,...",
                        help=f"comma-separated, from {', '.join(DTYPE_NAMES)} (default float16)")
    parser.add_argument("--one-pass", action="store_true",
                        help="also time a one-pass Triton kernel per hint")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    shapes = parse_shapes(args.shapes)
    if shapes is None:
        parser.error(f"--shapes {args.shapes!r}: expected comma-separated TOKENSxHIDDEN, "
                     "e.g. 16384x12288")
    dtypes = parse_list(parser, "--dtypes", args.dtypes, DTYPE_NAMES)
    print(f"| dtype | tokens x hidden | implementation | us | / copy_ | / torch.compile (median of "
          f"{args.rounds} rounds) |\n|---|---|---|---|---|---|")
    for dtype in dtypes:
        for tokens, hidden in shapes:
            time_shape(dtype, tokens, hidden, args.one_pass, args.rounds)


if __name__ == "__main__":
    main()
