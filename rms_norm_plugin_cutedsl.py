#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""RMSNorm as a TensorRT Python plugin whose kernel is written in CuteDSL.

What you will learn
-------------------
* A memory-bound CuteDSL kernel that reads every byte once in 128-bit vectors, reduces in FP32 and casts on store,
  in five steps of one ``@cute.jit`` helper each ([2]); one table picks its shape per row and token count ([3]).
* A ``@cute.jit`` launcher compiled before the first inference, the token count and TensorRT's stream passed at run
  time ([4]); TensorRT's pointers as CuTe tensors without a copy, through cupy ``UnownedMemory``, ``torch.as_tensor``
  and ``cute.runtime.from_dlpack`` ([5]); an ``IPluginV3`` and its ``IPluginCreatorV3One`` ([6]), an engine built by
  Polygraphy with a dynamic token count ([7]), checked against NumPy ([8]); every user error as one sentence ([9]).

It runs on an NVIDIA GPU of compute capability 8.0 or newer, TensorRT 10 or 11, CUDA 12 or 13, Python 3.11+:

    pip install -r requirements.txt                  # CUDA 12; requirements-cu13.txt for CUDA 13
    python3 rms_norm_plugin_cutedsl.py               # build, run 128/1/512/37 tokens, check against NumPy
    python3 rms_norm_plugin_cutedsl.py --from-onnx   # the same, through TensorRT's ONNX parser
    python3 rms_norm_plugin_cutedsl.py --plans --hidden-dim 8192   # which kernel runs which token counts

Exit codes: 0 every run matched NumPy, 1 one did not, 2 a usage or environment error. Companions importing this
file: rms_norm_onnx_model.py (your ONNX model), rms_norm_saved_engine.py (saved engines), rms_norm_aot_cutedsl.py.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import struct
import sys
import tempfile
import threading
from dataclasses import dataclass

EXIT_CORRECT, EXIT_INCORRECT, EXIT_USAGE = 0, 1, 2
PIP_NAMES = {"cuda": "cuda-python", "cupy": "cupy-cuda12x (cupy-cuda13x for CUDA 13)", "cutlass": "nvidia-cutlass-dsl",
             "tensorrt": "tensorrt-cu12 (tensorrt-cu13 for CUDA 13)"}  # where pip's name is not the import's


def import_error_message(exc: ImportError) -> str:
    """One sentence naming the pip package behind a failed import and how to install the sample's set."""
    install = "install the sample's set with `pip install -r requirements.txt` (CUDA 12) or `-r requirements-cu13.txt`"
    module = (exc.name or "").partition(".")[0]
    if isinstance(exc, ModuleNotFoundError) and module:
        return f"the package {PIP_NAMES.get(module, module)} is not installed (import '{exc.name}' failed); {install}"
    detail = " ".join(str(exc).split())  # installed but not loadable, e.g. a missing shared library
    return f"a package of this sample failed to import ({detail}); {install} in a fresh virtual environment"


try:
    import numpy as np

    import cuda.bindings.driver as cuda
    import cupy as cp
    import torch

    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32
    from cutlass.cute.nvgpu import cpasync
    from cutlass.cute.runtime import from_dlpack
except ImportError as exc:
    if __name__ == "__main__":  # one sentence and exit 2; imported, an ImportError that says the same
        print(f"error: {import_error_message(exc)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    raise ImportError(import_error_message(exc), name=exc.name) from exc

try:
    import tensorrt as trt
except ImportError:
    trt = None  # the kernel half works without TensorRT; main() says what to install

# A dtype as TensorRT, torch, cutlass, cupy (int16 carries bf16) and ONNX name it, its size, Y's tolerances ([8]).
DTypeNames = collections.namedtuple("DTypeNames", "trt torch cute cupy onnx bytes rtol atol")
DTYPES = {  # X and Y share a dtype; W may have any of the three (nine pairs): the kernel computes in FP32
    "float16": DTypeNames("HALF", "float16", "Float16", "float16", "FLOAT16", 2, rtol=2.0 ** -10, atol=1e-6),
    "bfloat16": DTypeNames("BF16", "bfloat16", "BFloat16", "int16", "BFLOAT16", 2, rtol=2.0 ** -7, atol=1e-6),
    "float32": DTypeNames("FLOAT", "float32", "Float32", "float32", "FLOAT", 4, rtol=2.0 ** -18, atol=1e-30),
}
ACTIVATION_DTYPES = ("float16", "bfloat16", "float32")  # X and Y
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")      # W; float32 first, as the default
DTYPE_PAIRS = tuple((x, w) for x in ACTIVATION_DTYPES for w in WEIGHT_DTYPES)  # every (X, W) pair it serves
DEFAULT_EPSILON = 1e-5
MAX_HIDDEN = 32768  # the longest row the last line of ROW_PLANS ([3]) holds


# %% [1] NumPy reference ----------------------------------------------------------


def rms_norm_reference(x: np.ndarray, w: np.ndarray, epsilon: float) -> np.ndarray:
    """y = x / sqrt(mean(x^2) + epsilon) * w over the last axis in float64 (the kernel: FP32 math, one rounding)."""
    x64 = np.asarray(x, dtype=np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + epsilon) * np.asarray(w, dtype=np.float64)


# %% [2] The CuteDSL kernel -------------------------------------------------------
# Memory traffic. RMSNorm does about 4 FLOPs per element and is bound by memory: N rows of H elements read N*H*x
# bytes of X and H*w of W and write N*H*x of Y (x, w: bytes per element). The floor is a copy of X into Y, so each
# element of X is read from DRAM once: a row stays on chip, in registers or shared memory, until it is stored.
#
# Work split. A row is cut into 16-byte vectors (8 fp16/bf16 or 4 fp32 values; fewer where H is not a multiple),
# W alike. The T threads of a row own vectors t, t+T, t+2T, ..., so neighbouring threads touch neighbouring bytes. A
# KernelPlan says how many threads share a row, how many rows a CTA, how a row arrives; [3] picks one per shape.
#
#      vector:   0    1   ...  T-1 |  T   T+1 ... 2T-1 | ...
#      thread:   t0   t1  ...  tT-1|  t0  t1  ... tT-1 | ...   Step 1  row_to_registers: X (and W) in registers,
#                 \    \        /     /    /       /                   from DRAM or staged by request_rows
#                  x^2 summed per thread, in FP32               Step 2  sum_of_squares
#                  \__ warp shuffle __/ [w0][w1]... smem        Step 3  row_sum: the row's sum in every thread
#                  rstd = rsqrt(sum / H + epsilon)              Step 4  inverse_rms
#                  y = x * rstd * w, cast, 16-byte stores       Step 5  store_row

VECTOR_BYTES = 16          # the widest global access per thread (ld.global.v4.b32); cp.async.cg copies exactly this
WARP_THREADS = 32
MAX_CTA_THREADS = 1024     # CUDA's limit on threads per CTA
FLT_MIN = float(np.finfo(np.float32).tiny)  # smallest normal float32, 2**-126


@dataclass(frozen=True)
class KernelPlan:
    """How the kernel maps rows onto threads: one compile-time value, baked into the kernel compiled with it."""

    hidden: int
    elem_bytes: int            # bytes per X/Y element: 2 (fp16, bf16) or 4 (fp32)
    vec: int                   # elements per vector access
    threads_per_row: int       # counted over all CTAs of a cluster, where a cluster shares each row
    rows_per_cta: int          # row slots side by side in a CTA
    vecs_per_thread: int
    arrival: str = "registers"  # Step 1: X straight into "registers", or staged in shared memory by "cp.async"
                                # (a copy per vector per thread) or by "bulk" copy (one per row, sm_90+)
    early_weight: bool = True   # W loaded with X (True), or after the reduction (no W registers held through it)
    rows_in_sequence: int = 1   # rows each slot normalizes in turn, all requested up front (staged plans)
    cluster_ctas: int = 1       # CTAs of a thread-block cluster, on as many SMs, that share each row (sm_90+)
    min_ctas_per_sm: int = 0    # a launch bound: ptxas budgets registers so that this many CTAs fit an SM

    num_vecs = property(lambda self: self.hidden // self.vec)
    warps_per_row = property(lambda self: max(1, self.threads_per_row // WARP_THREADS))
    cta_threads = property(lambda self: self.threads_per_row * self.rows_per_cta // self.cluster_ctas)
    cta_rows = property(lambda self: self.rows_per_cta * self.rows_in_sequence)
    ragged = property(lambda self: self.num_vecs % self.threads_per_row != 0, doc="some thread owns fewer vectors")

    # Index arithmetic in plain Python: the kernel runs it on Int32 values, tests/test_kernel_operands.py on ints.
    def grid(self, num_tokens):
        """CTAs for num_tokens rows (on ints, Int32 values and TensorRT's symbolic sizes alike)."""
        return (num_tokens + self.cta_rows - 1) // self.cta_rows * self.cluster_ctas

    def thread_slot(self, tidx, bidx):
        """(row_in_cta, t, first_row) of thread tidx of CTA bidx: its row slot, its place in the row, the slot's first
        row (the slot's rows are first_row + i * rows_per_cta)."""
        if self.cluster_ctas > 1:  # a row's CTAs are consecutive in the grid; CTA c holds threads c * cta_threads...
            tidx, bidx = tidx + bidx % self.cluster_ctas * self.cta_threads, bidx // self.cluster_ctas
        row_in_cta = tidx // self.threads_per_row
        return row_in_cta, tidx % self.threads_per_row, bidx * self.cta_rows + row_in_cta

    def owns(self, j):
        """Whether vector j, which some thread of the row holds, lies in the row (always, unless ragged)."""
        return not self.ragged or j < self.num_vecs

    def clamp(self, j):
        """Vector j, or the row's last vector where j is past a ragged row's end: an address any thread may load."""
        return cutlass.min(j, self.num_vecs - 1) if self.ragged else j

    def staged_bytes(self, num_tokens, first_row):
        """The bytes a bulk copy of the rows_per_cta rows from first_row brings in: only those that exist."""
        return cutlass.max(cutlass.min(num_tokens - first_row, self.rows_per_cta), 0) * (self.hidden * self.elem_bytes)

    def __str__(self) -> str:
        """A short tag: CuteDSL names a kernel after its compile-time arguments and cuts the name at 180 characters."""
        return (f"h{self.hidden}b{self.elem_bytes}v{self.vec}t{self.threads_per_row}r{self.rows_per_cta}"
                f"q{self.rows_in_sequence}c{self.cluster_ctas}m{self.min_ctas_per_sm}k{self.vecs_per_thread}"
                f"_w{'early' if self.early_weight else 'late'}_{self.arrival.replace('.', '')}")

    def describe(self) -> str:
        """One line for a reader: how a row is split and how it arrives."""
        rows = (f"each row over a cluster of {self.cluster_ctas} CTAs" if self.cluster_ctas > 1 else
                f"{self.cta_rows} rows/CTA in turn" if self.rows_in_sequence > 1 else
                f"{self.rows_per_cta} row{'s' if self.rows_per_cta > 1 else ''}/CTA")
        where = {"registers": "X in registers", "cp.async": "X staged by cp.async", "bulk": "X staged by bulk copy"}
        bound = f", launch bound {self.min_ctas_per_sm} CTAs/SM" if self.min_ctas_per_sm else ""
        vectors = f"{self.vecs_per_thread} vectors of {self.vec} x {self.elem_bytes * 8}-bit"
        return (f"{self.threads_per_row} threads/row x {vectors}, {rows}, {where[self.arrival]}, "
                f"W {'first' if self.early_weight else 'late'}{bound}")


def whole_row(tensor, r):
    """Row r of X or of sX as one run of hidden elements: a bulk copy of it is one instruction, not one per vector."""
    row = tensor[r, None, None]
    return cute.make_tensor(row.iterator, cute.make_layout(cute.size(row)))


@cute.jit
def request_rows(plan: cutlass.Constexpr, smem, mX, first_row, row_in_cta, t, num_tokens):
    """Step 1, staged plans: all rows of the CTA on their way into shared memory at once, later ones arriving while
    earlier ones are reduced and stored. Returns (sX, the rows' mbarriers), or (None, None)."""
    sX, rows_in = None, None
    if cutlass.const_expr(plan.arrival != "registers"):  # slot i * rows_per_cta + row_in_cta: row i of a slot
        sX = smem.allocate_tensor(mX.element_type, cute.make_layout(
            (plan.cta_rows, plan.vec, plan.num_vecs), stride=(plan.hidden, 1, plan.vec)), 16)
    if cutlass.const_expr(plan.arrival == "cp.async"):
        # Each thread copies its own vectors, 16 bytes per cp.async.cg (through L2 only), a commit group per row.
        g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), mX.element_type,
                                  num_bits_per_copy=VECTOR_BYTES * 8)
        for i in cutlass.range_constexpr(plan.rows_in_sequence):
            row = first_row + i * plan.rows_per_cta
            if row < num_tokens:
                for k in cutlass.range_constexpr(plan.vecs_per_thread):
                    j = t + k * plan.threads_per_row
                    if plan.owns(j):
                        cute.copy(g2s, mX[row, None, j], sX[i * plan.rows_per_cta + row_in_cta, None, j])
            cute.arch.cp_async_commit_group()
    if cutlass.const_expr(plan.arrival == "bulk"):
        # One thread hands each row whole to the SM's bulk-copy unit (TMA's cp.async.bulk) and an mbarrier per row
        # in sequence counts its bytes in: no thread spends instructions on X's addresses.
        rows_in = smem.allocate_array(cutlass.Int64, plan.rows_in_sequence)
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            for i in cutlass.range_constexpr(plan.rows_in_sequence):
                cute.arch.mbarrier_init(rows_in + i, 1)  # one arrival: thread 0's, with the bytes to expect
            cute.arch.mbarrier_init_fence()
        cute.arch.barrier()  # no thread waits on an mbarrier before thread 0 has set it up
        if tidx == 0:
            bulk = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), mX.element_type)
            for i in cutlass.range_constexpr(plan.rows_in_sequence):
                first = first_row + i * plan.rows_per_cta  # thread 0's row_in_cta is 0
                cute.arch.mbarrier_arrive_and_expect_tx(rows_in + i, plan.staged_bytes(num_tokens, first))
                for r in cutlass.range_constexpr(plan.rows_per_cta):
                    if first + r < num_tokens:
                        cute.copy(bulk, whole_row(mX, first + r), whole_row(sX, i * plan.rows_per_cta + r),
                                  mbar_ptr=rows_in + i)
    return sX, rows_in


@cute.jit
def load_columns(plan: cutlass.Constexpr, t, columns, ks: cutlass.Constexpr):
    """Vectors ks of thread t of each (view, registers) of per-column inputs such as W. Loaded first, every thread
    loads every slot, past a ragged row's end the last vector again: ptxas issues a checked load only once X is in."""
    for k in ks:
        j = t + k * plan.threads_per_row
        for view, regs in columns:
            if cutlass.const_expr(plan.early_weight):
                cute.autovec_copy(view[None, plan.clamp(j)], regs[None, k])
            else:
                if plan.owns(j):
                    cute.autovec_copy(view[None, j], regs[None, k])


@cute.jit
def row_to_registers(plan: cutlass.Constexpr, i, t, tXrX, mX, row, sX, slot, rows_in, row_ok, columns):
    """Step 1: thread t's vectors of row `row` of X in tXrX (zeros stay where it owns none): from DRAM, each of
    `columns` (W, where it comes first) just before X's; or staged, from sX slot `slot` once row i is in."""
    if cutlass.const_expr(plan.arrival == "registers"):
        for k in cutlass.range_constexpr(plan.vecs_per_thread):
            load_columns(plan, t, columns, (k,))
            j = t + k * plan.threads_per_row
            if plan.owns(j):
                if row_ok:
                    cute.autovec_copy(mX[row, None, j], tXrX[None, k])
    else:
        if cutlass.const_expr(plan.arrival == "bulk"):
            cute.arch.mbarrier_wait(rows_in + i, 0)  # phase 0 ends once this row's bytes are all in
        else:  # commit groups complete in order: once no more are pending than rows after this one, it is in
            cute.arch.cp_async_wait_group(plan.rows_in_sequence - 1 - i)
        if row_ok:
            for k in cutlass.range_constexpr(plan.vecs_per_thread):
                j = t + k * plan.threads_per_row
                if plan.owns(j):
                    cute.autovec_copy(sX[slot, None, j], tXrX[None, k])


@cute.jit
def sum_of_squares(tXrX):
    """Step 2: this thread's sum of x^2 in FP32; across its vectors first, then within one, so that the chain of
    dependent adds is vecs_per_thread + vec long, not their product."""
    x = tXrX.load().to(Float32)
    lane_sums = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=(None, 1))
    return lane_sums.reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)


@cute.jit
def row_sum_buffers(plan: cutlass.Constexpr, smem, reductions: cutlass.Constexpr):
    """Step 3's shared memory for a CTA that reduces `reductions` times: an FP32 sum per warp of each row slot, in up
    to two sets used in turn, and over a cluster an mbarrier per set that counts the sums sent in."""
    sets, sSum, sums_in = min(2, reductions), None, None
    if cutlass.const_expr(plan.warps_per_row > 1):
        sSum = smem.allocate_tensor(Float32, cute.make_layout((plan.warps_per_row, plan.rows_per_cta, sets)), 16)
    if cutlass.const_expr(plan.cluster_ctas > 1):
        sums_in = smem.allocate_array(cutlass.Int64, sets)
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            for s in cutlass.range_constexpr(sets):
                cute.arch.mbarrier_init(sums_in + s, 1)  # one arrival: thread 0's, with the bytes to expect
            cute.arch.mbarrier_init_fence()  # makes the barriers visible to the cluster's other CTAs
        cute.arch.cluster_arrive_relaxed()  # this CTA has started; row_sum waits until all have
    return sSum, sums_in


@cute.jit
def row_sum(plan: cutlass.Constexpr, partial, sums, n: cutlass.Constexpr, row_in_cta, t):
    """Step 3: the sum of `partial` over the row in every thread of it: a warp shuffle, then lane 0's sums through
    shared memory (over a cluster, every CTA's). n counts the CTA's earlier reductions: the set and the phase."""
    total = cute.arch.warp_reduction_sum(partial, threads_in_group=min(plan.threads_per_row, WARP_THREADS))
    if cutlass.const_expr(plan.warps_per_row > 1):
        sSum, sums_in = sums
        sets = cute.size(sSum, mode=[2])
        s = n % sets
        if cutlass.const_expr(plan.cluster_ctas > 1):
            # Lane c of each warp sends the warp's sum to CTA c (st.async, as a 32-bit word), and each CTA's
            # mbarrier counts the 4 bytes that arrive from every warp of the row.
            if cutlass.const_expr(n == 0):
                cute.arch.cluster_wait()  # every CTA has started and set up its mbarriers: safe to write to
            tidx, _, _ = cute.arch.thread_idx()
            if tidx == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(sums_in + s, 4 * plan.warps_per_row)
            if t % WARP_THREADS < plan.cluster_ctas:
                mine = sSum.iterator + cute.crd2idx((t // WARP_THREADS, row_in_cta, s), sSum.layout)
                cute.arch.store_async_dsmem(mine, total.bitcast(Int32), sums_in + s, t % WARP_THREADS)
            cute.arch.mbarrier_wait(sums_in + s, n // sets % 2)
        else:
            if t % WARP_THREADS == 0:
                sSum[t // WARP_THREADS, row_in_cta, s] = total
            cute.arch.barrier()
        total = Float32(0.0)
        for w in cutlass.range_constexpr(plan.warps_per_row):  # a few shared-memory reads, no second barrier
            total = total + sSum[w, row_in_cta, s]
    return total


@cute.jit
def inverse_rms(plan: cutlass.Constexpr, total, epsilon: cutlass.Constexpr):
    """Step 4: 1 / sqrt(total / hidden + epsilon). With a normal epsilon the argument is never subnormal, so the
    flush-to-zero rsqrt gives the same value without the guard ptxas puts around the plain one."""
    mean_sq_eps = total * (1.0 / plan.hidden) + epsilon  # 1 / hidden folds to a constant
    return cute.math.rsqrt(mean_sq_eps, approx=True, ftz=True) if epsilon >= FLT_MIN else cute.math.rsqrt(mean_sq_eps)


@cute.jit
def store_row(plan: cutlass.Constexpr, normalize, tXrX, sX, slot, mY, row, row_ok, t):
    """Step 5: y = normalize(x, k) in FP32 (k None: all the thread's vectors), cast once, stored as X came in. A
    staged row reads X again from shared memory rather than keep its FP32 values live through Steps 3-4."""
    if cutlass.const_expr(plan.arrival == "registers"):
        tYrY = cute.make_rmem_tensor((plan.vec, plan.vecs_per_thread), mY.element_type)
        tYrY.store(normalize(tXrX.load().to(Float32), None).to(mY.element_type))
    if row_ok:
        for k in cutlass.range_constexpr(plan.vecs_per_thread):
            j = t + k * plan.threads_per_row
            if plan.owns(j):
                if cutlass.const_expr(plan.arrival == "registers"):
                    cute.autovec_copy(tYrY[None, k], mY[row, None, j])
                else:
                    x = cute.make_rmem_tensor((plan.vec,), sX.element_type)
                    cute.autovec_copy(sX[slot, None, j], x)
                    y = cute.make_rmem_tensor((plan.vec,), mY.element_type)
                    y.store(normalize(x.load().to(Float32), k).to(mY.element_type))
                    cute.autovec_copy(y, mY[row, None, j])


@cute.kernel
def rms_norm_kernel(x_ptr: cute.Pointer, w_ptr: cute.Pointer, num_tokens: Int32, y_ptr: cute.Pointer,
                    plan: cutlass.Constexpr, epsilon: cutlass.Constexpr):
    # (X, W, num_tokens, Y) in the order TensorRT's ahead-of-time launcher passes arguments, so one PTX serves both
    # plugin flavors. A static row stride and (vec, num_vecs) rows prove every access 16-byte aligned (128-bit).
    rows = cute.make_layout((num_tokens, plan.vec, plan.num_vecs), stride=(plan.hidden, 1, plan.vec))
    mX, mY = cute.make_tensor(x_ptr, rows), cute.make_tensor(y_ptr, rows)
    mW = cute.make_tensor(w_ptr, cute.make_layout((plan.vec, plan.num_vecs), stride=(1, plan.vec)))
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    row_in_cta, t, first_row = plan.thread_slot(tidx, bidx)
    tXrX, tWrW = (cute.make_rmem_tensor((plan.vec, plan.vecs_per_thread), m.element_type) for m in (mX, mW))
    tXrX.fill(0.0)  # what a thread does not own stays zero
    tWrW.fill(0.0)
    columns = ((mW, tWrW),)  # per-column inputs: W (a LayerNorm's bias would join it here)
    smem = cutlass.memory.SmemAllocator()

    # Before any thread waits: a staged plan requests all its rows (Step 1), and W where W comes first.
    sX, rows_in = request_rows(plan, smem, mX, first_row, row_in_cta, t, num_tokens)
    if cutlass.const_expr(plan.early_weight and plan.arrival != "registers"):
        load_columns(plan, t, columns, range(plan.vecs_per_thread))
    sums = row_sum_buffers(plan, smem, plan.rows_in_sequence)  # one reduction per row
    with_x = columns if plan.early_weight and plan.arrival == "registers" else ()  # W requested with X

    for i in cutlass.range_constexpr(plan.rows_in_sequence):  # one row per slot, unless the plan stages more
        row, slot = first_row + i * plan.rows_per_cta, i * plan.rows_per_cta + row_in_cta
        row_ok = row < num_tokens  # the last CTA's spare slots read no X and store nothing
        row_to_registers(plan, i, t, tXrX, mX, row, sX, slot, rows_in, row_ok, with_x)   # Step 1
        total = row_sum(plan, sum_of_squares(tXrX), sums, i, row_in_cta, t)                # Steps 2 and 3
        rstd = inverse_rms(plan, total, epsilon)                                            # Step 4
        if cutlass.const_expr(not plan.early_weight and i == 0):  # W after the reduction
            load_columns(plan, t, columns, range(plan.vecs_per_thread))

        def normalize(x, k):  # FP32 vector k of X (None: all of the thread's vectors) -> FP32 Y
            return x * rstd * tWrW[None, k].load().to(Float32)

        store_row(plan, normalize, tXrX, sX, slot, mY, row, row_ok, t)                     # Step 5


# %% [3] Tuning: which plan runs which shape ---------------------------------------
# Every tuned number is here; benchmarks/NOTES.md says how each was chosen, with its command and what it beat.
# A row picks a line of ROW_PLANS by its bytes, the call's token count n one of the line's plans; the launcher ([4])
# holds a kernel for each (`--plans --hidden-dim H` prints them):
#
#   plan     token counts                X arrives by                  why it wins there
#   cluster  n <= cluster rows, sm_90+   registers                     too few rows for every SM: CLUSTER_CTAS
#                                                                      CTAs, one per SM, share each row
#   few      n <= FEW_TOKENS             registers, W first            one row per SM: the shortest chain wins
#   mid      MID_TOKENS < n <= mid rows  cp.async; bulk copy for rows  a few rows per SM: two per CTA, the first
#                                        over BULK_ROW_BYTES (sm_90+)  stored while the second arrives
#   many     every other n               the line's own plan           (16 KB rows over 2 CTAs above mid rows)
#
# For an adapter: R marks numbers set by RMSNorm's registers (X and W held through one reduction), T by its traffic
# (X read once, Y written once). `python3 support/check_kernel.py COPY.py` reports each plan's spills and CTAs/SM.


@dataclass(frozen=True)
class RowPlan:
    """One line of ROW_PLANS: how rows of at most max_row_bytes bytes are split, for each range of token counts."""

    max_row_bytes: int
    arrival: str              # many rows: "registers" or "cp.async" (only with 16-byte vectors, else registers)
    vecs_per_thread: int      # R, many rows
    early_weight: bool        # R, many rows: W with X, or after the reduction
    min_cta_threads: int      # T: short rows share a CTA until it has this many threads
    min_ctas_per_sm: int = 0  # R, many rows: a launch bound (ptxas otherwise issues W's loads after X's arrive)
    few_vecs: int = 0         # R, few rows: vectors per thread (0: no few-token plan)
    mid: tuple = (0, 0)       # T, R: (most rows, vectors per thread) of the mid plan ((0, 0): none)
    cluster: tuple = (0, 0)   # T, R: (most rows, vectors per thread) of the cluster plan ((0, 0): none)
    many_ctas: int = 1        # T, many rows: above mid rows, a cluster of this many CTAs shares each row


ROW_PLANS = (
    RowPlan(256, "registers", 2, False, 256),                            # short rows share warps
    RowPlan(2048, "registers", 2, True, 128, min_ctas_per_sm=8),
    RowPlan(3071, "registers", 2, True, 128),
    RowPlan(3072, "registers", 2, True, 128, min_ctas_per_sm=8),  # exactly 3 KB: hidden 1536
    RowPlan(4096, "registers", 2, True, 128),
    RowPlan(8192, "cp.async", 2, True, 128, few_vecs=2, mid=(1024, 2)),  # bandwidth-bound from here on
    RowPlan(15360, "cp.async", 4, True, 128, few_vecs=4, mid=(1024, 4)),
    RowPlan(16384, "registers", 4, True, 128, few_vecs=4, mid=(1024, 4), cluster=(32, 4), many_ctas=2),
    RowPlan(20480, "cp.async", 4, False, 128, few_vecs=4, mid=(4096, 4), cluster=(32, 2)),
    RowPlan(32767, "cp.async", 8, False, 128, few_vecs=4, mid=(4096, 4), cluster=(32, 4)),
    RowPlan(MAX_HIDDEN * 4, "registers", 4, False, 128, few_vecs=4, mid=(4096, 4), cluster=(128, 4)),
)
FEW_TOKENS = 128          # T: calls of at most this many rows run the few-token plan
MID_TOKENS = 384          # T: calls of more rows than this, up to the line's mid rows, run the mid plan
CLUSTER_CTAS = 4          # T: CTAs, on as many SMs, that share each row in the cluster plan
ROWS_IN_SEQUENCE = 2      # T: rows each CTA of the mid plan normalizes in turn
BULK_ROW_BYTES = 8192     # T: on sm_90+ the mid plan's rows longer than this arrive by bulk copy
MID_BOUND = (480, 2)      # R: mid plans of 480+ threads ask for 2 CTAs/SM, which ptxas misses by a few registers


def row_classes(elem_bytes: int) -> tuple:
    """((fewest, most) hidden, ...): the row lengths each line of ROW_PLANS serves at elem_bytes per element."""
    most = [min(MAX_HIDDEN, r.max_row_bytes // elem_bytes) for r in ROW_PLANS]
    return tuple((low + 1, high) for low, high in zip([0] + most, most) if high > low)


def threads_for(num_vecs: int, vecs_per_thread: int, ctas: int = 1) -> int:
    """Threads sharing a row: enough for vecs_per_thread vectors each, in whole warps (per CTA of a cluster of
    `ctas`), not a power of two, so none sit half idle; under a warp, a power of two, so the shuffle stays inside."""
    threads, step = math.ceil(num_vecs / vecs_per_thread), WARP_THREADS * ctas
    if threads <= WARP_THREADS and ctas == 1:
        return 1 << math.ceil(math.log2(threads))
    return min(step * math.ceil(threads / step), MAX_CTA_THREADS * ctas)


def row_plan(hidden: int, elem_bytes: int) -> RowPlan:
    """The line of ROW_PLANS that serves a row of `hidden` elements of `elem_bytes` bytes."""
    if isinstance(hidden, bool) or not isinstance(hidden, (int, np.integer)):
        raise TypeError(f"hidden must be an integer, got {hidden!r}")
    if not 1 <= hidden <= MAX_HIDDEN or type(elem_bytes) is not int or elem_bytes not in (2, 4):
        raise ValueError(f"hidden must be in [1, {MAX_HIDDEN}] and elem_bytes 2 or 4, got {hidden} and {elem_bytes!r}")
    return next(r for r in ROW_PLANS if hidden * elem_bytes <= r.max_row_bytes)


def plan_kernel(hidden: int, elem_bytes: int = 2, num_tokens: int | None = None, sm90: bool = True) -> KernelPlan:
    """The plan for num_tokens rows (None: many), as the table says; sm90=False: no clusters or bulk copies (older
    GPUs, the AOT flavor). A by-count plan holds X and W through Step 3: at most 512 threads a row (1024 clustered)."""
    row = row_plan(hidden, elem_bytes)
    vec = VECTOR_BYTES // elem_bytes
    while hidden % vec:  # a vector never straddles two rows, so every row stays aligned
        vec //= 2
    num_vecs, whole = hidden // vec, vec * elem_bytes == VECTOR_BYTES  # whole: what cp.async and clusters need
    n = math.inf if num_tokens is None else num_tokens
    fits = lambda vecs, most_threads: vecs > 0 and math.ceil(num_vecs / vecs) <= most_threads  # noqa: E731
    # (arrival, vectors per thread, W first, rows in sequence, CTAs per row, launch bound)
    spec = (row.arrival if whole else "registers", row.vecs_per_thread, row.early_weight, 1,
            row.many_ctas if sm90 and whole and n > row.mid[0] else 1, row.min_ctas_per_sm)
    if sm90 and whole and n <= row.cluster[0] and fits(row.cluster[1], MAX_CTA_THREADS):
        spec = ("registers", row.cluster[1], True, 1, CLUSTER_CTAS, 0)
    elif n <= FEW_TOKENS and fits(row.few_vecs, MAX_CTA_THREADS // 2):
        spec = ("registers", row.few_vecs, True, 1, 1, 0)
    elif whole and MID_TOKENS < n <= row.mid[0] and fits(row.mid[1], MAX_CTA_THREADS // 2):
        bound = MID_BOUND[1] if threads_for(num_vecs, row.mid[1]) >= MID_BOUND[0] else 0
        spec = ("bulk" if sm90 and hidden * elem_bytes > BULK_ROW_BYTES else "cp.async", row.mid[1], True,
                ROWS_IN_SEQUENCE, 1, bound)
    arrival, vecs, early_weight, in_sequence, ctas, bound = spec
    threads = threads_for(num_vecs, vecs, ctas)
    return KernelPlan(hidden, elem_bytes, vec, threads, max(1, row.min_cta_threads // threads) if ctas == 1 else 1,
                      math.ceil(num_vecs / threads), arrival, early_weight, in_sequence, ctas, bound)


def token_schedule(hidden: int, elem_bytes: int = 2, sm90: bool = True) -> tuple:
    """((plan, ((fewer, most), ...)), ...): each plan the launcher compiles, and the counts in (fewer, most] it runs."""
    row = row_plan(hidden, elem_bytes)
    bounds = sorted({FEW_TOKENS, MID_TOKENS, row.mid[0], row.cluster[0] if sm90 else 0} - {0})
    schedule: dict = {}
    for fewer, most in zip([None] + bounds, bounds + [None]):
        counts = schedule.setdefault(plan_kernel(hidden, elem_bytes, most, sm90), [])
        if counts and counts[-1][1] == fewer:  # one range where two meet
            fewer = counts.pop()[0]
        counts.append((fewer, most))
    return tuple((plan, tuple(counts)) for plan, counts in schedule.items())


def schedule_lines(hidden: int, elem_bytes: int = 2, sm90: bool = True) -> list:
    """The schedule as a reader sees it: one line per plan, with the token counts it serves."""
    return [", ".join(f"{(fewer or 0) + 1}-{most}" if most else f"{(fewer or 0) + 1}+" for fewer, most in counts)
            + f" tokens: {plan.describe()}" for plan, counts in token_schedule(hidden, elem_bytes, sm90)]


# %% [4] The @cute.jit launcher ---------------------------------------------------
# Compiled in: the dtypes, epsilon, the pointers' 16-byte alignment and the schedule (each plan, its token counts).
# At run time: the addresses, num_tokens and the stream; the host picks the plan from num_tokens, so one launcher
# serves the whole profile. Each plan has one launch site: CuteDSL compiles a kernel once per launch site.


def launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon):
    """Launch rms_norm_kernel with one plan: its grid, CTA size, cluster (if a row is split) and launch bound."""
    options = {"cluster": [plan.cluster_ctas, 1, 1]} if plan.cluster_ctas > 1 else {}
    if plan.min_ctas_per_sm:  # the carveout -1 (the driver's default) keeps CuteDSL from asking a GPU for its
        options.update(min_blocks_per_mp=plan.min_ctas_per_sm, preferred_smem_carveout=-1)  # shared memory size
    rms_norm_kernel(mX.iterator, mW.iterator, num_tokens, mY.iterator, plan, epsilon).launch(
        grid=[plan.grid(num_tokens), 1, 1], block=[plan.cta_threads, 1, 1], stream=stream, **options)


def serves(num_tokens, counts):
    """Whether num_tokens is in a range (fewer, most] of counts (None: unbounded); a runtime Boolean on an Int32."""
    hit = None
    for fewer, most in counts:
        term = (num_tokens > (fewer or 0)) & (num_tokens <= (most or 2**31 - 1))
        hit = term if hit is None else hit | term
    return hit


@cute.jit
def rms_norm_launch(mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, num_tokens: Int32, stream: cuda.CUstream,
                    schedule: cutlass.Constexpr, epsilon: cutlass.Constexpr):
    for p in cutlass.range_constexpr(len(schedule)):
        plan, counts = schedule[p]
        if cutlass.const_expr(len(schedule) == 1):  # one plan serves every count: no range test at run time
            launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon)
        elif serves(num_tokens, counts):
            launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon)


def validate_epsilon(value) -> float:
    """Epsilon as the float32 value the kernel uses, or ValueError (flags, plugin fields, compile)."""
    try:
        epsilon = struct.unpack("f", struct.pack("f", float(value)))[0]
    except OverflowError:  # beyond float32's range
        epsilon = math.inf
    except (TypeError, ValueError):
        raise ValueError(f"field 'epsilon' must be a number, got {value!r}") from None
    if not (math.isfinite(epsilon) and epsilon > 0.0):
        raise ValueError(f"field 'epsilon' must be finite and > 0 in float32, got {value}")
    return epsilon


def is_sm90(arch: str) -> bool:
    """Whether a compile target such as "sm_90a" is sm_90 or newer: it has thread-block clusters and bulk copies."""
    if not isinstance(arch, str) or arch not in cutlass.base_dsl.Arch.__members__:
        raise ValueError(f"arch must be a CuteDSL compile target such as 'sm_80' or 'sm_90a', got {arch!r}")
    return cutlass.base_dsl.Arch[arch].major >= 9


def gpu_arch() -> str:
    """The current GPU's compile target, e.g. "sm_90a" (the "a" unlocks Hopper's and later GPUs' own instructions)."""
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


_COMPILED, _COMPILE_LOCK = {}, threading.Lock()  # the launchers compiled in this process


def compile_launcher(schedule, dtype: str, w_dtype: str, epsilon: float, arch: str, keep_ptx: bool = False):
    """rms_norm_launch compiled for one schedule, dtype pair, epsilon and arch, on fake tensors (no GPU); keep_ptx:
    its PTX in .__ptx__. support/check_kernel.py compiles a copy's plans one by one through this hook."""
    fake, tokens = cute.runtime.make_fake_compact_tensor, cute.sym_int32()
    x, y = (fake(getattr(cutlass, DTYPES[dtype].cute), (tokens, schedule[0][0].hidden), stride_order=(1, 0),
                 assumed_align=VECTOR_BYTES) for _ in range(2))
    w = fake(getattr(cutlass, DTYPES[w_dtype].cute), (schedule[0][0].hidden,), assumed_align=VECTOR_BYTES)
    args = (rms_norm_launch, x, w, y, Int32(1), cute.runtime.make_fake_stream(), schedule, epsilon)
    if keep_ptx:  # CuteDSL also writes the PTX to a file: keep that out of the user's directory
        with tempfile.TemporaryDirectory() as dump_dir:
            return cute.compile(*args, options=f"--gpu-arch {arch} --keep-ptx --dump-dir {dump_dir}")
    return cute.compile(*args, options=f"--gpu-arch {arch}")


def compile_rms_norm(dtype: str, hidden: int, epsilon: float = DEFAULT_EPSILON, arch: str | None = None, *,
                     w_dtype: str = "float32", keep_ptx: bool = False, plans_by_tokens: bool = True):
    """The launcher for one X/Y dtype, W dtype, hidden and epsilon, compiled once per process for the GPU or `arch`
    ("sm_90a": no GPU needed). keep_ptx: compiled anew, PTX in .__ptx__. plans_by_tokens=False: AOT's one plan."""
    for name, value, allowed in (("dtype", dtype, ACTIVATION_DTYPES), ("w_dtype", w_dtype, WEIGHT_DTYPES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    elem_bytes, epsilon, arch = DTYPES[dtype].bytes, validate_epsilon(epsilon), gpu_arch() if arch is None else arch
    sm90 = is_sm90(arch)  # each argument is checked, with a clear error, before any tracing
    schedule = (token_schedule(hidden, elem_bytes, sm90=sm90) if plans_by_tokens
                else ((plan_kernel(hidden, elem_bytes, sm90=False), ((None, None),)),))
    key = (dtype, w_dtype, hidden, epsilon, arch, plans_by_tokens)
    with _COMPILE_LOCK:
        if keep_ptx:
            return compile_launcher(schedule, dtype, w_dtype, epsilon, arch, keep_ptx=True)
        if key not in _COMPILED:
            _COMPILED[key] = compile_launcher(schedule, dtype, w_dtype, epsilon, arch)
        return _COMPILED[key]


# %% [5] Zero-copy handoff: TensorRT's raw pointers -> CuTe tensors -----------------
# enqueue() gets device addresses as plain integers. Three hops make one a
# CuTe tensor without copying a byte; each library only describes memory
# that TensorRT keeps owning.


def cute_tensor_from_pointer(address: int, shape: tuple, dtype: str, device_id: int):
    """Wrap a device address TensorRT owns as a CuTe tensor (no copy, no sync)."""
    if address % VECTOR_BYTES:
        raise ValueError(
            f"RmsNormPlugin needs {VECTOR_BYTES}-byte aligned buffers, "
            f"got address {address:#x}")
    names = DTYPES[dtype]
    carrier = np.dtype(names.cupy)  # cupy has no bfloat16: int16 carries it
    nbytes = math.prod(shape) * carrier.itemsize

    # Hop 1: cupy wraps the address as memory it must not free, and gives
    # it a shape and a dtype.
    memory = cp.cuda.UnownedMemory(address, nbytes, owner=None, device_id=device_id)
    pointer = cp.cuda.MemoryPointer(memory, 0)
    array = cp.ndarray(shape, dtype=carrier, memptr=pointer)

    # Hop 2: torch reads cupy's __cuda_array_interface__; .view() turns the
    # int16 carrier back into bfloat16.
    view = torch.as_tensor(array, device=f"cuda:{device_id}")
    if names.cupy != names.torch:
        view = view.view(getattr(torch, names.torch))

    # Hop 3: CuTe takes torch's DLPack capsule. The kernel was compiled for
    # 16-byte aligned buffers, which the check above guarantees.
    return from_dlpack(view, assumed_align=VECTOR_BYTES)


# %% [6] The plugin: IPluginV3 with the OneCore / OneBuild / OneRuntime interfaces ---
# TensorRT talks to a V3 plugin through three capability interfaces; here one
# class implements all three. At build time TensorRT asks the plugin for
# dtypes, shapes, formats and the fields to store in the engine. At run time
# the creator remakes the plugin from those fields, TensorRT attaches it to
# an execution context, calls on_shape_change, then enqueue.

PLUGIN_NAME = "RmsNormPlugin"
PLUGIN_VERSION = "1"  # bump it when the stored fields change
PLUGIN_NAMESPACE = ""


class MissingTensorRT:
    """What `trt` names when TensorRT is not installed.

    The kernel half of this file works without TensorRT, so the file must
    still import, and the class statements below need their bases to exist.
    These are empty placeholders with TensorRT's names; require_tensorrt()
    stops a plugin or a creator from being made on them.
    """

    IPluginV3 = type("IPluginV3", (), {})
    IPluginV3OneCore = type("IPluginV3OneCore", (), {})
    IPluginV3OneBuild = type("IPluginV3OneBuild", (), {})
    IPluginV3OneRuntime = type("IPluginV3OneRuntime", (), {})
    IPluginCreatorV3One = type("IPluginCreatorV3One", (), {})


if trt is None:
    trt = MissingTensorRT


def require_tensorrt():
    """ModuleNotFoundError naming TensorRT's pip package, if it is missing."""
    if trt is MissingTensorRT:
        error = ModuleNotFoundError(name="tensorrt")
        raise ModuleNotFoundError(import_error_message(error), name="tensorrt")


def dtype_name(trt_type, tensor: str, allowed: tuple) -> str:
    """The name in `allowed` of a TensorRT dtype, or a ValueError."""
    for dtype in allowed:
        if trt_type == getattr(trt.DataType, DTYPES[dtype].trt):
            return dtype
    choices = f"{', '.join(allowed[:-1])} or {allowed[-1]}"
    raise ValueError(f"{PLUGIN_NAME}: {tensor} must be {choices}, got {trt_type}")


def epsilon_fields(epsilon: float):
    """(fields, the array they point into), for the plugin's one field.

    A trt.PluginField does not own its buffer, so the caller must keep the
    array alive as long as TensorRT may read the fields.
    """
    require_tensorrt()  # plugin_network starts here
    buffer = np.array([epsilon], dtype=np.float32)
    field = trt.PluginField("epsilon", buffer, trt.PluginFieldType.FLOAT32)
    fields = trt.PluginFieldCollection([field])
    return fields, buffer


class RmsNormPlugin(trt.IPluginV3, trt.IPluginV3OneCore,
                    trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
    """y = x / sqrt(mean(x^2) + epsilon) * w over the last axis of X [..., hidden]."""

    def __init__(self, epsilon: float = DEFAULT_EPSILON):
        """Called by the creator's create_plugin and by clone()."""
        require_tensorrt()
        # TensorRT's Python plugins must initialize each base explicitly.
        trt.IPluginV3.__init__(self)
        trt.IPluginV3OneCore.__init__(self)
        trt.IPluginV3OneBuild.__init__(self)
        trt.IPluginV3OneRuntime.__init__(self)
        self.plugin_name = PLUGIN_NAME
        self.plugin_version = PLUGIN_VERSION
        self.plugin_namespace = PLUGIN_NAMESPACE
        self.num_outputs = 1
        self.epsilon = validate_epsilon(epsilon)
        fields, buffer = epsilon_fields(self.epsilon)
        self._fields = fields
        self._epsilon_buffer = buffer  # the fields point into it
        # One execution context's state, never stored in the engine:
        self._kernel = None  # the compiled launcher
        self._io = None  # the (X dtype, hidden, W dtype) it serves
        self._device = None  # the CUDA device it was compiled on
        self._wrapped = {}  # (X, W, Y) addresses -> CuTe tensors
        self._streams = {}  # TensorRT's stream handle -> CUstream

    def get_capability_interface(self, type):
        """Build and run time, once per interface: this class implements all three."""
        return self

    def clone(self):
        """Build and run time: the same attributes, empty run-time state."""
        return RmsNormPlugin(self.epsilon)

    def get_output_data_types(self, input_types):
        """Build time, network definition: Y has X's dtype."""
        dtype_name(input_types[0], "X", ACTIVATION_DTYPES)
        dtype_name(input_types[1], "W", WEIGHT_DTYPES)
        return [input_types[0]]

    def get_output_shapes(self, inputs, shape_inputs, expr_builder):
        """Build time: Y has X's symbolic shape, X [..., hidden]."""
        if len(inputs) != 2 or len(inputs[0]) < 2 or len(inputs[1]) != 1:
            raise ValueError(f"{PLUGIN_NAME}: expects X [..., hidden] of rank 2 or more "
                             "and W [hidden]")
        x_dims = inputs[0]
        x_hidden = x_dims[len(x_dims) - 1]
        w_hidden = inputs[1][0]
        if not x_hidden.is_constant():
            raise ValueError(f"{PLUGIN_NAME}: the hidden dimension of X must be static "
                             "(the kernel bakes it in)")
        hidden = x_hidden.get_constant_value()
        if w_hidden.is_constant():
            w_size = w_hidden.get_constant_value()
            if w_size != hidden:
                raise ValueError(f"{PLUGIN_NAME}: X hidden {hidden} != W size {w_size}")
        if not 1 <= hidden <= MAX_HIDDEN:
            raise ValueError(f"{PLUGIN_NAME}: hidden must be in [1, {MAX_HIDDEN}], "
                             f"got {hidden}")
        return [trt.DimsExprs(x_dims)]

    def supports_format_combination(self, pos, in_out, num_inputs):
        """Build time, per I/O slot: linear X, W and Y; Y of X's dtype."""
        desc = in_out[pos].desc
        if desc.format != trt.TensorFormat.LINEAR:
            return False
        if pos == 2:
            return desc.type == in_out[0].desc.type
        allowed = ACTIVATION_DTYPES if pos == 0 else WEIGHT_DTYPES
        trt_types = [getattr(trt.DataType, DTYPES[d].trt) for d in allowed]
        return desc.type in trt_types

    def configure_plugin(self, inp, out):
        """Build time, once formats and profile are chosen: nothing to do."""

    def set_tactic(self, tactic):
        """Build and run time: there is no tactic to select."""

    def get_fields_to_serialize(self):
        """Build time and engine save: epsilon, the only stored attribute."""
        return self._fields

    def attach_to_context(self, context):
        """Run time, once per execution context: a clone owns its caches."""
        return self.clone()

    def on_shape_change(self, inp, out):
        """Run time, before the first enqueue and on a shape change: compile here."""
        dtype = dtype_name(inp[0].type, "X", ACTIVATION_DTYPES)
        hidden = inp[0].dims[-1]
        w_dtype = dtype_name(inp[1].type, "W", WEIGHT_DTYPES)
        io = (dtype, hidden, w_dtype)
        if io == self._io:
            return  # a new token count: the launcher takes it at run time
        # Compiling is slow; enqueue, on the inference path, never does it.
        self._kernel = compile_rms_norm(dtype, hidden, self.epsilon, w_dtype=w_dtype)
        self._io = io
        self._device = torch.cuda.current_device()
        self._wrapped.clear()

    def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
        """Run time, every inference: launch on TensorRT's stream."""
        num_tokens = math.prod(input_desc[0].dims[:-1])  # all but hidden count rows
        key = (inputs[0], inputs[1], outputs[0])
        tensors = self._wrapped.get(key)
        if tensors is None:  # a context usually reuses its buffers
            tensors = self._wrap_buffers(*key, num_tokens)
        cu_stream = self._streams.get(stream)
        if cu_stream is None:
            cu_stream = cuda.CUstream(stream)
            self._streams[stream] = cu_stream
        self._kernel(*tensors, num_tokens, cu_stream)

    def _wrap_buffers(self, x_ptr, w_ptr, y_ptr, num_tokens):
        """enqueue's handoff ([5]) for one set of addresses, then cached.

        The launcher takes the row count as an argument, so the tensors
        wrapped at one count serve every count.
        """
        dtype, hidden, w_dtype = self._io
        device = self._device
        # Addresses that change on every call must not grow the cache.
        if len(self._wrapped) >= 256:
            self._wrapped.clear()
        rows = (num_tokens, hidden)
        tensors = (
            cute_tensor_from_pointer(x_ptr, rows, dtype, device),
            cute_tensor_from_pointer(w_ptr, (hidden,), w_dtype, device),
            cute_tensor_from_pointer(y_ptr, rows, dtype, device),
        )
        self._wrapped[(x_ptr, w_ptr, y_ptr)] = tensors
        return tensors


class RmsNormPluginCreator(trt.IPluginCreatorV3One):
    """Makes RmsNormPlugin from its fields, for a build or an engine load."""

    def __init__(self):
        """Called once, by register_creator()."""
        require_tensorrt()
        trt.IPluginCreatorV3One.__init__(self)
        self.name = PLUGIN_NAME
        self.plugin_version = PLUGIN_VERSION
        self.plugin_namespace = PLUGIN_NAMESPACE
        # The fields create_plugin takes, with their defaults.
        fields, buffer = epsilon_fields(DEFAULT_EPSILON)
        self.field_names = fields
        self._default_epsilon = buffer  # the fields point into it

    def create_plugin(self, name, field_collection, phase):
        """Build time (network API, ONNX parser) and engine load: a plugin from its fields."""
        fields = {field.name: field for field in field_collection}
        field = fields.get("epsilon")
        if field is None:
            got = f"fields {sorted(fields)}"
        elif field.type != trt.PluginFieldType.FLOAT32:
            # The bindings cannot return .data of FLOAT16 or BF16 fields.
            got = f"a {field.type} field"
        elif len(field.data) != 1:
            got = f"a {field.type} field of {len(field.data)} values"
        else:
            return RmsNormPlugin(field.data[0])
        raise ValueError(f"{PLUGIN_NAME}: needs one FLOAT32 field 'epsilon' "
                         f"holding one value, got {got}")


# The registry does not keep a Python creator alive; this reference does.
_CREATOR = None


def register_creator():
    """Put the creator in TensorRT's registry, once; return it.

    Call it before building a network or loading an engine: an engine
    stores only the plugin's name, version, namespace and fields.
    """
    global _CREATOR
    require_tensorrt()
    registry = trt.get_plugin_registry()
    key = (PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    if registry.get_creator(*key) is None:
        _CREATOR = RmsNormPluginCreator()
        registry.register_creator(_CREATOR, PLUGIN_NAMESPACE)
    return registry.get_creator(*key)


# %% [7] The engine, built with Polygraphy ------------------------------------------
# X [num_tokens, hidden] and W [hidden] are network inputs: num_tokens is
# dynamic over the profile, hidden is static, and the network is strongly
# typed (TensorRT 11 has no other kind). A UsageError is the user's to fix;
# a TensorRTError is TensorRT refusing a step, with the reason in its log.


class UsageError(Exception):
    """A problem the user can fix; main() prints it as one sentence, exits 2."""


class TensorRTError(RuntimeError):
    """TensorRT refused a step (network, parse, build, load, run); exit 2."""


@contextlib.contextmanager
def tensorrt_stage(stage: str):
    """Any failure in a TensorRT step as a TensorRTError naming the step.

    TensorRT logs its own reason as an '[E]' line; the message points there.
    """
    try:
        yield
    except (UsageError, TensorRTError):
        raise
    except Exception as exc:
        detail = " ".join(str(exc).split())[:200]
        raise TensorRTError(
            f"TensorRT failed at the {stage} stage "
            f"({type(exc).__name__}: {detail}); "
            "TensorRT's own message is the '[E]' line in the log above",
        ) from exc


def plugin_network(hidden: int, dtype: str, epsilon: float, w_dtype: str):
    """((builder, network), plugin): one plugin layer, X and W its inputs.

    The plugin comes from the registered creator, as the ONNX parser gets
    it, so both ways of building go through create_plugin.
    """
    from polygraphy.backend.trt import create_network

    with tensorrt_stage("network definition"):
        builder, network = create_network(strongly_typed=True)
        # _buffer stays alive until create_plugin has copied the field.
        fields, _buffer = epsilon_fields(epsilon)
        creator = register_creator()
        phase = trt.TensorRTPhase.BUILD
        plugin = creator.create_plugin("rms_norm", fields, phase)
        x_type = getattr(trt.DataType, DTYPES[dtype].trt)
        w_type = getattr(trt.DataType, DTYPES[w_dtype].trt)
        x = network.add_input("X", x_type, (-1, hidden))
        w = network.add_input("W", w_type, (hidden,))
        layer = network.add_plugin_v3([x, w], [], plugin)
        y = layer.get_output(0)
        y.name = "Y"
        network.mark_output(y)
    return (builder, network), plugin


def onnx_network(hidden: int, dtype: str, epsilon: float, w_dtype: str):
    """The same network, from a one-node ONNX model of op type PLUGIN_NAME.

    TensorRT's parser asks the registry for the creator that the node's
    plugin_version and plugin_namespace name, and passes every other
    attribute (here epsilon) as a field.
    """
    try:
        from onnx import TensorProto, helper
    except ImportError:
        raise UsageError("--from-onnx needs the onnx package; "
                         "install it with `pip install onnx`") from None
    from polygraphy.backend.trt import network_from_onnx_bytes

    x_type = getattr(TensorProto, DTYPES[dtype].onnx)
    w_type = getattr(TensorProto, DTYPES[w_dtype].onnx)
    rows = ["num_tokens", hidden]
    x = helper.make_tensor_value_info("X", x_type, rows)
    w = helper.make_tensor_value_info("W", w_type, [hidden])
    y = helper.make_tensor_value_info("Y", x_type, rows)
    node = helper.make_node(
        PLUGIN_NAME,
        inputs=["X", "W"],
        outputs=["Y"],
        name="rms_norm",
        epsilon=float(epsilon),
        plugin_version=PLUGIN_VERSION,
        plugin_namespace=PLUGIN_NAMESPACE,
    )
    graph = helper.make_graph([node], "rms_norm", inputs=[x, w], outputs=[y])
    opset = helper.make_opsetid("", 17)
    model = helper.make_model(graph, ir_version=8, opset_imports=[opset])
    register_creator()  # the parser finds the plugin in the registry
    with tensorrt_stage("ONNX parse"):
        return network_from_onnx_bytes(model.SerializeToString(), strongly_typed=True)


def build_from_network(network, shapes: dict):
    """The engine, with one optimization profile.

    shapes maps each dynamic input to its (min, opt, max) shapes.
    """
    from polygraphy.backend.trt import CreateConfig, Profile, engine_from_network

    profile = Profile()
    for name, (low, opt, high) in shapes.items():
        profile.add(name, min=low, opt=opt, max=high)
    with tensorrt_stage("engine build"):
        config = CreateConfig(profiles=[profile])
        return engine_from_network(network, config=config)


# %% [8] Run and check against NumPy ------------------------------------------------
# Y's tolerance against the float64 reference. The kernel computes in FP32
# and rounds once, so a 16-bit Y is within one ulp of |ref| (its dtype's
# eps). An fp32 Y carries only the FP32 arithmetic's error, which
# tests/test_tolerance.py bounds below 2^-18. atol covers values too close
# to zero for a relative bound, such as fp16's subnormals.
Tolerance = collections.namedtuple("Tolerance", "rtol atol")
Y_TOLERANCE = {
    "float16": Tolerance(rtol=2.0**-10, atol=1e-6),
    "bfloat16": Tolerance(rtol=2.0**-7, atol=1e-6),
    "float32": Tolerance(rtol=2.0**-18, atol=1e-30),
}


def make_inputs(num_tokens: int, hidden: int, dtype: str, seed: int,
                w_dtype: str = "float32"):
    """Random X and W on the CPU, rounded to their dtypes, fixed by seed."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen)
    # W in [-0.5, 1.5): both signs, and some products near zero.
    w = torch.rand(hidden, generator=gen) * 2.0 - 0.5
    x = x.to(getattr(torch, DTYPES[dtype].torch))
    w = w.to(getattr(torch, DTYPES[w_dtype].torch))
    return x, w


def check_output(y: np.ndarray, x: np.ndarray, w: np.ndarray, epsilon: float, dtype: str):
    """(all within Y_TOLERANCE[dtype], max abs error) against float64."""
    ref = rms_norm_reference(x, w, epsilon)
    err = np.abs(y.astype(np.float64) - ref)
    tolerance = Y_TOLERANCE[dtype]
    bound = tolerance.atol + tolerance.rtol * np.abs(ref)
    finite = np.all(np.isfinite(y))
    ok = bool(finite and np.all(err <= bound))
    return ok, float(np.max(err, initial=0.0))


def run_and_check(engine, token_counts, hidden, dtype, epsilon, seed,
                  w_dtype="float32") -> bool:
    """Run each token count through one context and compare with NumPy.

    The buffers and the stream are torch's, as in an application.
    """
    context = engine.create_execution_context()
    stream = torch.cuda.Stream()
    all_ok = True
    for n in token_counts:
        # The flag's seed as given: every value it accepts is one torch takes.
        x, w = make_inputs(n, hidden, dtype, seed, w_dtype)
        xd = x.cuda()
        wd = w.cuda()
        # An element the engine leaves unwritten stays NaN and fails.
        yd = torch.full_like(xd, float("nan"))
        context.set_input_shape("X", tuple(xd.shape))
        context.set_tensor_address("X", xd.data_ptr())
        context.set_tensor_address("W", wd.data_ptr())
        context.set_tensor_address("Y", yd.data_ptr())
        # The uploads ran on torch's stream; TensorRT reads on `stream`.
        torch.cuda.synchronize()
        if not context.execute_async_v3(stream.cuda_stream):
            raise TensorRTError(f"TensorRT could not run the engine at {n} tokens; "
                                "its log above says why")
        stream.synchronize()
        y = yd.float().cpu().numpy()
        ok, err = check_output(y, x.float().numpy(), w.float().numpy(), epsilon, dtype)
        verdict = "ok" if ok else "MISMATCH"
        print(f"  tokens={n:<5d} max |y - ref| = {err:.3e}  {verdict}")
        all_ok = all_ok and ok
    return all_ok


# %% [9] Command line: each user error one sentence and exit code 2, before any GPU work
# The integer flags every script shares, each with the range it accepts.
# The kernel counts rows in an Int32; torch's generator takes a 64-bit seed.
IntFlag = collections.namedtuple("IntFlag", "name default lowest highest help")
INT32_MAX = 2**31 - 1
INT_FLAGS = (
    IntFlag(name="--hidden-dim", default=1024, lowest=1, highest=MAX_HIDDEN,
            help="hidden size H, static in the engine"),
    IntFlag(name="--num-tokens", default=128, lowest=1, highest=INT32_MAX,
            help="tokens in the main run, within the profile"),
    IntFlag(name="--min-tokens", default=1, lowest=1, highest=INT32_MAX,
            help="profile minimum"),
    IntFlag(name="--opt-tokens", default=128, lowest=1, highest=INT32_MAX,
            help="optimum"),
    IntFlag(name="--max-tokens", default=512, lowest=1, highest=INT32_MAX,
            help="profile maximum"),
    IntFlag(name="--seed", default=0, lowest=0, highest=2**64 - 1,
            help="seed of the inputs"),
)


def make_parser(description: str) -> argparse.ArgumentParser:
    """The shared flags; the saved-engine and AOT scripts add their own."""
    parser = argparse.ArgumentParser(
        description=description,
        epilog="exit codes: 0 every run matched NumPy, 1 a run did not, "
               "2 usage or environment error",
    )

    def one_sentence(message):
        parser.exit(EXIT_USAGE, f"error: {message} (see --help)\n")

    parser.error = one_sentence  # instead of argparse's usage dump
    for flag in INT_FLAGS:
        parser.add_argument(flag.name, type=int, default=flag.default,
                            help=f"{flag.help} (default {flag.default})")
    parser.add_argument("--dtype", choices=ACTIVATION_DTYPES, default="float16",
                        help="X/Y dtype (default float16)")
    parser.add_argument("--weight-dtype", choices=WEIGHT_DTYPES, default="float32",
                        help="W dtype (default float32)")
    parser.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON,
                        help=f"default {DEFAULT_EPSILON}")
    parser.add_argument("--from-onnx", action="store_true",
                        help="build through TensorRT's ONNX parser (needs onnx)")
    parser.add_argument("--plans", action="store_true",
                        help="print which kernel runs which token counts, and exit")
    return parser


def validate_args(parser: argparse.ArgumentParser,
                  args: argparse.Namespace) -> argparse.Namespace:
    """Refuse what TensorRT would refuse later, or not at all: exit 2."""
    for flag in INT_FLAGS:
        value = getattr(args, flag.name[2:].replace("-", "_"))
        if not flag.lowest <= value <= flag.highest:
            parser.error(f"{flag.name} must be in [{flag.lowest}, {flag.highest}], "
                         f"got {value}")
    low = args.min_tokens
    high = args.max_tokens
    if not low <= args.opt_tokens <= high:
        parser.error("the profile needs --min-tokens <= --opt-tokens <= --max-tokens, "
                     f"got {low}, {args.opt_tokens}, {high}")
    if not low <= args.num_tokens <= high:
        parser.error(f"--num-tokens {args.num_tokens} is outside the profile [{low}, {high}]")
    try:
        validate_epsilon(args.epsilon)
    except ValueError:
        parser.error(f"--epsilon must be finite and > 0 in float32, got {args.epsilon}")
    return args


def check_environment():
    """UsageError unless a usable GPU, TensorRT and Polygraphy are present."""
    if not torch.cuda.is_available():
        raise UsageError("no CUDA GPU is visible; this sample needs an NVIDIA GPU "
                         "of compute capability 8.0 or newer")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        name = torch.cuda.get_device_name()
        raise UsageError(f"{name} has compute capability {major}.{minor}; "
                         "the kernel needs 8.0 or newer")
    try:
        require_tensorrt()
        import polygraphy.backend.trt  # noqa: F401
    except ImportError as exc:
        raise UsageError(import_error_message(exc)) from None


def build_engine(args: argparse.Namespace):
    """[7] for these flags, through the network API or the ONNX parser."""
    elem_bytes = DTYPES[args.dtype].bytes
    sm90 = is_sm90(gpu_arch())
    print("\n".join(schedule_lines(args.hidden_dim, elem_bytes, sm90)))
    counts = (args.min_tokens, args.opt_tokens, args.max_tokens)
    shapes = {"X": tuple((n, args.hidden_dim) for n in counts)}
    network_args = (args.hidden_dim, args.dtype, args.epsilon, args.weight_dtype)
    if args.from_onnx:
        network = onnx_network(*network_args)
        return build_from_network(network, shapes)
    # The network only points at the plugin: hold it until the build ends.
    network, plugin = plugin_network(*network_args)
    return build_from_network(network, shapes)


def run(args: argparse.Namespace, make_engine) -> int:
    """Check the environment, make_engine(args), run and check: exit code.

    It runs the main token count, the profile's edges and an odd count.
    """
    low = args.min_tokens
    high = args.max_tokens
    # An odd count tests the tail: a last CTA with fewer rows than it takes.
    odd = 37 if low <= 37 <= high else high - 1
    wanted = (args.num_tokens, low, high, odd)
    counts = [n for n in dict.fromkeys(wanted) if n >= low]
    try:
        check_environment()
        print(f"RMSNorm {args.dtype}, hidden {args.hidden_dim}, W {args.weight_dtype}, "
              f"epsilon {args.epsilon:g}, profile [{low}, {high}] opt {args.opt_tokens}")
        engine = make_engine(args)
        with tensorrt_stage("execution context"):
            correct = run_and_check(engine, counts, args.hidden_dim, args.dtype,
                                    args.epsilon, args.seed, args.weight_dtype)
    except (UsageError, TensorRTError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if correct:
        print("Inference result correct!")
        return EXIT_CORRECT
    print("Inference result incorrect!")
    return EXIT_INCORRECT


def main(args: argparse.Namespace) -> int:
    """--plans prints the schedule (no GPU needed); else build, run, check."""
    if not args.plans:
        return run(args, build_engine)
    elem_bytes = DTYPES[args.dtype].bytes
    targets = (("sm_90 and newer", True), ("sm_80 to sm_89", False))
    for target, sm90 in targets:
        lines = schedule_lines(args.hidden_dim, elem_bytes, sm90)
        heading = f"{args.dtype} hidden {args.hidden_dim}, {target}:"
        print(heading, *lines, sep="\n  ")
    return EXIT_CORRECT


if __name__ == "__main__":
    PARSER = make_parser("Build a TensorRT engine around a CuteDSL RMSNorm plugin, "
                         "run it and check it against NumPy.")
    ARGS = validate_args(PARSER, PARSER.parse_args())
    sys.exit(main(ARGS))
