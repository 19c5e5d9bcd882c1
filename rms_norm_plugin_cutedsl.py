#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""RMSNorm as a TensorRT Python plugin whose kernel is written in CuteDSL.

What you will learn
-------------------
* [2] A memory-bound CuteDSL kernel in five steps, one ``@cute.jit`` helper
  each: every byte of X read once in 128-bit vectors, the sum in FP32, one
  cast on store.
* [3] How the kernel's shape follows from what a thread holds in registers:
  a short rule, no tuning table; ``--plans`` prints it.
* [4] A ``@cute.jit`` launcher compiled before the first inference, with the
  token count and TensorRT's stream passed at run time.
* [5] TensorRT's raw pointers as CuTe tensors without a copy: cupy
  ``UnownedMemory``, ``torch.as_tensor``, ``cute.runtime.from_dlpack``.
* [6] An ``IPluginV3`` and its ``IPluginCreatorV3One``; [7] an engine built
  by Polygraphy with a dynamic token count; [8] the check against NumPy;
  [9] every user error as one sentence.

It runs on an NVIDIA GPU of compute capability 8.0 or newer, with
TensorRT 10 or 11, CUDA 12 or 13 and Python 3.11+:

    pip install -r requirements.txt     # CUDA 12; requirements-cu13.txt: CUDA 13
    python3 rms_norm_plugin_cutedsl.py               # build, run, check
    python3 rms_norm_plugin_cutedsl.py --plans --hidden-dim 8192  # no GPU

Exit codes: 0 every run matched NumPy, 1 one did not, 2 a usage or
environment error. Next: rms_norm_fused_cutedsl.py extends this file by
import with faster plans and the fused forms (the residual Add, an FP8 Y);
rms_norm_onnx_model.py puts the plugin into your ONNX model.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
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
    install = ("install the sample's set with `pip install -r requirements.txt` (CUDA 12) or "
               "`-r requirements-cu13.txt`")
    module = (exc.name or "").partition(".")[0]
    if isinstance(exc, ModuleNotFoundError) and module:
        package = PIP_NAMES.get(module, module)
        return f"the package {package} is not installed (import '{exc.name}' failed); {install}"
    # Installed but not loadable, e.g. a shared library is missing.
    detail = " ".join(str(exc).split())
    return (f"a package of this sample failed to import ({detail}); {install} in a fresh "
            "virtual environment")


try:
    import numpy as np

    import cuda.bindings.driver as cuda
    import cupy as cp
    import torch

    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32
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
    # Y of rms_norm_fused_cutedsl.py's FP8 form; uint8 carries its bits through cupy.
    "float8_e4m3fn": DType("FP8", "float8_e4m3fn", "Float8E4M3FN", "uint8", "FLOAT8E4M3FN", 1),
}
ACTIVATION_DTYPES = ("float16", "bfloat16", "float32")  # X and Y
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")  # W; the first is the default
# Any X dtype with any W dtype: the kernel computes in FP32 either way.
DTYPE_PAIRS = tuple((x, w) for x in ACTIVATION_DTYPES for w in WEIGHT_DTYPES)
DEFAULT_EPSILON = 1e-5
MAX_HIDDEN = 32768  # the longest row one CTA's registers hold ([3])


# %% [1] NumPy reference ---------------------------------------------------------
def rms_norm_reference(x: np.ndarray, w: np.ndarray, epsilon: float) -> np.ndarray:
    """y = x / sqrt(mean(x^2) + epsilon) * w over the last axis, in float64."""
    x64 = np.asarray(x, dtype=np.float64)
    mean_square = np.mean(x64 * x64, axis=-1, keepdims=True)
    return x64 / np.sqrt(mean_square + epsilon) * np.asarray(w, dtype=np.float64)


# %% [2] The CuteDSL kernel ------------------------------------------------------
# Memory traffic. RMSNorm does about 4 FLOPs per element, so memory bounds
# it. N rows of H elements: X and Y move N*H*x bytes each, W H*w (x, w:
# bytes per element). The floor is a copy of X into Y, so the kernel reads
# each element of X from DRAM once: a row stays in registers until it is
# stored, and W, read by every row, comes from L2 and L1.
#
# Work split. A row is cut into 16-byte vectors (8 fp16/bf16 or 4 fp32
# values; fewer where H is not a multiple), W alike. The T threads of a row
# own vectors t, t+T, t+2T, ..., so neighbouring threads touch neighbouring
# bytes and every access is one 128-bit instruction.
#
#   vector:  0   1  ...  T-1 | T  T+1 ... 2T-1 | ...
#   thread:  t0  t1 ...  tT-1| t0 t1  ... tT-1 | ...
#            X and W into registers             Step 1  load_row
#            x^2 summed per thread, FP32        Step 2  sum_of_squares
#            warp shuffle, then [w0][w1].. smem Step 3  row_sum
#            rstd = rsqrt(sum / H + epsilon)    Step 4  inverse_rms
#            y = x * rstd * w, cast, stored     Step 5  store_row
#
# The hooks an op of its own changes: the rows Step 1 reads (`row_inputs`:
# X), the per-column inputs (`columns`: W), the row sums (`row_sum`'s n) and
# Step 5's math (`normalize`). rms_norm_fused_cutedsl.py adds a residual
# row R, an FP8 Y and faster plans through the same hooks.
VECTOR_BYTES = 16  # the widest global access per thread (ld.global.v4.b32)
WARP_THREADS = 32
MAX_CTA_THREADS = 1024  # CUDA's limit on threads per CTA
FLT_MIN = float(np.finfo(np.float32).tiny)  # smallest normal float32, 2**-126

# Registers. A thread holds its vectors of X from Step 1 to Step 5, so a plan
# must leave room for them: an SM has 65536 32-bit registers, a thread at
# most 255, and a CTA of T threads can take 65536 / T each. What a thread
# holds, besides the indices, addresses and sums every plan needs:
ROW_INPUTS = 1  # rows read and held to the store: X (a gated norm's z: 2)
COLUMN_INPUTS = 1  # per-column inputs held like W (a LayerNorm's bias: 2)
REDUCTIONS = 1  # row sums per row: x^2 (a LayerNorm's mean and variance: 2)
REGISTERS_PER_SM = 65536
MAX_THREAD_REGISTERS = 255
# Registers spent besides what is held: the most that the tightest plans
# ptxas fits without a spill leave (256-thread rows of 2-element vectors
# under 8 CTAs/SM: 32 registers, 6 held).
OTHER_REGISTERS = 26


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """How the kernel maps rows onto threads; baked into the kernel compiled with it."""

    hidden: int
    elem_bytes: int  # bytes per X/Y element: 2 (fp16, bf16) or 4 (fp32)
    vec: int  # elements per vector access
    threads_per_row: int
    rows_per_cta: int  # rows side by side in a CTA
    vecs_per_thread: int
    weight_by_vector: bool = False  # W loaded with X (Step 1), or a vector at a time in Step 5

    @property
    def num_vecs(self) -> int:
        return self.hidden // self.vec

    @property
    def warps_per_row(self) -> int:
        return max(1, self.threads_per_row // WARP_THREADS)

    @property
    def cta_threads(self) -> int:
        return self.threads_per_row * self.rows_per_cta

    @property
    def ragged(self) -> bool:
        """Whether some thread owns fewer vectors than the others."""
        return self.num_vecs % self.threads_per_row != 0

    def grid(self, num_tokens):
        """CTAs for num_tokens rows (ints, Int32 values or TensorRT's symbolic sizes)."""
        return (num_tokens + self.rows_per_cta - 1) // self.rows_per_cta

    def thread_slot(self, tidx, bidx):
        """(row slot in the CTA, place t in the row, the slot's row) of thread tidx of CTA bidx."""
        row_in_cta = tidx // self.threads_per_row
        t = tidx % self.threads_per_row
        return row_in_cta, t, bidx * self.rows_per_cta + row_in_cta

    @property
    def weight_first(self) -> bool:
        """Whether W is loaded with X in Step 1 (else a vector at a time in Step 5)."""
        return not self.weight_by_vector

    def owns(self, j):
        """Whether vector j of some thread lies in the row (always, unless ragged)."""
        return not self.ragged or j < self.num_vecs

    def clamp(self, j):
        """Vector j, or the row's last where j is past a ragged end: safe to load."""
        if self.ragged:
            return cutlass.min(j, self.num_vecs - 1)
        return j

    def registers_needed(self) -> int:
        """32-bit registers: OTHER_REGISTERS, every row input's vectors from Step 1 to the
        store, and W's (one vector where W comes a vector at a time), W at 4 bytes an element."""
        row_vector = math.ceil(self.vec * self.elem_bytes / 4)
        rows = self.vecs_per_thread * row_vector * ROW_INPUTS
        columns = self.vec * COLUMN_INPUTS
        if not self.weight_by_vector:
            columns *= self.vecs_per_thread
        return OTHER_REGISTERS + rows + columns

    def register_ceiling(self) -> int:
        """The registers a thread may use: what one CTA of the plan leaves it."""
        per_thread = REGISTERS_PER_SM // self.cta_threads
        return min(MAX_THREAD_REGISTERS, per_thread // 8 * 8)  # allocated 8 at a time

    def __str__(self) -> str:
        """A short tag: CuteDSL names a kernel after it and cuts names at 180 characters."""
        weight = "vector" if self.weight_by_vector else "first"
        return (f"h{self.hidden}b{self.elem_bytes}v{self.vec}t{self.threads_per_row}"
                f"r{self.rows_per_cta}k{self.vecs_per_thread}_w{weight}")

    def describe(self) -> str:
        """One line for a reader: how a row is split among threads, and when W arrives."""
        rows = f"{self.rows_per_cta} row{'s' if self.rows_per_cta > 1 else ''}/CTA"
        vectors = f"{self.vecs_per_thread} vectors of {self.vec} x {self.elem_bytes * 8}-bit"
        weight = "a vector at a time at the store" if self.weight_by_vector else "first"
        return (f"{self.threads_per_row} threads/row x {vectors}, {rows}, X in registers, "
                f"W {weight}")


@cute.jit
def thread_registers(plan: cutlass.Constexpr, view):
    """A thread's registers for its vectors of a row (or of W), zero where it owns none."""
    registers = cute.make_rmem_tensor((plan.vec, plan.vecs_per_thread), view.element_type)
    registers.fill(0.0)
    return registers


@cute.jit
def load_columns(plan: cutlass.Constexpr, t, columns, k: cutlass.Constexpr):
    """Vector k of thread t of each per-column input: (view, registers) pairs, W alone here.

    The only code that reads W. Loaded with X, every thread loads every slot
    (past a ragged end, the last vector again), so ptxas need not wait for a
    bounds check before issuing the load.
    """
    j = t + k * plan.threads_per_row
    for view, regs in columns:
        if cutlass.const_expr(plan.weight_first):
            cute.autovec_copy(view[None, plan.clamp(j)], regs[None, k])
        else:
            if plan.owns(j):
                cute.autovec_copy(view[None, j], regs[None, k])


@cute.jit
def load_row(plan: cutlass.Constexpr, t, row, row_ok, row_inputs, columns):
    """Step 1: thread t's vectors of the row into registers, each after W's.

    row_inputs holds (view, registers) pairs, X alone here. W's loads go
    first, so that ptxas may keep them in flight with X's where registers
    allow; [3] says where W comes later.
    """
    for k in cutlass.range_constexpr(plan.vecs_per_thread):
        if cutlass.const_expr(plan.weight_first):
            load_columns(plan, t, columns, k)
        j = t + k * plan.threads_per_row
        if plan.owns(j):
            if row_ok:
                for view, regs in row_inputs:
                    cute.autovec_copy(view[row, None, j], regs[None, k])


@cute.jit
def sum_of_squares(tXrX):
    """Step 2: this thread's sum of x^2 in FP32.

    Across its vectors first, then within one: the chain of dependent adds is
    vecs_per_thread + vec long, not their product.
    """
    x = tXrX.load().to(Float32)
    squares = x * x
    lane_sums = squares.reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=(None, 1))
    return lane_sums.reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)


@cute.jit
def row_sum_buffers(plan: cutlass.Constexpr, smem, reductions: cutlass.Constexpr):
    """Step 3's shared memory: an FP32 sum per warp of each row slot (None within a warp).

    Two sets, used in turn, where a CTA reduces more than once (a LayerNorm's
    mean and variance): a new sum never overwrites one still being read.
    """
    sSum = None
    if cutlass.const_expr(plan.warps_per_row > 1):
        layout = cute.make_layout((plan.warps_per_row, plan.rows_per_cta, min(2, reductions)))
        sSum = smem.allocate_tensor(Float32, layout, 16)
    return sSum


@cute.jit
def row_sum(plan: cutlass.Constexpr, partial, sSum, n: cutlass.Constexpr, row_in_cta, t):
    """Step 3: the row's sum of `partial`, in every thread of the row.

    A warp shuffle, then one barrier after which every thread adds the warps'
    sums itself. n counts the CTA's earlier reductions.
    """
    lanes = min(plan.threads_per_row, WARP_THREADS)
    total = cute.arch.warp_reduction_sum(partial, threads_in_group=lanes)
    if cutlass.const_expr(plan.warps_per_row > 1):
        s = n % cute.size(sSum, mode=[2])
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
def store_row(plan: cutlass.Constexpr, normalize, tXrX, mY, row, row_ok, t):
    """Step 5: y = normalize(x, k) in FP32, cast once, stored as X came in.

    All the thread's vectors at once (k None), or vector by vector where W
    arrives a vector at a time.
    """
    whole = not plan.weight_by_vector
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
                    yk = cute.make_rmem_tensor((plan.vec,), mY.element_type)
                    yk.store(normalize(tXrX[None, k].load().to(Float32), k).to(mY.element_type))
                    cute.autovec_copy(yk, mY[row, None, j])


def row_tensor(plan, pointer, num_tokens):
    """[num_tokens, vec, num_vecs] rows at a pointer: a static stride proves 16-byte vectors."""
    shape = (num_tokens, plan.vec, plan.num_vecs)
    return cute.make_tensor(pointer, cute.make_layout(shape, stride=(plan.hidden, 1, plan.vec)))


def column_tensor(plan, pointer):
    """[vec, num_vecs] per-column values (W) at a pointer."""
    layout = cute.make_layout((plan.vec, plan.num_vecs), stride=(1, plan.vec))
    return cute.make_tensor(pointer, layout)


@cute.kernel
def rms_norm_kernel(
    x_ptr: cute.Pointer,
    w_ptr: cute.Pointer,
    num_tokens: Int32,
    y_ptr: cute.Pointer,
    plan: cutlass.Constexpr,
    epsilon: cutlass.Constexpr,
):
    # Parameters in the order of TensorRT's ahead-of-time launcher: inputs,
    # its extra num_tokens, outputs.
    mX = row_tensor(plan, x_ptr, num_tokens)
    mY = row_tensor(plan, y_ptr, num_tokens)
    mW = column_tensor(plan, w_ptr)
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    row_in_cta, t, row = plan.thread_slot(tidx, bidx)
    row_ok = row < num_tokens  # the last CTA's spare slots load and store nothing
    tXrX = thread_registers(plan, mX)
    tWrW = thread_registers(plan, mW)
    row_inputs = ((mX, tXrX),)  # a gated norm's z would join X
    columns = ((mW, tWrW),)  # a LayerNorm's bias would join W
    sSum = row_sum_buffers(plan, cutlass.memory.SmemAllocator(), REDUCTIONS)

    load_row(plan, t, row, row_ok, row_inputs, columns)  # Step 1
    total = row_sum(plan, sum_of_squares(tXrX), sSum, 0, row_in_cta, t)  # Steps 2-3
    rstd = inverse_rms(plan, total, epsilon)  # Step 4

    def normalize(x, k):
        """FP32 vector k of X (None: all the thread's) to FP32 Y."""
        if cutlass.const_expr(plan.weight_by_vector):
            load_columns(plan, t, columns, k)  # just before its use
        return x * rstd * tWrW[None, k].load().to(Float32)

    store_row(plan, normalize, tXrX, mY, row, row_ok, t)  # Step 5


# %% [3] The plan: a row's threads, from what they hold -----------------------------
# Three choices, each a rule from the hardware rather than a timing:
#   vec      16 bytes per access, halved until whole vectors tile the row;
#   threads  enough that each holds VECS_PER_THREAD vectors (two loads in
#            flight), one CTA at most; longer rows give each thread more;
#   rows     short rows share a CTA until it has MIN_CTA_THREADS threads.
# What a thread then holds must fit its registers; where it does not, the
# rule takes FIT_STEPS in order, and refuses a row none of them fits. The
# demo's 1024 fp16 values: 128 vectors, 64 threads x 2, 2 rows per CTA.
VECS_PER_THREAD = 2
MIN_CTA_THREADS = 128
# What the rule changes, in order, while a plan's estimate is over its ceiling.
FIT_STEPS = (
    {"weight_by_vector": True},  # W a vector at a time at the store: none held through Steps 1-4
)


class PlanError(ValueError):
    """A row the rule cannot fit: one sentence naming its size."""


def fit_registers(plan: KernelPlan, steps: tuple = FIT_STEPS) -> KernelPlan:
    """The plan, changed by as few of `steps` as it takes to fit its registers, or PlanError."""
    for step in steps:
        if plan.registers_needed() <= plan.register_ceiling():
            return plan
        plan = dataclasses.replace(plan, **step)
    if plan.registers_needed() <= plan.register_ceiling():
        return plan
    raise PlanError(f"rows of {plan.hidden} elements of {plan.elem_bytes * 8} bits need "
                    f"{plan.registers_needed()} registers a thread even after every fitting "
                    f"step, more than the {plan.register_ceiling()} a CTA of "
                    f"{plan.cta_threads} threads leaves ({plan})")


def vector_elements(hidden: int, elem_bytes: int) -> int:
    """Elements per vector: 16 bytes' worth, halved until whole vectors tile the row."""
    vec = VECTOR_BYTES // elem_bytes
    while hidden % vec:
        vec //= 2
    return vec


def threads_for(num_vecs: int, vecs_per_thread: int) -> int:
    """Threads sharing a row: enough for vecs_per_thread vectors each, one CTA at most.

    Whole warps, not a power of two, so none sit half idle; under a warp a
    power of two, so the shuffle stays inside it.
    """
    threads = math.ceil(num_vecs / vecs_per_thread)
    if threads <= WARP_THREADS:
        return 1 << math.ceil(math.log2(threads))
    return min(WARP_THREADS * math.ceil(threads / WARP_THREADS), MAX_CTA_THREADS)


def plan_kernel(hidden: int, elem_bytes: int = 2) -> KernelPlan:
    """The plan for rows of `hidden` elements of `elem_bytes` bytes, or PlanError."""
    if isinstance(hidden, bool) or not isinstance(hidden, (int, np.integer)):
        raise TypeError(f"hidden must be an integer, got {hidden!r}")
    if not 1 <= hidden <= MAX_HIDDEN or type(elem_bytes) is not int or elem_bytes not in (2, 4):
        raise ValueError(f"hidden must be in [1, {MAX_HIDDEN}] and elem_bytes 2 or 4, "
                         f"got {hidden} and {elem_bytes!r}")
    vec = vector_elements(hidden, elem_bytes)
    num_vecs = hidden // vec
    threads = threads_for(num_vecs, VECS_PER_THREAD)
    plan = KernelPlan(
        hidden=hidden,
        elem_bytes=elem_bytes,
        vec=vec,
        threads_per_row=threads,
        rows_per_cta=max(1, MIN_CTA_THREADS // threads),
        vecs_per_thread=math.ceil(num_vecs / threads),
    )
    return fit_registers(plan)


# %% [4] The @cute.jit launcher ---------------------------------------------------
# Compiled in: the dtypes, epsilon, 16-byte alignment and the plan. At run
# time: the addresses, num_tokens and the stream, so one compiled launcher
# serves every token count of the engine's profile.
@cute.jit
def rms_norm_launch(
    mX: cute.Tensor,
    mW: cute.Tensor,
    mY: cute.Tensor,
    num_tokens: Int32,
    stream: cuda.CUstream,
    plan: cutlass.Constexpr,
    epsilon: cutlass.Constexpr,
):
    kernel = rms_norm_kernel(mX.iterator, mW.iterator, num_tokens, mY.iterator, plan, epsilon)
    kernel.launch(grid=[plan.grid(num_tokens), 1, 1], block=[plan.cta_threads, 1, 1],
                  stream=stream)


def fake_tensor(dtype: str, shape: tuple):
    """A row-major tensor of `shape` for cute.compile, with no memory behind it."""
    element_type = getattr(cutlass, DTYPES[dtype].cute)
    order = tuple(reversed(range(len(shape))))
    return cute.runtime.make_fake_compact_tensor(element_type, shape, stride_order=order,
                                                 assumed_align=VECTOR_BYTES)


def compile_for(arch: str, keep_ptx: bool, *args):
    """cute.compile(*args) for `arch`; keep_ptx: the PTX in .__ptx__, no file left behind."""
    if not keep_ptx:
        return cute.compile(*args, options=f"--gpu-arch {arch}")
    # CuteDSL also writes the PTX to a file: keep it out of the user's directory.
    with tempfile.TemporaryDirectory() as dump_dir:
        return cute.compile(*args, options=f"--gpu-arch {arch} --keep-ptx --dump-dir {dump_dir}")


def compile_launcher(plan: KernelPlan, dtype: str, w_dtype: str, epsilon: float, arch: str,
                     keep_ptx: bool = False):
    """rms_norm_launch for one plan, dtype pair, epsilon and arch, on fake tensors: no GPU."""
    rows = (cute.sym_int32(), plan.hidden)  # num_tokens is symbolic
    x = fake_tensor(dtype, rows)
    w = fake_tensor(w_dtype, (plan.hidden,))
    y = fake_tensor(dtype, rows)
    stream = cute.runtime.make_fake_stream()
    return compile_for(arch, keep_ptx, rms_norm_launch, x, w, y, Int32(1), stream, plan, epsilon)


_COMPILED = {}  # the launchers compiled in this process
_COMPILE_LOCK = threading.Lock()


def compiled_once(key: tuple, compile_launcher_now):
    """The launcher compiled under `key`, compiled by compile_launcher_now() the first time."""
    with _COMPILE_LOCK:
        if key not in _COMPILED:
            _COMPILED[key] = compile_launcher_now()
        return _COMPILED[key]


def compile_rms_norm(dtype: str, hidden: int, epsilon: float = DEFAULT_EPSILON,
                     arch: str | None = None, *, w_dtype: str = "float32"):
    """launcher(X, W, Y, num_tokens, stream) for one dtype pair, hidden and epsilon, compiled
    once per process, for the current GPU or for `arch` ("sm_90a": no GPU needed)."""
    validate_dtypes(dtype, w_dtype)
    epsilon = validate_epsilon(epsilon)
    plan = plan_kernel(hidden, DTYPES[dtype].bytes)  # every argument is checked before tracing
    arch = validate_arch(gpu_arch() if arch is None else arch)
    key = ("plain", dtype, w_dtype, hidden, epsilon, arch)
    return compiled_once(key, lambda: compile_launcher(plan, dtype, w_dtype, epsilon, arch))


# %% [5] Zero-copy handoff: TensorRT's raw pointers -> CuTe tensors -----------------
# enqueue() gets device addresses as plain integers. Three hops make one a
# CuTe tensor without copying a byte; each library only describes memory
# that TensorRT keeps owning.
def cute_tensor_from_pointer(address: int, shape: tuple, dtype: str, device_id: int):
    """Wrap a device address TensorRT owns as a CuTe tensor (no copy, no sync)."""
    if address % VECTOR_BYTES:
        raise ValueError(f"{PLUGIN_NAME} needs {VECTOR_BYTES}-byte aligned buffers, "
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


def wrap_buffers(addresses, dtypes: dict, hidden: int, num_tokens: int, device_id: int) -> dict:
    """{name: CuTe tensor} for TensorRT's addresses, in the order of dtypes' names: W [hidden],
    every other tensor [num_tokens, hidden]."""
    tensors = {}
    for (name, dtype), address in zip(dtypes.items(), addresses):
        shape = (hidden,) if name == "W" else (num_tokens, hidden)
        tensors[name] = cute_tensor_from_pointer(address, shape, dtype, device_id)
    return tensors


# %% [6] The plugin: IPluginV3 with the OneCore / OneBuild / OneRuntime interfaces ---
# TensorRT talks to a V3 plugin through three capability interfaces; here one
# class implements all three. At build time TensorRT asks the plugin for
# dtypes, shapes, formats and the fields to store in the engine. At run time
# the creator remakes the plugin from those fields, TensorRT attaches it to
# an execution context, calls on_shape_change, then enqueue.
PLUGIN_NAME = "RmsNormPlugin"
# An engine finds its creator by name, version and namespace. Bump the version
# only where an engine saved before could not be served any more.
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = ""
# Fields of the forms rms_norm_fused_cutedsl.py serves under the same name:
# this file's creator refuses a node or an engine that sets one of them.
FUSED_FIELDS = ("residual", "quantize", "y_scale")


class MissingTensorRT:
    """What `trt` names without TensorRT: the kernel half still imports, the classes below get
    empty bases, and require_tensorrt() stops a plugin or creator from being made on them."""

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


def float32_field(value, name: str) -> float:
    """A field's value as the float32 the kernel uses (inf beyond its range), or ValueError."""
    try:
        return struct.unpack("f", struct.pack("f", float(value)))[0]
    except OverflowError:
        return math.inf
    except (TypeError, ValueError):
        raise ValueError(f"field '{name}' must be a number, got {value!r}") from None


def validate_epsilon(value) -> float:
    """Epsilon as the float32 value the kernel uses, or ValueError."""
    epsilon = float32_field(value, "epsilon")
    if not (math.isfinite(epsilon) and epsilon > 0.0):
        raise ValueError(f"field 'epsilon' must be finite and > 0 in float32, got {value}")
    return epsilon


def validate_dtypes(dtype: str, w_dtype: str):
    """ValueError unless dtype is an X dtype and w_dtype a W dtype."""
    for name, value, allowed in (("dtype", dtype, ACTIVATION_DTYPES),
                                 ("w_dtype", w_dtype, WEIGHT_DTYPES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def validate_arch(arch: str) -> str:
    """arch, if it is a CuteDSL compile target such as "sm_80" or "sm_90a", else ValueError."""
    if not isinstance(arch, str) or arch not in cutlass.base_dsl.Arch.__members__:
        raise ValueError("arch must be a CuteDSL compile target such as 'sm_80' or 'sm_90a', "
                         f"got {arch!r}")
    return arch


def dtype_name(trt_type, tensor: str, allowed: tuple) -> str:
    """The name in `allowed` of a TensorRT dtype, or a ValueError."""
    for dtype in allowed:
        if trt_type == getattr(trt.DataType, DTYPES[dtype].trt):
            return dtype
    choices = f"{', '.join(allowed[:-1])} or {allowed[-1]}"
    raise ValueError(f"{PLUGIN_NAME}: {tensor} must be {choices}, got {trt_type}")


def plugin_fields(values: dict):
    """(fields, the arrays they point into) of {name: np.float32 or np.int32 array}; a
    PluginField does not own its buffer, so the caller keeps the arrays alive."""
    require_tensorrt()  # plugin_network starts here
    types = {np.float32: trt.PluginFieldType.FLOAT32, np.int32: trt.PluginFieldType.INT32}
    fields = trt.PluginFieldCollection([
        trt.PluginField(name, array, types[array.dtype.type]) for name, array in values.items()
    ])
    return fields, tuple(values.values())


def epsilon_values(epsilon: float) -> dict:
    """The plain plugin's one field: epsilon as float32."""
    return {"epsilon": np.array([epsilon], dtype=np.float32)}


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
        self.epsilon = validate_epsilon(epsilon)
        self._inputs, self._outputs = ("X", "W"), ("Y",)  # TensorRT's order
        self.num_outputs = len(self._outputs)
        # The fields point into the buffers: both live as long as the plugin.
        self._fields, self._buffers = plugin_fields(epsilon_values(self.epsilon))
        # One execution context's state, never stored in the engine:
        self._kernel = None  # the compiled launcher
        self._io = None  # the (X dtype, hidden, W dtype) it serves
        self._device = None  # the CUDA device it was compiled on
        self._launches = {}  # the I/O addresses -> the launcher bound to their tensors
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
        dtype_name(input_types[-1], "W", WEIGHT_DTYPES)
        return [input_types[0]]

    def get_output_shapes(self, inputs, shape_inputs, expr_builder):
        """Build time: Y has X's symbolic shape, X [..., hidden] with hidden static."""
        if len(inputs) != 2 or len(inputs[0]) < 2 or len(inputs[1]) != 1:
            raise ValueError(f"{PLUGIN_NAME}: expects X [..., hidden] of rank 2 or more "
                             "and W [hidden]")
        check_hidden(inputs[0], inputs[1])
        return [trt.DimsExprs(inputs[0])]

    def supports_format_combination(self, pos, in_out, num_inputs):
        """Build time, per I/O slot: all linear; X and W of their dtypes, Y of X's."""
        desc = in_out[pos].desc
        if desc.format != trt.TensorFormat.LINEAR:
            return False
        name = (self._inputs + self._outputs)[pos]
        if name not in ("X", "W"):
            return desc.type == in_out[0].desc.type
        allowed = ACTIVATION_DTYPES if name == "X" else WEIGHT_DTYPES
        return desc.type in [getattr(trt.DataType, DTYPES[d].trt) for d in allowed]

    def configure_plugin(self, inp, out):
        """Build time, once formats and profile are chosen: nothing to do."""

    def set_tactic(self, tactic):
        """Build and run time: there is no tactic to select."""

    def get_fields_to_serialize(self):
        """Build time and engine save: the attributes stored in the engine."""
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
        self._kernel = self._compile(dtype, hidden, w_dtype)
        self._io = io
        self._device = torch.cuda.current_device()
        self._launches.clear()

    def _compile(self, dtype, hidden, w_dtype):
        """The launcher on_shape_change caches for this plugin's form."""
        return compile_rms_norm(dtype, hidden, self.epsilon, w_dtype=w_dtype)

    def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
        """Run time, every inference: launch on TensorRT's stream."""
        num_tokens = math.prod(input_desc[0].dims[:-1])  # all but hidden count rows
        key = (*inputs, *outputs)
        launch = self._launches.get(key)
        if launch is None:  # a context usually reuses its buffers
            # Addresses that change on every call must not grow the cache.
            if len(self._launches) >= 256:
                self._launches.clear()
            launch = self._bind_buffers(key, num_tokens)
            self._launches[key] = launch
        cu_stream = self._streams.get(stream)
        if cu_stream is None:
            cu_stream = cuda.CUstream(stream)
            self._streams[stream] = cu_stream
        launch(num_tokens, cu_stream)

    def _bind_buffers(self, addresses, num_tokens):
        """enqueue's handoff ([5]): the launcher bound to these buffers, called as (n, stream);
        tensors wrapped at one token count serve every count."""
        tensors = wrap_buffers(addresses, self._dtypes(), self._io[1], num_tokens, self._device)
        return functools.partial(self._kernel, tensors["X"], tensors["W"], tensors["Y"])

    def _dtypes(self) -> dict:
        """Each I/O tensor's dtype by name, in TensorRT's order: W's, or X's."""
        dtype, _, w_dtype = self._io
        return {name: w_dtype if name == "W" else dtype for name in self._inputs + self._outputs}


def check_hidden(x_dims, w_dims) -> int:
    """X's static hidden size, equal to W's and one the rule plans, or ValueError."""
    x_hidden = x_dims[len(x_dims) - 1]
    if not x_hidden.is_constant():
        raise ValueError(f"{PLUGIN_NAME}: the hidden dimension of X must be static "
                         "(the kernel bakes it in)")
    hidden = x_hidden.get_constant_value()
    if w_dims[0].is_constant() and w_dims[0].get_constant_value() != hidden:
        raise ValueError(f"{PLUGIN_NAME}: X hidden {hidden} != W size "
                         f"{w_dims[0].get_constant_value()}")
    if not 1 <= hidden <= MAX_HIDDEN:
        raise ValueError(f"{PLUGIN_NAME}: hidden must be in [1, {MAX_HIDDEN}], got {hidden}")
    return hidden


class RmsNormPluginCreator(trt.IPluginCreatorV3One):
    """Makes RmsNormPlugin from its fields, for a build or an engine load."""

    def __init__(self):
        """Called once, by register_creator()."""
        require_tensorrt()
        trt.IPluginCreatorV3One.__init__(self)
        self.name = PLUGIN_NAME
        self.plugin_version = PLUGIN_VERSION
        self.plugin_namespace = PLUGIN_NAMESPACE
        # Every field create_plugin reads, with its type: the ONNX parser passes
        # only the node's attributes listed here, so the fused forms' are too.
        values = {**epsilon_values(DEFAULT_EPSILON), "residual": np.zeros(1, np.int32),
                  "quantize": np.zeros(1, np.int32), "y_scale": np.ones(1, np.float32)}
        self.field_names, self._buffers = plugin_fields(values)

    def create_plugin(self, name, field_collection, phase):
        """Build time (network API, ONNX parser) and engine load: a plugin from its fields."""
        fields = {field.name: field for field in field_collection}
        for field in FUSED_FIELDS:
            if field in fields and np.any(np.asarray(fields[field].data) != 0):
                raise ValueError(f"{PLUGIN_NAME}: field '{field}' selects a form that "
                                 "rms_norm_fused_cutedsl.py serves; call its register_creator() "
                                 "before building or loading")
        return RmsNormPlugin(epsilon_field(fields))


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


# The registry does not keep a Python creator alive; this reference does.
_CREATOR = None


def register_creator():
    """Put the creator in TensorRT's registry unless one is there; return the registered one.
    Call it before a build or an engine load: an engine names its plugin, it does not hold it."""
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
# typed (TensorRT 11 has no other kind).
class UsageError(Exception):
    """A problem the user can fix; main() prints it as one sentence, exits 2."""


class TensorRTError(RuntimeError):
    """TensorRT refused a step (network, parse, build, load, run); exit 2."""


@contextlib.contextmanager
def tensorrt_stage(stage: str):
    """Any failure in a TensorRT step as a TensorRTError naming the step and TensorRT's log."""
    try:
        yield
    except (UsageError, TensorRTError):
        raise
    except Exception as exc:
        detail = " ".join(str(exc).split())[:200]
        raise TensorRTError(f"TensorRT failed at the {stage} stage ({type(exc).__name__}: "
                            f"{detail}); TensorRT's own message is the '[E]' line in the log "
                            "above") from exc


def io_shapes(hidden: int, dtypes: dict) -> dict:
    """{name: (dtype, shape)}: W [hidden], every other tensor [num_tokens, hidden] (-1: dynamic)."""
    return {name: (dtype, (hidden,) if name == "W" else (-1, hidden))
            for name, dtype in dtypes.items()}


def one_plugin_network(creator, values: dict, inputs: dict, outputs: tuple):
    """((builder, network), plugin): one layer of the plugin `creator` makes from the field
    values, inputs {name: (dtype, shape)} in, `outputs` out. The registered creator makes it,
    as for the ONNX parser, so both ways of building go through create_plugin."""
    from polygraphy.backend.trt import create_network

    with tensorrt_stage("network definition"):
        builder, network = create_network(strongly_typed=True)
        fields, _buffers = plugin_fields(values)  # alive until create_plugin copies them
        plugin = creator.create_plugin("rms_norm", fields, trt.TensorRTPhase.BUILD)
        tensors = []
        for name, (dtype, shape) in inputs.items():
            tensors.append(network.add_input(name, getattr(trt.DataType, DTYPES[dtype].trt),
                                             shape))
        layer = network.add_plugin_v3(tensors, [], plugin)
        for i, name in enumerate(outputs):
            output = layer.get_output(i)
            output.name = name
            network.mark_output(output)
    return (builder, network), plugin


def plugin_network(hidden: int, dtype: str, epsilon: float, w_dtype: str):
    """((builder, network), plugin): X, W in, Y out, through the network API."""
    inputs = io_shapes(hidden, {"X": dtype, "W": w_dtype})
    return one_plugin_network(register_creator(), epsilon_values(epsilon), inputs, ("Y",))


def build_from_network(network, shapes: dict):
    """The engine, with one optimization profile: shapes {dynamic input: (min, opt, max)}."""
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


def execute(context, stream, tensors: dict) -> dict:
    """Run the engine once on CPU `tensors` ({name: tensor}, inputs and outputs): the
    outputs start as NaN (an output left unwritten fails the check); returns them on the GPU."""
    on_gpu = {name: tensor.cuda() for name, tensor in tensors.items()}
    engine = context.engine
    for name, tensor in on_gpu.items():
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT and name != "W":
            context.set_input_shape(name, tuple(tensor.shape))
        context.set_tensor_address(name, tensor.data_ptr())
    # The uploads ran on torch's stream; TensorRT reads on `stream`.
    torch.cuda.synchronize()
    if not context.execute_async_v3(stream.cuda_stream):
        raise TensorRTError("TensorRT could not run the engine; its log above says why")
    stream.synchronize()
    return on_gpu


def report(num_tokens: int, ok: bool, err: float, note: str = "") -> bool:
    """One line per run: the largest error against the reference, and the verdict."""
    verdict = "ok" if ok else "MISMATCH"
    print(f"  tokens={num_tokens:<5d} max |y - ref| = {err:.3e}{note}  {verdict}")
    return ok


def run_and_check(engine, token_counts, hidden, dtype, epsilon, seed, w_dtype="float32") -> bool:
    """Run each token count through one context, on torch's buffers and stream as an
    application would, and compare Y with NumPy."""
    context = engine.create_execution_context()
    stream = torch.cuda.Stream()
    all_ok = True
    for n in token_counts:
        # The flag's seed as given: every value it accepts is one torch takes.
        x, w = make_inputs(n, hidden, dtype, seed, w_dtype)
        tensors = {"X": x, "W": w, "Y": torch.full_like(x, float("nan"))}
        y = execute(context, stream, tensors)["Y"].float().cpu().numpy()
        ok, err = check_output(y, x.float().numpy(), w.float().numpy(), epsilon, dtype)
        all_ok = report(n, ok, err) and all_ok
    return all_ok


def check_engine(engine, token_counts, args) -> bool:
    """run_and_check with the flags' shapes, dtypes, epsilon and seed."""
    return run_and_check(engine, token_counts, args.hidden_dim, args.dtype, args.epsilon,
                         args.seed, args.weight_dtype)


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
    """The shared flags; the companions add their own."""
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
    try:
        plan_kernel(args.hidden_dim, DTYPES[args.dtype].bytes)
    except PlanError as exc:
        parser.error(f"--hidden-dim {args.hidden_dim} is refused: {exc}")
    return args


def gpu_arch() -> str:
    """The current GPU's target, e.g. "sm_90a" (the "a": Hopper's own instructions)."""
    major, minor = torch.cuda.get_device_capability()
    suffix = "a" if major >= 9 else ""
    return f"sm_{major}{minor}{suffix}"


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


def row_shapes(args: argparse.Namespace) -> tuple:
    """The profile's (min, opt, max) shapes of a row input."""
    counts = (args.min_tokens, args.opt_tokens, args.max_tokens)
    return tuple((n, args.hidden_dim) for n in counts)


def build_engine(args: argparse.Namespace):
    """[7] for these flags."""
    print(f"every token count: {plan_kernel(args.hidden_dim, DTYPES[args.dtype].bytes).describe()}")
    # The network only points at the plugin: hold it until the build ends.
    network, plugin = plugin_network(args.hidden_dim, args.dtype, args.epsilon, args.weight_dtype)
    return build_from_network(network, {"X": row_shapes(args)})


def run(args: argparse.Namespace, make_engine, check, title: str = "RMSNorm") -> int:
    """Check the environment, make_engine(args), check(engine, counts, args) at the main token
    count, the profile's edges and an odd count: the exit code."""
    low = args.min_tokens
    high = args.max_tokens
    # An odd count tests the tail: a last CTA with fewer rows than it takes.
    odd = 37 if low <= 37 <= high else high - 1
    wanted = (args.num_tokens, low, high, odd)
    counts = [n for n in dict.fromkeys(wanted) if n >= low]
    try:
        check_environment()
        print(f"{title} {args.dtype}, hidden {args.hidden_dim}, W {args.weight_dtype}, "
              f"epsilon {args.epsilon:g}, profile [{low}, {high}] opt {args.opt_tokens}")
        engine = make_engine(args)
        with tensorrt_stage("execution context"):
            correct = check(engine, counts, args)
    except (UsageError, TensorRTError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if correct:
        print("Inference result correct!")
        return EXIT_CORRECT
    print("Inference result incorrect!")
    return EXIT_INCORRECT


def main(args: argparse.Namespace) -> int:
    """--plans prints the plan (no GPU needed); else build, run, check."""
    if not args.plans:
        return run(args, build_engine, check_engine)
    plan = plan_kernel(args.hidden_dim, DTYPES[args.dtype].bytes)
    print(f"{args.dtype} hidden {args.hidden_dim}, every GPU and token count:")
    print(f"  {plan.describe()}")
    return EXIT_CORRECT


if __name__ == "__main__":
    PARSER = make_parser("Build a TensorRT engine around a CuteDSL RMSNorm plugin, "
                         "run it and check it against NumPy.")
    ARGS = validate_args(PARSER, PARSER.parse_args())
    sys.exit(main(ARGS))
