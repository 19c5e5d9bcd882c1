#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""RMSNorm as a TensorRT Python plugin whose kernel is written in CuteDSL.

What you will learn
-------------------
* How to write a memory-bound CuteDSL kernel (``@cute.kernel``) that reads every
  byte once with 128-bit vector accesses, reduces in FP32 and casts on store,
  and stages mid-size rows in shared memory with ``cp.async`` (whole rows with
  Hopper's ``cp.async.bulk`` and an mbarrier where that pays); every shape
  decision reaches it as one frozen ``KernelPlan``, a compile-time value, and
  the launcher picks one of up to four plans from the token count at run time;
  for a few long rows, a thread-block cluster shares each row.
* How to compile it ahead of the first inference call with a ``@cute.jit``
  launcher whose token count is a runtime ``Int32`` and whose stream is the one
  TensorRT hands to ``enqueue``.
* How to turn TensorRT's raw device pointers into CuTe tensors without a copy:
  cupy ``UnownedMemory`` -> ``torch.as_tensor`` -> ``cute.runtime.from_dlpack``.
* How to wrap that in an ``IPluginV3`` plugin and its ``IPluginCreatorV3One``,
  build an engine with a dynamic token count through Polygraphy, save and load
  it, and check it against NumPy.

What it runs on
---------------
An NVIDIA GPU of compute capability 8.0 or newer (Ampere, Ada, Hopper,
Blackwell), TensorRT 10.x or 11.x, CUDA 12 or 13, Python 3.11 to 3.13.

How to run it
-------------
    pip install -r requirements.txt          # CUDA 12; requirements-cu13.txt for CUDA 13
    python3 rms_norm_plugin_cutedsl.py       # builds, runs 128/1/512/37 tokens, checks
    python3 rms_norm_plugin_cutedsl.py --from-onnx        # same, via TensorRT's ONNX parser
    python3 rms_norm_plugin_cutedsl.py --compare-builtin  # and against TensorRT's own RMSNormalization
    python3 rms_norm_plugin_cutedsl.py --from-onnx model.onnx  # the plugin in your model, vs TensorRT's import

Exit codes: 0 every run matched NumPy, 1 a run did not, 2 usage or environment
error (bad flag, no GPU, GPU older than SM80, missing package, unreadable
engine or one saved with other flags, a step TensorRT refused). ``--help``
lists the flags.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import struct
import sys
import tempfile
import threading
from dataclasses import dataclass

EXIT_CORRECT, EXIT_INCORRECT, EXIT_USAGE = 0, 1, 2
DEFAULT_EPSILON = 1e-5
MAX_HIDDEN = 32768  # the longest row the kernel holds (see plan_kernel); here so the flags can check it early


@dataclass(frozen=True)
class DTypeNames:
    """One dtype as each library names it (strings, resolved with getattr where used), its size and check tolerances."""

    trt: str             # tensorrt.DataType member
    torch: str           # torch dtype attribute
    cute: str            # cutlass numeric type
    cupy: str            # numpy/cupy dtype that carries the bytes (cupy has no bfloat16; the bits are never read)
    onnx: str            # onnx.TensorProto element type
    bytes: int
    rtol: float          # check_output's tolerance relative to |ref|, for Y of this dtype (see [7])
    atol: float          # check_output's absolute tolerance, for results near zero (see [7])


# Every X dtype works with every W dtype (nine combinations): the kernel reads W as FP32 whatever its dtype.
DTYPES = {
    "float16": DTypeNames(trt="HALF", torch="float16", cute="Float16", cupy="float16", onnx="FLOAT16", bytes=2,
                          rtol=2.0 ** -10, atol=1e-6),
    "bfloat16": DTypeNames(trt="BF16", torch="bfloat16", cute="BFloat16", cupy="int16", onnx="BFLOAT16", bytes=2,
                           rtol=2.0 ** -7, atol=1e-6),
    "float32": DTypeNames(trt="FLOAT", torch="float32", cute="Float32", cupy="float32", onnx="FLOAT", bytes=4,
                          rtol=2.0 ** -18, atol=1e-30),
}
ACTIVATION_DTYPES = ("float16", "bfloat16", "float32")  # X, and Y, which has X's dtype
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")      # W; float32 first, as the default


class UsageError(Exception):
    """A problem the user can fix; main() prints it as one sentence and exits 2."""


class EngineLoadError(RuntimeError):
    """A saved engine that cannot be used; main() turns it into exit code 2."""


class TensorRTError(RuntimeError):
    """TensorRT refused a step (network definition, ONNX parse, build, load, run); main() exits 2."""


# %% [0] Flags ------------------------------------------------------------------
#
# Everything up to the heavy imports below uses the standard library only, so
# that --help and a mistyped flag answer at once instead of after the seconds
# torch, CuteDSL and TensorRT take to import. rms_norm_aot_cutedsl.py shares
# these flags.


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        """One sentence on stderr and exit code 2, instead of argparse's usage dump."""
        self.exit(EXIT_USAGE, f"error: {message} (see --help)\n")


def make_parser(description: str) -> argparse.ArgumentParser:
    """The flags every flavor of this sample shares (rms_norm_aot_cutedsl.py uses it too)."""
    parser = _ArgumentParser(
        description=description,
        epilog="exit codes: 0 every run matched NumPy, 1 a run did not, 2 usage or environment error",
    )
    parser.add_argument("--hidden-dim", type=int, default=1024, help="hidden size H, static in the engine (default 1024)")
    parser.add_argument("--num-tokens", type=int, default=128, help="tokens in the main run (default 128)")
    parser.add_argument("--min-tokens", type=int, default=1, help="profile minimum (default 1)")
    parser.add_argument("--opt-tokens", type=int, default=128, help="profile optimum (default 128)")
    parser.add_argument("--max-tokens", type=int, default=512, help="profile maximum (default 512)")
    parser.add_argument("--dtype", choices=ACTIVATION_DTYPES, default="float16", help="X/Y dtype (default float16)")
    parser.add_argument("--weight-dtype", choices=WEIGHT_DTYPES, default="float32", help="W dtype (default float32)")
    parser.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON, help=f"default {DEFAULT_EPSILON}")
    parser.add_argument("--engine", metavar="PATH",
                        help="load the engine from PATH if it exists (checked against PATH.json, the record of the "
                             "flags it was built with), else build it and save both there")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random inputs (default 0)")
    return parser


def validate_epsilon(value) -> float:
    """Return epsilon as the float32 value the kernel uses, or raise ValueError (flags, plugin fields, compile)."""
    try:
        epsilon = struct.unpack("f", struct.pack("f", float(value)))[0]
    except OverflowError:  # beyond float32's range
        epsilon = math.inf
    except (TypeError, ValueError):
        raise ValueError(f"field 'epsilon' must be a number, got {value!r}") from None
    if not (math.isfinite(epsilon) and epsilon > 0.0):
        raise ValueError(f"field 'epsilon' must be finite and > 0 in float32, got {value!r}")
    return epsilon


def validate_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Refuse (one sentence, exit 2) what TensorRT would otherwise refuse later or not at all."""
    if not 1 <= args.hidden_dim <= MAX_HIDDEN:
        parser.error(f"--hidden-dim must be in [1, {MAX_HIDDEN}], got {args.hidden_dim}")
    if not 1 <= args.min_tokens <= args.opt_tokens <= args.max_tokens:
        parser.error(
            f"the profile needs 1 <= --min-tokens <= --opt-tokens <= --max-tokens, "
            f"got {args.min_tokens}, {args.opt_tokens}, {args.max_tokens}"
        )
    if not args.min_tokens <= args.num_tokens <= args.max_tokens:
        parser.error(f"--num-tokens {args.num_tokens} is outside the profile [{args.min_tokens}, {args.max_tokens}]")
    try:
        validate_epsilon(args.epsilon)
    except ValueError:
        parser.error(f"--epsilon must be finite and > 0 in float32, got {args.epsilon}")
    if args.engine:
        # Found before the build, not after it: the engine is saved only once it is built.
        if os.path.exists(args.engine):
            if not os.path.isfile(args.engine):
                parser.error(f"--engine '{args.engine}' exists but is not a file")
        else:
            folder = os.path.dirname(os.path.abspath(args.engine))
            if not os.path.exists(folder):
                parser.error(f"--engine '{args.engine}': directory '{folder}' does not exist")
            if not os.path.isdir(folder):
                parser.error(f"--engine '{args.engine}': '{folder}' is not a directory")
            if not os.access(folder, os.W_OK | os.X_OK):
                parser.error(f"--engine '{args.engine}': directory '{folder}' is not writable")
    return args


def parse_args(argv=None) -> argparse.Namespace:
    """The plugin flavor's flags: the shared ones plus how to build and what to compare against."""
    parser = make_parser("Build a TensorRT engine around a CuteDSL RMSNorm plugin, run it and check it against NumPy.")
    parser.add_argument("--from-onnx", nargs="?", const="", metavar="MODEL.onnx",
                        help="build through TensorRT's ONNX parser from a one-node ONNX model (needs onnx); with "
                             "MODEL.onnx: put the plugin into that model, build it and the original, compare them "
                             "(only the token profile flags and --seed apply; see rms_norm_onnx_model.py)")
    parser.add_argument("--compare-builtin", action="store_true",
                        help="also build an ONNX RMSNormalization node with TensorRT's parser, check it and time "
                             "both engines (needs onnx and TensorRT 10.15+)")
    args = validate_args(parser, parser.parse_args(argv))
    if args.from_onnx:  # a model path: checked here, before any import, like --engine's
        if not os.path.isfile(args.from_onnx):
            parser.error(f"--from-onnx '{args.from_onnx}' does not exist or is not a file")
        for flag, given in (("--engine", args.engine), ("--compare-builtin", args.compare_builtin)):
            if given:
                parser.error(f"{flag} applies to the sample's own model, not to --from-onnx MODEL.onnx")
    return args


if __name__ == "__main__":
    ARGS = parse_args()  # before the heavy imports: --help and flag errors must not wait for torch


# pip's name for each package this file imports, where a user could not guess it from the import.
PIP_NAMES = {"cuda": "cuda-python", "cupy": "cupy-cuda12x (cupy-cuda13x for CUDA 13)", "cutlass": "nvidia-cutlass-dsl",
             "tensorrt": "tensorrt-cu12 (tensorrt-cu13 for CUDA 13)"}


def import_error_message(exc: ImportError) -> str:
    """One sentence naming the pip package behind a failed import and how to install the sample's set."""
    install = ("install the sample's set with `pip install -r requirements.txt` (CUDA 12) or "
               "`pip install -r requirements-cu13.txt` (CUDA 13)")
    module = (exc.name or "").partition(".")[0]
    if isinstance(exc, ModuleNotFoundError) and module:
        return f"the Python package {PIP_NAMES.get(module, module)} is not installed (import '{exc.name}' failed); {install}"
    # Installed but not loadable: a missing shared library, or a version without a name this file imports.
    detail = " ".join(str(exc).split())
    return f"a package of this sample failed to import ({detail}); {install} in a fresh virtual environment"


# The kernel half of the file needs NumPy, CuteDSL, torch and cupy; TensorRT and
# Polygraphy only the plugin and engine half. Run as a script, a missing
# package is one sentence and exit code 2; imported, an ImportError saying the same.
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
    if __name__ == "__main__":
        print(f"error: {import_error_message(exc)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    raise ImportError(import_error_message(exc), name=exc.name) from exc

try:
    import tensorrt as trt
except ImportError:
    trt = None  # main() refuses to run; the kernel half stays importable for tests


# %% [1] NumPy reference ------------------------------------------------------
#
#   y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + epsilon) * w
#
# computed in float64 from the same low-precision inputs the kernel reads, so
# the only differences left are the kernel's FP32 arithmetic and its final
# rounding to X's dtype.


def rms_norm_reference(x: np.ndarray, w: np.ndarray, epsilon: float) -> np.ndarray:
    """RMSNorm over the last axis, in float64."""
    x64 = np.asarray(x, dtype=np.float64)
    w64 = np.asarray(w, dtype=np.float64)
    mean_sq = np.mean(x64 * x64, axis=-1, keepdims=True)
    return x64 / np.sqrt(mean_sq + epsilon) * w64


# %% [2] The CuteDSL kernel -----------------------------------------------------
#
# Memory-traffic model. RMSNorm does ~4 FLOPs per element and is bound by
# memory: per call it reads N*H*x bytes of X, H*w bytes of W, and writes
# N*H*x bytes of Y (x, w: bytes per element; fp16 X and fp32 W: 2 and 4).
# GB/s below always means
#     (2*N*H*x + H*w) / seconds.
# The floor is a device-to-device copy of X into Y, so the kernel must read
# each X element from DRAM exactly once: a whole row stays on chip between
# the reduction and the store, in registers or staged in shared memory.
#
# Work split. A row of H elements is cut into 16-byte vectors (8 fp16/bf16
# or 4 fp32 values; fewer when H is not a multiple of that), and W into
# vectors of as many elements as X's. T = threads_per_row threads
# share a row and thread t owns vectors t, t+T, t+2T, ... so neighbouring
# threads touch neighbouring 16-byte chunks (coalesced). Short rows share a
# CTA (rows_per_cta rows side by side); in the mid plan each CTA also takes
# rows_in_sequence rows in turn, and in the cluster plan a row's T threads are
# spread over cluster_ctas CTAs. plan_kernel() picks the numbers for a call of
# so many rows (ROW_PLANS below).
#
#      vector:   0    1   ...  T-1 |  T   T+1 ... 2T-1 | ...
#      thread:   t0   t1  ...  tT-1|  t0  t1  ... tT-1 | ...   <- Step 1: load X (registers or smem), W
#                 \    \        /     /    /       /
#                  partial sum of x^2 per thread (FP32)      <- Step 2
#                  \___ warp butterfly shuffle ___/          <- Step 3a
#                   [warp 0][warp 1]...  shared memory       <- Step 3b (T > 32 only;
#                                                                   over a cluster, in every CTA)
#                          row total in every thread         <- Step 3c
#                  rstd = rsqrt(total / H + epsilon)         <- Step 4
#                  y = x * rstd * w, cast, 16-byte stores    <- Step 5

# Facts of the hardware and of the data.
VECTOR_BYTES = 16          # widest global access per thread (ld.global.v4.b32); cp.async.cg copies exactly this
WARP_THREADS = 32
MAX_CTA_THREADS = 1024     # CUDA's limit on threads per CTA
FLT_MIN = float(np.finfo(np.float32).tiny)  # smallest normal float32, 2**-126

# How each row length is served: one row of this table per range of row
# sizes, tuned on the H200 against copy_ (benchmarks/NOTES.md has the
# measurements and the alternatives). Longer vectors per thread mean fewer
# threads per row; "shared" needs 16-byte vectors (cp.async.cg copies exactly
# 16 bytes), else X stays in registers. How many rows a call has matters too,
# so the launcher picks one of up to four plans at run time (token_schedule()):
#   cluster  at most cluster[0] rows (sm_90 and newer): too few rows to give
#         every SM one, so one SM's load bandwidth would bound each row; a cluster
#         of CLUSTER_CTAS CTAs on as many SMs splits every row (X in registers, W
#         with it, cluster[1] vectors per thread) and adds the row's warp sums
#         across the cluster;
#   few   at most FEW_TOKENS rows: about one row per SM, one DRAM round trip with
#         nothing to overlap it, so the shortest chain wins: X in registers and
#         W requested with it, few_tokens_vecs vectors per thread;
#   mid   more than MID_TOKENS, at most mid[0] rows: a few rows per SM, which
#         would all load at once and then all store at once; a CTA that stages
#         two rows up front and normalizes them in turn stores the first while
#         the second still arrives (W first, mid[1] vectors per thread). On sm_90+
#         rows over BULK_ROW_BYTES come in by one bulk copy each, which also
#         keeps rows of 20 KB and more ahead of their own plan up to 4096 rows;
#   many  any other count, and wherever the column is 0: the line's own plan
#         (over mid[0] rows split over cluster_ctas CTAs where the line names
#         more than one; benchmarks/NOTES.md, fourth pass, says why).
# ptxas, not the source, decides when a load is issued. Left to itself it saves
# registers in the plans of rows up to 2 KB and of hidden 1536 (96 threads, 2
# vectors each) by issuing W's loads only once X has arrived, which undoes "W
# first"; a launch bound of min_ctas_per_sm CTAs per SM raises their register
# budget and they keep them first. The other rows of 2-3 KB got no earlier
# loads from one and ran slower with it (benchmarks/NOTES.md, fifth and sixth
# passes), hence a line for rows of exactly 3 KB.
@dataclass(frozen=True)
class RowPlan:
    max_row_bytes: int
    x_in: str              # "registers" or "shared"
    vecs_per_thread: int
    early_weight: bool     # W loaded before the reduction (True) or after it
    min_cta_threads: int   # short rows are packed side by side until a CTA has this many threads
    few_tokens_vecs: int = 0
    mid: tuple = (0, 0)      # (at most this many rows, vectors per thread) for the mid plan
    cluster: tuple = (0, 0)  # (at most this many rows, vectors per thread) for the cluster plan
    cluster_ctas: int = 1    # over mid[0] rows, the line's own plan splits each row over this many CTAs
    min_ctas_per_sm: int = 0  # a launch bound for the line's own plan (0: none; see above)


ROW_PLANS = (
    RowPlan(256, "registers", 2, False, 256),                                     # tuned: rows share warps
    RowPlan(2048, "registers", 2, True, 128, min_ctas_per_sm=8),                  # tuned: latency-bound; keep W first
    RowPlan(3071, "registers", 2, True, 128, 1),                                  # tuned
    RowPlan(3072, "registers", 2, True, 128, 1, min_ctas_per_sm=8),               # tuned: exactly 3 KB: keep W first
    RowPlan(4096, "registers", 2, True, 128),                                     # tuned
    RowPlan(8192, "shared", 2, True, 128, 2, (1024, 2)),                          # tuned: bandwidth-bound from here on
    RowPlan(15360, "shared", 4, True, 128, 4, (1024, 4)),                         # tuned
    RowPlan(16384, "registers", 4, True, 128, 4, (1024, 4), (32, 4), 2),          # tuned: staged only for mid counts
    RowPlan(20480, "shared", 4, False, 128, 4, (4096, 4), (32, 2)),               # tuned: no W registers in Step 3
    RowPlan(32767, "shared", 8, False, 128, 4, (4096, 4), (32, 4)),               # tuned
    RowPlan(MAX_HIDDEN * 4, "registers", 4, False, 128, 4, (4096, 4), (128, 4)),  # tuned: too few staged/SM
)
# MAX_HIDDEN (top of the file) is the longest row the last plan holds:
# MAX_CTA_THREADS x 4 vectors of 8 fp16/bf16 elements. An fp32 row as long takes
# twice the vectors per thread and still stays in registers without spills
# (tests/test_kernel_compile.py checks both).
CLUSTER_CTAS = 4          # tuned: CTAs, on as many SMs, that share one row in the cluster plan
FEW_TOKENS = 128          # tuned: calls of at most this many rows run the few-token plan
MID_TOKENS = 384          # tuned: calls of more rows than this, up to the line's mid[0], run the mid plan
ROWS_IN_SEQUENCE = 2      # rows each CTA of the mid plan normalizes in turn
BULK_ROW_BYTES = 8192     # tuned: on sm_90+ the mid plan's rows longer than this arrive by one bulk copy each
MID_BOUND = (480, 2)      # tuned: mid plans of at least 480 threads ask ptxas for 2 CTAs per SM (see plan_kernel)


@dataclass(frozen=True)
class KernelPlan:
    """How one hidden size maps onto threads; the kernel receives it whole, as one compile-time value."""

    hidden: int
    elem_bytes: int       # bytes per X/Y element (2: fp16 or bf16, 4: fp32)
    vec: int              # elements per vector access
    threads_per_row: int
    rows_per_cta: int
    vecs_per_thread: int
    early_weight: bool    # load W before the reduction, its latency hidden behind X's (True), or after it (the
                          # row then holds no W registers through the reduction)
    stage_x: bool         # X goes to shared memory by cp.async (True) or straight to registers
    rows_in_sequence: int = 1  # rows each row slot of a CTA normalizes one after another (staged plans only)
    cluster_ctas: int = 1      # CTAs one row is split over, a thread-block cluster (sm_90+); threads_per_row counts all
    min_ctas_per_sm: int = 0   # a launch bound: ptxas budgets registers so that this many CTAs fit on an SM (0: none)
    bulk_copy: bool = False    # staged rows arrive by one cp.async.bulk each (sm_90+), counted in by an mbarrier

    def __post_init__(self):
        if (self.rows_in_sequence > 1 or self.bulk_copy) and not self.stage_x:
            raise ValueError("rows in sequence and bulk copies go through shared memory: the plan must stage X")
        if self.cluster_ctas > 1 and (self.stage_x or self.rows_per_cta > 1
                                      or self.threads_per_row % (WARP_THREADS * self.cluster_ctas)):
            raise ValueError("a row split over a cluster keeps X in registers, one row per CTA, whole warps per CTA")

    @property
    def num_vecs(self) -> int:
        return self.hidden // self.vec

    @property
    def ragged(self) -> bool:
        """Whether the last column of vectors is only partly owned, so each vector needs a bounds check."""
        return self.num_vecs % self.threads_per_row != 0

    @property
    def warps_per_row(self) -> int:
        return max(1, self.threads_per_row // WARP_THREADS)

    @property
    def cta_threads(self) -> int:
        return self.threads_per_row * self.rows_per_cta // self.cluster_ctas

    @property
    def cta_rows(self) -> int:
        """Rows one CTA normalizes: rows_per_cta side by side, each slot rows_in_sequence times."""
        return self.rows_per_cta * self.rows_in_sequence

    @property
    def sum_buffers(self) -> int:
        """Sets of warp sums in shared memory: two when rows follow each other, so that a warp may write the
        next row's sum while a slower warp still reads this row's."""
        return min(2, self.rows_in_sequence)

    def grid(self, num_tokens):
        """CTAs for num_tokens rows; works on ints, on the launcher's Int32 and on TensorRT's symbolic sizes."""
        return (num_tokens + self.cta_rows - 1) // self.cta_rows * self.cluster_ctas

    @property
    def shared_memory_bytes(self) -> int:
        """Dynamic shared memory per CTA, in the kernel's allocation order: the staged
        rows (if any) and, with bulk copies, one 8-byte mbarrier per row in sequence
        (padded to 16 bytes for what follows); one FP32 sum per warp of each row (if a
        row spans warps); over a cluster the 8-byte mbarrier that counts the sums arriving."""
        staged = self.cta_rows * self.hidden * self.elem_bytes if self.stage_x else 0
        staged += 16 * math.ceil(self.rows_in_sequence / 2) if self.bulk_copy else 0
        sums = 4 * self.warps_per_row * self.rows_per_cta * self.sum_buffers
        return staged + (sums if self.warps_per_row > 1 else 0) + (8 if self.cluster_ctas > 1 else 0)

    def __str__(self) -> str:
        """A short tag: CuteDSL names the kernel after its compile-time arguments' str() and cuts the name at
        180 characters, where the dataclass's long repr would push epsilon out of it."""
        weight = "early" if self.early_weight else "late"
        sequence = f"q{self.rows_in_sequence}" if self.rows_in_sequence > 1 else ""
        sequence += f"c{self.cluster_ctas}" if self.cluster_ctas > 1 else ""
        sequence += f"m{self.min_ctas_per_sm}" if self.min_ctas_per_sm else ""
        sequence += "b" if self.bulk_copy else ""
        return (f"h{self.hidden}b{self.elem_bytes}v{self.vec}t{self.threads_per_row}r{self.rows_per_cta}{sequence}"
                f"k{self.vecs_per_thread}_w{weight}_{'smem' if self.stage_x else 'regs'}")

    def owns(self, j):
        """Whether vector j, which some thread of the row holds, is in the row (always, unless ragged)."""
        return not self.ragged or j < self.num_vecs

    def clamp(self, j):
        """Vector j, or the row's last vector where j is past a ragged row's end: an address every thread may load."""
        return cutlass.min(j, self.num_vecs - 1) if self.ragged else j

    def describe(self) -> str:
        """One line for a reader: which way the kernel holds a row, and how the row is split."""
        where = "X staged in shared memory" if self.stage_x else "X in registers"
        where += " by bulk copy" if self.bulk_copy else ""
        rows = f"{self.rows_per_cta} row{'s' if self.rows_per_cta > 1 else ''}/CTA"
        if self.rows_in_sequence > 1:
            rows = f"{self.cta_rows} rows/CTA in turn"
        if self.cluster_ctas > 1:
            rows = f"each row over a cluster of {self.cluster_ctas} CTAs"
        bound = f", launch bound {self.min_ctas_per_sm} CTAs/SM" if self.min_ctas_per_sm else ""
        return (f"kernel: vector {self.vec} x {self.elem_bytes * 8}-bit, {self.threads_per_row} threads/row "
                f"x {self.vecs_per_thread} vectors, {rows}, {where}{bound}")


def threads_for(num_vecs: int, vecs_per_thread: int, ctas: int = 1) -> int:
    """Threads that share a row: enough for vecs_per_thread vectors each, in whole warps (per CTA, when ``ctas``
    CTAs of a cluster share the row).

    A multiple of 32, not a power of two: a row of 192 vectors at 2 per thread
    gets 96 threads, all busy, where rounding up to 128 would leave a quarter
    of them half idle. Rows shorter than a warp use a power of two, so that the
    butterfly shuffle of Step 3a stays inside the row.
    """
    threads, step = math.ceil(num_vecs / vecs_per_thread), WARP_THREADS * ctas
    if threads <= WARP_THREADS and ctas == 1:
        return 1 << math.ceil(math.log2(threads))
    return min(step * math.ceil(threads / step), MAX_CTA_THREADS * ctas)


def row_plan(hidden: int, elem_bytes: int) -> RowPlan:
    """The line of ROW_PLANS that serves a row of ``hidden`` elements of ``elem_bytes`` bytes."""
    if not 1 <= hidden <= MAX_HIDDEN:
        raise ValueError(f"hidden must be in [1, {MAX_HIDDEN}], got {hidden}")
    return next(r for r in ROW_PLANS if hidden * elem_bytes <= r.max_row_bytes)


def plan_kernel(hidden: int, elem_bytes: int = 2, num_tokens: int | None = None, sm90: bool = True) -> KernelPlan:
    """Choose vector width and thread split for a row of ``hidden`` elements.

    The row's size in bytes picks a line of ROW_PLANS: short rows are
    latency-bound and keep X in registers; most longer rows are bandwidth-bound
    and stage X in shared memory, where cp.async holds no register while the
    bytes arrive, so more rows fit on an SM (the table says which do not).
    ``num_tokens`` gives the plan the launcher runs for a call of that many rows
    (None: the plan for many rows); ``sm90=False`` (GPUs before sm_90, or a launch
    without cluster dimensions) leaves out clusters and bulk copies. A few- or
    mid-token plan needs at most 512 threads per row, a cluster plan 1024 and
    16-byte vectors, else the line's own plan serves the count.
    """
    row = row_plan(hidden, elem_bytes)
    vec = VECTOR_BYTES // elem_bytes
    while hidden % vec:  # a vector never straddles two rows, so every row stays aligned
        vec //= 2
    num_vecs = hidden // vec
    whole_vectors = vec * elem_bytes == VECTOR_BYTES  # what cp.async.cg copies, and what the clusters were tuned on
    # Shorter vectors would spread a row over a cluster in up to 64 warps, each adding to Step 3c's chain.
    clusters = sm90 and whole_vectors
    rows = math.inf if num_tokens is None else num_tokens
    x_in, vecs, early_weight, in_sequence = row.x_in, row.vecs_per_thread, row.early_weight, 1
    bound = row.min_ctas_per_sm  # the launch bound belongs to the line's own plan only
    ctas = row.cluster_ctas if clusters and rows > row.mid[0] else 1
    # (X in, vectors per thread, rows in sequence, CTAs per row) of the plan for this count, if the line has one
    by_count = ("registers", 0, 1, 1)
    if clusters and rows <= row.cluster[0]:
        by_count = ("registers", row.cluster[1], 1, CLUSTER_CTAS)
    elif rows <= FEW_TOKENS:
        by_count = ("registers", row.few_tokens_vecs, 1, 1)
    elif MID_TOKENS < rows <= row.mid[0] and whole_vectors:
        by_count = ("shared", row.mid[1], ROWS_IN_SEQUENCE, 1)
    # Each holds W's registers next to X's through the reduction; at 1024 threads per CTA (64 registers each)
    # that would spill, and the mid plan would stage two rows of up to 128 KB each. A row over a cluster keeps
    # to 1024 threads, so Step 3c adds at most 32 warp sums, as in one CTA.
    limit = MAX_CTA_THREADS if by_count[3] > 1 else MAX_CTA_THREADS // 2
    if by_count[1] and math.ceil(num_vecs / by_count[1]) <= limit:
        x_in, vecs, in_sequence, ctas = by_count
        early_weight, bound = True, 0
    threads = threads_for(num_vecs, vecs, ctas)
    if in_sequence > 1 and threads >= MID_BOUND[0]:
        # Two such CTAs leave 64 registers per thread; ptxas may take a few more and
        # fit only one CTA per SM, half the rows in flight (benchmarks/NOTES.md,
        # seventh pass). Smaller mid-plan CTAs fit two anyway, and a bound there
        # would only let ptxas spend more registers on them.
        bound = MID_BOUND[1]
    return KernelPlan(hidden, elem_bytes, vec, threads, max(1, row.min_cta_threads // threads) if ctas == 1 else 1,
                      math.ceil(num_vecs / threads), early_weight=early_weight,
                      stage_x=x_in == "shared" and whole_vectors, rows_in_sequence=in_sequence, cluster_ctas=ctas,
                      min_ctas_per_sm=bound,
                      bulk_copy=sm90 and in_sequence > 1 and hidden * elem_bytes > BULK_ROW_BYTES)


def token_schedule(hidden: int, elem_bytes: int = 2, sm90: bool = True) -> tuple:
    """The launcher's table: ((plan, ((fewer, most), ...)), ...), each distinct plan with the token counts it
    serves, more than ``fewer`` and at most ``most`` rows (None: no bound)."""
    row = row_plan(hidden, elem_bytes)
    cluster_tokens = row.cluster[0] if sm90 else 0
    bounds = sorted({FEW_TOKENS, MID_TOKENS, row.mid[0], cluster_tokens} - {0})
    ranges = list(zip([None] + bounds, bounds + [None]))
    schedule: dict = {}
    for fewer, most in ranges:
        counts = schedule.setdefault(plan_kernel(hidden, elem_bytes, most, sm90), [])
        if counts and counts[-1][1] == fewer:  # one range where two meet
            fewer = counts.pop()[0]
        counts.append((fewer, most))
    return tuple((plan, tuple(counts)) for plan, counts in schedule.items())


def vector_of(view, k: int, j):
    """Vector k of a thread's register tensor, vector j of W, or vector j of row r of X, Y or sX given as (tensor, r).

    Rows are sliced here, at the access, so the address arithmetic sits where the access is.
    """
    if isinstance(view, tuple):
        tensor, r = view
        return tensor[r, None, j]
    return view[None, k] if view.memspace == cute.AddressSpace.rmem else view[None, j]


@cute.jit
def copy_vectors(t: Int32, plan: cutlass.Constexpr, *copies, weight=None, atom=None, transform=None):
    """For each vector thread t owns and each (src, dst, when) in copies: copy src's vector to dst's if when.

    Thread t owns vector j = t + k * threads_per_row of its row, for k = 0, 1, ...
    (see vector_of). Several copies interleave, vector k of each in turn. ``weight``,
    a pair (mW, tWrW), loads W's vector k ahead of them, in every thread: W first (Step
    1 says why). With ``transform``, each vector passes through registers as transform(values, k).
    """
    for k in cutlass.range_constexpr(plan.vecs_per_thread):
        j = t + k * plan.threads_per_row
        if cutlass.const_expr(weight is not None):
            mW, tWrW = weight
            cute.autovec_copy(vector_of(mW, k, plan.clamp(j)), vector_of(tWrW, k, j))
        if plan.owns(j):
            for src, dst, when in copies:
                if when:
                    if cutlass.const_expr(transform is not None):
                        values = cute.make_rmem_tensor((plan.vec,), src[0].element_type)
                        cute.autovec_copy(vector_of(src, k, j), values)
                        result = cute.make_rmem_tensor((plan.vec,), dst[0].element_type)
                        result.store(transform(values.load(), k))
                        cute.autovec_copy(result, vector_of(dst, k, j))
                    elif cutlass.const_expr(atom is not None):
                        cute.copy(atom, vector_of(src, k, j), vector_of(dst, k, j))
                    else:
                        cute.autovec_copy(vector_of(src, k, j), vector_of(dst, k, j))


def whole_row(tensor, r):
    """Row r of X or of sX as one run of hidden elements: a bulk copy of it is one instruction, not one per vector."""
    row = tensor[r, None, None]
    return cute.make_tensor(row.iterator, cute.make_layout(cute.size(row)))


@cute.kernel
def rms_norm_kernel(
    x_ptr: cute.Pointer,  # X [num_tokens, hidden], fp16, bf16 or fp32, 16-byte aligned
    w_ptr: cute.Pointer,  # W [hidden], fp32, fp16 or bf16, 16-byte aligned
    num_tokens: Int32,
    y_ptr: cute.Pointer,  # Y, like X
    plan: cutlass.Constexpr,
    epsilon: cutlass.Constexpr,
):
    # The parameters are (X, W, num_tokens, Y): raw pointers and one int32, in
    # the order TensorRT's ahead-of-time plugin launcher passes them (inputs,
    # extra arguments, outputs), so the same PTX serves both plugin flavors.
    # The tensors are described here: a static row stride and a (vec, num_vecs)
    # split of each row let the compiler prove that every vector access is
    # 16-byte aligned, so it emits 128-bit loads and stores.
    vec, hidden = plan.vec, plan.hidden
    rows = cute.make_layout((num_tokens, vec, plan.num_vecs), stride=(hidden, 1, vec))
    mX = cute.make_tensor(x_ptr, rows)
    mY = cute.make_tensor(y_ptr, rows)
    mW = cute.make_tensor(w_ptr, cute.make_layout((vec, plan.num_vecs), stride=(1, vec)))

    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    if cutlass.const_expr(plan.cluster_ctas > 1):
        # A row over a cluster: its CTAs are consecutive in the grid, and CTA c
        # holds the row's threads c * cta_threads, c * cta_threads + 1, ...
        lead = tidx == 0  # this CTA's first thread: it sets up the CTA's mbarrier
        tidx, bidx = tidx + bidx % plan.cluster_ctas * plan.cta_threads, bidx // plan.cluster_ctas
    row_in_cta, t = tidx // plan.threads_per_row, tidx % plan.threads_per_row
    first_row = bidx * plan.cta_rows + row_in_cta  # the slot's rows: first_row + i * rows_per_cta
    smem = cutlass.memory.SmemAllocator()

    # Step 1: each thread loads its vectors of X (and, where the plan says so,
    # of W) into registers. Unowned slots stay zero: they add nothing to the sum.
    # W keeps its own dtype in registers (a 16-bit W needs half the registers of
    # an fp32 one) and becomes FP32 in Step 5, where it is used. Where W comes
    # first, every thread loads a W vector for every slot, past a ragged row's end
    # the row's last one again (KernelPlan.clamp): ptxas issues a load that sits
    # behind a bounds check only once X has arrived, adding W's latency to the row's.
    tXrX = cute.make_rmem_tensor((vec, plan.vecs_per_thread), mX.element_type)
    tWrW = cute.make_rmem_tensor((vec, plan.vecs_per_thread), mW.element_type)
    tXrX.fill(0.0)
    tWrW.fill(0.0)
    early_w = (mW, tWrW) if cutlass.const_expr(plan.early_weight) else None
    if cutlass.const_expr(plan.stage_x):
        # Staged: X goes to shared memory while W is loaded; no register waits for
        # X's bytes from DRAM. All of the CTA's rows are requested up front, and row
        # i waits below for its own bytes only: the next row keeps arriving while
        # this one is reduced and stored. Slot s of sX holds the CTA's row s.
        sX = smem.allocate_tensor(mX.element_type, cute.make_layout((plan.cta_rows, vec, plan.num_vecs),
                                                                    stride=(hidden, 1, vec)), 16)
        if cutlass.const_expr(plan.bulk_copy):
            # One thread hands each row whole to the SM's bulk-copy unit (TMA's
            # cp.async.bulk, sm_90+), and an mbarrier for each row in sequence counts
            # its bytes in; no thread spends instructions on X's addresses.
            rows_in = smem.allocate_array(cutlass.Int64, plan.rows_in_sequence)
            if tidx == 0:
                for i in cutlass.range_constexpr(plan.rows_in_sequence):
                    cute.arch.mbarrier_init(rows_in + i, 1)  # one arrival: thread 0's, with the bytes to expect
                cute.arch.mbarrier_init_fence()
            cute.arch.barrier()  # no thread waits on an mbarrier before thread 0 has set it up
            if tidx == 0:
                bulk = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), mX.element_type)
                for i in cutlass.range_constexpr(plan.rows_in_sequence):
                    first = first_row + i * plan.rows_per_cta  # this thread's row_in_cta is 0
                    rows_here = cutlass.max(cutlass.min(num_tokens - first, plan.rows_per_cta), 0)
                    cute.arch.mbarrier_arrive_and_expect_tx(rows_in + i, rows_here * (hidden * plan.elem_bytes))
                    for r in cutlass.range_constexpr(plan.rows_per_cta):
                        if first + r < num_tokens:
                            cute.copy(bulk, whole_row(mX, first + r), whole_row(sX, i * plan.rows_per_cta + r),
                                      mbar_ptr=rows_in + i)
        else:
            # Each thread copies its own vectors by cp.async.cg (16 bytes per copy,
            # L2 only), one commit group per row, and later waits for its own copies
            # only, so no barrier is needed.
            g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), mX.element_type,
                                      num_bits_per_copy=VECTOR_BYTES * 8)
            for i in cutlass.range_constexpr(plan.rows_in_sequence):
                row, slot = first_row + i * plan.rows_per_cta, i * plan.rows_per_cta + row_in_cta
                if row < num_tokens:
                    copy_vectors(t, plan, ((mX, row), (sX, slot), True), atom=g2s)
                cute.arch.cp_async_commit_group()
        copy_vectors(t, plan, weight=early_w)
    if cutlass.const_expr(plan.warps_per_row > 1):
        sSum = smem.allocate_tensor(Float32, cute.make_layout((plan.warps_per_row, plan.rows_per_cta,
                                                               plan.sum_buffers)), 16)
    if cutlass.const_expr(plan.cluster_ctas > 1):
        # Step 3b will write this CTA's warp sums into every CTA of the cluster; an
        # mbarrier counts the bytes arriving here. Each CTA sets up its barrier and
        # announces itself now; Step 3b waits until all have, after the loads.
        sums_in = smem.allocate_array(cutlass.Int64, 1)
        if lead:
            cute.arch.mbarrier_init(sums_in, 1)  # one arrival: this thread's, in Step 3b
            cute.arch.mbarrier_init_fence()      # makes the barrier visible to the cluster's other CTAs
        cute.arch.cluster_arrive_relaxed()

    for i in cutlass.range_constexpr(plan.rows_in_sequence):  # one row per slot, unless the plan says otherwise
        row, slot = first_row + i * plan.rows_per_cta, i * plan.rows_per_cta + row_in_cta  # slot: the row's place in sX
        row_ok = row < num_tokens  # the last CTA's spare rows read no X and store nothing
        if cutlass.const_expr(plan.stage_x):
            if cutlass.const_expr(plan.bulk_copy):
                cute.arch.mbarrier_wait(rows_in + i, 0)  # phase 0 ends once this row's bytes are all in
            else:
                # cp.async groups complete in the order they were committed: once no more
                # groups are pending than rows after this one, this row is in shared memory.
                cute.arch.cp_async_wait_group(plan.rows_in_sequence - 1 - i)
            if row_ok:
                copy_vectors(t, plan, ((sX, slot), tXrX, True))
        else:
            # Registers: X straight from DRAM, each W vector requested just before
            # the X vector it scales (the order that ran fastest, benchmarks/NOTES.md).
            copy_vectors(t, plan, ((mX, row), tXrX, row_ok), weight=early_w)

        # Step 2: per-thread partial sum of squares, in FP32. Adding across the
        # thread's vectors first (vec independent running sums), then within one
        # vector, keeps the chain of dependent adds vecs_per_thread + vec long
        # instead of their product: every row waits for this chain before its shuffles.
        x = tXrX.load().to(Float32)
        lane_sums = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=(None, 1))
        partial = lane_sums.reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)

        # Step 3a: butterfly shuffle inside the warp (or inside the row's slice of it).
        total = cute.arch.warp_reduction_sum(partial, threads_in_group=min(plan.threads_per_row, WARP_THREADS))
        if cutlass.const_expr(plan.warps_per_row > 1):
            # Step 3b: a row spans several warps; lane 0 of each parks its sum in shared memory.
            if cutlass.const_expr(plan.cluster_ctas > 1):
                # Over a cluster, lane c of each warp sends the sum to CTA c's shared memory
                # (st.async), and every CTA waits until its mbarrier has counted all the row's sums.
                cute.arch.cluster_wait()  # every CTA has started and set up its mbarrier: safe to write to
                if lead:  # 4 bytes will arrive from each warp of the row
                    cute.arch.mbarrier_arrive_and_expect_tx(sums_in, 4 * plan.warps_per_row)
                if t % WARP_THREADS < plan.cluster_ctas:
                    mine = sSum.iterator + cute.crd2idx((t // WARP_THREADS, row_in_cta, 0), sSum.layout)
                    # store_async_dsmem takes 32-bit integers: the sum travels as its bit pattern
                    cute.arch.store_async_dsmem(mine, total.bitcast(Int32), sums_in, t % WARP_THREADS)
                cute.arch.mbarrier_wait(sums_in, 0)
            else:
                if t % WARP_THREADS == 0:
                    sSum[t // WARP_THREADS, row_in_cta, i % plan.sum_buffers] = total
                cute.arch.barrier()
            # Step 3c: every thread adds the row's warp sums (a few smem reads, no second barrier).
            total = Float32(0.0)
            for w in cutlass.range_constexpr(plan.warps_per_row):
                total = total + sSum[w, row_in_cta, i % plan.sum_buffers]

        # Step 4: one reciprocal square root per row. Its argument is at least
        # epsilon, so when epsilon is a normal float32 the argument is never
        # subnormal and the flush-to-zero form returns the same value without the
        # subnormal-input guard ptxas puts around plain rsqrt.approx.f32 on every
        # row's critical path.
        mean_sq_eps = total * (1.0 / plan.hidden) + epsilon  # 1/hidden folds to a constant
        if cutlass.const_expr(epsilon >= FLT_MIN):
            rstd = cute.math.rsqrt(mean_sq_eps, approx=True, ftz=True)
        else:
            rstd = cute.math.rsqrt(mean_sq_eps)

        # Step 5: scale in FP32, cast once, store with the same vectors that were
        # loaded, with the default cache policy (Y is usually read next by another
        # kernel). A staged row reads X again from shared memory one vector at a
        # time instead of keeping a row of FP32 values live through Steps 3-4,
        # which also lets ptxas issue W's loads before the cp.async wait.
        if cutlass.const_expr(not plan.early_weight and i == 0):
            copy_vectors(t, plan, (mW, tWrW, True))
        if cutlass.const_expr(plan.stage_x):
            def normalize(values, k):  # one vector of X, read back from shared memory, to one vector of Y
                return (values.to(Float32) * rstd * tWrW[None, k].load().to(Float32)).to(mY.element_type)

            if row_ok:
                copy_vectors(t, plan, ((sX, slot), (mY, row), True), transform=normalize)
        else:
            tYrY = cute.make_rmem_tensor((vec, plan.vecs_per_thread), mY.element_type)
            tYrY.store((x * rstd * tWrW.load().to(Float32)).to(mY.element_type))
            if row_ok:
                copy_vectors(t, plan, (tYrY, (mY, row), True))


# %% [3] The @cute.jit launcher -------------------------------------------------
#
# Baked in at compile time: the X/Y and W dtypes, the plans and the token
# counts each serves (token_schedule(): hidden size, vector width, threads per
# row, rows per CTA, registers or shared memory, cluster; see ROW_PLANS),
# epsilon, and the 16-byte alignment of the three base pointers. Runtime
# arguments: the three addresses, num_tokens and the stream. The launcher
# picks the plan from num_tokens on the host, so one compiled launcher serves
# every token count of the optimization profile. CuteDSL compiles a kernel
# once per launch site, so each distinct plan is launched from one place, for
# every range of counts it serves.


def launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon):
    """Launch rms_norm_kernel with one plan: plan.grid() CTAs of plan.cta_threads threads, in clusters of
    plan.cluster_ctas where a row is split over several CTAs, under the plan's launch bound if it has one."""
    options = {"cluster": [plan.cluster_ctas, 1, 1]} if plan.cluster_ctas > 1 else {}
    if plan.min_ctas_per_sm:
        # The carveout -1 (the driver's default) keeps CuteDSL from asking the GPU
        # for its shared memory size, so a bounded kernel still compiles without one.
        options.update(min_blocks_per_mp=plan.min_ctas_per_sm, preferred_smem_carveout=-1)
    rms_norm_kernel(mX.iterator, mW.iterator, num_tokens, mY.iterator, plan, epsilon).launch(
        grid=[plan.grid(num_tokens), 1, 1], block=[plan.cta_threads, 1, 1], stream=stream, **options)


def serves(num_tokens, counts):
    """Whether num_tokens is in one of the ranges (fewer, most] of counts (None: no bound), as a runtime Boolean."""
    hit = None
    for fewer, most in counts:
        above = num_tokens > fewer if fewer is not None else None
        below = num_tokens <= most if most is not None else None
        term = above if below is None else below if above is None else above & below
        hit = term if hit is None else hit | term
    return hit


@cute.jit
def rms_norm_launch(
    mX: cute.Tensor,
    mW: cute.Tensor,
    mY: cute.Tensor,
    num_tokens: Int32,
    stream: cuda.CUstream,
    schedule: cutlass.Constexpr,  # token_schedule(): ((plan, token counts it serves), ...)
    epsilon: cutlass.Constexpr,
):
    for p in cutlass.range_constexpr(len(schedule)):
        plan, counts = schedule[p]
        if cutlass.const_expr(len(schedule) == 1):
            launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon)
        elif serves(num_tokens, counts):
            launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon)


def is_sm90(arch: str) -> bool:
    """Whether a compile target such as "sm_90a" is sm_90 or newer: it has thread-block clusters and bulk copies."""
    return int(arch.removeprefix("sm_").rstrip("af")) >= 90


def gpu_arch() -> str:
    """The current GPU's compile target, e.g. "sm_90a" (the "a" unlocks Hopper's and later GPUs' own instructions)."""
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


_COMPILED: dict = {}
_COMPILE_LOCK = threading.Lock()


def compile_rms_norm(dtype: str, hidden: int, epsilon: float = DEFAULT_EPSILON, arch: str | None = None, *,
                     w_dtype: str = "float32", keep_ptx: bool = False, plans_by_tokens: bool = True):
    """Compile the launcher for one X/Y dtype, W dtype, hidden size and epsilon, once per process.

    The cache key is exactly what the compiled code bakes in: both dtypes, hidden,
    epsilon (as the float32 the kernel uses), the GPU architecture and whether the
    plans by token count are in (clusters and bulk copies only where ``arch`` is sm_90+).
    ``arch`` (e.g. ``"sm_90a"``) compiles without a GPU;
    ``None`` targets the current GPU. ``keep_ptx=True`` bypasses the cache and
    returns a fresh compilation whose ``__ptx__`` holds the PTX text (one kernel
    per distinct plan). ``plans_by_tokens=False`` compiles the many-row plan
    alone and without a cluster, for every token count: one kernel with plain
    launch dimensions, as the AOT flavor needs.
    """
    if dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"dtype must be one of {list(ACTIVATION_DTYPES)}, got {dtype!r}")
    if w_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"w_dtype must be one of {list(WEIGHT_DTYPES)}, got {w_dtype!r}")
    plan_kernel(hidden, DTYPES[dtype].bytes)  # a clear ValueError before any tracing
    epsilon = validate_epsilon(epsilon)
    arch = arch or gpu_arch()
    schedule = (token_schedule(hidden, DTYPES[dtype].bytes, sm90=is_sm90(arch)) if plans_by_tokens
                else ((plan_kernel(hidden, DTYPES[dtype].bytes, sm90=False), ((None, None),)),))
    key = (dtype, w_dtype, hidden, epsilon, arch, plans_by_tokens)
    with _COMPILE_LOCK:
        if keep_ptx or key not in _COMPILED:
            elem = getattr(cutlass, DTYPES[dtype].cute)
            tokens = cute.sym_int32()
            fake = cute.runtime.make_fake_compact_tensor
            fake_x = fake(elem, (tokens, hidden), stride_order=(1, 0), assumed_align=VECTOR_BYTES)
            fake_y = fake(elem, (tokens, hidden), stride_order=(1, 0), assumed_align=VECTOR_BYTES)
            fake_w = fake(getattr(cutlass, DTYPES[w_dtype].cute), (hidden,), assumed_align=VECTOR_BYTES)
            args = (rms_norm_launch, fake_x, fake_w, fake_y, Int32(1), cute.runtime.make_fake_stream(), schedule,
                    epsilon)
            if keep_ptx:  # CuteDSL also writes the PTX to a file: keep that out of the user's directory
                with tempfile.TemporaryDirectory() as dump_dir:
                    return cute.compile(*args, options=f"--gpu-arch {arch} --keep-ptx --dump-dir {dump_dir}")
            _COMPILED[key] = cute.compile(*args, options=f"--gpu-arch {arch}")
        return _COMPILED[key]


def rms_norm_torch(x: "torch.Tensor", w: "torch.Tensor", epsilon: float = DEFAULT_EPSILON, out=None):
    """The kernel on torch CUDA tensors, on torch's current stream: the same code path without TensorRT."""
    out = torch.empty_like(x) if out is None else out
    kernel = compile_rms_norm(str(x.dtype).removeprefix("torch."), x.shape[-1], epsilon,
                              w_dtype=str(w.dtype).removeprefix("torch."))
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    x2, y2 = x.reshape(-1, x.shape[-1]), out.view(-1, x.shape[-1])
    kernel(from_dlpack(x2, assumed_align=VECTOR_BYTES), from_dlpack(w, assumed_align=VECTOR_BYTES),
           from_dlpack(y2, assumed_align=VECTOR_BYTES), x2.shape[0], stream)
    return out


# %% [4] Zero-copy handoff: TensorRT's raw pointers -> CuTe tensors -------------
#
# TensorRT gives enqueue() plain integers (device addresses). Three hops turn
# one into something the compiled launcher accepts, without copying a byte:
#   1. cupy.cuda.UnownedMemory wraps the address as device memory that cupy
#      must not free (TensorRT owns it); a cupy ndarray gives it shape and dtype.
#   2. torch.as_tensor reads cupy's __cuda_array_interface__ and returns a
#      torch view of the same memory.
#   3. cute.runtime.from_dlpack takes torch's DLPack capsule (with stream=-1,
#      so no cross-stream synchronization is inserted) and returns a CuTe
#      tensor; assumed_align=16 promises the 16-byte alignment the kernel was
#      compiled for (TensorRT allocates plugin I/O with 256-byte alignment;
#      enqueue checks it anyway).
# cupy has no bfloat16 dtype. bf16 data is wrapped as int16 (same width, the
# bits are never interpreted; DTYPES' cupy column) and reinterpreted in torch
# with .view(bfloat16), which changes the dtype tag only.


def cute_tensor_from_pointer(address: int, shape: tuple, dtype: str, device_id: int):
    """Wrap a device address TensorRT owns as a CuTe tensor (no copy, no sync)."""
    if address % VECTOR_BYTES:
        raise ValueError(f"RmsNormPlugin needs {VECTOR_BYTES}-byte aligned buffers, got address {address:#x}")
    names = DTYPES[dtype]
    carrier = np.dtype(names.cupy)
    nbytes = int(np.prod(shape)) * carrier.itemsize
    memory = cp.cuda.UnownedMemory(address, nbytes, owner=None, device_id=device_id)  # hop 1
    array = cp.ndarray(shape, dtype=carrier, memptr=cp.cuda.MemoryPointer(memory, 0))
    view = torch.as_tensor(array, device=f"cuda:{device_id}")                       # hop 2
    if names.cupy != names.torch:
        view = view.view(getattr(torch, names.torch))
    return from_dlpack(view, assumed_align=VECTOR_BYTES)                             # hop 3


# %% [5] The plugin: IPluginV3 with the OneCore / OneBuild / OneRuntime interfaces
#
# TensorRT talks to a V3 plugin through three capability interfaces; a Python
# plugin usually implements all of them on one class and returns itself from
# get_capability_interface. Build time: get_output_data_types,
# get_output_shapes, supports_format_combination, configure_plugin,
# get_workspace_size, get_fields_to_serialize. Run time: the engine's stored
# fields go to the creator, then attach_to_context, on_shape_change, enqueue.

PLUGIN_NAME = "RmsNormPlugin"
PLUGIN_VERSION = "1"      # bump whenever the serialized fields change
PLUGIN_NAMESPACE = ""

if trt is not None:
    _PLUGIN_BASES = (trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime)
    _CREATOR_BASES = (trt.IPluginCreatorV3One,)
else:  # without TensorRT the classes exist but main() never reaches them
    _PLUGIN_BASES = _CREATOR_BASES = (object,)


def trt_dtype(dtype: str):
    """The tensorrt.DataType of one of DTYPES' names."""
    return getattr(trt.DataType, DTYPES[dtype].trt)


def _dtype_name(trt_type, tensor: str, allowed: tuple) -> str:
    """The name in `allowed` of `tensor`'s TensorRT dtype, or raise ValueError saying what is allowed."""
    for dtype in allowed:
        if trt_type == trt_dtype(dtype):
            return dtype
    raise ValueError(f"{PLUGIN_NAME}: {tensor} must be {', '.join(allowed[:-1])} or {allowed[-1]}, got {trt_type}")


class RmsNormPlugin(*_PLUGIN_BASES):
    """y = x / sqrt(mean(x^2) + epsilon) * w over the last axis of X [num_tokens, hidden]."""

    def __init__(self, epsilon: float = DEFAULT_EPSILON):
        for base in _PLUGIN_BASES:
            base.__init__(self)
        self.plugin_name = PLUGIN_NAME
        self.plugin_version = PLUGIN_VERSION
        self.plugin_namespace = PLUGIN_NAMESPACE
        self.num_outputs = 1
        self.epsilon = validate_epsilon(epsilon)
        # trt.PluginField does not own its numpy buffer and TensorRT reads it
        # after get_fields_to_serialize returns: the array lives as long as the plugin.
        self._epsilon_buffer = np.array([self.epsilon], dtype=np.float32)
        self._fields = trt.PluginFieldCollection(
            [trt.PluginField("epsilon", self._epsilon_buffer, trt.PluginFieldType.FLOAT32)]
        )
        # Run-time state of one execution context; never serialized, never shared.
        self._kernel = None      # compiled launcher, set by on_shape_change
        self._io = None          # (X dtype, hidden, W dtype) the kernel was compiled for
        self._device = None
        self._wrapped = {}       # (x, w, y addresses) -> their CuTe tensors (the handoff, done once)
        self._streams = {}       # raw stream handle -> cuda.CUstream

    # -- IPluginV3 / IPluginV3OneCore ------------------------------------------------
    def get_capability_interface(self, type):
        """Build and run time: TensorRT asks for each interface; this class is all three."""
        return self

    def clone(self):
        """Build and run time: a new plugin with the same attributes and empty run-time state."""
        return RmsNormPlugin(self.epsilon)

    # -- IPluginV3OneBuild -------------------------------------------------------------
    def get_output_data_types(self, input_types):
        """Build time (network construction): Y has X's dtype; X and W each fp16, bf16 or fp32."""
        _dtype_name(input_types[0], "X", ACTIVATION_DTYPES)
        _dtype_name(input_types[1], "W", WEIGHT_DTYPES)
        return [input_types[0]]

    def get_output_shapes(self, inputs, shape_inputs, expr_builder):
        """Build time: Y has X's symbolic shape; checks ranks and that hidden is static and matches W."""
        # X may have any rank >= 2 ([batch, seq, hidden] as exported): the kernel sees rows, so every
        # dimension but the last counts tokens (enqueue multiplies them).
        if len(inputs) != 2 or len(inputs[0]) < 2 or len(inputs[1]) != 1:
            raise ValueError(f"{PLUGIN_NAME}: expects X [..., hidden] of rank 2 or more and W [hidden]")
        x_hidden, w_hidden = inputs[0][len(inputs[0]) - 1], inputs[1][0]
        if not x_hidden.is_constant():
            raise ValueError(f"{PLUGIN_NAME}: the hidden dimension of X must be static (it is compiled into the kernel)")
        hidden = x_hidden.get_constant_value()
        if w_hidden.is_constant() and w_hidden.get_constant_value() != hidden:
            raise ValueError(f"{PLUGIN_NAME}: X hidden {hidden} != W size {w_hidden.get_constant_value()}")
        if not 1 <= hidden <= MAX_HIDDEN:
            raise ValueError(f"{PLUGIN_NAME}: hidden must be in [1, {MAX_HIDDEN}], got {hidden}")
        return [trt.DimsExprs(inputs[0])]

    def supports_format_combination(self, pos, in_out, num_inputs):
        """Build time, per I/O slot: linear X and W, each fp16, bf16 or fp32, and a linear Y of X's dtype."""
        desc = in_out[pos].desc
        if desc.format != trt.TensorFormat.LINEAR:
            return False
        if pos == 0:
            return desc.type in [trt_dtype(dtype) for dtype in ACTIVATION_DTYPES]
        if pos == 1:
            return desc.type in [trt_dtype(dtype) for dtype in WEIGHT_DTYPES]
        return desc.type == in_out[0].desc.type

    def configure_plugin(self, inp, out):
        """Build time, once formats and the profile's min/opt/max are chosen: nothing to set up."""

    def get_workspace_size(self, inp, out):
        """Build time: no scratch memory; the reduction lives in registers and shared memory."""
        return 0

    def get_valid_tactics(self):
        """Build time: a single implementation, so no tactics to time."""
        return []

    def set_tactic(self, tactic):
        """Build and run time: nothing to select (see get_valid_tactics)."""

    def get_fields_to_serialize(self):
        """Build time (and on engine save): the only attribute stored in the engine is epsilon."""
        return self._fields

    # -- IPluginV3OneRuntime -----------------------------------------------------------
    def attach_to_context(self, context):
        """Run time, once per execution context: an independent clone owns that context's caches."""
        return self.clone()

    def on_shape_change(self, inp, out):
        """Run time, before the first enqueue and whenever shapes change: compile here, never in enqueue."""
        io = (_dtype_name(inp[0].type, "X", ACTIVATION_DTYPES), inp[0].dims[-1],
              _dtype_name(inp[1].type, "W", WEIGHT_DTYPES))
        if io != self._io:
            dtype, hidden, w_dtype = io
            self._kernel = compile_rms_norm(dtype, hidden, self.epsilon, w_dtype=w_dtype)
            self._io = io
            self._device = torch.cuda.current_device()
            self._wrapped.clear()

    def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
        """Run time, every inference: marshal the pointers and launch on TensorRT's stream."""
        num_tokens = math.prod(input_desc[0].dims[:-1])
        key = (inputs[0], inputs[1], outputs[0])
        tensors = self._wrapped.get(key)
        if tensors is None:  # TensorRT usually reuses a context's buffers: wrap them once
            tensors = self._wrap_buffers(*key, num_tokens)
        cu_stream = self._streams.get(stream)
        if cu_stream is None:
            cu_stream = self._streams[stream] = cuda.CUstream(stream)
        self._kernel(*tensors, num_tokens, cu_stream)

    def _wrap_buffers(self, x_ptr, w_ptr, y_ptr, num_tokens):
        """The three-hop handoff for one set of addresses, cached for later enqueues.

        The launcher reads only the tensors' addresses and dtypes; the row
        count it uses is its num_tokens argument. So the tensors wrapped at
        one token count serve every later count on the same buffers, and a
        shape change costs no new handoff. (A kernel that read mX.shape would
        need num_tokens in this cache's key.)
        """
        dtype, hidden, w_dtype = self._io
        if len(self._wrapped) >= 256:  # addresses that change every call must not grow the cache
            self._wrapped.clear()
        tensors = (
            cute_tensor_from_pointer(x_ptr, (num_tokens, hidden), dtype, self._device),
            cute_tensor_from_pointer(w_ptr, (hidden,), w_dtype, self._device),
            cute_tensor_from_pointer(y_ptr, (num_tokens, hidden), dtype, self._device),
        )
        self._wrapped[(x_ptr, w_ptr, y_ptr)] = tensors
        return tensors


class RmsNormPluginCreator(*_CREATOR_BASES):
    """Makes RmsNormPlugin from fields: at network build time and when an engine is deserialized."""

    def __init__(self):
        for base in _CREATOR_BASES:
            base.__init__(self)
        self.name = PLUGIN_NAME
        self.plugin_version = PLUGIN_VERSION
        self.plugin_namespace = PLUGIN_NAMESPACE
        self._default_epsilon = np.array([DEFAULT_EPSILON], dtype=np.float32)  # kept alive, see RmsNormPlugin
        self.field_names = trt.PluginFieldCollection(
            [trt.PluginField("epsilon", self._default_epsilon, trt.PluginFieldType.FLOAT32)]
        )

    def create_plugin(self, name, field_collection, phase):
        """Build time (network/ONNX import) and run time (engine load): parse and check 'epsilon'."""
        return RmsNormPlugin(parse_epsilon_field(field_collection))


def parse_epsilon_field(field_collection) -> float:
    """Read the one required FLOAT32 field 'epsilon'; raise ValueError naming the problem."""
    fields = {f.name: f for f in field_collection}
    if "epsilon" not in fields:
        raise ValueError(f"{PLUGIN_NAME}: required field 'epsilon' is missing (got {sorted(fields) or 'no fields'})")
    field = fields["epsilon"]
    if field.type != trt.PluginFieldType.FLOAT32:
        raise ValueError(f"{PLUGIN_NAME}: field 'epsilon' must be FLOAT32, got {field.type}")
    raw = np.asarray(field.data)
    values = raw.reshape(-1) if raw.dtype == np.float32 else np.frombuffer(raw.tobytes(), np.uint8)
    if raw.dtype != np.float32 and values.size % 4 == 0:  # some bindings hand over raw bytes
        values = values.view(np.float32)
    if values.dtype != np.float32 or values.size != 1:
        raise ValueError(f"{PLUGIN_NAME}: field 'epsilon' must hold exactly one float32 value, got {raw!r}")
    return validate_epsilon(values[0])


_CREATOR = None


def register_creator():
    """Put the creator in TensorRT's registry (idempotent). Required before building or loading."""
    global _CREATOR
    registry = trt.get_plugin_registry()
    if registry.get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE) is None:
        _CREATOR = RmsNormPluginCreator()  # the registry does not keep the Python object alive
        registry.register_creator(_CREATOR, PLUGIN_NAMESPACE)
    return registry.get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE)


# %% [6] Engine: build with Polygraphy (network API or ONNX), or load a saved one
#
# X [num_tokens, hidden] and W [hidden] are network inputs, so one engine
# normalizes any activations with any weight. num_tokens is dynamic over the
# optimization profile; hidden is static because it is compiled into the
# kernel. The network is strongly typed (TensorRT 11 has no other kind):
# tensor dtypes come from the inputs and get_output_data_types, not from
# builder precision flags.

def _add_io(network, hidden: int, dtype: str, w_dtype: str):
    """The inputs X [-1, hidden] (dtype) and W [hidden] (w_dtype) every network here starts from."""
    x = network.add_input("X", trt_dtype(dtype), (-1, hidden))
    w = network.add_input("W", trt_dtype(w_dtype), (hidden,))
    return x, w


def _mark_y(network, layer):
    y = layer.get_output(0)
    y.name = "Y"
    network.mark_output(y)


def define_plugin_network(network, hidden: int, dtype: str, epsilon: float, w_dtype: str = "float32"):
    """One plugin layer, created through the registry exactly as TensorRT's ONNX parser would.

    Returns the plugin, which the caller keeps until the build is done: TensorRT
    clones it, but holding the original costs nothing and depends on no such detail.
    """
    creator = register_creator()
    eps_field = np.array([epsilon], dtype=np.float32)  # alive until create_plugin has copied it
    fields = trt.PluginFieldCollection([trt.PluginField("epsilon", eps_field, trt.PluginFieldType.FLOAT32)])
    plugin = creator.create_plugin("rms_norm", fields, trt.TensorRTPhase.BUILD)
    x, w = _add_io(network, hidden, dtype, w_dtype)
    _mark_y(network, network.add_plugin_v3([x, w], [], plugin))
    return plugin


def make_onnx_model(hidden: int, dtype: str, epsilon: float, w_dtype: str = "float32", builtin: bool = False) -> bytes:
    """A one-node ONNX model whose op type is the plugin's name: how an exported model reaches the plugin.

    For an op type it does not know, TensorRT's ONNX parser asks the plugin
    registry for a creator named like the op (version and namespace from the
    node's plugin_version / plugin_namespace attributes, default "1" and "")
    and hands every other attribute to create_plugin as a PluginField.
    builtin=True writes ONNX's own RMSNormalization (opset 23) instead, as
    current exporters do, for TensorRT to import with its own layers.
    """
    try:
        from onnx import TensorProto, helper
    except ImportError:
        raise UsageError("--from-onnx and --compare-builtin need the onnx package; install it with "
                         "`pip install onnx`") from None
    elem, w_elem = getattr(TensorProto, DTYPES[dtype].onnx), getattr(TensorProto, DTYPES[w_dtype].onnx)
    if builtin:
        # ONNX gives Y the scale's dtype; the cast returns it to X's, so both engines have the same bindings.
        nodes = [helper.make_node("RMSNormalization", ["X", "W"], ["Y_scaled"], name="rms_norm",
                                  axis=-1, epsilon=float(epsilon), stash_type=1),
                 helper.make_node("Cast", ["Y_scaled"], ["Y"], name="to_x_dtype", to=elem)]
        opset, ir_version = 23, 11  # RMSNormalization arrived in opset 23, which needs IR version 11
    else:
        nodes = [helper.make_node(PLUGIN_NAME, ["X", "W"], ["Y"], name="rms_norm", epsilon=float(epsilon),
                                  plugin_version=PLUGIN_VERSION, plugin_namespace=PLUGIN_NAMESPACE)]
        opset, ir_version = 17, 8
    graph = helper.make_graph(
        nodes, "rms_norm",
        [helper.make_tensor_value_info("X", elem, ["num_tokens", hidden]),
         helper.make_tensor_value_info("W", w_elem, [hidden])],
        [helper.make_tensor_value_info("Y", elem, ["num_tokens", hidden])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model.SerializeToString()


def build_engine(hidden: int, dtype: str, min_tokens: int, opt_tokens: int, max_tokens: int, epsilon: float,
                 source: str = "plugin", w_dtype: str = "float32"):
    """Build an engine: source "plugin" (network API), "onnx" (the plugin through the ONNX parser) or
    "builtin" (TensorRT's own import of ONNX RMSNormalization)."""
    from polygraphy.backend.trt import create_network

    shapes = {"X": tuple((tokens, hidden) for tokens in (min_tokens, opt_tokens, max_tokens))}
    if source != "plugin":
        # The ONNX parser first imports RMSNormalization in TensorRT 10.15 (onnx-tensorrt's changelog).
        stage = "ONNX parse" if source == "onnx" else "ONNX parse (RMSNormalization needs TensorRT 10.15 or newer)"
        model = make_onnx_model(hidden, dtype, epsilon, w_dtype, builtin=source == "builtin")
        return build_onnx_engine(model, shapes, stage)
    with tensorrt_stage("network definition"):
        builder, network = create_network(strongly_typed=True)
        plugin = define_plugin_network(network, hidden, dtype, epsilon, w_dtype)
    engine = build_from_network((builder, network), shapes)
    del plugin  # held until the build is done (see define_plugin_network)
    return engine


def build_onnx_engine(model: bytes, shapes: dict, stage: str = "ONNX parse"):
    """Parse an ONNX model, plugin nodes included, and build it for `shapes`: {input: (min, opt, max)}."""
    from polygraphy.backend.trt import network_from_onnx_bytes

    register_creator()  # the parser looks an op type it does not know up in the registry
    with tensorrt_stage(stage):
        network = network_from_onnx_bytes(model, strongly_typed=True)
    return build_from_network(network, shapes)


def build_from_network(network, shapes: dict):
    """Polygraphy builds the engine with one optimization profile over `shapes`."""
    from polygraphy.backend.trt import CreateConfig, Profile, engine_from_network

    profile = Profile()
    for name, (low, opt, high) in shapes.items():
        profile.add(name, min=low, opt=opt, max=high)
    with tensorrt_stage("engine build"):
        return engine_from_network(network, config=CreateConfig(profiles=[profile]))


def load_engine(path: str):
    """Deserialize an engine; the creator must be registered first, as the engine holds only epsilon.

    TensorRT stores a Python plugin in the engine by name, version, namespace
    and serialized fields; the code lives in this file. That is why trtexec, a
    C++ program with no Python interpreter and no such creator in its registry,
    cannot load the engine: deserialization stops at the unknown plugin.
    """
    from polygraphy.backend.trt import get_trt_logger

    register_creator()
    with open(path, "rb") as f:
        data = f.read()
    engine = trt.Runtime(get_trt_logger()).deserialize_cuda_engine(data) if data else None
    if engine is None:
        raise EngineLoadError(
            f"cannot deserialize engine file '{path}': it is not an engine of this TensorRT version and GPU, "
            f"or it needs a plugin other than {PLUGIN_NAME} v{PLUGIN_VERSION} (whose creator this file "
            "registers first); delete the file to rebuild"
        )
    return engine


# A saved engine is reused only with the flags it was built with. TensorRT
# records the tensors' dtypes and profile but not what a plugin baked in
# (epsilon lives in plugin fields, or in the PTX of the AOT flavor), so a JSON
# record is written beside the engine (PATH.json) with every flag that shaped
# it and a hash of the engine's bytes, and checked before anything is loaded.


def engine_record(args: argparse.Namespace, source: str, plugin: str) -> dict:
    """What shaped an engine: its source (as in build_engine, or "aot"), the plugin it needs, every flag."""
    return {
        "source": source,
        "plugin": plugin,
        "dtype": args.dtype,
        "weight_dtype": args.weight_dtype,
        "hidden": args.hidden_dim,
        "profile": [args.min_tokens, args.opt_tokens, args.max_tokens],
        "epsilon": validate_epsilon(args.epsilon),
    }


def save_engine(path: str, data: bytes, record: dict):
    """Write the engine's bytes to `path` and its record, with their SHA-256, to `path`.json."""
    try:
        with open(path, "wb") as f:
            f.write(data)
        with open(path + ".json", "w") as f:
            json.dump({**record, "sha256": hashlib.sha256(data).hexdigest()}, f, indent=1)
            f.write("\n")
    except OSError as exc:
        raise UsageError(f"cannot save the engine to '{path}' ({exc.strerror})") from None


def check_saved_engine(path: str, record: dict):
    """Raise UsageError unless `path`.json is this engine's record and matches `record` (the current flags)."""
    record_path = path + ".json"
    redo = f"delete '{path}' and '{record_path}' to rebuild"
    try:
        with open(record_path) as f:
            saved = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"engine '{path}' has no record '{record_path}' of the flags it was built with; "
                         f"{redo}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the engine record '{record_path}' ({exc}); {redo}") from None
    if not isinstance(saved, dict) or set(saved) != set(record) | {"sha256"}:
        raise UsageError(f"'{record_path}' is not an engine record written by this sample; {redo}")
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError as exc:
        raise UsageError(f"cannot read the engine '{path}' ({exc.strerror})") from None
    if digest != saved["sha256"]:
        raise UsageError(f"engine '{path}' is not the engine its record '{record_path}' was written for; {redo}")
    differ = [key for key in record if saved[key] != record[key]]
    if differ:
        def show(values):
            return ", ".join(f"{key} {values[key]:g}" if key == "epsilon" else f"{key} {values[key]}"
                             for key in differ)
        raise UsageError(f"engine '{path}' was built for {show(saved)}, not {show(record)}; "
                         f"pass matching flags or {redo}")


@contextlib.contextmanager
def tensorrt_stage(stage: str):
    """Turn any failure inside one TensorRT step into TensorRTError naming the step (main() exits 2).

    TensorRT reports its own errors, including exceptions raised in a plugin's
    callbacks, as log lines ('[E]' through Polygraphy) and then returns None,
    which Polygraphy turns into an exception: that exception says little, the
    log line says why.
    """
    try:
        yield
    except (UsageError, EngineLoadError, TensorRTError):
        raise
    except Exception as exc:
        detail = " ".join(str(exc).split())[:200]
        raise TensorRTError(f"TensorRT failed at the {stage} stage ({type(exc).__name__}: {detail}); "
                            "TensorRT's own message is the '[E]' line in the log above") from exc


# %% [7] Run and check ----------------------------------------------------------
#
# Tolerance. The kernel reads X and W exactly (a 16-bit W is exact in FP32, so
# W's dtype changes nothing here), computes in FP32 and rounds once to Y's
# dtype. In FP32 (u = 2^-24, half an ulp) each of the d roundings on the way
# from a square to the row's sum (the square, the thread's adds, the shuffles,
# the cross-warp adds) adds at most u to the sum's relative error, as all
# terms are positive, and the mean and epsilon add 3 u; the reciprocal square
# root halves that and adds its own 2 ulp (4 u); the two products add 2 u.
# Every plan has d < 72 (tests/test_tolerance.py), so the FP32 result is
# within 43 u of the float64 reference.
# fp16 and bf16: the final rounding, at most half an ulp of Y (2^-11, 2^-8
# relative), dominates; one ulp relative to |ref| (2^-10, 2^-7) bounds both
# while still catching any real error. fp32: nothing rounds afterwards, and
# rtol is 2^-18 (64 u). The absolute term covers results near zero: fp16
# subnormals, and for fp32 no more than a flushed subnormal.
#
# ONNX's RMSNormalization (stash_type=1, what exporters write) rounds twice:
# the normalized value x/rms to X's dtype, then its product with the scale.
# One rounding to a dtype with p fraction bits errs by at most u = 2^-(p+1)
# relative, and the first error, u*|x/rms|, is multiplied by |scale|: u*|y|.
# So TensorRT's import of that op is within 2u*|y| of exact RMSNorm, this
# kernel within u*|y|, and the two engines within 3u*|y| of each other: a user
# comparing them sees Y differ by one ulp at some elements, by definition.
# FP32_NOISE covers the FP32 arithmetic before the rounding (a tree sum of up
# to 32768 squares and a square root: about 20 FP32 roundings, 2^-19.7).

FP32_NOISE = 2.0 ** -18


def rounding_error(dtype: str) -> float:
    """u: the largest relative error of one rounding to `dtype`, 2^-(fraction bits + 1)."""
    return torch.finfo(getattr(torch, DTYPES[dtype].torch)).eps / 2


def onnx_tolerance(dtype: str) -> float:
    """Relative bound of ONNX RMSNormalization (two roundings) against exact RMSNorm."""
    u = rounding_error(dtype)
    return 2 * u + u * u + FP32_NOISE


def engines_tolerance(dtype: str, magnitude, scale):
    """Largest |this kernel - ONNX RMSNormalization| where exact RMSNorm is `magnitude`: three roundings.

    The absolute term is the subnormal range, where each rounding errs by half
    the subnormal spacing instead of relatively (the first one times |scale|).
    """
    u, finfo = rounding_error(dtype), torch.finfo(getattr(torch, DTYPES[dtype].torch))
    return (3 * u + u * u + 2 * FP32_NOISE) * magnitude + finfo.tiny * finfo.eps * (1 + np.abs(scale))


def make_inputs(num_tokens: int, hidden: int, dtype: str, seed: int, w_dtype: str = "float32"):
    """Random X (rounded to dtype) and W (rounded to w_dtype), deterministic in seed, on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen).to(getattr(torch, DTYPES[dtype].torch))
    w = (torch.rand(hidden, generator=gen) * 2.0 - 0.5).to(getattr(torch, DTYPES[w_dtype].torch))
    return x, w


def check_output(y: np.ndarray, x: np.ndarray, w: np.ndarray, epsilon: float, dtype: str, rtol=None):
    """(all within tolerance, max abs error) of y against the float64 reference; rtol: DTYPES[dtype]'s."""
    ref = rms_norm_reference(x, w, epsilon)
    err = np.abs(y.astype(np.float64) - ref)
    rtol = DTYPES[dtype].rtol if rtol is None else rtol
    ok = bool(np.all(np.isfinite(y)) and np.all(err <= DTYPES[dtype].atol + rtol * np.abs(ref)))
    return ok, float(np.max(err, initial=0.0))


def bind_io(context, x, w, y):
    """Set X's shape in `context` and point X, W and Y at these torch CUDA tensors (no copies)."""
    context.set_input_shape("X", tuple(x.shape))
    for name, tensor in (("X", x), ("W", w), ("Y", y)):
        context.set_tensor_address(name, tensor.data_ptr())


def run_and_check(engine, token_counts, hidden, dtype, epsilon, seed, w_dtype="float32", rtol=None) -> bool:
    """Run each token count through one execution context and compare with NumPy (rtol: see check_output).

    The context runs on torch's buffers and a torch stream, as in time_engine, so
    no CUDA runtime library has to be found: Polygraphy's TrtRunner looks for
    libcudart in places where a pip-installed CUDA 13 does not put it.
    """
    context = engine.create_execution_context()
    stream = torch.cuda.Stream()
    all_ok = True
    for i, n in enumerate(token_counts):
        x, w = make_inputs(n, hidden, dtype, seed + i, w_dtype)
        xd, wd = x.cuda(), w.cuda()
        yd = torch.full_like(xd, float("nan"))  # an element the engine leaves unwritten fails the check
        bind_io(context, xd, wd, yd)
        torch.cuda.synchronize()  # the uploads ran on torch's stream, TensorRT reads on `stream`
        if not context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError(f"TensorRT could not run the engine at {n} tokens; its log above says why")
        stream.synchronize()
        ok, err = check_output(yd.float().cpu().numpy(), x.float().numpy(), w.float().numpy(), epsilon, dtype,
                               rtol)
        print(f"  tokens={n:<5d} max |y - ref| = {err:.3e}  {'ok' if ok else 'MISMATCH'}")
        all_ok &= ok
    return all_ok


# %% [8] The plugin against TensorRT's own layers ----------------------------------
#
# A plugin is worth keeping only if it beats what TensorRT builds from its
# own layers. Both engines run the same inputs on one stream; CUDA events
# around many execute_async_v3 calls measure what an application sees per
# call, which for a Python plugin includes the Python enqueue on the host.


def time_engine(engine, tokens: int, hidden: int, dtype: str, w_dtype: str, iterations: int = 500) -> float:
    """Microseconds per execute_async_v3 call at `tokens`, after warm-up."""
    context = engine.create_execution_context()
    x, w = make_inputs(tokens, hidden, dtype, 0, w_dtype)
    x, w = x.cuda(), w.cuda()
    y = torch.empty_like(x)
    bind_io(context, x, w, y)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    for _ in range(20):
        context.execute_async_v3(stream.cuda_stream)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(iterations):
        context.execute_async_v3(stream.cuda_stream)
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iterations


def compare_engines(plugin_engine, builtin_engine, token_counts, hidden: int, dtype: str, w_dtype: str):
    """Print per-call time of both engines at each token count and which one to deploy."""
    ratios = []
    for n in token_counts:
        ours = time_engine(plugin_engine, n, hidden, dtype, w_dtype)
        theirs = time_engine(builtin_engine, n, hidden, dtype, w_dtype)
        ratios.append(ours / theirs)
        print(f"  tokens={n:<5d} plugin {ours:8.2f} us   built-in layers {theirs:8.2f} us   plugin / built-in {ratios[-1]:.2f}")
    if all(r < 1 for r in ratios):
        verdict = "deploy the plugin: it is faster at every profiled shape"
    elif all(r > 1 for r in ratios):
        verdict = "deploy TensorRT's built-in layers: they are faster at every profiled shape"
    else:
        verdict = "mixed: the plugin wins only at some shapes; measure at your real token counts"
    print(f"For these shapes: {verdict}.")


# %% [9] Command line: check, build or load, run ----------------------------------


def token_counts(args) -> list:
    """The main run first, then the profile's edges and an odd count, without repeats."""
    odd = 37 if args.min_tokens <= 37 <= args.max_tokens else args.max_tokens - 1
    candidates = (args.num_tokens, args.min_tokens, args.max_tokens, odd)
    return list(dict.fromkeys(c for c in candidates if c >= args.min_tokens))


def check_environment() -> str:
    """Raise UsageError unless a usable GPU, TensorRT and Polygraphy are present; return the GPU's compile target."""
    if not torch.cuda.is_available():
        raise UsageError("no CUDA GPU is visible; this sample needs an NVIDIA GPU of compute capability 8.0 or newer")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        raise UsageError(
            f"{torch.cuda.get_device_name()} has compute capability {major}.{minor}; "
            "the CuteDSL kernel needs 8.0 (Ampere) or newer"
        )
    if trt is None:
        raise UsageError(import_error_message(ModuleNotFoundError(name="tensorrt")))
    try:
        import polygraphy.backend.trt  # noqa: F401
    except ImportError as exc:
        raise UsageError(import_error_message(exc)) from None
    return gpu_arch()


def main(args: argparse.Namespace) -> int:
    """Exit code 0 every run matched NumPy, 1 one did not, 2 usage, environment or TensorRT error."""
    try:
        if args.from_onnx:  # a model path: the lesson continues in rms_norm_onnx_model.py
            sys.modules.setdefault("rms_norm_plugin_cutedsl", sys.modules[__name__])  # it imports this run's module
            try:
                from rms_norm_onnx_model import check_model
            except ModuleNotFoundError as exc:
                raise UsageError(f"--from-onnx MODEL.onnx needs the {exc.name} package; install it with "
                                 f"`pip install {exc.name}`") from None

            correct = check_model(args)
            print("Inference result correct!" if correct else "Inference result incorrect!")
            return EXIT_CORRECT if correct else EXIT_INCORRECT
        reuse = bool(args.engine) and os.path.exists(args.engine)
        source = "onnx" if args.from_onnx is not None else "plugin"
        record = engine_record(args, source, f"{PLUGIN_NAME} v{PLUGIN_VERSION}")
        if reuse:
            check_saved_engine(args.engine, record)
        arch = check_environment()
        if reuse:
            with tensorrt_stage("engine load"):
                engine = load_engine(args.engine)
            print(f"Loaded engine from {args.engine}")
        else:
            engine = build_engine(
                args.hidden_dim, args.dtype, args.min_tokens, args.opt_tokens, args.max_tokens, args.epsilon,
                source=source, w_dtype=args.weight_dtype,
            )
            if args.engine:
                save_engine(args.engine, engine.serialize(), record)
                print(f"Saved engine to {args.engine} and its record to {args.engine}.json")

        counts = token_counts(args)  # all through one execution context
        print(f"RMSNorm {args.dtype}, hidden {args.hidden_dim}, W {args.weight_dtype}, epsilon {args.epsilon:g}, "
              f"profile [{args.min_tokens}, {args.max_tokens}] opt {args.opt_tokens}")
        schedule = token_schedule(args.hidden_dim, DTYPES[args.dtype].bytes, is_sm90(arch))
        for plan, counts in schedule:  # the plan the kernel was compiled with, for each range of token counts
            spans = ", ".join(f"{(fewer or 0) + 1}-{most or ''}" for fewer, most in counts)
            print(plan.describe() if len(schedule) == 1 else f"{spans} tokens: {plan.describe()}")
        with tensorrt_stage("execution context"):
            correct = run_and_check(engine, counts, args.hidden_dim, args.dtype, args.epsilon, args.seed,
                                    args.weight_dtype)
        if args.compare_builtin:
            print("TensorRT's own import of ONNX RMSNormalization (two roundings, see [7]):")
            builtin = build_engine(args.hidden_dim, args.dtype, args.min_tokens, args.opt_tokens, args.max_tokens,
                                   args.epsilon, source="builtin", w_dtype=args.weight_dtype)
            with tensorrt_stage("execution context"):
                correct &= run_and_check(builtin, counts, args.hidden_dim, args.dtype, args.epsilon, args.seed,
                                         args.weight_dtype, onnx_tolerance(args.dtype))
                compare_engines(engine, builtin, (args.min_tokens, args.opt_tokens, args.max_tokens),
                                args.hidden_dim, args.dtype, args.weight_dtype)
    except (UsageError, EngineLoadError, TensorRTError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print("Inference result correct!" if correct else "Inference result incorrect!")
    return EXIT_CORRECT if correct else EXIT_INCORRECT


if __name__ == "__main__":
    sys.exit(main(ARGS))
