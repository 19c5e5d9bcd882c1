#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The same CuteDSL RMSNorm, embedded ahead of time: an engine that runs without Python.

A Python ``IPluginV3`` (rms_norm_plugin_cutedsl.py) calls back into Python on
every inference, and its engine loads only in a Python process that registered
the creator: not in ``trtexec``, a C++ application or a C++ inference server.
TensorRT's quickly deployable plugins (``tensorrt.plugin``, TensorRT >= 10.9)
take an ahead-of-time implementation instead: ``@trtp.aot_impl`` returns a
kernel name, its PTX, launch dimensions and symbolic extra arguments, and
TensorRT embeds the PTX in the engine and launches it itself. This file does
that with the CuteDSL kernel of rms_norm_fused_cutedsl.py, the lesson's
extended by import, and a dynamic token count.

What you will learn
-------------------
* How the kernel's parameter list is made to match TensorRT's AOT calling
  convention by construction (see ``fused_rms_norm_kernel``: X, W,
  num_tokens, Y; with --residual, X, R, W, num_tokens, Y, S).
* How to pick the PTX ISA version so the deployment driver can load it.
* How to register a QDP op with an AOT implementation and build, run and save
  an engine that ``trtexec`` loads without this file.

Which flavor to choose
----------------------
Python plugin: prototyping, any Python in ``enqueue``, runtime-compiled for the
exact GPU. AOT plugin: deployment, ``trtexec``, C++ and Triton; no Python at
run time and no per-call Python cost. Both run the same kernel.

How to run it (TensorRT >= 10.9, SM80+ GPU)
-------------------------------------------
    python3 rms_norm_aot_cutedsl.py --engine rms_norm_aot.engine
    trtexec --loadEngine=rms_norm_aot.engine --shapes=X:128x1024
    python3 rms_norm_aot_cutedsl.py --residual --engine add_rms_norm_aot.engine
    trtexec --loadEngine=add_rms_norm_aot.engine --shapes=X:128x1024,R:128x1024
    python3 rms_norm_aot_cutedsl.py --y-scale 0.05    # Y as FP8 E4M3 (sm_89+)

Exit codes as in rms_norm_plugin_cutedsl.py: 0 correct, 1 incorrect, 2 usage
or environment error.
"""

# No `from __future__ import annotations`: tensorrt.plugin inspects the
# annotations of the functions below as real types.
import dataclasses
import re
import sys

# The run lives in the lesson, the kernel, its plans and the forms' flags in the fused companion,
# and the engine record in rms_norm_saved_engine.py.
try:
    import rms_norm_plugin_cutedsl as lesson
    import rms_norm_fused_cutedsl as fused
    import rms_norm_saved_engine as saved
except ImportError as exc:  # the lesson's ImportError names the missing pip package in one sentence
    if __name__ != "__main__":
        raise
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
from rms_norm_plugin_cutedsl import UsageError

OP_NAME = "rms_norm_cutedsl::rms_norm"
# The residual form, a second op: (X, R, W) -> (Y, S = X + R), S rounded to X's dtype.
FUSED_OP_NAME = "rms_norm_cutedsl::add_rms_norm"
# The FP8 form of each: Y is FP8 E4M3 of y / y_scale (S stays in X's dtype).
FP8_OP_NAME = "rms_norm_cutedsl::rms_norm_fp8"
FUSED_FP8_OP_NAME = "rms_norm_cutedsl::add_rms_norm_fp8"


def op_name(residual: bool, fp8: bool = False) -> str:
    """The op of the plain or the residual form, with Y in X's dtype or in FP8."""
    if fp8:
        return FUSED_FP8_OP_NAME if residual else FP8_OP_NAME
    return FUSED_OP_NAME if residual else OP_NAME


# %% [1] The PTX TensorRT embeds ------------------------------------------------
#
# TensorRT hands the embedded PTX to the driver, and a driver refuses PTX whose
# ISA version is newer than it knows (CUDA_ERROR_UNSUPPORTED_PTX_VERSION).
# CuteDSL declares the ISA of the CUDA it was built with, which can be newer
# than the deployment driver (its CUDA 13 build's ".version 9.4" was refused by
# a CUDA 13.0 driver). The kernel needs nothing newer than the ISA that
# introduced its target, so the PTX is rewritten to that version (never below
# 8.0, CUDA 12.0); the CPU tests let ptxas confirm the kernel assembles at
# exactly these versions, and the GPU test loads it into a real driver.

# 8.0 needs a driver of R525 (CUDA 12.0) or newer; 8.6 and 8.7 (Blackwell) R570 or newer.
AOT_PTX_ISA = {"sm_80": "8.0", "sm_86": "8.0", "sm_89": "8.0", "sm_90a": "8.0", "sm_100a": "8.6",
               "sm_120a": "8.7"}
# The FP8 form's cvt to E4M3 came with ISA 7.8 for sm_90 but only with 8.1 (R530) for
# sm_89: ptxas refuses it there at 8.0. sm_80 and sm_86 have no FP8 conversion at all.
AOT_FP8_PTX_ISA = {"sm_89": "8.1", "sm_90a": "8.0", "sm_100a": "8.6", "sm_120a": "8.7"}


def check_aot_arch(arch: str, fp8: bool = False):
    """Raise UsageError unless the AOT flavor has a PTX version for `arch`, in the FP8 form too."""
    if arch not in AOT_PTX_ISA:
        supported = ", ".join(AOT_PTX_ISA)
        raise UsageError(f"no AOT PTX version is chosen for {arch}; supported: {supported}")
    if fp8 and arch not in AOT_FP8_PTX_ISA:
        raise UsageError(f"the FP8 form (--y-scale) needs sm_89 or newer, which convert to FP8 "
                         f"in hardware, got {arch}")


# A kernel gets more than 48 KB of dynamic shared memory only once its launcher
# opts it in (cuFuncSetAttribute), and tensorrt.plugin's KernelLaunchParams
# offer no such setting: the AOT kernel asks for at most 48 KB, which any
# launch gets. The plain form's staged rows stay below it; the residual form
# stages R too, and where the two no longer fit, its rows stay in registers,
# the remedy the companion's own table_plan takes where staged rows do not fit
# a CTA.
AOT_SHARED_BYTES = 48 * 1024


def aot_plan(hidden: int, elem_bytes: int, residual: bool = False):
    """The AOT kernel's one plan: the many-token plan without a cluster or bulk copy (every
    GPU from sm_80), its rows in registers where staging them would pass AOT_SHARED_BYTES."""
    plan = fused.plan_kernel(hidden, elem_bytes, sm90=False, residual=residual)
    if shared_memory_bytes(plan) > AOT_SHARED_BYTES:
        # Rows in registers hold more through the reduction: fit the plan to them again.
        in_registers = dataclasses.replace(plan, arrival="registers")
        plan = lesson.fit_registers(in_registers, fused.FIT_STEPS)
    return plan


def aot_kernel(dtype: str, hidden: int, epsilon: float, arch: str, w_dtype: str = "float32",
               residual: bool = False, y_scale: float | None = None):
    """(kernel name, PTX, plan) of the companion's kernel compiled for `arch`, epsilon baked in.

    One plan alone (aot_plan): an AOT implementation gives TensorRT one kernel for every
    token count, launched with a grid and a block only. residual: the fused form, PTX
    parameters (X, R, W, num_tokens, Y, S). y_scale: the FP8 form, baked in as epsilon is;
    the parameters stay the same, Y pointing at FP8.
    """
    fp8 = y_scale is not None
    check_aot_arch(arch, fp8)
    plan = aot_plan(hidden, lesson.DTYPES[dtype].bytes, residual)
    # compile_launcher, not compile_rms_norm: the latter plans without the 48 KB rule above.
    schedule = ((plan, ((None, None),)),)
    epsilon = lesson.validate_epsilon(epsilon)
    if fp8:
        y_scale = fused.validate_y_scale(y_scale)
    compiled = fused.compile_launcher(schedule, dtype, w_dtype, epsilon, arch, True, y_scale)
    isa = AOT_FP8_PTX_ISA[arch] if fp8 else AOT_PTX_ISA[arch]
    ptx = re.sub(r"^\.version \d+\.\d+$", f".version {isa}", compiled.__ptx__, count=1, flags=re.M)
    (name,) = re.findall(r"^\.visible \.entry (\w+)\(", ptx, flags=re.M)
    return name, ptx, plan


def shared_memory_bytes(plan) -> int:
    """The dynamic shared memory the kernel allocates for a plan without a cluster or bulk copy
    (what this flavor compiles): the staged rows (stage_rows: X, then R in the residual form,
    num_row_inputs of them), then one FP32 sum per warp of each row slot, in as many sets as the
    CTA has rows in sequence, up to two (row_sum_buffers). A CPU test holds it to CuteDSL's own
    count."""
    row_bytes = plan.cta_rows * plan.hidden * plan.elem_bytes
    staged = row_bytes * plan.num_row_inputs if plan.arrival != "registers" else 0
    sums = 0
    if plan.warps_per_row > 1:
        sums = 4 * plan.warps_per_row * plan.rows_per_cta * min(2, plan.rows_in_sequence)
    return staged + sums


def aot_launch_dims(plan, num_tokens):
    """(grid_x, block_x, dynamic shared memory bytes) for `num_tokens` rows; works on ints and
    TensorRT's symbols.

    These must equal what launch_kernel uses for this plan: the PTX requires exactly
    plan.cta_threads threads (.reqntid), and its shared memory is dynamic, so TensorRT must be
    told its size.
    """
    return plan.grid(num_tokens), plan.cta_threads, shared_memory_bytes(plan)


# %% [2] The QDP ops: shape/dtype inference, formats, AOT implementation ------
#
# Registered inside a function, so importing this file does no work and does
# not need tensorrt. Attributes of an AOT plugin are not stored in the engine
# (only the PTX is), and AOT extra arguments are symbolic int32 values, so
# epsilon cannot be a kernel argument: it is baked into the PTX, which is
# exactly what the companion's kernel does anyway (see compile_rms_norm).
#
# epsilon is a one-element float32 array, not a Python float: tensorrt.plugin
# 10.9-11.1 turns a float attribute back with float(array), which NumPy 2.4
# refuses (fixed in 11.2); arrays take another path that works on every
# version, and float32 is what the kernel uses anyway.
#
# TensorRT passes *every* registered attribute to aot_impl, positionally and
# in registration order, so the attributes after the tensors must be the same
# list, in the same order, in the three functions of each op below.
#
# The residual form is an op of its own, not an attribute of one op: an op's
# inputs and outputs are fixed by the signature tensorrt.plugin reads. The FP8
# form is one too, since Y's dtype must not depend on an attribute's value; its
# y_scale is a float32 array baked into the PTX, for epsilon's reasons.

_REGISTERED = False


def register_aot_op(arch: str):
    """Register both ops with tensorrt.plugin (idempotent); `arch`: the GPU the PTX is made for."""
    global _REGISTERED
    if _REGISTERED:
        return
    from typing import List, Tuple, Union

    import numpy as np
    import numpy.typing as npt
    import tensorrt as trt
    import tensorrt.plugin as trtp

    names = {getattr(trt.DataType, row.trt): name for name, row in lesson.DTYPES.items()}
    Epsilon = npt.NDArray[np.float32]  # see above: an array attribute, not a float
    YScale = npt.NDArray[np.float32]  # the same, for the FP8 form's scale
    AotResult = Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymExprs]

    def aot_result(op: str, x, w, epsilon, r=None, y_scale=None) -> AotResult:
        """What aot_impl returns at build time per dtype combination: kernel name, PTX,
        launch dims, extra args. r: R's desc in the residual form; y_scale: the FP8 form's."""
        hidden_expr = x.shape_expr[1]
        if not hidden_expr.is_constant:
            raise ValueError(f"{op}: the hidden dimension must be static "
                             "(it is compiled into the kernel)")
        # is_constant is a property but constant_value() a method (tensorrt.plugin's ShapeExpr).
        hidden = hidden_expr.constant_value()
        if r is not None:  # the kernel reads R with X's row layout
            r_hidden = r.shape_expr[len(r.shape_expr) - 1]
            same = r_hidden.is_constant and r_hidden.constant_value() == hidden
            if len(r.shape_expr) != 2 or not same:
                raise ValueError(f"{op}: R must have X's shape [num_tokens, {hidden}]")
        scale = None if y_scale is None else float(y_scale[0])
        name, ptx, plan = aot_kernel(names[x.dtype], hidden, float(epsilon[0]), arch,
                                     names[w.dtype], residual=r is not None, y_scale=scale)
        num_tokens = x.shape_expr[0]
        grid, block, smem = aot_launch_dims(plan, num_tokens)
        launch = trtp.KernelLaunchParams()
        launch.grid_x = grid
        launch.block_x = int(block)
        launch.shared_mem = int(smem)
        # The kernel's parameters are (X, W, num_tokens, Y), or (X, R, W, num_tokens, Y, S):
        # TensorRT passes the input pointers, then these extra arguments, then the output pointers.
        extra = trtp.SymIntExprs(1)
        extra[0] = trtp.SymInt32(num_tokens)
        return name, ptx, launch, extra

    @trtp.register(OP_NAME)
    def rms_norm_desc(x: trtp.TensorDesc, w: trtp.TensorDesc, epsilon: Epsilon) -> trtp.TensorDesc:
        """Y has X's shape and dtype."""
        return x.like()

    @trtp.autotune(OP_NAME)
    def rms_norm_formats(x: trtp.TensorDesc, w: trtp.TensorDesc, epsilon: Epsilon,
                         outputs: Tuple[trtp.TensorDesc]) -> List[trtp.AutoTuneCombination]:
        """X and Y fp16, bf16 or fp32, of one dtype ('|' ties them), times W fp32, fp16 or bf16
        ('*': any), linear."""
        io_types = "FP16|BF16|FP32, FP32*FP16*BF16, FP16|BF16|FP32"
        return [trtp.AutoTuneCombination(io_types, "LINEAR")]

    @trtp.aot_impl(OP_NAME)
    def rms_norm_aot(x: trtp.TensorDesc, w: trtp.TensorDesc, epsilon: Epsilon,
                     outputs: Tuple[trtp.TensorDesc], tactic: int) -> AotResult:
        """Called at build time per dtype combination: the kernel name, its PTX, launch dims,
        extra args."""
        return aot_result(OP_NAME, x, w, epsilon)

    @trtp.register(FUSED_OP_NAME)
    def add_rms_norm_desc(x: trtp.TensorDesc, r: trtp.TensorDesc, w: trtp.TensorDesc,
                          epsilon: Epsilon) -> Tuple[trtp.TensorDesc, trtp.TensorDesc]:
        """Y and S have X's shape and dtype."""
        return x.like(), x.like()

    @trtp.autotune(FUSED_OP_NAME)
    def add_rms_norm_formats(x: trtp.TensorDesc, r: trtp.TensorDesc, w: trtp.TensorDesc,
                             epsilon: Epsilon, outputs: Tuple[trtp.TensorDesc]
                             ) -> List[trtp.AutoTuneCombination]:
        """X, R, Y and S of one dtype, fp16, bf16 or fp32, times any W, as the plain op; linear."""
        rows = "FP16|BF16|FP32"
        io_types = f"{rows}, {rows}, FP32*FP16*BF16, {rows}, {rows}"
        return [trtp.AutoTuneCombination(io_types, "LINEAR")]

    @trtp.aot_impl(FUSED_OP_NAME)
    def add_rms_norm_aot(x: trtp.TensorDesc, r: trtp.TensorDesc, w: trtp.TensorDesc,
                         epsilon: Epsilon, outputs: Tuple[trtp.TensorDesc], tactic: int
                         ) -> AotResult:
        """As rms_norm_aot, for the residual form's kernel."""
        return aot_result(FUSED_OP_NAME, x, w, epsilon, r)

    def fp8_desc(x: trtp.TensorDesc) -> trtp.TensorDesc:
        """Y of an FP8 op: X's shape, FP8's dtype (like() returns a desc whose dtype may be set)."""
        y = x.like()
        y.dtype = trt.DataType.FP8
        return y

    @trtp.register(FP8_OP_NAME)
    def rms_norm_fp8_desc(x: trtp.TensorDesc, w: trtp.TensorDesc, epsilon: Epsilon,
                          y_scale: YScale) -> trtp.TensorDesc:
        """Called when the network is built: Y has X's shape, in FP8."""
        return fp8_desc(x)

    @trtp.autotune(FP8_OP_NAME)
    def rms_norm_fp8_formats(x: trtp.TensorDesc, w: trtp.TensorDesc, epsilon: Epsilon,
                             y_scale: YScale, outputs: Tuple[trtp.TensorDesc]
                             ) -> List[trtp.AutoTuneCombination]:
        """Called by the builder: X and W as the plain op's, Y always FP8; linear."""
        return [trtp.AutoTuneCombination("FP16|BF16|FP32, FP32*FP16*BF16, FP8", "LINEAR")]

    @trtp.aot_impl(FP8_OP_NAME)
    def rms_norm_fp8_aot(x: trtp.TensorDesc, w: trtp.TensorDesc, epsilon: Epsilon,
                         y_scale: YScale, outputs: Tuple[trtp.TensorDesc], tactic: int
                         ) -> AotResult:
        """Called at build time per dtype combination: as rms_norm_aot, y_scale baked in."""
        return aot_result(FP8_OP_NAME, x, w, epsilon, y_scale=y_scale)

    @trtp.register(FUSED_FP8_OP_NAME)
    def add_rms_norm_fp8_desc(x: trtp.TensorDesc, r: trtp.TensorDesc, w: trtp.TensorDesc,
                              epsilon: Epsilon, y_scale: YScale
                              ) -> Tuple[trtp.TensorDesc, trtp.TensorDesc]:
        """Called when the network is built: Y in FP8, S in X's dtype, both X's shape."""
        return fp8_desc(x), x.like()

    @trtp.autotune(FUSED_FP8_OP_NAME)
    def add_rms_norm_fp8_formats(x: trtp.TensorDesc, r: trtp.TensorDesc, w: trtp.TensorDesc,
                                 epsilon: Epsilon, y_scale: YScale,
                                 outputs: Tuple[trtp.TensorDesc]
                                 ) -> List[trtp.AutoTuneCombination]:
        """Called by the builder: X, R and S of one dtype, any W, Y always FP8; linear."""
        rows = "FP16|BF16|FP32"
        io_types = f"{rows}, {rows}, FP32*FP16*BF16, FP8, {rows}"
        return [trtp.AutoTuneCombination(io_types, "LINEAR")]

    @trtp.aot_impl(FUSED_FP8_OP_NAME)
    def add_rms_norm_fp8_aot(x: trtp.TensorDesc, r: trtp.TensorDesc, w: trtp.TensorDesc,
                             epsilon: Epsilon, y_scale: YScale,
                             outputs: Tuple[trtp.TensorDesc], tactic: int) -> AotResult:
        """Called at build time per dtype combination: as add_rms_norm_aot, y_scale baked in."""
        return aot_result(FUSED_FP8_OP_NAME, x, w, epsilon, r, y_scale)

    _REGISTERED = True


def build_aot_engine(hidden: int, dtype: str, min_tokens: int, opt_tokens: int, max_tokens: int,
                     epsilon: float, w_dtype: str = "float32", residual: bool = False,
                     y_scale: float | None = None):
    """An engine whose only layer is the AOT op: TensorRT embeds the PTX and launches it itself.

    Its tensors are named as the companion's (io_names): X, W -> Y, or with `residual`
    X, R, W -> Y, S. y_scale: the FP8 op, Y in FP8 E4M3.
    """
    import numpy as np
    import tensorrt as trt
    import tensorrt.plugin as trtp
    from polygraphy.backend.trt import create_network

    arch = lesson.gpu_arch()
    # Refused before TensorRT calls aot_impl, where an error is only a log line.
    check_aot_arch(arch, fp8=y_scale is not None)
    register_aot_op(arch)
    builder, network = create_network(strongly_typed=True)
    input_names, output_names = fused.io_names(residual)
    x_type = getattr(trt.DataType, lesson.DTYPES[dtype].trt)
    w_type = getattr(trt.DataType, lesson.DTYPES[w_dtype].trt)
    inputs = [network.add_input(name, w_type, (hidden,)) if name == "W"
              else network.add_input(name, x_type, (-1, hidden)) for name in input_names]
    eps = np.array([epsilon], dtype=np.float32)  # see [2]: an array attribute, not a float
    attrs = {"epsilon": eps}
    if y_scale is not None:
        attrs["y_scale"] = np.array([y_scale], dtype=np.float32)
    # trtp.op.rms_norm_cutedsl.<name>: the op registered as "rms_norm_cutedsl::<name>".
    op = getattr(trtp.op.rms_norm_cutedsl, op_name(residual, y_scale is not None).split("::")[1])
    layer = network.add_plugin(op(*inputs, **attrs), aot=True)
    for i, name in enumerate(output_names):
        output = layer.get_output(i)
        output.name = name
        network.mark_output(output)
    rows = tuple((n, hidden) for n in (min_tokens, opt_tokens, max_tokens))
    shapes = {name: rows for name in input_names if name != "W"}
    return lesson.build_from_network((builder, network), shapes)


def check_aot_support():
    """Raise UsageError unless this TensorRT can build AOT plugins (tensorrt.plugin.aot_impl,
    TensorRT 10.9+)."""
    import tensorrt as trt

    try:
        import tensorrt.plugin as trtp
    except ImportError:
        trtp = None
    if not hasattr(trtp, "aot_impl"):  # tensorrt.plugin arrived in 10.6, its AOT half in 10.9
        raise UsageError(f"TensorRT {trt.__version__} has no ahead-of-time plugins "
                         "(tensorrt.plugin.aot_impl); the AOT flavor needs TensorRT 10.9 or newer")


# %% [3] Command line -----------------------------------------------------------


def trtexec_command(args) -> str:
    """The trtexec line that runs the saved engine at --num-tokens: trtexec needs the shape of every
    dynamic input, X and, in the residual form, R."""
    rows = [name for name in fused.io_names(args.residual)[0] if name != "W"]
    shapes = ",".join(f"{name}:{args.num_tokens}x{args.hidden_dim}" for name in rows)
    return f"trtexec --loadEngine={args.engine} --shapes={shapes}"


def main(argv=None) -> int:
    """Exit codes as in rms_norm_plugin_cutedsl.py: 0 correct, 1 incorrect, 2 usage, environment
    or TensorRT error."""
    parser = fused.make_parser("Build a TensorRT engine with the CuteDSL RMSNorm embedded ahead of "
                               "time, run it and check it against NumPy.")
    parser.add_argument("--engine", metavar="PATH",
                        help="load the engine from PATH if it exists (checked against PATH.json, "
                             "the record of the flags it was built with), else build it and save "
                             "both there")
    args = fused.validate_args(parser, parser.parse_args(argv))
    if args.from_onnx:
        parser.error("--from-onnx builds the Python plugin's engine; this flavor builds its own "
                     "AOT op")
    plan = aot_plan(args.hidden_dim, lesson.DTYPES[args.dtype].bytes, args.residual)
    if args.plans:
        print(f"every token count: {plan.describe()}")
        return lesson.EXIT_CORRECT
    record = saved.engine_record(args, "aot", op_name(args.residual, args.y_scale is not None))
    data = saved.check_engine_flag(parser, args, record) if args.engine is not None else None

    def build(args):
        # The build itself names its own stage.
        with lesson.tensorrt_stage("network definition"):
            return build_aot_engine(args.hidden_dim, args.dtype, args.min_tokens, args.opt_tokens,
                                    args.max_tokens, args.epsilon, args.weight_dtype,
                                    args.residual, args.y_scale)

    def make_engine(args):
        # Before TensorRT is asked anything, whether the engine is built or loaded.
        if args.y_scale is not None and fused.fp8_refusal():
            raise UsageError(fused.fp8_refusal())
        check_aot_support()
        print(f"AOT kernel, every token count: {plan.describe()}")
        if args.engine is None:
            return build(args)
        engine = saved.load_or_build(args, record, build, data)
        print(f"Run it without Python: {trtexec_command(args)}")
        return engine

    return lesson.run(args, make_engine, fused.check_engine, fused.form_title(args))


if __name__ == "__main__":
    sys.exit(main())
