#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The fast and fused forms of rms_norm_plugin_cutedsl.py's RMSNorm, built on it by import.

Read rms_norm_plugin_cutedsl.py first: this file reuses its kernel steps,
launcher pieces, handoff, plugin, engine build and command line, and adds
only what makes the kernel faster at every shape and what fuses its
neighbours into it.

What you will learn
-------------------
* [1] The fused forms and their references: the residual form reads a
  second row R and stores S = X + R, a decoder layer's Add; the FP8 form
  stores Y as FP8 E4M3 of y / y_scale, the QuantizeLinear after the norm.
* [2] Speed layers on the same five steps: rows staged in shared memory by
  cp.async or one bulk copy per row, several rows in turn per CTA, and a
  row split over a cluster of CTAs that share their sums.
* [3] The fused forms through the lesson's hooks: R is a second row input,
  S is stored in Step 1, the FP8 scale rides in Step 5's factor.
* [4] A timed table of plans by row length and token count on top of the
  lesson's register rule; ``--plans`` prints which kernel runs where.
* [5] One launcher holding several plans, one picked per call from the
  run-time token count.
* [6] A plugin and creator that extend the lesson's, serving every form
  under the same plugin name, so engines saved before load here too.

It runs where the lesson runs (FP8 Y needs sm_89 or newer):

    python3 rms_norm_fused_cutedsl.py                     # the fast plans, plain form
    python3 rms_norm_fused_cutedsl.py --residual          # (X, R, W) -> (Y, S = X + R)
    python3 rms_norm_fused_cutedsl.py --residual --y-scale 0.05   # Y in FP8
    python3 rms_norm_fused_cutedsl.py --from-onnx         # through TensorRT's ONNX parser
    python3 rms_norm_fused_cutedsl.py --plans --hidden-dim 8192   # no GPU

Exit codes as the lesson's: 0 correct, 1 incorrect, 2 usage or environment.
"""

from __future__ import annotations

import dataclasses
import math
import sys

try:
    import rms_norm_plugin_cutedsl as lesson
except ImportError as exc:  # the lesson's ImportError names the missing pip package
    if __name__ != "__main__":
        raise
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
import numpy as np
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync
from rms_norm_plugin_cutedsl import (DTYPES, KernelPlan, MAX_CTA_THREADS, MAX_HIDDEN,
                                     VECTOR_BYTES, WARP_THREADS, column_tensor, cuda, fit_registers,
                                     inverse_rms, load_columns, load_row, row_sum, row_sum_buffers,
                                     row_tensor, store_row, sum_of_squares, thread_registers, trt)

Y_FP8 = "float8_e4m3fn"  # Y of the FP8 form: E4M3, finite only, largest 448
FP8_MAX = 448.0


# %% [1] The fused forms' references ---------------------------------------------


def residual_reference(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """s = x + r rounded once to X's dtype (torch: NumPy has no bfloat16).

    The FP32 sum rounds to fp16 or bf16 as the exact sum would: FP32 carries
    more than twice their digits. The residual form's Y is the norm of s.
    """
    return (x.float() + r.float()).to(x.dtype)


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


# %% [2] The plan's extra choices, and the speed layers ------------------------------
# The lesson's kernel holds X in registers and gives each row its own threads.
# Three layers change only how a row arrives (Step 1) and where its sum is
# added (Step 3); [4] picks them per shape.
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
#
# Memory traffic of the fused forms: the residual form also reads R and
# writes S, each once, so a decoder layer's Add costs no pass of its own; the
# FP8 form stores Y as the FP8 GEMM after it reads it, one byte an element.

# Registers and shared memory of the rule ([4]), besides the lesson's.
MAX_SM_THREADS = 2048
# Shared memory one CTA may use: sm_90's 227 KB, and before it the least of
# sm_80's 163 KB and sm_86/sm_89's 99 KB.
CTA_SHARED_BYTES = {True: 227 * 1024, False: 99 * 1024}
# What an SM holds for all its CTAs, each with 1 KB of the system's: sm_90's
# 228 KB and sm_80's 164 KB (where sm_86/sm_89's 100 KB hold fewer CTAs, a
# launch bound only narrows their registers).
SM_SHARED_BYTES = {True: 228 * 1024, False: 164 * 1024}
RESERVED_CTA_SHARED_BYTES = 1024


@dataclasses.dataclass(frozen=True)
class FusedPlan(KernelPlan):
    """The lesson's plan, and how rows arrive, rows a CTA takes in turn, the cluster, the form."""

    early_weight: bool = True  # W loaded with X (Step 1), or after the reduction
    # Step 1: X straight into "registers", or staged in shared memory by
    # "cp.async" (a copy per vector) or "bulk" copy (one per row, sm_90+).
    arrival: str = "registers"
    rows_in_sequence: int = 1  # rows each slot normalizes in turn (staged plans)
    cluster_ctas: int = 1  # CTAs sharing each row (sm_90+); threads_per_row spans them all
    min_ctas_per_sm: int = 0  # a launch bound: ptxas budgets registers for it
    residual: bool = False  # the fused form: R added to X first, the sum S stored too
    residual_by_vector: bool = False  # R loaded and added a vector at a time, not held whole

    @property
    def weight_first(self) -> bool:
        return self.early_weight

    @property
    def num_row_inputs(self) -> int:
        """Rows each thread reads: X, and R in the residual form."""
        return lesson.ROW_INPUTS + self.residual

    @property
    def cta_threads(self) -> int:
        return self.threads_per_row * self.rows_per_cta // self.cluster_ctas

    @property
    def cta_rows(self) -> int:
        return self.rows_per_cta * self.rows_in_sequence

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

    def registers_needed(self) -> int:
        """The 32-bit registers a thread of the plan needs: OTHER_REGISTERS and what it holds.

        Held through the reduction: X's vectors where X is in registers (or a
        later reduction reads them), every other row input's as they arrive
        (a staged plan's too: R waits for X to be added to it), and the
        per-column inputs where they come first or, loaded for a CTA's first
        row, are held through its next rows' sums; counted at 4 bytes an element.
        Held at the store: X, and the columns (one vector of them where they
        come a vector at a time).
        """
        x_vector = math.ceil(self.vec * self.elem_bytes / 4)
        column_vector = self.vec * lesson.COLUMN_INPUTS
        x_held = self.arrival == "registers" or lesson.REDUCTIONS > 1
        other_rows = self.vecs_per_thread * x_vector * (self.num_row_inputs - 1)
        if self.residual_by_vector:
            other_rows = x_vector
        through = self.vecs_per_thread * x_vector * x_held + other_rows
        columns_held = self.early_weight or self.rows_in_sequence > 1 and not self.weight_by_vector
        if columns_held:
            through += self.vecs_per_thread * column_vector
        x_at_store = x_vector
        if self.arrival == "registers":
            x_at_store = self.vecs_per_thread * x_vector
        columns_at_store = self.vecs_per_thread * column_vector
        if self.weight_by_vector:
            columns_at_store = column_vector
        return lesson.OTHER_REGISTERS + max(through, x_at_store + columns_at_store)

    def register_ceiling(self) -> int:
        """The registers a thread may use: what the launch bound (or one CTA) leaves it."""
        ctas = max(1, self.min_ctas_per_sm)
        per_thread = lesson.REGISTERS_PER_SM // (ctas * self.cta_threads)
        return min(lesson.MAX_THREAD_REGISTERS, per_thread // 8 * 8)  # allocated 8 at a time

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
            f"{'_rv' * self.residual_by_vector}"
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
        if self.residual_by_vector:
            rows_in = "X, and R a vector at a time,"
        where = {
            "registers": f"{rows_in} in registers",
            "cp.async": f"{rows_in} staged by cp.async",
            "bulk": f"{rows_in} staged by bulk copy",
        }[self.arrival]
        bound = ""
        if self.min_ctas_per_sm:
            bound = f", launch bound {self.min_ctas_per_sm} CTAs/SM"
        vectors = f"{self.vecs_per_thread} vectors of {self.vec} x {self.elem_bytes * 8}-bit"
        weight = "first" if self.early_weight else "late"
        if self.weight_by_vector:
            weight = "late, a vector at a time"
        return (f"{self.threads_per_row} threads/row x {vectors}, {rows}, {where}, "
                f"W {weight}{bound}")


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
def load_all_columns(plan: cutlass.Constexpr, t, columns):
    """Every vector of W this thread owns: before a staged plan's first wait, or after the sum."""
    for k in cutlass.range_constexpr(plan.vecs_per_thread):
        load_columns(plan, t, columns, k)


@cute.jit
def unstage_row(plan: cutlass.Constexpr, t, i, row_ok, staged, slot, row_inputs, columns):
    """Step 1 of a staged plan, second half: once row i is in, its vectors into registers.

    W, where it comes first, is loaded before the first wait.
    """
    staged_rows, rows_in = staged
    if cutlass.const_expr(plan.early_weight and i == 0):
        load_all_columns(plan, t, columns)
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
def cluster_row_sum(plan: cutlass.Constexpr, partial, sSum, sums_in, n: cutlass.Constexpr,
                    row_in_cta, t):
    """Step 3 over a cluster: lane c of each warp sends the warp's sum to CTA c (st.async).

    Each CTA's mbarrier counts the 4 bytes that arrive from every warp of the
    row; once they are in, every CTA holds all the row's warp sums and adds
    them as the lesson's row_sum does.
    """
    total = cute.arch.warp_reduction_sum(partial, threads_in_group=WARP_THREADS)
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
    total = Float32(0.0)
    for w in cutlass.range_constexpr(plan.warps_per_row):
        total = total + sSum[w, row_in_cta, s]
    return total


# %% [3] The fused forms through the lesson's hooks ------------------------------------
# R is a second row input: it joins X in row_inputs, so load_row, stage_rows
# and unstage_row bring it in with X, and the rule counts it. add_residual is
# Step 1's second half: s = x + r, stored as S and normalized in X's place.
# The FP8 form changes Step 5's epilogue alone: 1 / y_scale joins rstd, and
# the cast to Y's dtype is the hardware's saturating FP8 cvt.


@cute.jit
def add_residual(plan: cutlass.Constexpr, t, row, row_ok, row_inputs, mR, mS, staged, slot):
    """Step 1 of the residual form, second half: s = x + r, stored as S, normalized as X.

    The sum is rounded to X's dtype before the norm reads it, as torch and
    onnxruntime compute it, so Y is the norm of exactly the S stored. A
    staged plan also writes s over its row of sX, which Step 5 reads again.
    Where X and R do not both fit a thread's registers (residual_by_vector),
    each vector of R is loaded and added just before its S is stored.
    """
    tXrX = row_inputs[0][1]
    if cutlass.const_expr(not plan.residual_by_vector):
        s = tXrX.load().to(Float32) + row_inputs[1][1].load().to(Float32)
        tXrX.store(s.to(tXrX.element_type))
    if row_ok:
        for k in cutlass.range_constexpr(plan.vecs_per_thread):
            j = t + k * plan.threads_per_row
            if plan.owns(j):
                if cutlass.const_expr(plan.residual_by_vector):
                    tRrR = cute.make_rmem_tensor((plan.vec,), mR.element_type)
                    cute.autovec_copy(mR[row, None, j], tRrR)
                    sk = tXrX[None, k].load().to(Float32) + tRrR.load().to(Float32)
                    tXrX[None, k].store(sk.to(tXrX.element_type))
                cute.autovec_copy(tXrX[None, k], mS[row, None, j])
                if cutlass.const_expr(plan.arrival != "registers"):
                    sX = staged[0][0]
                    cute.autovec_copy(tXrX[None, k], sX[slot, None, j])


@cute.jit
def store_staged_row(plan: cutlass.Constexpr, normalize, sX, slot, mY, row, row_ok, t):
    """Step 5 of a staged plan: each vector of X again from shared memory, then as the lesson's.

    The row is not held in registers through Steps 3-4, and W may arrive a
    vector at a time where the plan says so.
    """
    if row_ok:
        for k in cutlass.range_constexpr(plan.vecs_per_thread):
            j = t + k * plan.threads_per_row
            if plan.owns(j):
                xk = cute.make_rmem_tensor((plan.vec,), sX.element_type)
                cute.autovec_copy(sX[slot, None, j], xk)
                yk = cute.make_rmem_tensor((plan.vec,), mY.element_type)
                yk.store(normalize(xk.load().to(Float32), k).to(mY.element_type))
                cute.autovec_copy(yk, mY[row, None, j])


@cute.kernel
def fused_rms_norm_kernel(
    x_ptr: cute.Pointer, r_ptr: cute.Pointer | None, w_ptr: cute.Pointer,  # inputs
    num_tokens: Int32,
    y_ptr: cute.Pointer, s_ptr: cute.Pointer | None,  # outputs
    plan: cutlass.Constexpr, epsilon: cutlass.Constexpr, y_scale: cutlass.Constexpr,
):
    # The lesson's parameter order (TensorRT's AOT launcher's): R and S are
    # None in the plain form, and then no parameters at all, so the plain
    # PTX has the lesson's parameters and the residual's are (X, R, W,
    # num_tokens, Y, S).
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    row_in_cta, t, first_row = plan.thread_slot(tidx, bidx)
    mX = row_tensor(plan, x_ptr, num_tokens)
    mY = row_tensor(plan, y_ptr, num_tokens)
    mW = column_tensor(plan, w_ptr)
    tXrX = thread_registers(plan, mX)
    tWrW = thread_registers(plan, mW)
    row_inputs = ((mX, tXrX),)
    mR = None
    mS = None
    if cutlass.const_expr(plan.residual):
        mR = row_tensor(plan, r_ptr, num_tokens)
        mS = row_tensor(plan, s_ptr, num_tokens)
    if cutlass.const_expr(plan.residual and not plan.residual_by_vector):
        row_inputs = ((mX, tXrX), (mR, thread_registers(plan, mX)))
    columns = ((mW, tWrW),)
    smem = cutlass.memory.SmemAllocator()

    staged = stage_rows(plan, smem, row_inputs, first_row, row_in_cta, t, num_tokens)
    sSum = row_sum_buffers(plan, smem, plan.rows_in_sequence)  # one sum per row
    sums_in = None
    if cutlass.const_expr(plan.cluster_ctas > 1):
        sums_in = cluster_sum_barriers(smem, cute.size(sSum, mode=[2]))

    # One row per slot, unless a staged plan normalizes several in turn.
    for i in cutlass.range_constexpr(plan.rows_in_sequence):
        row = first_row + i * plan.rows_per_cta
        slot = i * plan.rows_per_cta + row_in_cta
        row_ok = row < num_tokens  # the last CTA's spare slots load and store nothing
        if cutlass.const_expr(plan.arrival == "registers"):
            load_row(plan, t, row, row_ok, row_inputs, columns)  # Step 1
        else:
            unstage_row(plan, t, i, row_ok, staged, slot, row_inputs, columns)
        if cutlass.const_expr(plan.residual):
            add_residual(plan, t, row, row_ok, row_inputs, mR, mS, staged, slot)
        partial = sum_of_squares(tXrX)  # Step 2
        if cutlass.const_expr(plan.cluster_ctas > 1):
            total = cluster_row_sum(plan, partial, sSum, sums_in, i, row_in_cta, t)  # Step 3
        else:
            total = row_sum(plan, partial, sSum, i, row_in_cta, t)  # Step 3
        rstd = inverse_rms(plan, total, epsilon)  # Step 4
        if cutlass.const_expr(y_scale is not None):
            # The FP8 form's y / y_scale, folded into the row's one factor (an
            # op that adds a term after it, a LayerNorm's bias, scales that too);
            # Step 5's cast to FP8 is the hardware's saturating one.
            rstd = rstd * (1.0 / y_scale)
        late = not plan.early_weight and not plan.weight_by_vector
        if cutlass.const_expr(late and i == 0):
            load_all_columns(plan, t, columns)

        def normalize(x, k):
            """FP32 vector k of X (None: all the thread's) to FP32 Y."""
            if cutlass.const_expr(plan.weight_by_vector):
                load_columns(plan, t, columns, k)  # just before its use
            return x * rstd * tWrW[None, k].load().to(Float32)

        if cutlass.const_expr(plan.arrival == "registers"):
            store_row(plan, normalize, tXrX, mY, row, row_ok, t)  # Step 5
        else:
            store_staged_row(plan, normalize, staged[0][0], slot, mY, row, row_ok, t)


# %% [4] Which plan runs which shape: a timed table on the lesson's rule --------------
# Two kinds of number decide a plan.
#
# Register numbers are not tuned: they follow from what a thread holds, by
# the lesson's fit_registers with FIT_STEPS below. W first, a whole late W
# and a launch bound are kept only where what the thread then holds fits.
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

# What the rule changes, in order, while a plan's estimate is over its ceiling.
FIT_STEPS = (
    {"early_weight": False},  # W after the reduction: none held through it
    {"weight_by_vector": True},  # and a vector at a time at the store
    {"min_ctas_per_sm": 0},  # no launch bound: fewer CTAs per SM, more registers each
    {"residual_by_vector": True},  # R added a vector at a time: one vector of it held
)


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
    residual_cluster: tuple = None  # the residual forms' cluster plan, where not `cluster`
    many_ctas: int = 1  # above mid rows, a cluster of this many CTAs per row

    def cluster_plan(self, residual: bool) -> tuple:
        """(most rows, vectors per thread) of the form's cluster plan."""
        if residual and self.residual_cluster is not None:
            return self.residual_cluster
        return self.cluster


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
    RowPlan(max_row_bytes=12288, arrival="cp.async", vecs_per_thread=4,
            early_weight=True, min_cta_threads=128,
            few_vecs=4, mid=(1024, 4)),
    # The residual forms read X and R: with 8 or fewer such rows, a cluster puts
    # 4 SMs' loads in flight on each row where the few plan has one; shorter
    # rows did not gain from it (benchmarks/NOTES.md).
    RowPlan(max_row_bytes=15360, arrival="cp.async", vecs_per_thread=4,
            early_weight=True, min_cta_threads=128,
            few_vecs=4, mid=(1024, 4), residual_cluster=(8, 4)),
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


def estimated_ctas(plan: FusedPlan) -> int:
    """The CTAs per SM that registers_needed leaves room for (at least one)."""
    registers = math.ceil(plan.registers_needed() / 8) * 8
    by_registers = lesson.REGISTERS_PER_SM // (registers * plan.cta_threads)
    return max(1, min(by_registers, MAX_SM_THREADS // plan.cta_threads))


def shared_bytes(plan: FusedPlan) -> int:
    """The shared memory a CTA of the plan allocates: its staged rows (X, and R in the residual
    form), an FP32 sum per warp of each row slot in up to two sets (row_sum_buffers), and the
    mbarriers that count bulk-copied rows in or a cluster's sums (8 bytes each)."""
    staged = 0
    if plan.arrival != "registers":
        staged = plan.cta_rows * plan.hidden * plan.elem_bytes * plan.num_row_inputs
    sets = min(2, plan.rows_in_sequence)
    sums = 0
    if plan.warps_per_row > 1:
        sums = 4 * plan.warps_per_row * plan.rows_per_cta * sets
    mbarriers = (plan.arrival == "bulk") * plan.rows_in_sequence + (plan.cluster_ctas > 1) * sets
    return staged + math.ceil(sums / 8) * 8 + 8 * mbarriers


def staged_fits(plan: FusedPlan, sm90: bool) -> bool:
    """Whether a staged plan's shared memory fits one CTA, and its bound's CTAs one SM."""
    cta = shared_bytes(plan)
    ctas = max(1, plan.min_ctas_per_sm)
    on_sm = ctas * (cta + RESERVED_CTA_SHARED_BYTES)
    return cta <= CTA_SHARED_BYTES[sm90] and on_sm <= SM_SHARED_BYTES[sm90]


def threads_for(num_vecs: int, vecs_per_thread: int, ctas: int = 1) -> int:
    """Threads sharing a row over a cluster of `ctas` CTAs: the lesson's threads_for for one CTA,
    whole warps in each CTA of a cluster."""
    if ctas == 1:
        return lesson.threads_for(num_vecs, vecs_per_thread)
    step = WARP_THREADS * ctas
    threads = math.ceil(num_vecs / vecs_per_thread)
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


def split_row(hidden, elem_bytes, vecs_per_thread, line, ctas=1, **choices) -> FusedPlan:
    """A plan whose threads hold vecs_per_thread vectors each, over `ctas` CTAs.

    Short rows share a CTA until it has line.min_cta_threads threads.
    """
    vec = lesson.vector_elements(hidden, elem_bytes)
    num_vecs = hidden // vec
    threads = threads_for(num_vecs, vecs_per_thread, ctas)
    rows_per_cta = 1
    if ctas == 1:
        rows_per_cta = max(1, line.min_cta_threads // threads)
    return FusedPlan(
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
                sm90: bool = True, residual: bool = False) -> FusedPlan:
    """The plan for num_tokens rows (None: many): the table's, fitted to registers.

    sm90=False: no clusters or bulk copies (older GPUs, the AOT flavor).
    residual: the fused form, which reads R and writes S too.
    """
    plan = table_plan(hidden, elem_bytes, num_tokens, sm90, residual)
    if plan.min_ctas_per_sm * plan.cta_threads > MAX_SM_THREADS:
        plan = dataclasses.replace(plan, min_ctas_per_sm=0)  # a bound no SM could meet
    plan = fit_registers(plan, FIT_STEPS)
    if str(plan) in BOUND_BY_ESTIMATE:
        plan = dataclasses.replace(plan, min_ctas_per_sm=estimated_ctas(plan))
    return plan


def table_plan(hidden: int, elem_bytes: int, num_tokens: int | None,
               sm90: bool, residual: bool) -> FusedPlan:
    """The plan ROW_PLANS and the token thresholds name for num_tokens rows.

    The by-count plans hold X and W through Step 3, so they take at most 512
    threads a row (1024 over a cluster).
    """
    line = row_plan(hidden, elem_bytes)
    vec = lesson.vector_elements(hidden, elem_bytes)
    num_vecs = hidden // vec
    whole = vec * elem_bytes == VECTOR_BYTES  # what cp.async and clusters need
    n = math.inf if num_tokens is None else num_tokens

    def fits(vecs, most_threads):
        return vecs > 0 and math.ceil(num_vecs / vecs) <= most_threads

    shape = (hidden, elem_bytes)
    cluster_rows, cluster_vecs = line.cluster_plan(residual)
    if sm90 and whole and n <= cluster_rows and fits(cluster_vecs, MAX_CTA_THREADS):
        return split_row(*shape, cluster_vecs, line, ctas=CLUSTER_CTAS, residual=residual)
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
    cluster_rows = line.cluster_plan(residual)[0] if sm90 else 0
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




# %% [5] The launcher: several plans, one picked per call ----------------------------
# Compiled in, besides the lesson's: the form (residual: R and S given; FP8:
# Y's scale) and the schedule. At run time the host code picks the plan from
# num_tokens. Each plan has one launch site: CuteDSL compiles a kernel once
# per launch site.


def launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon, y_scale, mR, mS):
    """Launch fused_rms_norm_kernel with one plan: grid, CTA size, cluster and launch bound."""
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
    kernel = fused_rms_norm_kernel(*pointers, plan, epsilon, y_scale)
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
def fused_rms_norm_launch(
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
    # compiled launcher is called as the lesson's, (X, W, Y, num_tokens, stream).
    # y_scale: None, or the FP8 form's scale (mY then holds FP8).
    for p in cutlass.range_constexpr(len(schedule)):
        plan, counts = schedule[p]
        # One plan for every count needs no range test at run time.
        if cutlass.const_expr(len(schedule) == 1):
            launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon, y_scale, mR, mS)
        elif serves(num_tokens, counts):
            launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon, y_scale, mR, mS)


def validate_y_scale(value) -> float:
    """The FP8 form's y_scale as the float32 value Y is divided by, or ValueError."""
    y_scale = lesson.float32_field(value, "y_scale")
    # Below float32's normal range 1 / y_scale would overflow to inf.
    if not (math.isfinite(y_scale) and y_scale >= lesson.FLT_MIN):
        raise ValueError("field 'y_scale' must be finite and >= 2^-126 (a normal float32), "
                         f"got {value}")
    return y_scale


def has_fp8(arch: str) -> bool:
    """Whether a target converts to FP8 in hardware (cvt ... e4m3x2): sm_89 and newer."""
    target = cutlass.base_dsl.Arch[arch]
    return (target.major, target.minor) >= (8, 9)


def is_sm90(arch: str) -> bool:
    """Whether a target such as "sm_90a" has thread-block clusters and bulk copies."""
    return cutlass.base_dsl.Arch[lesson.validate_arch(arch)].major >= 9


def compile_launcher(schedule, dtype: str, w_dtype: str, epsilon: float, arch: str,
                     keep_ptx: bool = False, y_scale: float | None = None):
    """fused_rms_norm_launch for one schedule, dtype pair, epsilon and arch, on fake tensors.

    No GPU needed; the schedule's plans say the form, y_scale the FP8 form.
    support/check_kernel.py compiles the plans one at a time through it.
    """
    hidden = schedule[0][0].hidden
    rows = (cute.sym_int32(), hidden)  # num_tokens is symbolic
    w = lesson.fake_tensor(w_dtype, (hidden,))
    y = lesson.fake_tensor(dtype if y_scale is None else Y_FP8, rows)
    residual = (None, None)
    if schedule[0][0].residual:
        residual = (lesson.fake_tensor(dtype, rows), lesson.fake_tensor(dtype, rows))
    stream = cute.runtime.make_fake_stream()
    x = lesson.fake_tensor(dtype, rows)
    return lesson.compile_for(arch, keep_ptx, fused_rms_norm_launch, x, w, y, Int32(1), stream,
                              schedule, epsilon, y_scale, *residual)


def compile_rms_norm(dtype: str, hidden: int, epsilon: float = lesson.DEFAULT_EPSILON,
                     arch: str | None = None, *, w_dtype: str = "float32",
                     keep_ptx: bool = False, plans_by_tokens: bool = True,
                     residual: bool = False, y_scale: float | None = None):
    """The launcher for one dtype pair, hidden, epsilon and form, compiled once per process.

    For the current GPU, or for `arch` ("sm_90a": no GPU needed). keep_ptx:
    compiled anew, PTX in .__ptx__. plans_by_tokens=False: sm_80's many plan alone.
    residual=True: the fused form, called as (X, W, Y, num_tokens, stream, R, S).
    y_scale: the FP8 form, Y an FP8 E4M3 tensor of y / y_scale (sm_89+).
    """
    lesson.validate_dtypes(dtype, w_dtype)
    elem_bytes = DTYPES[dtype].bytes
    epsilon = lesson.validate_epsilon(epsilon)
    if y_scale is not None:
        y_scale = validate_y_scale(y_scale)
    if arch is None:
        arch = lesson.gpu_arch()
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
    key = ("fused", dtype, w_dtype, hidden, epsilon, arch, plans_by_tokens, residual, y_scale)
    return lesson.compiled_once(
        key, lambda: compile_launcher(schedule, dtype, w_dtype, epsilon, arch, y_scale=y_scale))


# %% [6] The plugin and its creator, extending the lesson's ----------------------------
# One plugin name for every form: the lesson's creator makes the plain form
# and refuses the fields below; this file's creator, registered in its
# place, makes every form, so an engine or ONNX node of either loads here.
PLUGIN_NAME = lesson.PLUGIN_NAME
PLUGIN_VERSION = lesson.PLUGIN_VERSION
PLUGIN_NAMESPACE = lesson.PLUGIN_NAMESPACE


def field_values(epsilon: float, residual: bool, y_scale: float | None) -> dict:
    """The plugin's fields: the lesson's epsilon; residual 1, the fused form; quantize 1, Y in
    FP8 E4M3, with y_scale (only then given)."""
    values = {
        **lesson.epsilon_values(epsilon),
        "residual": np.array([int(residual)], dtype=np.int32),
        "quantize": np.array([int(y_scale is not None)], dtype=np.int32),
    }
    if y_scale is not None:
        values["y_scale"] = np.array([y_scale], dtype=np.float32)
    return values


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


class FusedRmsNormPlugin(lesson.RmsNormPlugin):
    """The lesson's plugin running this file's plans, in every form.

    The residual form takes (X, R, W) and returns (Y, S): S = X + R in X's
    dtype, the next layer's residual, and Y the norm of S. The FP8 form (a
    y_scale) stores Y as FP8 E4M3 of y / y_scale, as a QuantizeLinear would.
    """

    def __init__(self, epsilon: float = lesson.DEFAULT_EPSILON, residual: bool = False,
                 y_scale: float | None = None):
        """Called by the creator's create_plugin and by clone()."""
        super().__init__(epsilon)
        self.residual = bool(residual)
        self.y_scale = None if y_scale is None else validate_y_scale(y_scale)
        self._inputs, self._outputs = io_names(self.residual)
        self.num_outputs = len(self._outputs)
        values = field_values(self.epsilon, self.residual, self.y_scale)
        self._fields, self._buffers = lesson.plugin_fields(values)

    def clone(self):
        """Build and run time: the same attributes, empty run-time state."""
        return FusedRmsNormPlugin(self.epsilon, self.residual, self.y_scale)

    def get_output_data_types(self, input_types):
        """Build time, network definition: Y has X's dtype, or FP8; S has X's."""
        x_type = input_types[0]
        super().get_output_data_types([x_type, input_types[-1]])
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
        """Build time: Y (and S) have X's symbolic shape; R, in the residual form, X's too."""
        if self.residual:
            if len(inputs) != 3 or not same_dims(inputs[0], inputs[1]):
                raise ValueError(f"{PLUGIN_NAME}: expects X [..., hidden] of rank 2 or more, "
                                 "R of its shape and W [hidden]")
            inputs = [inputs[0], inputs[2]]
        shapes = super().get_output_shapes(inputs, shape_inputs, expr_builder)
        return shapes + [trt.DimsExprs(inputs[0]) for _ in range(self.num_outputs - 1)]

    def supports_format_combination(self, pos, in_out, num_inputs):
        """Build time, per I/O slot: the lesson's; Y FP8 in the FP8 form, R and S X's dtype."""
        desc = in_out[pos].desc
        name = (self._inputs + self._outputs)[pos]
        if name == "Y" and self.y_scale is not None:
            linear = desc.format == trt.TensorFormat.LINEAR
            return linear and desc.type == self._y_type() and fp8_refusal() is None
        return super().supports_format_combination(pos, in_out, num_inputs)

    def _compile(self, dtype, hidden, w_dtype):
        """The launcher on_shape_change caches for this plugin's form."""
        return compile_rms_norm(dtype, hidden, self.epsilon, w_dtype=w_dtype,
                                residual=self.residual, y_scale=self.y_scale)

    def _bind_buffers(self, addresses, num_tokens):
        """The lesson's handoff, with R and S passed after the stream in the residual form."""
        tensors = lesson.wrap_buffers(addresses, self._dtypes(), self._io[1], num_tokens,
                                      self._device)
        kernel = self._kernel
        x, w, y = tensors["X"], tensors["W"], tensors["Y"]
        residual = (tensors["R"], tensors["S"]) if self.residual else ()
        return lambda n, stream: kernel(x, w, y, n, stream, *residual)

    def _dtypes(self) -> dict:
        """The lesson's dtypes, with Y in FP8 in the FP8 form."""
        dtypes = super()._dtypes()
        if self.y_scale is not None:
            dtypes["Y"] = Y_FP8
        return dtypes


class FusedRmsNormPluginCreator(lesson.RmsNormPluginCreator):
    """Makes FusedRmsNormPlugin from its fields, for a build or an engine load, every form."""

    def __init__(self):
        """Called once, by register_creator()."""
        super().__init__()
        # The FP8 form's values are given only to list y_scale.
        values = field_values(lesson.DEFAULT_EPSILON, False, 1.0)
        self.field_names, self._buffers = lesson.plugin_fields(values)

    def create_plugin(self, name, field_collection, phase):
        """Build time (network API, ONNX parser) and engine load: a plugin from its fields."""
        fields = {field.name: field for field in field_collection}
        return FusedRmsNormPlugin(lesson.epsilon_field(fields), residual_field(fields),
                                  y_scale_field(fields))


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
    """Put this file's creator in TensorRT's registry, in place of the lesson's; return it.

    Call it before building a network or loading an engine of any form.
    """
    global _CREATOR
    lesson.require_tensorrt()
    registry = trt.get_plugin_registry()
    key = (PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    registered = registry.get_creator(*key)
    if not isinstance(registered, FusedRmsNormPluginCreator):
        if registered is not None:
            registry.deregister_creator(registered)
        _CREATOR = FusedRmsNormPluginCreator()
        registry.register_creator(_CREATOR, PLUGIN_NAMESPACE)
    return registry.get_creator(*key)


# %% [7] The engine, run and checked -------------------------------------------------


def io_dtypes(dtype: str, w_dtype: str, residual: bool, y_scale: float | None) -> tuple:
    """({input: dtype}, {output: dtype}) of a form, in TensorRT's order."""
    inputs, outputs = io_names(residual)
    y_dtype = dtype if y_scale is None else Y_FP8
    return ({name: w_dtype if name == "W" else dtype for name in inputs},
            {name: y_dtype if name == "Y" else dtype for name in outputs})


def plugin_network(hidden: int, dtype: str, epsilon: float, w_dtype: str,
                   residual: bool = False, y_scale: float | None = None):
    """((builder, network), plugin): X, (R,) W in, Y (, S) out; Y in FP8 with a y_scale."""
    inputs, outputs = io_dtypes(dtype, w_dtype, residual, y_scale)
    values = field_values(epsilon, residual, y_scale)
    return lesson.one_plugin_network(register_creator(), values,
                                     lesson.io_shapes(hidden, inputs), tuple(outputs))


def one_node_onnx_network(attributes: dict, inputs: dict, outputs: dict):
    """The network TensorRT's ONNX parser builds from a one-node model of op type PLUGIN_NAME
    (--from-onnx).

    inputs and outputs: {name: (dtype, shape)}. The parser asks the registry
    for the creator that the node's plugin_version and plugin_namespace name,
    and passes every other attribute as a field.
    """
    try:
        from onnx import TensorProto, helper
    except ImportError:
        raise lesson.UsageError("--from-onnx needs the onnx package; "
                                "install it with `pip install onnx`") from None
    from polygraphy.backend.trt import network_from_onnx_bytes

    register_creator()  # the parser finds the plugin in the registry

    def value_info(name, dtype, shape):
        onnx_shape = ["num_tokens" if size == -1 else size for size in shape]
        return helper.make_tensor_value_info(name, getattr(TensorProto, DTYPES[dtype].onnx),
                                             onnx_shape)

    node = helper.make_node(PLUGIN_NAME, inputs=list(inputs), outputs=list(outputs),
                            name="rms_norm", plugin_version=PLUGIN_VERSION,
                            plugin_namespace=PLUGIN_NAMESPACE, **attributes)
    graph = helper.make_graph(
        [node],
        "rms_norm",
        inputs=[value_info(name, *io) for name, io in inputs.items()],
        outputs=[value_info(name, *io) for name, io in outputs.items()],
    )
    opset = helper.make_opsetid("", 17)
    model = helper.make_model(graph, ir_version=8, opset_imports=[opset])
    with lesson.tensorrt_stage("ONNX parse"):
        return network_from_onnx_bytes(model.SerializeToString(), strongly_typed=True)


def onnx_network(hidden: int, dtype: str, epsilon: float, w_dtype: str,
                 residual: bool = False, y_scale: float | None = None):
    """The same network, from a one-node ONNX model whose attributes are the fields."""
    inputs, outputs = io_dtypes(dtype, w_dtype, residual, y_scale)
    attributes = {"epsilon": float(epsilon), "residual": int(residual)}
    if y_scale is not None:
        attributes.update(quantize=1, y_scale=float(y_scale))
    return one_node_onnx_network(attributes, lesson.io_shapes(hidden, inputs),
                                 lesson.io_shapes(hidden, outputs))


# An FP8 Y is the FP8 rounding of the float64 reference, except where that
# reference lies so near the midpoint of two FP8 values that FP32's error
# (below 2^-18, as the lesson's Y_TOLERANCE) may cross it: there either
# neighbour is right.
FP8_MIDPOINT_BAND = 2.0**-16


def make_residual(num_tokens: int, hidden: int, dtype: str, seed: int):
    """Random R of the residual form, as the lesson's make_inputs' X but drawn apart from it."""
    # Another stream than X's (the seed's low bits flipped): S must not be 2X.
    gen = torch.Generator().manual_seed(seed ^ 0x5EED)
    r = torch.randn(num_tokens, hidden, generator=gen)
    return r.to(getattr(torch, DTYPES[dtype].torch))


def check_quantized(y: np.ndarray, x: np.ndarray, w: np.ndarray, epsilon: float,
                    y_scale: float):
    """(all FP8 roundings of the reference, max abs error) for the FP8 form's Y, decoded."""
    ref = lesson.rms_norm_reference(x, w, epsilon)
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
    """The lesson's run_and_check for every form: S must equal X + R bit for bit, Y is the
    norm of S, and with a y_scale that norm quantized to FP8."""
    context = engine.create_execution_context()
    stream = torch.cuda.Stream()
    all_ok = True
    for n in token_counts:
        x, w = lesson.make_inputs(n, hidden, dtype, seed, w_dtype)
        tensors = {"X": x, "W": w}
        if residual:
            tensors["R"] = make_residual(n, hidden, dtype, seed)
        _, outputs = io_dtypes(dtype, w_dtype, residual, y_scale)
        for name, out_dtype in outputs.items():
            nan = torch.full_like(x, float("nan"))
            tensors[name] = nan.to(getattr(torch, DTYPES[out_dtype].torch))
        on_gpu = lesson.execute(context, stream, tensors)
        normalized = x
        note = ""
        s_ok = True
        if residual:
            normalized = residual_reference(x, tensors["R"])
            s_ok = torch.equal(on_gpu["S"].cpu(), normalized)
            note = "  S == X + R" if s_ok else "  S != X + R"
        y = on_gpu["Y"].float().cpu().numpy()
        inputs = (y, normalized.float().numpy(), w.float().numpy(), epsilon)
        if y_scale is None:
            ok, err = lesson.check_output(*inputs, dtype)
        else:
            ok, err = check_quantized(*inputs, y_scale)
        all_ok = lesson.report(n, ok and s_ok, err, note) and all_ok
    return all_ok


def check_engine(engine, token_counts, args) -> bool:
    """run_and_check with the flags' shapes, dtypes, epsilon, seed and form."""
    return run_and_check(engine, token_counts, args.hidden_dim, args.dtype, args.epsilon,
                         args.seed, args.weight_dtype, args.residual, args.y_scale)


# %% [8] Command line: the lesson's, with the forms' flags ---------------------------


def make_parser(description: str):
    """The lesson's flags, --residual, --y-scale and --from-onnx; the AOT flavor adds its own."""
    parser = lesson.make_parser(description)
    parser.add_argument("--from-onnx", action="store_true",
                        help="build through TensorRT's ONNX parser (needs onnx)")
    parser.add_argument("--residual", action="store_true",
                        help="the fused form: (X, R, W) in, (Y, S = X + R) out")
    parser.add_argument("--y-scale", type=float, metavar="SCALE",
                        help="the FP8 form: Y stored as FP8 E4M3 of y / SCALE (sm_89+)")
    return parser


def validate_args(parser, args):
    """The lesson's checks, and --y-scale's: exit 2 with one sentence."""
    args = lesson.validate_args(parser, args)
    if args.y_scale is not None:
        try:
            validate_y_scale(args.y_scale)
        except ValueError:
            parser.error("--y-scale must be finite and >= 2^-126 (a normal float32), "
                         f"got {args.y_scale}")
    return args


def form_title(args) -> str:
    """The first line's name of the form the flags select."""
    title = "X + R, then RMSNorm" if args.residual else "RMSNorm"
    if args.y_scale is not None:
        title += f" to FP8 (y_scale {args.y_scale:g})"
    return title


def build_engine(args):
    """The lesson's build for these flags and form, through the network API or the ONNX parser."""
    if args.y_scale is not None and fp8_refusal():
        raise lesson.UsageError(fp8_refusal())
    elem_bytes = DTYPES[args.dtype].bytes
    sm90 = is_sm90(lesson.gpu_arch())
    fp8 = args.y_scale is not None
    print("\n".join(schedule_lines(args.hidden_dim, elem_bytes, sm90, args.residual, fp8)))
    shapes = {"X": lesson.row_shapes(args)}
    if args.residual:
        shapes["R"] = lesson.row_shapes(args)
    network_args = (args.hidden_dim, args.dtype, args.epsilon, args.weight_dtype, args.residual,
                    args.y_scale)
    if args.from_onnx:
        return lesson.build_from_network(onnx_network(*network_args), shapes)
    # The network only points at the plugin: hold it until the build ends.
    network, plugin = plugin_network(*network_args)
    return lesson.build_from_network(network, shapes)


def main(args) -> int:
    """--plans prints the schedule (no GPU needed); else build, run, check."""
    if not args.plans:
        return lesson.run(args, build_engine, check_engine, form_title(args))
    elem_bytes = DTYPES[args.dtype].bytes
    targets = (("sm_90 and newer", True), ("sm_80 to sm_89", False))
    for target, sm90 in targets:
        lines = schedule_lines(args.hidden_dim, elem_bytes, sm90, args.residual,
                               args.y_scale is not None)
        heading = f"{args.dtype} hidden {args.hidden_dim}, {target}:"
        print(heading, *lines, sep="\n  ")
    return lesson.EXIT_CORRECT


if __name__ == "__main__":
    PARSER = make_parser("Build a TensorRT engine around the fast and fused CuteDSL RMSNorm "
                         "plugin, run it and check it against NumPy.")
    ARGS = validate_args(PARSER, PARSER.parse_args())
    sys.exit(main(ARGS))
