#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""RMSNorm as a TensorRT Python plugin whose kernel is written in CuteDSL.

What you will learn
-------------------
* [2] A memory-bound CuteDSL kernel in five steps, one ``@cute.jit`` helper
  each: every byte of X read once in 128-bit vectors, sums in FP32, one
  cast on store. Its residual form fuses a decoder's Add: s = x + r, stored,
  then normalized. [3] adds the layers that make it fast at every shape.
* [4] How a plan follows from what the kernel holds in registers, and one
  table of timed choices; ``--plans`` prints which kernel runs where.
* [5] A ``@cute.jit`` launcher compiled before the first inference, with the
  token count and TensorRT's stream passed at run time.
* [6] TensorRT's raw pointers as CuTe tensors without a copy: cupy
  ``UnownedMemory``, ``torch.as_tensor``, ``cute.runtime.from_dlpack``.
* [7] An ``IPluginV3`` and its ``IPluginCreatorV3One``; [8] an engine built
  by Polygraphy with a dynamic token count; [9] the check against NumPy;
  [10] every user error as one sentence.

It runs on an NVIDIA GPU of compute capability 8.0 or newer, with
TensorRT 10 or 11, CUDA 12 or 13 and Python 3.11+:

    pip install -r requirements.txt     # CUDA 12; requirements-cu13.txt: CUDA 13
    python3 rms_norm_plugin_cutedsl.py               # build, run, check
    python3 rms_norm_plugin_cutedsl.py --from-onnx   # through the ONNX parser
    python3 rms_norm_plugin_cutedsl.py --plans --hidden-dim 8192  # no GPU

Exit codes: 0 every run matched NumPy, 1 one did not, 2 a usage or
environment error. Companions that import this file: rms_norm_onnx_model.py
(your ONNX model), rms_norm_saved_engine.py (saved engines) and
rms_norm_aot_cutedsl.py (no Python at run time).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import math
import struct
import sys
import tempfile
import threading

EXIT_CORRECT = 0
EXIT_INCORRECT = 1
EXIT_USAGE = 2

# Where pip's package name is not the name Python imports.
PIP_NAMES = {
    "cuda": "cuda-python",
    "cupy": "cupy-cuda12x (cupy-cuda13x for CUDA 13)",
    "cutlass": "nvidia-cutlass-dsl",
    "tensorrt": "tensorrt-cu12 (tensorrt-cu13 for CUDA 13)",
}


def import_error_message(exc: ImportError) -> str:
    """One sentence naming the pip package behind a failed import."""
    install = (
        "install the sample's set with `pip install -r requirements.txt` "
        "(CUDA 12) or `-r requirements-cu13.txt`"
    )
    module = (exc.name or "").partition(".")[0]
    if isinstance(exc, ModuleNotFoundError) and module:
        package = PIP_NAMES.get(module, module)
        return (
            f"the package {package} is not installed "
            f"(import '{exc.name}' failed); {install}"
        )
    # Installed but not loadable, e.g. a shared library is missing.
    detail = " ".join(str(exc).split())
    return (
        f"a package of this sample failed to import ({detail}); "
        f"{install} in a fresh virtual environment"
    )


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
    # Run as a script: one sentence and exit 2. Imported: the same sentence.
    if __name__ == "__main__":
        print(f"error: {import_error_message(exc)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    raise ImportError(import_error_message(exc), name=exc.name) from exc

try:
    import tensorrt as trt
except ImportError:
    trt = None  # the kernel half runs without TensorRT; main() says what to install

# One dtype as TensorRT, torch, CuTe, cupy and ONNX name it, and its size.
# cupy has no bfloat16: an int16 array carries its bits.
DType = collections.namedtuple("DType", "trt torch cute cupy onnx bytes")
DTYPES = {
    "float16": DType("HALF", "float16", "Float16", "float16", "FLOAT16", 2),
    "bfloat16": DType("BF16", "bfloat16", "BFloat16", "int16", "BFLOAT16", 2),
    "float32": DType("FLOAT", "float32", "Float32", "float32", "FLOAT", 4),
    # Y of the FP8 form only; uint8 carries its bits through cupy.
    "float8_e4m3fn": DType("FP8", "float8_e4m3fn", "Float8E4M3FN", "uint8", "FLOAT8E4M3FN", 1),
}
ACTIVATION_DTYPES = ("float16", "bfloat16", "float32")  # X and Y
Y_FP8 = "float8_e4m3fn"  # Y of the FP8 form: E4M3, finite only, largest 448
FP8_MAX = 448.0
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")  # W; the first is the default
# Any X dtype with any W dtype: the kernel computes in FP32 either way.
DTYPE_PAIRS = tuple((x, w) for x in ACTIVATION_DTYPES for w in WEIGHT_DTYPES)
DEFAULT_EPSILON = 1e-5
MAX_HIDDEN = 32768  # the longest row the last line of ROW_PLANS ([4]) serves


# %% [1] NumPy reference ---------------------------------------------------------


def rms_norm_reference(x: np.ndarray, w: np.ndarray, epsilon: float) -> np.ndarray:
    """y = x / sqrt(mean(x^2) + epsilon) * w over the last axis, in float64."""
    x64 = np.asarray(x, dtype=np.float64)
    mean_square = np.mean(x64 * x64, axis=-1, keepdims=True)
    return x64 / np.sqrt(mean_square + epsilon) * np.asarray(w, dtype=np.float64)


def quantize_reference(y: np.ndarray, y_scale: float) -> np.ndarray:
    """y / y_scale rounded to FP8 E4M3 (nearest, ties to even, saturated at 448), in float64.

    ONNX's QuantizeLinear to FLOAT8E4M3FN with saturate=1: infinities become
    +-448 and NaN stays NaN. E4M3 keeps 3 bits after the leading one, and
    below 2^-6 its steps stay 2^-9 (subnormals).
    """
    v = np.asarray(y, dtype=np.float64) / y_scale
    magnitude = np.abs(v)
    with np.errstate(divide="ignore", invalid="ignore"):
        exponent = np.floor(np.log2(magnitude))
    # Exponents past 8 saturate anyway; NaN's step does not matter.
    exponent = np.clip(np.nan_to_num(exponent, nan=0.0, neginf=-6.0, posinf=9.0), -6.0, 9.0)
    step = np.exp2(exponent - 3.0)
    rounded = np.round(magnitude / step) * step  # np.round ties to even; the division is exact
    rounded = np.minimum(rounded, FP8_MAX)  # inf included
    return np.where(np.isnan(v), np.nan, np.copysign(rounded, v))


def residual_reference(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """s = x + r rounded once to X's dtype (torch: NumPy has no bfloat16).

    The FP32 sum rounds to fp16 or bf16 as the exact sum would: FP32 carries
    more than twice their digits. The residual form's Y is the norm of s.
    """
    return (x.float() + r.float()).to(x.dtype)


# %% [2] The CuteDSL kernel ------------------------------------------------------
# Memory traffic. RMSNorm does about 4 FLOPs per element, so memory bounds
# it. N rows of H elements: X and Y move N*H*x bytes each, W H*w (x, w:
# bytes per element). The floor is a copy of X into Y, so the kernel reads
# each element of X from DRAM once: a row stays on chip until it is stored.
# The residual form also reads R and writes S = X + R, each once: a decoder
# layer's Add costs no pass of its own. The FP8 form stores Y as the FP8 GEMM
# after it reads it, one byte per element: no quantize pass reads Y again.
#
# Work split. A row is cut into 16-byte vectors (8 fp16/bf16 or 4 fp32
# values; fewer where H is not a multiple), W alike. The T threads of a row
# own vectors t, t+T, t+2T, ..., so neighbouring threads touch neighbouring
# bytes and every access is one 128-bit instruction.
#
#   vector:  0   1  ...  T-1 | T  T+1 ... 2T-1 | ...
#   thread:  t0  t1 ...  tT-1| t0 t1  ... tT-1 | ...
#            X (and R) and W into registers     Step 1  load_row
#            s = x + r stored, kept as x        (residual form: add_residual)
#            x^2 summed per thread, FP32        Step 2  sum_of_squares
#            warp shuffle, then [w0][w1].. smem Step 3  row_sum
#            rstd = rsqrt(sum / H + epsilon)    Step 4  inverse_rms
#            y = x * rstd * w, cast, stored     Step 5  store_row
#            (FP8 form: rstd / y_scale, and the cast saturates)
#
# The plan the demo runs (hidden 1024) is exactly this: X in registers,
# a warp shuffle and shared memory for the sum. [3] adds staged rows and
# clusters; a reader may skip it on the first pass.

VECTOR_BYTES = 16  # the widest global access per thread (ld.global.v4.b32)
WARP_THREADS = 32
MAX_CTA_THREADS = 1024  # CUDA's limit on threads per CTA
FLT_MIN = float(np.finfo(np.float32).tiny)  # smallest normal float32, 2**-126


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """How the kernel maps rows onto threads; baked into the kernel compiled with it."""

    hidden: int
    elem_bytes: int  # bytes per X/Y element: 2 (fp16, bf16) or 4 (fp32)
    vec: int  # elements per vector access
    threads_per_row: int  # over all CTAs of a cluster, where a cluster shares a row
    rows_per_cta: int  # row slots side by side in a CTA
    vecs_per_thread: int
    # Step 1: X straight into "registers", or staged in shared memory ([3]) by
    # "cp.async" (a copy per vector) or "bulk" copy (one per row, sm_90+).
    arrival: str = "registers"
    early_weight: bool = True  # W loaded with X (Step 1), or after the reduction
    weight_by_vector: bool = False  # a late W loaded a vector at a time in Step 5
    rows_in_sequence: int = 1  # rows each slot normalizes in turn (staged plans)
    cluster_ctas: int = 1  # CTAs of a cluster that share each row (sm_90+)
    min_ctas_per_sm: int = 0  # a launch bound: ptxas budgets registers for it
    residual: bool = False  # the fused form: R added to X first, the sum S stored too

    @property
    def num_row_inputs(self) -> int:
        """Rows each thread reads: X, and R in the residual form."""
        return ROW_INPUTS + self.residual

    @property
    def num_vecs(self) -> int:
        return self.hidden // self.vec

    @property
    def warps_per_row(self) -> int:
        return max(1, self.threads_per_row // WARP_THREADS)

    @property
    def cta_threads(self) -> int:
        return self.threads_per_row * self.rows_per_cta // self.cluster_ctas

    @property
    def cta_rows(self) -> int:
        return self.rows_per_cta * self.rows_in_sequence

    @property
    def ragged(self) -> bool:
        """Whether some thread owns fewer vectors than the others."""
        return self.num_vecs % self.threads_per_row != 0

    # Index arithmetic in plain Python: the kernel runs it on Int32 values,
    # tests/test_kernel_operands.py on ints.
    def grid(self, num_tokens):
        """CTAs for num_tokens rows (ints, Int32 values or TensorRT's symbolic sizes)."""
        ctas_of_rows = (num_tokens + self.cta_rows - 1) // self.cta_rows
        return ctas_of_rows * self.cluster_ctas

    def thread_slot(self, tidx, bidx):
        """(row slot, place t in the row, the slot's first row) of thread tidx of CTA bidx.

        A slot's rows are first_row + i * rows_per_cta, i < rows_in_sequence.
        """
        if self.cluster_ctas > 1:
            # A row's CTAs are neighbours in the grid: CTA c of a cluster holds
            # threads c * cta_threads and up of each row.
            tidx = tidx + bidx % self.cluster_ctas * self.cta_threads
            bidx = bidx // self.cluster_ctas
        row_in_cta = tidx // self.threads_per_row
        t = tidx % self.threads_per_row
        return row_in_cta, t, bidx * self.cta_rows + row_in_cta

    def owns(self, j):
        """Whether vector j of some thread lies in the row (always, unless ragged)."""
        return not self.ragged or j < self.num_vecs

    def clamp(self, j):
        """Vector j, or the row's last where j is past a ragged end: safe to load."""
        if self.ragged:
            return cutlass.min(j, self.num_vecs - 1)
        return j

    def __str__(self) -> str:
        """A short tag: CuteDSL names a kernel after it and cuts names at 180 characters."""
        weight = "early" if self.early_weight else "late"
        if self.weight_by_vector:
            weight = "vector"
        return (
            f"h{self.hidden}b{self.elem_bytes}v{self.vec}t{self.threads_per_row}"
            f"r{self.rows_per_cta}q{self.rows_in_sequence}c{self.cluster_ctas}"
            f"m{self.min_ctas_per_sm}k{self.vecs_per_thread}"
            f"_w{weight}_{self.arrival.replace('.', '')}{'_residual' * self.residual}"
        )

    def describe(self) -> str:
        """One line for a reader: how a row is split and how it arrives."""
        if self.cluster_ctas > 1:
            rows = f"each row over a cluster of {self.cluster_ctas} CTAs"
        elif self.rows_in_sequence > 1:
            rows = f"{self.cta_rows} rows/CTA in turn"
        else:
            rows = f"{self.rows_per_cta} row{'s' if self.rows_per_cta > 1 else ''}/CTA"
        rows_in = "X and R" if self.residual else "X"
        where = {
            "registers": f"{rows_in} in registers",
            "cp.async": f"{rows_in} staged by cp.async",
            "bulk": f"{rows_in} staged by bulk copy",
        }[self.arrival]
        bound = ""
        if self.min_ctas_per_sm:
            bound = f", launch bound {self.min_ctas_per_sm} CTAs/SM"
        vectors = (
            f"{self.vecs_per_thread} vectors of {self.vec} x {self.elem_bytes * 8}-bit"
        )
        weight = "first" if self.early_weight else "late"
        if self.weight_by_vector:
            weight = "late, a vector at a time"
        return (
            f"{self.threads_per_row} threads/row x {vectors}, {rows}, {where}, "
            f"W {weight}{bound}"
        )


@cute.jit
def load_columns(plan: cutlass.Constexpr, t, columns, k: cutlass.Constexpr):
    """Vector k of thread t of each per-column input: (view, registers) pairs, W alone here.

    The only code that reads W. Loaded first, every thread loads every slot
    (past a ragged end, the last vector again), so ptxas need not wait for a
    bounds check before issuing the load.
    """
    j = t + k * plan.threads_per_row
    for view, regs in columns:
        if cutlass.const_expr(plan.early_weight):
            cute.autovec_copy(view[None, plan.clamp(j)], regs[None, k])
        else:
            if plan.owns(j):
                cute.autovec_copy(view[None, j], regs[None, k])


@cute.jit
def load_row(plan: cutlass.Constexpr, t, row, row_ok, row_inputs, columns):
    """Step 1: thread t's vectors of the row into registers, each after W's.

    row_inputs holds (view, registers) pairs: X, and R in the residual form;
    zeros stay where the thread owns no vector. W's loads go first, so that
    they are in flight with X's ([4] says where W is late).
    """
    for k in cutlass.range_constexpr(plan.vecs_per_thread):
        if cutlass.const_expr(plan.early_weight):
            load_columns(plan, t, columns, k)
        j = t + k * plan.threads_per_row
        if plan.owns(j):
            if row_ok:
                for view, regs in row_inputs:
                    cute.autovec_copy(view[row, None, j], regs[None, k])


@cute.jit
def add_residual(plan: cutlass.Constexpr, t, row, row_ok, row_inputs, mS, staged, slot):
    """Step 1 of the residual form, second half: s = x + r, stored as S, normalized as X.

    The sum is rounded to X's dtype before the norm reads it, as torch and
    onnxruntime compute it, so Y is the norm of exactly the S stored. A
    staged plan also writes s over its row of sX, which Step 5 reads again.
    """
    (_, tXrX), (_, tRrR) = row_inputs
    s = tXrX.load().to(Float32) + tRrR.load().to(Float32)
    tXrX.store(s.to(tXrX.element_type))
    if row_ok:
        for k in cutlass.range_constexpr(plan.vecs_per_thread):
            j = t + k * plan.threads_per_row
            if plan.owns(j):
                cute.autovec_copy(tXrX[None, k], mS[row, None, j])
                if cutlass.const_expr(plan.arrival != "registers"):
                    sX = staged[0][0]
                    cute.autovec_copy(tXrX[None, k], sX[slot, None, j])


@cute.jit
def sum_of_squares(tXrX):
    """Step 2: this thread's sum of x^2 in FP32.

    Across its vectors first, then within one: the chain of dependent adds is
    vecs_per_thread + vec long, not their product.
    """
    x = tXrX.load().to(Float32)
    squares = x * x
    lane_sums = squares.reduce(
        cute.ReductionOp.ADD, Float32(0.0), reduction_profile=(None, 1)
    )
    return lane_sums.reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)


@cute.jit
def row_sum_buffers(plan: cutlass.Constexpr, smem, reductions: cutlass.Constexpr):
    """Step 3's shared memory: an FP32 sum per warp of each row slot.

    Up to two sets, used in turn by a CTA that reduces `reductions` times;
    a cluster plan adds the mbarriers its sums arrive on ([3]).
    """
    sets = min(2, reductions)
    sSum = None
    if cutlass.const_expr(plan.warps_per_row > 1):
        layout = cute.make_layout((plan.warps_per_row, plan.rows_per_cta, sets))
        sSum = smem.allocate_tensor(Float32, layout, 16)
    sums_in = None
    if cutlass.const_expr(plan.cluster_ctas > 1):
        sums_in = cluster_sum_barriers(smem, sets)
    return sSum, sums_in


@cute.jit
def row_sum(plan: cutlass.Constexpr, partial, sums, n: cutlass.Constexpr, row_in_cta, t):
    """Step 3: the row's sum of `partial`, in every thread of the row.

    A warp shuffle adds 32 threads' partials; lane 0 of each warp writes the
    warp's sum to shared memory, and after one barrier every thread adds
    those few sums itself. n counts the CTA's earlier reductions.
    """
    lanes = min(plan.threads_per_row, WARP_THREADS)
    total = cute.arch.warp_reduction_sum(partial, threads_in_group=lanes)
    if cutlass.const_expr(plan.warps_per_row > 1):
        sSum, sums_in = sums
        sets = cute.size(sSum, mode=[2])
        s = n % sets  # two sets in turn: a new sum never overwrites one being read
        if cutlass.const_expr(plan.cluster_ctas > 1):
            send_sum_to_cluster(plan, total, sSum, sums_in, n, row_in_cta, t)
        else:
            if t % WARP_THREADS == 0:
                sSum[t // WARP_THREADS, row_in_cta, s] = total
            cute.arch.barrier()
        total = Float32(0.0)
        # A few shared-memory reads, and no second barrier.
        for w in cutlass.range_constexpr(plan.warps_per_row):
            total = total + sSum[w, row_in_cta, s]
    return total


@cute.jit
def inverse_rms(plan: cutlass.Constexpr, total, epsilon: cutlass.Constexpr):
    """Step 4: 1 / sqrt(total / hidden + epsilon).

    With epsilon a normal float32 the argument is never subnormal, so the
    flush-to-zero rsqrt returns the same value without the plain one's guard.
    """
    mean_sq_eps = total * (1.0 / plan.hidden) + epsilon  # 1 / hidden is a constant
    if cutlass.const_expr(epsilon >= FLT_MIN):
        return cute.math.rsqrt(mean_sq_eps, approx=True, ftz=True)
    return cute.math.rsqrt(mean_sq_eps)


@cute.jit
def store_row(plan: cutlass.Constexpr, normalize, x, mY, row, row_ok, t):
    """Step 5: y = normalize(x, k) in FP32, cast once, stored as X came in.

    x is (tXrX, sX, slot). With X in registers, all the thread's vectors at
    once (k None); otherwise vector by vector, which lets a staged row come
    again from shared memory instead of being held through Steps 3-4, and W
    arrive a vector at a time where the plan says so.
    """
    tXrX, sX, slot = x
    whole = plan.arrival == "registers" and not plan.weight_by_vector
    if cutlass.const_expr(whole):
        tYrY = cute.make_rmem_tensor((plan.vec, plan.vecs_per_thread), mY.element_type)
        y = normalize(tXrX.load().to(Float32), None)
        tYrY.store(y.to(mY.element_type))
    if row_ok:
        for k in cutlass.range_constexpr(plan.vecs_per_thread):
            j = t + k * plan.threads_per_row
            if plan.owns(j):
                if cutlass.const_expr(whole):
                    cute.autovec_copy(tYrY[None, k], mY[row, None, j])
                else:
                    xk = tXrX[None, k]
                    if cutlass.const_expr(plan.arrival != "registers"):
                        xk = cute.make_rmem_tensor((plan.vec,), sX.element_type)
                        cute.autovec_copy(sX[slot, None, j], xk)
                    yk = cute.make_rmem_tensor((plan.vec,), mY.element_type)
                    yk.store(normalize(xk.load().to(Float32), k).to(mY.element_type))
                    cute.autovec_copy(yk, mY[row, None, j])


@cute.kernel
def rms_norm_kernel(
    x_ptr: cute.Pointer,
    r_ptr: cute.Pointer | None,
    w_ptr: cute.Pointer,
    num_tokens: Int32,
    y_ptr: cute.Pointer,
    s_ptr: cute.Pointer | None,
    plan: cutlass.Constexpr,
    epsilon: cutlass.Constexpr,
    y_scale: cutlass.Constexpr,
):
    # Arguments in the order of TensorRT's ahead-of-time launcher (inputs, its
    # extra num_tokens, outputs), so that one PTX serves both plugin flavors.
    # R and S are None in the plain form, and then no parameters at all. A
    # static row stride and (vec, num_vecs) rows prove every access 16-byte
    # aligned, hence 128-bit.
    rows = cute.make_layout(
        (num_tokens, plan.vec, plan.num_vecs), stride=(plan.hidden, 1, plan.vec)
    )
    mX = cute.make_tensor(x_ptr, rows)
    mY = cute.make_tensor(y_ptr, rows)
    columns_layout = cute.make_layout((plan.vec, plan.num_vecs), stride=(1, plan.vec))
    mW = cute.make_tensor(w_ptr, columns_layout)

    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    row_in_cta, t, first_row = plan.thread_slot(tidx, bidx)
    register_shape = (plan.vec, plan.vecs_per_thread)
    tXrX = cute.make_rmem_tensor(register_shape, mX.element_type)
    tWrW = cute.make_rmem_tensor(register_shape, mW.element_type)
    tXrX.fill(0.0)  # what a thread owns no vector of stays zero
    tWrW.fill(0.0)
    # Per-row inputs and per-column inputs: (view, registers) pairs. The
    # residual form adds R to the rows and S to the outputs; a LayerNorm's
    # bias would join W.
    row_inputs = ((mX, tXrX),)
    mS = None
    if cutlass.const_expr(plan.residual):
        tRrR = cute.make_rmem_tensor(register_shape, mX.element_type)
        tRrR.fill(0.0)
        row_inputs = ((mX, tXrX), (cute.make_tensor(r_ptr, rows), tRrR))
        mS = cute.make_tensor(s_ptr, rows)
    columns = ((mW, tWrW),)
    smem = cutlass.memory.SmemAllocator()

    staged = stage_rows(plan, smem, row_inputs, first_row, row_in_cta, t, num_tokens)
    sums = row_sum_buffers(plan, smem, plan.rows_in_sequence)  # one sum per row

    # One row per slot, unless a staged plan ([3]) normalizes several in turn.
    for i in cutlass.range_constexpr(plan.rows_in_sequence):
        row = first_row + i * plan.rows_per_cta
        slot = i * plan.rows_per_cta + row_in_cta
        row_ok = row < num_tokens  # the last CTA's spare slots load and store nothing
        if cutlass.const_expr(plan.arrival == "registers"):
            load_row(plan, t, row, row_ok, row_inputs, columns)  # Step 1
        else:
            unstage_row(plan, t, i, row_ok, staged, slot, row_inputs, columns)
        if cutlass.const_expr(plan.residual):
            add_residual(plan, t, row, row_ok, row_inputs, mS, staged, slot)
        total = row_sum(plan, sum_of_squares(tXrX), sums, i, row_in_cta, t)  # Steps 2-3
        rstd = inverse_rms(plan, total, epsilon)  # Step 4
        if cutlass.const_expr(y_scale is not None):
            # The FP8 form's y / y_scale, folded into the row's one factor (an
            # op that adds a term after it, a LayerNorm's bias, scales that too);
            # Step 5's cast to FP8 is the hardware's saturating one.
            rstd = rstd * (1.0 / y_scale)
        late = not plan.early_weight and not plan.weight_by_vector
        if cutlass.const_expr(late and i == 0):
            # W after the reduction: no W registers held through it.
            for k in cutlass.range_constexpr(plan.vecs_per_thread):
                load_columns(plan, t, columns, k)

        def normalize(x, k):
            """FP32 vector k of X (None: all the thread's) to FP32 Y."""
            if cutlass.const_expr(plan.weight_by_vector):
                load_columns(plan, t, columns, k)  # just before its use
            return x * rstd * tWrW[None, k].load().to(Float32)

        store_row(plan, normalize, (tXrX, staged[0][0], slot), mY, row, row_ok, t)  # Step 5


# %% [3] Speed layers: staged rows and clusters ----------------------------------
# The kernel above is complete. These layers change only how a row arrives
# (Step 1) and where its sum is added (Step 3); [4] picks them per shape.
#
# Staged rows. A thread that loads X into registers waits one DRAM round trip
# per row. With a few rows per SM that wait is the whole kernel; so a staged
# plan requests all its rows into shared memory first, and a CTA reduces and
# stores one row while the next arrives. cp.async copies 16 bytes per thread
# per instruction; on sm_90+ one thread hands a whole row to the bulk-copy
# unit (TMA's cp.async.bulk) and an mbarrier counts its bytes in.
#
# Clusters. With fewer rows than SMs, most SMs idle; a cluster of CTAs on
# several SMs shares each row, and each CTA sends its warps' sums into the
# others' shared memory (st.async), where an mbarrier counts them in.


def whole_row(tensor, r):
    """Row r of X or of sX as one run of elements: one bulk copy, not one per vector."""
    row = tensor[r, None, None]
    return cute.make_tensor(row.iterator, cute.make_layout(cute.size(row)))


def staged_bytes(plan, num_tokens, first_row):
    """The bytes the bulk copies of the rows_per_cta rows from first_row bring: those that exist."""
    rows = cutlass.max(cutlass.min(num_tokens - first_row, plan.rows_per_cta), 0)
    return rows * (plan.hidden * plan.elem_bytes * plan.num_row_inputs)


@cute.jit
def stage_rows(plan: cutlass.Constexpr, smem, row_inputs, first_row, row_in_cta, t, num_tokens):
    """Step 1 of a staged plan, first half: every row of the CTA requested at once.

    Returns ((sX, and sR in the residual form), the rows' mbarriers); Nones for
    X in registers. Slot i * rows_per_cta + row_in_cta of sX holds row i of a slot.
    """
    staged_rows = (None,) * len(row_inputs)
    rows_in = None
    if cutlass.const_expr(plan.arrival != "registers"):
        layout = cute.make_layout(
            (plan.cta_rows, plan.vec, plan.num_vecs), stride=(plan.hidden, 1, plan.vec)
        )
        staged_rows = tuple(
            smem.allocate_tensor(view.element_type, layout, 16) for view, _ in row_inputs
        )
    if cutlass.const_expr(plan.arrival == "cp.async"):
        copy_rows_by_vector(plan, row_inputs, staged_rows, first_row, row_in_cta, t, num_tokens)
    if cutlass.const_expr(plan.arrival == "bulk"):
        rows_in = smem.allocate_array(cutlass.Int64, plan.rows_in_sequence)
        copy_rows_in_bulk(plan, row_inputs, staged_rows, rows_in, first_row, num_tokens)
    return staged_rows, rows_in


@cute.jit
def copy_rows_by_vector(plan: cutlass.Constexpr, row_inputs, staged_rows, first_row, row_in_cta,
                        t, num_tokens):
    """Each thread copies its own vectors, 16 bytes per cp.async.cg (through L2 only).

    One commit group per row (of X and R alike): groups complete in order, so
    a thread can wait for row i while later rows are still on their way.
    """
    g2s = cute.make_copy_atom(
        cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
        row_inputs[0][0].element_type,
        num_bits_per_copy=VECTOR_BYTES * 8,
    )
    for i in cutlass.range_constexpr(plan.rows_in_sequence):
        row = first_row + i * plan.rows_per_cta
        slot = i * plan.rows_per_cta + row_in_cta
        if row < num_tokens:
            for k in cutlass.range_constexpr(plan.vecs_per_thread):
                j = t + k * plan.threads_per_row
                if plan.owns(j):
                    for (view, _), sV in zip(row_inputs, staged_rows):
                        cute.copy(g2s, view[row, None, j], sV[slot, None, j])
        cute.arch.cp_async_commit_group()


@cute.jit
def copy_rows_in_bulk(plan: cutlass.Constexpr, row_inputs, staged_rows, rows_in, first_row,
                      num_tokens):
    """Thread 0 hands each row whole to the bulk-copy unit; mbarrier i counts row i's bytes.

    No thread spends instructions on X's addresses (nor R's).
    """
    tidx, _, _ = cute.arch.thread_idx()
    if tidx == 0:
        for i in cutlass.range_constexpr(plan.rows_in_sequence):
            cute.arch.mbarrier_init(rows_in + i, 1)  # one arrival: thread 0's
        cute.arch.mbarrier_init_fence()
    cute.arch.barrier()  # no thread waits on an mbarrier before it is set up
    if tidx == 0:
        bulk = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), row_inputs[0][0].element_type)
        for i in cutlass.range_constexpr(plan.rows_in_sequence):
            first = first_row + i * plan.rows_per_cta  # thread 0's row_in_cta is 0
            expected = staged_bytes(plan, num_tokens, first)
            cute.arch.mbarrier_arrive_and_expect_tx(rows_in + i, expected)
            for r in cutlass.range_constexpr(plan.rows_per_cta):
                if first + r < num_tokens:
                    slot = i * plan.rows_per_cta + r
                    for (view, _), sV in zip(row_inputs, staged_rows):
                        cute.copy(
                            bulk,
                            whole_row(view, first + r),
                            whole_row(sV, slot),
                            mbar_ptr=rows_in + i,
                        )


@cute.jit
def unstage_row(plan: cutlass.Constexpr, t, i, row_ok, staged, slot, row_inputs, columns):
    """Step 1 of a staged plan, second half: once row i is in, its vectors into registers.

    W, where it comes first, is loaded before the first wait.
    """
    staged_rows, rows_in = staged
    if cutlass.const_expr(plan.early_weight and i == 0):
        for k in cutlass.range_constexpr(plan.vecs_per_thread):
            load_columns(plan, t, columns, k)
    if cutlass.const_expr(plan.arrival == "bulk"):
        cute.arch.mbarrier_wait(rows_in + i, 0)  # phase 0 ends with the row's last byte
    else:
        # Groups complete in order: with no more pending than rows after i, row i is in.
        cute.arch.cp_async_wait_group(plan.rows_in_sequence - 1 - i)
    if row_ok:
        for k in cutlass.range_constexpr(plan.vecs_per_thread):
            j = t + k * plan.threads_per_row
            if plan.owns(j):
                for (_, regs), sV in zip(row_inputs, staged_rows):
                    cute.autovec_copy(sV[slot, None, j], regs[None, k])


@cute.jit
def cluster_sum_barriers(smem, sets: cutlass.Constexpr):
    """An mbarrier per set of sums, set up before any CTA of the cluster sends one."""
    sums_in = smem.allocate_array(cutlass.Int64, sets)
    tidx, _, _ = cute.arch.thread_idx()
    if tidx == 0:
        for s in cutlass.range_constexpr(sets):
            cute.arch.mbarrier_init(sums_in + s, 1)  # one arrival: thread 0's
        cute.arch.mbarrier_init_fence()  # visible to the cluster's other CTAs
    cute.arch.cluster_arrive_relaxed()  # this CTA has started; row_sum waits for all
    return sums_in


@cute.jit
def send_sum_to_cluster(plan: cutlass.Constexpr, total, sSum, sums_in, n: cutlass.Constexpr,
                        row_in_cta, t):
    """Lane c of each warp sends the warp's sum to CTA c of the cluster (st.async).

    Each CTA's mbarrier counts the 4 bytes that arrive from every warp of the
    row; once they are in, every CTA holds all the row's warp sums.
    """
    sets = cute.size(sSum, mode=[2])
    s = n % sets
    if cutlass.const_expr(n == 0):
        cute.arch.cluster_wait()  # every CTA has set up its mbarriers
    tidx, _, _ = cute.arch.thread_idx()
    if tidx == 0:
        cute.arch.mbarrier_arrive_and_expect_tx(sums_in + s, 4 * plan.warps_per_row)
    lane = t % WARP_THREADS
    if lane < plan.cluster_ctas:
        index = cute.crd2idx((t // WARP_THREADS, row_in_cta, s), sSum.layout)
        cute.arch.store_async_dsmem(
            sSum.iterator + index, total.bitcast(Int32), sums_in + s, lane
        )
    cute.arch.mbarrier_wait(sums_in + s, n // sets % 2)


# %% [4] Tuning: which plan runs which shape --------------------------------------
# Two kinds of number decide a plan.
#
# Register numbers are not tuned: they follow from what a thread holds, by
# fit_registers(). Its inputs are the three constants below, the only ones
# an adapter of the math changes here. W first, a whole late W and a launch
# bound are kept only where what the thread then holds fits its registers.
#
# Traffic and latency numbers were timed (benchmarks/NOTES.md says where and
# against what) and hold for any op that reads each row once: ROW_PLANS
# and the thresholds after it. A row picks a line of ROW_PLANS by its bytes,
# the call's token count n one of the line's plans:
#
#   plan     token counts            X arrives by         why it wins there
#   cluster  n <= cluster rows       registers            too few rows for the
#            (sm_90+)                                     SMs: CTAs on several
#                                                         SMs share each row
#   few      n <= FEW_TOKENS         registers, W first   about one row per SM:
#                                                         the shortest chain
#   mid      MID_TOKENS < n          cp.async; bulk copy  a few rows per SM:
#            <= mid rows             over BULK_ROW_BYTES  one stored while the
#                                    (sm_90+)             next arrives
#   many     every other n           the line's own plan
#
# `--plans --hidden-dim H` prints the schedule; support/check_kernel.py
# compiles every plan and reports registers, spills and CTAs per SM.

# What one thread holds through the row's reductions, besides X.
COLUMN_INPUTS = 1  # per-column inputs held like W (a LayerNorm's bias: 2)
REDUCTIONS = 1  # row sums per row: x^2 (a LayerNorm's mean and variance: 2)
ROW_INPUTS = 1  # rows read per row: X (the residual form adds R; a staged plan keeps each)

# Hardware facts the rule reads (every GPU of compute capability 8.0+).
REGISTERS_PER_SM = 65536
MAX_THREAD_REGISTERS = 255
MAX_SM_THREADS = 2048
# Shared memory one CTA may use: sm_90's 227 KB, and before it the least of
# sm_80's 163 KB and sm_86/sm_89's 99 KB.
CTA_SHARED_BYTES = {True: 227 * 1024, False: 99 * 1024}
# What an SM holds for all its CTAs, each with 1 KB of the system's: sm_90's
# 228 KB and sm_80's 164 KB (where sm_86/sm_89's 100 KB hold fewer CTAs, a
# launch bound only narrows their registers).
SM_SHARED_BYTES = {True: 228 * 1024, False: 164 * 1024}
RESERVED_CTA_SHARED_BYTES = 1024
# Registers the kernel spends besides what it holds: indices, addresses and
# sums. The most that the tightest plans ptxas fits without a spill leave:
# 256-thread rows of 2-element vectors under 8 CTAs/SM (32 registers, 6 held).
OTHER_REGISTERS = 26


@dataclasses.dataclass(frozen=True)
class RowPlan:
    """One line of ROW_PLANS: the plans for rows of at most max_row_bytes."""

    max_row_bytes: int
    arrival: str  # many rows: "registers" or "cp.async" (16-byte vectors only)
    vecs_per_thread: int  # many rows: bytes in flight per thread
    early_weight: bool  # many rows: W first where it fits (else late)
    min_cta_threads: int  # short rows share a CTA until it has this many threads
    min_ctas_per_sm: int = 0  # many rows: a launch bound, where it fits
    few_vecs: int = 0  # few rows: vectors per thread (0: no few-token plan)
    mid: tuple = (0, 0)  # (most rows, vectors per thread) of the mid plan
    cluster: tuple = (0, 0)  # (most rows, vectors per thread) of the cluster plan
    many_ctas: int = 1  # above mid rows, a cluster of this many CTAs per row


ROW_PLANS = (
    # Short rows share warps, and W waits until after the sum.
    RowPlan(max_row_bytes=256, arrival="registers", vecs_per_thread=2,
            early_weight=False, min_cta_threads=256),
    RowPlan(max_row_bytes=2048, arrival="registers", vecs_per_thread=2,
            early_weight=True, min_cta_threads=128, min_ctas_per_sm=8),
    RowPlan(max_row_bytes=3071, arrival="registers", vecs_per_thread=2,
            early_weight=True, min_cta_threads=128),
    # Exactly 3 KB (hidden 1536 in 16 bits) gains from the bound, its
    # neighbours do not.
    RowPlan(max_row_bytes=3072, arrival="registers", vecs_per_thread=2,
            early_weight=True, min_cta_threads=128, min_ctas_per_sm=8),
    RowPlan(max_row_bytes=4096, arrival="registers", vecs_per_thread=2,
            early_weight=True, min_cta_threads=128),
    # Bandwidth-bound from here on: fewer rows than SMs happen.
    RowPlan(max_row_bytes=8192, arrival="cp.async", vecs_per_thread=2,
            early_weight=True, min_cta_threads=128,
            few_vecs=2, mid=(1024, 2)),
    RowPlan(max_row_bytes=15360, arrival="cp.async", vecs_per_thread=4,
            early_weight=True, min_cta_threads=128,
            few_vecs=4, mid=(1024, 4)),
    RowPlan(max_row_bytes=16384, arrival="registers", vecs_per_thread=4,
            early_weight=True, min_cta_threads=128,
            few_vecs=4, mid=(1024, 4), cluster=(32, 4), many_ctas=2),
    RowPlan(max_row_bytes=20480, arrival="cp.async", vecs_per_thread=4,
            early_weight=False, min_cta_threads=128,
            few_vecs=4, mid=(4096, 4), cluster=(32, 2)),
    RowPlan(max_row_bytes=32767, arrival="cp.async", vecs_per_thread=8,
            early_weight=False, min_cta_threads=128,
            few_vecs=4, mid=(4096, 4), cluster=(32, 4)),
    RowPlan(max_row_bytes=MAX_HIDDEN * 4, arrival="registers", vecs_per_thread=4,
            early_weight=False, min_cta_threads=128,
            few_vecs=4, mid=(4096, 4), cluster=(128, 4)),
)
FEW_TOKENS = 128  # calls of at most this many rows run the few-token plan
MID_TOKENS = 384  # calls of more rows, up to the line's mid rows, run the mid plan
CLUSTER_CTAS = 4  # CTAs, on as many SMs, that share each row in the cluster plan
ROWS_IN_SEQUENCE = 2  # rows each CTA of the mid plan normalizes in turn
BULK_ROW_BYTES = 8192  # on sm_90+, mid-plan rows longer than this arrive in bulk
MID_BOUND = (480, 2)  # mid plans of 480+ threads ask for 2 CTAs/SM, where it fits
# The FP8 form writes half of Y's bytes, so loads bound it more: for rows of
# these bytes the mid plan, a CTA's next row in flight while it stores one,
# was faster at every count past MID_TOKENS (benchmarks/NOTES.md).
FP8_MID_ROW_BYTES = (4097, 16384)
# Plans in which ptxas, choosing registers alone, spills a few bytes to fit one
# more CTA per SM. They ask for the CTAs per SM the estimate gives, which ptxas
# meets without a spill. support/check_kernel.py lists such a plan of a copy (a
# spill without a launch bound) by its tag.
BOUND_BY_ESTIMATE = {
    "h2560b4v4t160r1q2c1m0k4_wearly_bulk",  # fp32 X, mid rows, sm_90a
}


def registers_needed(plan: KernelPlan) -> int:
    """The 32-bit registers a thread of the plan needs: OTHER_REGISTERS and what it holds.

    Held through the reduction: X's vectors where X is in registers (or a
    later reduction reads them), every other row input's as they arrive
    (a staged plan's too: R waits for X to be added to it), and the
    per-column inputs where they come first or, loaded for a CTA's first
    row, are held through its next rows' sums; counted at 4 bytes an element.
    Held at the store: X, and the columns (one vector of them where they
    come a vector at a time).
    """
    x_vector = math.ceil(plan.vec * plan.elem_bytes / 4)
    column_vector = plan.vec * COLUMN_INPUTS
    x_held = plan.arrival == "registers" or REDUCTIONS > 1
    rows_held = x_held + plan.num_row_inputs - 1
    through = plan.vecs_per_thread * x_vector * rows_held
    columns_held = plan.early_weight or plan.rows_in_sequence > 1 and not plan.weight_by_vector
    if columns_held:
        through += plan.vecs_per_thread * column_vector
    x_at_store = x_vector
    if plan.arrival == "registers":
        x_at_store = plan.vecs_per_thread * x_vector
    columns_at_store = plan.vecs_per_thread * column_vector
    if plan.weight_by_vector:
        columns_at_store = column_vector
    return OTHER_REGISTERS + max(through, x_at_store + columns_at_store)


def register_ceiling(plan: KernelPlan) -> int:
    """The registers a thread may use: what the launch bound (or one CTA) leaves it."""
    ctas = max(1, plan.min_ctas_per_sm)
    per_thread = REGISTERS_PER_SM // (ctas * plan.cta_threads)
    return min(MAX_THREAD_REGISTERS, per_thread // 8 * 8)  # allocated 8 at a time


def estimated_ctas(plan: KernelPlan) -> int:
    """The CTAs per SM that registers_needed leaves room for (at least one)."""
    registers = math.ceil(registers_needed(plan) / 8) * 8
    by_registers = REGISTERS_PER_SM // (registers * plan.cta_threads)
    return max(1, min(by_registers, MAX_SM_THREADS // plan.cta_threads))


def fit_registers(plan: KernelPlan) -> KernelPlan:
    """The plan, changed as little as it takes for what a thread holds to fit.

    First W moves after the reduction, then it comes a vector at a time at
    the store (the occupancy stays); last the launch bound goes (fewer CTAs
    per SM, which --plans shows). A bound of more threads than an SM holds
    could never be met, so it goes first.
    """
    if plan.min_ctas_per_sm * plan.cta_threads > MAX_SM_THREADS:
        plan = dataclasses.replace(plan, min_ctas_per_sm=0)
    if plan.early_weight and registers_needed(plan) > register_ceiling(plan):
        plan = dataclasses.replace(plan, early_weight=False)
    if not plan.early_weight and registers_needed(plan) > register_ceiling(plan):
        plan = dataclasses.replace(plan, weight_by_vector=True)
    if plan.min_ctas_per_sm and registers_needed(plan) > register_ceiling(plan):
        plan = dataclasses.replace(plan, min_ctas_per_sm=0)
    return plan


def staged_fits(plan: KernelPlan, sm90: bool) -> bool:
    """Whether a staged plan's rows fit one CTA's shared memory, and its bound's CTAs one SM's."""
    staged = plan.cta_rows * plan.hidden * plan.elem_bytes * plan.num_row_inputs
    ctas = max(1, plan.min_ctas_per_sm)
    on_sm = ctas * (staged + RESERVED_CTA_SHARED_BYTES)
    return staged <= CTA_SHARED_BYTES[sm90] and on_sm <= SM_SHARED_BYTES[sm90]


def threads_for(num_vecs: int, vecs_per_thread: int, ctas: int = 1) -> int:
    """Threads sharing a row: enough for vecs_per_thread vectors each.

    Whole warps (per CTA of a cluster of `ctas`), not a power of two, so none
    sit half idle; under a warp a power of two, so the shuffle stays inside.
    """
    threads = math.ceil(num_vecs / vecs_per_thread)
    if threads <= WARP_THREADS and ctas == 1:
        return 1 << math.ceil(math.log2(threads))
    step = WARP_THREADS * ctas
    return min(step * math.ceil(threads / step), MAX_CTA_THREADS * ctas)


def row_plan(hidden: int, elem_bytes: int) -> RowPlan:
    """The line of ROW_PLANS that serves a row of `hidden` elements of `elem_bytes` bytes."""
    if isinstance(hidden, bool) or not isinstance(hidden, (int, np.integer)):
        raise TypeError(f"hidden must be an integer, got {hidden!r}")
    size_ok = 1 <= hidden <= MAX_HIDDEN
    if not size_ok or type(elem_bytes) is not int or elem_bytes not in (2, 4):
        raise ValueError(
            f"hidden must be in [1, {MAX_HIDDEN}] and elem_bytes 2 or 4, "
            f"got {hidden} and {elem_bytes!r}"
        )
    return next(r for r in ROW_PLANS if hidden * elem_bytes <= r.max_row_bytes)


def row_classes(elem_bytes: int) -> tuple:
    """((fewest, most) hidden, ...): the row lengths each line of ROW_PLANS serves."""
    most = [min(MAX_HIDDEN, r.max_row_bytes // elem_bytes) for r in ROW_PLANS]
    return tuple((low + 1, high) for low, high in zip([0] + most, most) if high > low)


def vector_elements(hidden: int, elem_bytes: int) -> int:
    """Elements per vector: 16 bytes' worth, halved until whole vectors tile the row."""
    vec = VECTOR_BYTES // elem_bytes
    while hidden % vec:
        vec //= 2
    return vec


def split_row(hidden, elem_bytes, vecs_per_thread, line, ctas=1, **choices) -> KernelPlan:
    """A plan whose threads hold vecs_per_thread vectors each, over `ctas` CTAs.

    Short rows share a CTA until it has line.min_cta_threads threads.
    """
    vec = vector_elements(hidden, elem_bytes)
    num_vecs = hidden // vec
    threads = threads_for(num_vecs, vecs_per_thread, ctas)
    rows_per_cta = 1
    if ctas == 1:
        rows_per_cta = max(1, line.min_cta_threads // threads)
    return KernelPlan(
        hidden=hidden,
        elem_bytes=elem_bytes,
        vec=vec,
        threads_per_row=threads,
        rows_per_cta=rows_per_cta,
        vecs_per_thread=math.ceil(num_vecs / threads),
        cluster_ctas=ctas,
        **choices,
    )


def plan_kernel(hidden: int, elem_bytes: int = 2, num_tokens: int | None = None,
                sm90: bool = True, residual: bool = False) -> KernelPlan:
    """The plan for num_tokens rows (None: many): the table's, fitted to registers.

    sm90=False: no clusters or bulk copies (older GPUs, the AOT flavor).
    residual: the fused form, which reads R and writes S too.
    """
    plan = fit_registers(table_plan(hidden, elem_bytes, num_tokens, sm90, residual))
    if str(plan) in BOUND_BY_ESTIMATE:
        plan = dataclasses.replace(plan, min_ctas_per_sm=estimated_ctas(plan))
    return plan


def table_plan(hidden: int, elem_bytes: int, num_tokens: int | None,
               sm90: bool, residual: bool) -> KernelPlan:
    """The plan ROW_PLANS and the token thresholds name for num_tokens rows.

    The by-count plans hold X and W through Step 3, so they take at most 512
    threads a row (1024 over a cluster).
    """
    line = row_plan(hidden, elem_bytes)
    vec = vector_elements(hidden, elem_bytes)
    num_vecs = hidden // vec
    whole = vec * elem_bytes == VECTOR_BYTES  # what cp.async and clusters need
    n = math.inf if num_tokens is None else num_tokens

    def fits(vecs, most_threads):
        return vecs > 0 and math.ceil(num_vecs / vecs) <= most_threads

    shape = (hidden, elem_bytes)
    if sm90 and whole and n <= line.cluster[0] and fits(line.cluster[1], MAX_CTA_THREADS):
        return split_row(*shape, line.cluster[1], line, ctas=CLUSTER_CTAS, residual=residual)
    if n <= FEW_TOKENS and fits(line.few_vecs, MAX_CTA_THREADS // 2):
        return split_row(*shape, line.few_vecs, line, residual=residual)
    if whole and MID_TOKENS < n <= line.mid[0] and fits(line.mid[1], MAX_CTA_THREADS // 2):
        bulk = sm90 and hidden * elem_bytes > BULK_ROW_BYTES
        threads = threads_for(num_vecs, line.mid[1])
        plan = split_row(
            *shape,
            line.mid[1],
            line,
            arrival="bulk" if bulk else "cp.async",
            rows_in_sequence=ROWS_IN_SEQUENCE,
            min_ctas_per_sm=MID_BOUND[1] if threads >= MID_BOUND[0] else 0,
            residual=residual,
        )
        # Where an SM's shared memory holds the rows of fewer CTAs than the bound
        # asks for, the many plan's rows in registers win (benchmarks/NOTES.md).
        if staged_fits(plan, sm90):
            return plan
    ctas = 1
    if sm90 and whole and n > line.mid[0]:
        ctas = line.many_ctas
    bound = line.min_ctas_per_sm
    if sm90 and residual and not whole and num_vecs > line.vecs_per_thread * MAX_CTA_THREADS:
        # X and R in vectors under 16 bytes, more of them than one CTA's threads
        # hold at the line's count: ptxas spills; two CTAs give twice the
        # registers, and a bound of one CTA per SM lets ptxas take them.
        ctas = 2
        bound = 1
    plan = split_row(
        *shape,
        line.vecs_per_thread,
        line,
        ctas=ctas,
        arrival=line.arrival if whole else "registers",
        early_weight=line.early_weight,
        min_ctas_per_sm=bound,
        residual=residual,
    )
    if plan.arrival != "registers" and not staged_fits(plan, sm90):
        plan = dataclasses.replace(plan, arrival="registers")
    return plan


def token_schedule(hidden: int, elem_bytes: int = 2, sm90: bool = True,
                   residual: bool = False, fp8: bool = False) -> tuple:
    """((plan, ((fewer, most), ...)), ...): each plan and the counts in (fewer, most] it runs.

    fp8: the FP8 form's, where FP8_MID_ROW_BYTES gives the mid plan more counts.
    """
    line = row_plan(hidden, elem_bytes)
    cluster_rows = line.cluster[0] if sm90 else 0
    bounds = sorted({FEW_TOKENS, MID_TOKENS, line.mid[0], cluster_rows} - {0})
    low, high = FP8_MID_ROW_BYTES
    mid_past_its_count = fp8 and low <= hidden * elem_bytes <= high
    schedule: dict = {}
    for fewer, most in zip([None] + bounds, bounds + [None]):
        count = most
        if mid_past_its_count and (fewer or 0) >= line.mid[0]:
            count = line.mid[0]  # a count the mid plan serves
        plan = plan_kernel(hidden, elem_bytes, count, sm90, residual)
        counts = schedule.setdefault(plan, [])
        if counts and counts[-1][1] == fewer:  # two ranges that meet become one
            fewer = counts.pop()[0]
        counts.append((fewer, most))
    return tuple((plan, tuple(counts)) for plan, counts in schedule.items())


def schedule_lines(hidden: int, elem_bytes: int = 2, sm90: bool = True,
                   residual: bool = False, fp8: bool = False) -> list:
    """The schedule as a reader sees it: one line per plan, with the token counts it serves."""
    lines = []
    for plan, counts in token_schedule(hidden, elem_bytes, sm90, residual, fp8):
        spans = []
        for fewer, most in counts:
            first = (fewer or 0) + 1
            spans.append(f"{first}-{most}" if most else f"{first}+")
        lines.append(f"{', '.join(spans)} tokens: {plan.describe()}")
    return lines


# %% [5] The @cute.jit launcher ---------------------------------------------------
# Compiled in: the dtypes, epsilon, the pointers' 16-byte alignment, the form
# (residual: R and S given; FP8: Y's scale) and the schedule. At run time:
# the addresses, num_tokens and the stream; the host code picks the plan from
# num_tokens, so one launcher serves the whole profile. Each plan has one
# launch site: CuteDSL compiles a kernel once per launch site.


def launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon, y_scale, mR, mS):
    """Launch rms_norm_kernel with one plan: grid, CTA size, cluster and launch bound."""
    options = {}
    if plan.cluster_ctas > 1:
        options["cluster"] = [plan.cluster_ctas, 1, 1]
    if plan.min_ctas_per_sm:
        options["min_blocks_per_mp"] = plan.min_ctas_per_sm
        # -1, the driver's default carveout, keeps CuteDSL from asking the
        # GPU for its shared-memory size at compile time.
        options["preferred_smem_carveout"] = -1
    r_ptr = mR.iterator if plan.residual else None
    s_ptr = mS.iterator if plan.residual else None
    pointers = (mX.iterator, r_ptr, mW.iterator, num_tokens, mY.iterator, s_ptr)
    kernel = rms_norm_kernel(*pointers, plan, epsilon, y_scale)
    kernel.launch(
        grid=[plan.grid(num_tokens), 1, 1],
        block=[plan.cta_threads, 1, 1],
        stream=stream,
        **options,
    )


def serves(num_tokens, counts):
    """Whether num_tokens lies in a range (fewer, most] of counts: a run-time Boolean."""
    hit = None
    for fewer, most in counts:
        above = num_tokens > (fewer or 0)
        within = num_tokens <= (most or 2**31 - 1)
        term = above & within
        hit = term if hit is None else hit | term
    return hit


@cute.jit
def rms_norm_launch(
    mX: cute.Tensor,
    mW: cute.Tensor,
    mY: cute.Tensor,
    num_tokens: Int32,
    stream: cuda.CUstream,
    schedule: cutlass.Constexpr,
    epsilon: cutlass.Constexpr,
    y_scale: cutlass.Constexpr,
    mR: cute.Tensor | None = None,
    mS: cute.Tensor | None = None,
):
    # The residual form's R and S come last, so that the plain form's
    # compiled launcher is called with (X, W, Y, num_tokens, stream) alone.
    # y_scale: None, or the FP8 form's scale (mY then holds FP8).
    for p in cutlass.range_constexpr(len(schedule)):
        plan, counts = schedule[p]
        # One plan for every count needs no range test at run time.
        if cutlass.const_expr(len(schedule) == 1):
            launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon, y_scale, mR, mS)
        elif serves(num_tokens, counts):
            launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon, y_scale, mR, mS)


def validate_epsilon(value) -> float:
    """Epsilon as the float32 value the kernel uses, or ValueError."""
    try:
        epsilon = struct.unpack("f", struct.pack("f", float(value)))[0]
    except OverflowError:  # beyond float32's range
        epsilon = math.inf
    except (TypeError, ValueError):
        raise ValueError(f"field 'epsilon' must be a number, got {value!r}") from None
    if not (math.isfinite(epsilon) and epsilon > 0.0):
        raise ValueError(f"field 'epsilon' must be finite and > 0 in float32, got {value}")
    return epsilon


def validate_y_scale(value) -> float:
    """The FP8 form's y_scale as the float32 value Y is divided by, or ValueError."""
    try:
        y_scale = struct.unpack("f", struct.pack("f", float(value)))[0]
    except OverflowError:
        y_scale = math.inf
    except (TypeError, ValueError):
        raise ValueError(f"field 'y_scale' must be a number, got {value!r}") from None
    # Below float32's normal range 1 / y_scale would overflow to inf.
    if not (math.isfinite(y_scale) and y_scale >= FLT_MIN):
        raise ValueError("field 'y_scale' must be finite and >= 2^-126 (a normal float32), "
                         f"got {value}")
    return y_scale


def has_fp8(arch: str) -> bool:
    """Whether a target converts to FP8 in hardware (cvt ... e4m3x2): sm_89 and newer."""
    target = cutlass.base_dsl.Arch[arch]
    return (target.major, target.minor) >= (8, 9)


def is_sm90(arch: str) -> bool:
    """Whether a target such as "sm_90a" has thread-block clusters and bulk copies."""
    if not isinstance(arch, str) or arch not in cutlass.base_dsl.Arch.__members__:
        raise ValueError(
            "arch must be a CuteDSL compile target such as 'sm_80' or 'sm_90a', "
            f"got {arch!r}"
        )
    return cutlass.base_dsl.Arch[arch].major >= 9


def gpu_arch() -> str:
    """The current GPU's target, e.g. "sm_90a" (the "a": Hopper's own instructions)."""
    major, minor = torch.cuda.get_device_capability()
    suffix = "a" if major >= 9 else ""
    return f"sm_{major}{minor}{suffix}"


def compile_launcher(schedule, dtype: str, w_dtype: str, epsilon: float, arch: str,
                     keep_ptx: bool = False, y_scale: float | None = None):
    """rms_norm_launch for one schedule, dtype pair, epsilon and arch, on fake tensors.

    No GPU needed; the schedule's plans say the form, y_scale the FP8 form.
    keep_ptx: the PTX in .__ptx__. support/check_kernel.py compiles a copy's
    plans one at a time through this function.
    """
    hidden = schedule[0][0].hidden
    fake = cute.runtime.make_fake_compact_tensor
    tokens = cute.sym_int32()
    x_type = getattr(cutlass, DTYPES[dtype].cute)
    w_type = getattr(cutlass, DTYPES[w_dtype].cute)
    rows = (tokens, hidden)

    def fake_rows(element_type=x_type):
        return fake(element_type, rows, stride_order=(1, 0), assumed_align=VECTOR_BYTES)

    w = fake(w_type, (hidden,), assumed_align=VECTOR_BYTES)
    y = fake_rows()
    if y_scale is not None:
        y = fake_rows(getattr(cutlass, DTYPES[Y_FP8].cute))
    residual = (None, None)
    if schedule[0][0].residual:
        residual = (fake_rows(), fake_rows())
    stream = cute.runtime.make_fake_stream()
    args = (rms_norm_launch, fake_rows(), w, y, Int32(1), stream, schedule, epsilon, y_scale,
            *residual)
    if not keep_ptx:
        return cute.compile(*args, options=f"--gpu-arch {arch}")
    # CuteDSL also writes the PTX to a file: keep it out of the user's directory.
    with tempfile.TemporaryDirectory() as dump_dir:
        options = f"--gpu-arch {arch} --keep-ptx --dump-dir {dump_dir}"
        return cute.compile(*args, options=options)


_COMPILED = {}  # the launchers compiled in this process
_COMPILE_LOCK = threading.Lock()


def compile_rms_norm(dtype: str, hidden: int, epsilon: float = DEFAULT_EPSILON,
                     arch: str | None = None, *, w_dtype: str = "float32",
                     keep_ptx: bool = False, plans_by_tokens: bool = True,
                     residual: bool = False, y_scale: float | None = None):
    """The launcher for one dtype pair, hidden, epsilon and form, compiled once per process.

    For the current GPU, or for `arch` ("sm_90a": no GPU needed). keep_ptx:
    compiled anew, PTX in .__ptx__. plans_by_tokens=False: sm_80's many plan alone.
    residual=True: the fused form, called as (X, W, Y, num_tokens, stream, R, S).
    y_scale: the FP8 form, Y an FP8 E4M3 tensor of y / y_scale (sm_89+).
    """
    for name, value, allowed in (
        ("dtype", dtype, ACTIVATION_DTYPES),
        ("w_dtype", w_dtype, WEIGHT_DTYPES),
    ):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    elem_bytes = DTYPES[dtype].bytes
    epsilon = validate_epsilon(epsilon)
    if y_scale is not None:
        y_scale = validate_y_scale(y_scale)
    if arch is None:
        arch = gpu_arch()
    sm90 = is_sm90(arch)  # every argument is checked before any tracing
    if y_scale is not None and not has_fp8(arch):
        raise ValueError(f"the FP8 form needs sm_89 or newer (FP8 conversions), got {arch}")
    if plans_by_tokens:
        schedule = token_schedule(hidden, elem_bytes, sm90, residual, y_scale is not None)
    else:
        plan = plan_kernel(hidden, elem_bytes, sm90=False, residual=residual)
        schedule = ((plan, ((None, None),)),)
    if keep_ptx:
        return compile_launcher(schedule, dtype, w_dtype, epsilon, arch, True, y_scale)
    key = (dtype, w_dtype, hidden, epsilon, arch, plans_by_tokens, residual, y_scale)
    with _COMPILE_LOCK:
        if key not in _COMPILED:
            _COMPILED[key] = compile_launcher(schedule, dtype, w_dtype, epsilon, arch,
                                              y_scale=y_scale)
        return _COMPILED[key]


# %% [6] Zero-copy handoff: TensorRT's raw pointers -> CuTe tensors -----------------
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


# %% [7] The plugin: IPluginV3 with the OneCore / OneBuild / OneRuntime interfaces ---
# TensorRT talks to a V3 plugin through three capability interfaces; here one
# class implements all three. At build time TensorRT asks the plugin for
# dtypes, shapes, formats and the fields to store in the engine. At run time
# the creator remakes the plugin from those fields, TensorRT attaches it to
# an execution context, calls on_shape_change, then enqueue.

PLUGIN_NAME = "RmsNormPlugin"
# An engine finds its creator by name, version and namespace. Bump the version
# only where an engine saved before could not be served any more: a new field
# with a default, as `residual` (absent: the plain form), keeps it loading.
PLUGIN_VERSION = "1"
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


def plugin_fields(epsilon: float, residual: bool, y_scale: float | None = None):
    """(fields, the arrays they point into): epsilon, the form, Y's quantization.

    residual 1: the fused form. quantize 1: Y in FP8 E4M3, with y_scale (only
    then given). A trt.PluginField does not own its buffer, so the caller must
    keep the arrays alive as long as TensorRT may read the fields.
    """
    require_tensorrt()  # plugin_network starts here
    values = {
        "epsilon": np.array([epsilon], dtype=np.float32),
        "residual": np.array([int(residual)], dtype=np.int32),
        "quantize": np.array([int(y_scale is not None)], dtype=np.int32),
    }
    if y_scale is not None:
        values["y_scale"] = np.array([y_scale], dtype=np.float32)
    types = {np.float32: trt.PluginFieldType.FLOAT32, np.int32: trt.PluginFieldType.INT32}
    fields = trt.PluginFieldCollection([
        trt.PluginField(name, array, types[array.dtype.type]) for name, array in values.items()
    ])
    return fields, tuple(values.values())


def fp8_refusal() -> str | None:
    """Why this GPU cannot store an FP8 Y (no FP8 conversions before sm_89), or None.

    A build without a visible GPU (TensorRT-RTX builds on the CPU) is not
    refused here: compile_rms_norm refuses at run time on such a GPU.
    """
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) >= (8, 9):
        return None
    return (f"the FP8 form (a y_scale) needs compute capability 8.9 or newer, "
            f"{torch.cuda.get_device_name()} has {major}.{minor}")


def io_names(residual: bool) -> tuple:
    """The plugin's inputs, then its outputs, in TensorRT's order."""
    if residual:
        return ("X", "R", "W"), ("Y", "S")
    return ("X", "W"), ("Y",)


def same_dims(x_dims, r_dims) -> bool:
    """Whether R can have X's symbolic shape: its rank, and its sizes where both are known."""
    if len(r_dims) != len(x_dims):
        return False
    for i in range(len(x_dims)):
        x_dim = x_dims[i]
        r_dim = r_dims[i]
        if x_dim.is_constant() and r_dim.is_constant():
            if x_dim.get_constant_value() != r_dim.get_constant_value():
                return False
    return True


class RmsNormPlugin(trt.IPluginV3, trt.IPluginV3OneCore,
                    trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
    """y = x / sqrt(mean(x^2) + epsilon) * w over the last axis of X [..., hidden].

    The residual form takes (X, R, W) and returns (Y, S): S = X + R in X's
    dtype, the next layer's residual, and Y the norm of S. The FP8 form (a
    y_scale) stores Y as FP8 E4M3 of y / y_scale, as a QuantizeLinear would.
    """

    def __init__(self, epsilon: float = DEFAULT_EPSILON, residual: bool = False,
                 y_scale: float | None = None):
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
        self.epsilon = validate_epsilon(epsilon)
        self.residual = bool(residual)
        self.y_scale = None if y_scale is None else validate_y_scale(y_scale)
        self._inputs, self._outputs = io_names(self.residual)
        self.num_outputs = len(self._outputs)
        # The fields point into the buffers: both live as long as the plugin.
        self._fields, self._buffers = plugin_fields(self.epsilon, self.residual, self.y_scale)
        # One execution context's state, never stored in the engine:
        self._kernel = None  # the compiled launcher
        self._io = None  # the (X dtype, hidden, W dtype) it serves
        self._device = None  # the CUDA device it was compiled on
        self._wrapped = {}  # the I/O addresses -> CuTe tensors
        self._streams = {}  # TensorRT's stream handle -> CUstream

    def get_capability_interface(self, type):
        """Build and run time, once per interface: this class implements all three."""
        return self

    def clone(self):
        """Build and run time: the same attributes, empty run-time state."""
        return RmsNormPlugin(self.epsilon, self.residual, self.y_scale)

    def get_output_data_types(self, input_types):
        """Build time, network definition: Y has X's dtype, or FP8; S has X's."""
        x_type = input_types[0]
        dtype_name(x_type, "X", ACTIVATION_DTYPES)
        dtype_name(input_types[-1], "W", WEIGHT_DTYPES)
        if self.residual and input_types[1] != x_type:
            raise ValueError(f"{PLUGIN_NAME}: R must have X's dtype {x_type}, "
                             f"got {input_types[1]}")
        if self.y_scale is None:
            return [x_type] * self.num_outputs
        refusal = fp8_refusal()
        if refusal:
            raise ValueError(f"{PLUGIN_NAME}: {refusal}")
        return [self._y_type()] + [x_type] * (self.num_outputs - 1)

    def _y_type(self):
        """Y's TensorRT dtype in the FP8 form."""
        return getattr(trt.DataType, DTYPES[Y_FP8].trt)

    def get_output_shapes(self, inputs, shape_inputs, expr_builder):
        """Build time: Y (and S) have X's symbolic shape, X [..., hidden]."""
        expected = f"X [..., hidden] of rank 2 or more{', R of its shape' * self.residual}"
        if (len(inputs) != len(self._inputs) or len(inputs[0]) < 2
                or len(inputs[-1]) != 1):
            raise ValueError(f"{PLUGIN_NAME}: expects {expected} and W [hidden]")
        x_dims = inputs[0]
        if self.residual and not same_dims(x_dims, inputs[1]):
            raise ValueError(f"{PLUGIN_NAME}: expects {expected} and W [hidden]")
        x_hidden = x_dims[len(x_dims) - 1]
        w_hidden = inputs[-1][0]
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
        return [trt.DimsExprs(x_dims) for _ in self._outputs]

    def supports_format_combination(self, pos, in_out, num_inputs):
        """Build time, per I/O slot: all linear; X and W of their dtypes, Y FP8 or X's, S X's."""
        desc = in_out[pos].desc
        if desc.format != trt.TensorFormat.LINEAR:
            return False
        name = (self._inputs + self._outputs)[pos]
        if name == "Y" and self.y_scale is not None:
            return desc.type == self._y_type() and fp8_refusal() is None
        if name not in ("X", "W"):
            return desc.type == in_out[0].desc.type
        allowed = ACTIVATION_DTYPES if name == "X" else WEIGHT_DTYPES
        trt_types = [getattr(trt.DataType, DTYPES[d].trt) for d in allowed]
        return desc.type in trt_types

    def configure_plugin(self, inp, out):
        """Build time, once formats and profile are chosen: nothing to do."""

    def set_tactic(self, tactic):
        """Build and run time: there is no tactic to select."""

    def get_fields_to_serialize(self):
        """Build time and engine save: epsilon, the form and y_scale, the stored attributes."""
        return self._fields

    def attach_to_context(self, context):
        """Run time, once per execution context: a clone owns its caches."""
        return self.clone()

    def on_shape_change(self, inp, out):
        """Run time, before the first enqueue and on a shape change: compile here."""
        dtype = dtype_name(inp[0].type, "X", ACTIVATION_DTYPES)
        hidden = inp[0].dims[-1]
        w_dtype = dtype_name(inp[-1].type, "W", WEIGHT_DTYPES)
        io = (dtype, hidden, w_dtype)
        if io == self._io:
            return  # a new token count: the launcher takes it at run time
        # Compiling is slow; enqueue, on the inference path, never does it.
        self._kernel = compile_rms_norm(dtype, hidden, self.epsilon, w_dtype=w_dtype,
                                        residual=self.residual, y_scale=self.y_scale)
        self._io = io
        self._device = torch.cuda.current_device()
        self._wrapped.clear()

    def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
        """Run time, every inference: launch on TensorRT's stream."""
        num_tokens = math.prod(input_desc[0].dims[:-1])  # all but hidden count rows
        key = (*inputs, *outputs)
        tensors = self._wrapped.get(key)
        if tensors is None:  # a context usually reuses its buffers
            tensors = self._wrap_buffers(key, num_tokens)
        cu_stream = self._streams.get(stream)
        if cu_stream is None:
            cu_stream = cuda.CUstream(stream)
            self._streams[stream] = cu_stream
        x, w, y, *residual = tensors
        self._kernel(x, w, y, num_tokens, cu_stream, *residual)

    def _wrap_buffers(self, addresses, num_tokens):
        """enqueue's handoff ([6]) for one set of addresses, then cached.

        Returns the launcher's tensors: X, W, Y, and R, S in the residual form.
        It takes the row count as an argument, so the tensors wrapped at one
        count serve every count.
        """
        dtype, hidden, w_dtype = self._io
        device = self._device
        # Addresses that change on every call must not grow the cache.
        if len(self._wrapped) >= 256:
            self._wrapped.clear()
        dtypes = {"W": w_dtype}
        if self.y_scale is not None:
            dtypes["Y"] = Y_FP8
        by_name = {}
        for name, address in zip(self._inputs + self._outputs, addresses):
            shape = (hidden,) if name == "W" else (num_tokens, hidden)
            name_dtype = dtypes.get(name, dtype)
            by_name[name] = cute_tensor_from_pointer(address, shape, name_dtype, device)
        order = ("X", "W", "Y", "R", "S")[:3 + 2 * self.residual]
        tensors = tuple(by_name[name] for name in order)
        self._wrapped[addresses] = tensors
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
        # Every field create_plugin takes, with its type: the ONNX parser turns
        # a node's attributes into fields of these types. The FP8 form's values
        # are given only to list y_scale.
        self.field_names, self._buffers = plugin_fields(DEFAULT_EPSILON, False, 1.0)

    def create_plugin(self, name, field_collection, phase):
        """Build time (network API, ONNX parser) and engine load: a plugin from its fields."""
        fields = {field.name: field for field in field_collection}
        return RmsNormPlugin(epsilon_field(fields), residual_field(fields), y_scale_field(fields))


def epsilon_field(fields: dict) -> float:
    """The value of the field 'epsilon' (fields by name), or ValueError."""
    field = fields.get("epsilon")
    if field is None:
        got = f"fields {sorted(fields)}"
    elif field.type != trt.PluginFieldType.FLOAT32:
        # The bindings cannot return .data of FLOAT16 or BF16 fields.
        got = f"a {field.type} field"
    elif len(field.data) != 1:
        got = f"a {field.type} field of {len(field.data)} values"
    else:
        return field.data[0]
    raise ValueError(f"{PLUGIN_NAME}: needs one FLOAT32 field 'epsilon' "
                     f"holding one value, got {got}")


def residual_field(fields: dict) -> bool:
    """The form the field 'residual' selects; absent (an engine saved before it): plain."""
    field = fields.get("residual")
    if field is None:
        return False
    if field.type != trt.PluginFieldType.INT32:
        got = f"a {field.type} field"
    elif len(field.data) != 1 or field.data[0] not in (0, 1):
        got = f"values {np.asarray(field.data).tolist()}"
    else:
        return bool(field.data[0])
    raise ValueError(f"{PLUGIN_NAME}: field 'residual' must be one INT32 value, 0 (plain) "
                     f"or 1 (residual), got {got}")


def y_scale_field(fields: dict) -> float | None:
    """y_scale where the field 'quantize' is 1 (FP8 Y), None where it is 0 or absent."""
    quantize = fields.get("quantize")
    scale = fields.get("y_scale")
    values = [0] if quantize is None else np.asarray(quantize.data).tolist()
    int32 = quantize is None or quantize.type == trt.PluginFieldType.INT32
    if values not in ([0], [1]) or not int32:
        raise ValueError(f"{PLUGIN_NAME}: field 'quantize' must be one INT32 value, 0 (Y in "
                         f"X's dtype) or 1 (Y in FP8), got {values}")
    if values == [0]:
        if scale is not None:
            raise ValueError(f"{PLUGIN_NAME}: field 'y_scale' is given but 'quantize' is not 1, "
                             "so Y would not be scaled")
        return None
    got = None
    if scale is None:
        got = "none"
    elif scale.type != trt.PluginFieldType.FLOAT32:
        got = f"a {scale.type} field"  # FLOAT16 and BF16 data cannot be read: see epsilon_field
    elif len(scale.data) != 1:
        got = f"{len(scale.data)} values"
    if got is not None:
        raise ValueError(f"{PLUGIN_NAME}: quantize 1 (FP8 Y) needs one FLOAT32 field 'y_scale', "
                         f"got {got}")
    try:
        return validate_y_scale(scale.data[0])
    except ValueError as exc:
        raise ValueError(f"{PLUGIN_NAME}: {exc}") from None


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


# %% [8] The engine, built with Polygraphy ------------------------------------------
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


def plugin_network(hidden: int, dtype: str, epsilon: float, w_dtype: str,
                   residual: bool = False, y_scale: float | None = None):
    """((builder, network), plugin): one plugin layer, its inputs the network's.

    X, (R,) W in, Y (, S) out; Y in FP8 with a y_scale. The plugin comes
    from the registered creator, as the ONNX parser gets it, so both ways of
    building go through create_plugin.
    """
    from polygraphy.backend.trt import create_network

    with tensorrt_stage("network definition"):
        builder, network = create_network(strongly_typed=True)
        # _buffers stay alive until create_plugin has copied the fields.
        fields, _buffers = plugin_fields(epsilon, residual, y_scale)
        creator = register_creator()
        phase = trt.TensorRTPhase.BUILD
        plugin = creator.create_plugin("rms_norm", fields, phase)
        x_type = getattr(trt.DataType, DTYPES[dtype].trt)
        w_type = getattr(trt.DataType, DTYPES[w_dtype].trt)
        input_names, output_names = io_names(residual)
        inputs = []
        for name in input_names:
            if name == "W":
                inputs.append(network.add_input(name, w_type, (hidden,)))
            else:
                inputs.append(network.add_input(name, x_type, (-1, hidden)))
        layer = network.add_plugin_v3(inputs, [], plugin)
        for i, name in enumerate(output_names):
            output = layer.get_output(i)
            output.name = name
            network.mark_output(output)
    return (builder, network), plugin


def onnx_network(hidden: int, dtype: str, epsilon: float, w_dtype: str,
                 residual: bool = False, y_scale: float | None = None):
    """The same network, from a one-node ONNX model of op type PLUGIN_NAME.

    TensorRT's parser asks the registry for the creator that the node's
    plugin_version and plugin_namespace name, and passes every other
    attribute (epsilon, residual, and quantize with y_scale) as a field.
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
    input_names, output_names = io_names(residual)

    types = {"W": w_type}
    quantized = {}
    if y_scale is not None:
        types["Y"] = getattr(TensorProto, DTYPES[Y_FP8].onnx)
        quantized = {"quantize": 1, "y_scale": float(y_scale)}

    def value_info(name):
        shape = [hidden] if name == "W" else rows
        return helper.make_tensor_value_info(name, types.get(name, x_type), shape)

    node = helper.make_node(
        PLUGIN_NAME,
        inputs=list(input_names),
        outputs=list(output_names),
        name="rms_norm",
        epsilon=float(epsilon),
        residual=int(residual),
        **quantized,
        plugin_version=PLUGIN_VERSION,
        plugin_namespace=PLUGIN_NAMESPACE,
    )
    graph = helper.make_graph(
        [node],
        "rms_norm",
        inputs=[value_info(name) for name in input_names],
        outputs=[value_info(name) for name in output_names],
    )
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


# %% [9] Run and check against NumPy ------------------------------------------------
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


# An FP8 Y is the FP8 rounding of the float64 reference, except where that
# reference lies so near the midpoint of two FP8 values that FP32's error
# (below 2^-18, as above) may cross it: there either neighbour is right.
FP8_MIDPOINT_BAND = 2.0**-16


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


def make_residual(num_tokens: int, hidden: int, dtype: str, seed: int):
    """Random R of the residual form, as make_inputs' X but drawn apart from it."""
    # Another stream than X's (the seed's low bits flipped): S must not be 2X.
    gen = torch.Generator().manual_seed(seed ^ 0x5EED)
    r = torch.randn(num_tokens, hidden, generator=gen)
    return r.to(getattr(torch, DTYPES[dtype].torch))


def check_output(y: np.ndarray, x: np.ndarray, w: np.ndarray, epsilon: float, dtype: str):
    """(all within Y_TOLERANCE[dtype], max abs error) against float64."""
    ref = rms_norm_reference(x, w, epsilon)
    err = np.abs(y.astype(np.float64) - ref)
    tolerance = Y_TOLERANCE[dtype]
    bound = tolerance.atol + tolerance.rtol * np.abs(ref)
    finite = np.all(np.isfinite(y))
    ok = bool(finite and np.all(err <= bound))
    return ok, float(np.max(err, initial=0.0))


def check_quantized(y: np.ndarray, x: np.ndarray, w: np.ndarray, epsilon: float,
                    y_scale: float):
    """(all FP8 roundings of the reference, max abs error) for the FP8 form's Y, decoded."""
    ref = rms_norm_reference(x, w, epsilon)
    expected = quantize_reference(ref, y_scale)
    y = y.astype(np.float64)
    both_nan = np.isnan(y) & np.isnan(expected)
    differ = ~((y == expected) | both_nan)
    # Rounding is monotonic: where Y differs, the values the band's two ends
    # round to must bound it.
    near = ref[differ]
    ends = (quantize_reference(near * (1.0 - FP8_MIDPOINT_BAND), y_scale),
            quantize_reference(near * (1.0 + FP8_MIDPOINT_BAND), y_scale))
    ok = bool(np.all((np.minimum(*ends) <= y[differ]) & (y[differ] <= np.maximum(*ends))))
    err = np.abs(np.where(both_nan, 0.0, y - expected))
    return ok, float(np.max(err, initial=0.0))


def run_and_check(engine, token_counts, hidden, dtype, epsilon, seed,
                  w_dtype="float32", residual=False, y_scale=None) -> bool:
    """Run each token count through one context and compare with NumPy.

    The buffers and the stream are torch's, as in an application. In the
    residual form S must equal X + R bit for bit, and Y is S's norm; with a
    y_scale, Y is that norm quantized to FP8.
    """
    context = engine.create_execution_context()
    stream = torch.cuda.Stream()
    all_ok = True
    for n in token_counts:
        # The flag's seed as given: every value it accepts is one torch takes.
        x, w = make_inputs(n, hidden, dtype, seed, w_dtype)
        tensors = {"X": x, "W": w}
        if residual:
            tensors["R"] = make_residual(n, hidden, dtype, seed)
        # An output the engine leaves unwritten stays NaN and fails.
        for name in io_names(residual)[1]:
            tensors[name] = torch.full_like(x, float("nan"))
        if y_scale is not None:
            tensors["Y"] = tensors["Y"].to(getattr(torch, DTYPES[Y_FP8].torch))
        on_gpu = {name: tensor.cuda() for name, tensor in tensors.items()}
        context.set_input_shape("X", tuple(x.shape))
        if residual:
            context.set_input_shape("R", tuple(x.shape))
        for name, tensor in on_gpu.items():
            context.set_tensor_address(name, tensor.data_ptr())
        # The uploads ran on torch's stream; TensorRT reads on `stream`.
        torch.cuda.synchronize()
        if not context.execute_async_v3(stream.cuda_stream):
            raise TensorRTError(f"TensorRT could not run the engine at {n} tokens; "
                                "its log above says why")
        stream.synchronize()
        normalized = x
        s_note = ""
        s_ok = True
        if residual:
            normalized = residual_reference(x, tensors["R"])
            s_ok = torch.equal(on_gpu["S"].cpu(), normalized)
            s_note = "  S == X + R" if s_ok else "  S != X + R"
        y = on_gpu["Y"].float().cpu().numpy()
        inputs = (y, normalized.float().numpy(), w.float().numpy(), epsilon)
        if y_scale is None:
            ok, err = check_output(*inputs, dtype)
        else:
            ok, err = check_quantized(*inputs, y_scale)
        ok = ok and s_ok
        verdict = "ok" if ok else "MISMATCH"
        print(f"  tokens={n:<5d} max |y - ref| = {err:.3e}{s_note}  {verdict}")
        all_ok = all_ok and ok
    return all_ok


# %% [10] Command line: each user error one sentence and exit code 2, before any GPU work
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
    parser.add_argument("--residual", action="store_true",
                        help="the fused form: (X, R, W) in, (Y, S = X + R) out")
    parser.add_argument("--y-scale", type=float, metavar="SCALE",
                        help="the FP8 form: Y stored as FP8 E4M3 of y / SCALE (sm_89+)")
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
    if args.y_scale is not None:
        try:
            validate_y_scale(args.y_scale)
        except ValueError:
            parser.error("--y-scale must be finite and >= 2^-126 (a normal float32), "
                         f"got {args.y_scale}")
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
    """[8] for these flags, through the network API or the ONNX parser."""
    elem_bytes = DTYPES[args.dtype].bytes
    sm90 = is_sm90(gpu_arch())
    fp8 = args.y_scale is not None
    print("\n".join(schedule_lines(args.hidden_dim, elem_bytes, sm90, args.residual, fp8)))
    counts = (args.min_tokens, args.opt_tokens, args.max_tokens)
    rows = tuple((n, args.hidden_dim) for n in counts)
    shapes = {"X": rows}
    if args.residual:
        shapes["R"] = rows
    network_args = (args.hidden_dim, args.dtype, args.epsilon, args.weight_dtype, args.residual,
                    args.y_scale)
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
        if args.y_scale is not None and fp8_refusal():
            raise UsageError(fp8_refusal())
        form = "X + R, then RMSNorm" if args.residual else "RMSNorm"
        if args.y_scale is not None:
            form += f" to FP8 (y_scale {args.y_scale:g})"
        print(f"{form} {args.dtype}, hidden {args.hidden_dim}, W {args.weight_dtype}, "
              f"epsilon {args.epsilon:g}, profile [{low}, {high}] opt {args.opt_tokens}")
        engine = make_engine(args)
        with tensorrt_stage("execution context"):
            correct = run_and_check(engine, counts, args.hidden_dim, args.dtype, args.epsilon,
                                    args.seed, args.weight_dtype, args.residual, args.y_scale)
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
        lines = schedule_lines(args.hidden_dim, elem_bytes, sm90, args.residual,
                               args.y_scale is not None)
        heading = f"{args.dtype} hidden {args.hidden_dim}, {target}:"
        print(heading, *lines, sep="\n  ")
    return EXIT_CORRECT


if __name__ == "__main__":
    PARSER = make_parser("Build a TensorRT engine around a CuteDSL RMSNorm plugin, "
                         "run it and check it against NumPy.")
    ARGS = validate_args(PARSER, PARSER.parse_args())
    sys.exit(main(ARGS))
