#!/usr/bin/env python3
"""Time a persistent RMSNorm kernel that streams rows through a ring of shared-memory slots, beside
the fused companion's kernel.

The companion (rms_norm_fused_cutedsl.py) launches one CTA per row (or per two rows, in the mid
plan) and lets the hardware start the next CTA when one exits, so an SM's loads come in bursts: a
CTA requests its rows, then only reduces and stores them. This variant keeps the loads going
instead: P CTAs per SM loop over rows r = CTA, CTA + grid, ... and each holds a ring of S slots.
Thread 0 bulk-copies (cp.async.bulk) one row into each slot up front; a row's mbarrier counts its
bytes in; every thread copies its vectors of the row into registers; and once the CTA barrier of
the row's sum has passed, every thread holds its X, so thread 0 refills the slot with the row S
further on while the row is normalized and stored. W is loaded once per CTA, into registers.
16-bit X/Y, fp32 W, rows of whole warps only. benchmarks/NOTES.md, ninth pass, has what it showed
on the H200.

A variant is written tTkKsSpP: T threads per row (whole warps), K vectors of 8 elements per thread
(T * K * 8 is the hidden size), S ring slots, P CTAs per SM (also the kernel's launch bound, so
that P fit).

    python3 benchmarks/experiments/persistent_ring.py --shapes 4096x12288 \
        --variants t384k4s2p2,t384k4s4p2
"""

import argparse
import pathlib
import re
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402

import rms_norm_plugin_cutedsl as lesson  # noqa: E402
from rms_norm_fused_cutedsl import compile_rms_norm, whole_row  # noqa: E402

VARIANT = re.compile(r"t(\d+)k(\d+)s(\d+)p(\d+)$")
VEC = 8  # 16-bit elements per 16-byte vector


def parse_variant(spec: str, hidden: int):
    """(hidden, threads per row, vectors per thread, slots, CTAs per SM); ValueError if the variant
    cannot serve."""
    match = VARIANT.match(spec)
    if not match:
        raise ValueError(f"variant {spec!r} is not of the form tTkKsSpP")
    threads, vecs, slots, ctas = map(int, match.groups())
    if threads * vecs * VEC != hidden or threads % lesson.WARP_THREADS:
        raise ValueError(f"variant {spec!r}: {threads} threads (whole warps) x {vecs} vectors "
                         f"must cover {hidden}")
    return hidden, threads, vecs, slots, ctas


@cute.kernel
def ring_kernel(x_ptr: cute.Pointer, w_ptr: cute.Pointer, num_tokens: Int32,
                y_ptr: cute.Pointer, variant: cutlass.Constexpr):
    hidden, threads, vecs, slots, _ = variant
    rows = cute.make_layout((num_tokens, VEC, hidden // VEC), stride=(hidden, 1, VEC))
    mX, mY = cute.make_tensor(x_ptr, rows), cute.make_tensor(y_ptr, rows)
    mW = cute.make_tensor(w_ptr, cute.make_layout((VEC, hidden // VEC), stride=(1, VEC)))
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    grid, _, _ = cute.arch.grid_dim()
    smem = cutlass.memory.SmemAllocator()
    ring = cute.make_layout((slots, VEC, hidden // VEC), stride=(hidden, 1, VEC))
    sX = smem.allocate_tensor(mX.element_type, ring, 128)
    # slot s's mbarrier: one arrival plus the row's bytes
    full = smem.allocate_array(cutlass.Int64, slots)
    warps = threads // lesson.WARP_THREADS
    # two sets: rows alternate
    sSum = smem.allocate_tensor(Float32, cute.make_layout((warps, 2)), 16)
    if tidx == 0:
        for s in cutlass.range_constexpr(slots):
            cute.arch.mbarrier_init(full + s, 1)
        cute.arch.mbarrier_init_fence()
    cute.arch.barrier()

    my_rows = (num_tokens - bidx + grid - 1) // grid
    bulk = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), mX.element_type)
    row_bytes = hidden * mX.element_type.width // 8
    if tidx == 0:
        for s in cutlass.range_constexpr(slots):
            if s < my_rows:
                cute.arch.mbarrier_arrive_and_expect_tx(full + s, row_bytes)
                cute.copy(bulk, whole_row(mX, bidx + s * grid), whole_row(sX, s),
                          mbar_ptr=full + s)
    tWrW = cute.make_rmem_tensor((VEC, vecs), mW.element_type)
    for k in cutlass.range_constexpr(vecs):
        cute.autovec_copy(mW[None, tidx + k * threads], tWrW[None, k])

    for it in cutlass.range(my_rows, unroll=1):
        s, row = it % slots, bidx + it * grid
        # the slot's phase flips each time it is refilled
        cute.arch.mbarrier_wait(full + s, it // slots % 2)
        tXrX = cute.make_rmem_tensor((VEC, vecs), mX.element_type)
        for k in cutlass.range_constexpr(vecs):
            cute.autovec_copy(sX[s, None, tidx + k * threads], tXrX[None, k])
        x = tXrX.load().to(Float32)
        lane_sums = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0),
                                   reduction_profile=(None, 1))
        total = cute.arch.warp_reduction_sum(lane_sums.reduce(cute.ReductionOp.ADD, Float32(0.0),
                                                              reduction_profile=0))
        if tidx % lesson.WARP_THREADS == 0:
            sSum[tidx // lesson.WARP_THREADS, it % 2] = total
        cute.arch.barrier()
        # past the barrier every thread holds its X: the slot takes the row `slots` further on
        if tidx == 0:
            if it + slots < my_rows:
                cute.arch.mbarrier_arrive_and_expect_tx(full + s, row_bytes)
                cute.copy(bulk, whole_row(mX, row + slots * grid), whole_row(sX, s),
                          mbar_ptr=full + s)
        total = Float32(0.0)
        for w in cutlass.range_constexpr(warps):
            total = total + sSum[w, it % 2]
        rstd = cute.math.rsqrt(total * (1.0 / hidden) + lesson.DEFAULT_EPSILON, approx=True,
                               ftz=True)
        tYrY = cute.make_rmem_tensor((VEC, vecs), mY.element_type)
        tYrY.store((x * rstd * tWrW.load().to(Float32)).to(mY.element_type))
        for k in cutlass.range_constexpr(vecs):
            cute.autovec_copy(tYrY[None, k], mY[row, None, tidx + k * threads])


@cute.jit
def ring_launch(mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, num_tokens: Int32,
                stream: cuda.CUstream, variant: cutlass.Constexpr, sms: cutlass.Constexpr):
    _, threads, _, _, ctas_per_sm = variant
    ring_kernel(mX.iterator, mW.iterator, num_tokens, mY.iterator, variant).launch(
        grid=[cutlass.min(num_tokens, sms * ctas_per_sm), 1, 1], block=[threads, 1, 1],
        stream=stream, min_blocks_per_mp=ctas_per_sm, preferred_smem_carveout=-1)


def compile_variant(dtype: str, variant, arch: str, sms: int, keep_ptx: bool = False):
    """The compiled launcher of one variant (no GPU needed); keep_ptx: its __ptx__ holds the PTX."""
    rows = (cute.sym_int32(), variant[0])
    x, y = lesson.fake_tensor(dtype, rows), lesson.fake_tensor(dtype, rows)
    w = lesson.fake_tensor("float32", (variant[0],))
    return lesson.compile_for(arch, keep_ptx, ring_launch, x, w, y, Int32(1),
                              cute.runtime.make_fake_stream(), variant, sms)


def main():
    import torch

    from bench_records import interleaved_rounds, median_ratio
    from bench_rms_norm import checked_cute_timer, graph_timer, parse_shapes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", required=True, help="comma-separated TOKENSxHIDDEN")
    parser.add_argument("--variants", required=True,
                        help="comma-separated tTkKsSpP; each runs where it covers the row")
    parser.add_argument("--dtypes", default="float16", help="float16 and/or bfloat16")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    shapes = parse_shapes(args.shapes)
    arch, sms = lesson.gpu_arch(), torch.cuda.get_device_properties(0).multi_processor_count
    print(f"| dtype | tokens x hidden | kernel | us | / copy_ | / the companion (median of "
          f"{args.rounds} rounds) |")
    print("|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        names = lesson.DTYPES[dtype]
        for tokens, hidden in shapes:
            x = torch.randn(tokens, hidden, device="cuda", dtype=getattr(torch, names.torch))
            w = torch.rand(hidden, device="cuda") + 0.5
            y_copy = torch.empty_like(x)
            calls = {"the companion": compile_rms_norm(dtype, hidden)}
            for spec in args.variants.split(","):
                try:
                    calls[spec] = compile_variant(dtype, parse_variant(spec, hidden), arch, sms)
                except ValueError:
                    continue  # a variant for another hidden size
            timers, outputs = {"copy_": graph_timer(lambda: y_copy.copy_(x), tokens, hidden)}, {}
            for name, call in calls.items():
                outputs[name] = torch.empty_like(x)  # each output lives until the shape is timed
                timers[name] = checked_cute_timer(name, call, x, w, outputs[name], dtype)
            rounds = interleaved_rounds(timers, args.rounds)
            for name, times in rounds.items():
                to_copy = median_ratio(times, rounds["copy_"])
                to_companion = median_ratio(times, rounds["the companion"])
                print(f"| {dtype} | {tokens}x{hidden} | {name} | {statistics.median(times):.2f} | "
                      f"{to_copy:.3f} | {to_companion:.3f} |", flush=True)


if __name__ == "__main__":
    main()
