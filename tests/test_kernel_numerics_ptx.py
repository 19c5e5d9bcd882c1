"""CPU: the sum of squares and the scaling by W are computed in FP32, read from the PTX's data flow.

The PTX of both kernels (the lesson's plan, and every plan of the companion's sm_90a launcher) is
compiled without a GPU, each plan alone, for X x W dtype combinations. Starting
from the value the first warp shuffle exchanges (a thread's partial sum), every
instruction it depends on is followed back to the loads of X. On that backward
slice, each add, multiply and fma must be an .f32 operation, and the squares
must be f32 products of values converted from fp16/bf16 (or, for fp32 X, of
the loaded values themselves): a kernel that squared or summed in fp16/bf16 and
converted afterwards would show .f16/.bf16 arithmetic there (and a looser test
that only looks for some .f32 instruction anywhere in the kernel would miss it).

The same walk back from the values stored to Y covers Step 5: W is converted
to FP32 (a 16-bit W by cvt.f32), every product is .f32, and the only rounding
to a 16-bit type is the final one to Y's dtype (none for fp32 Y).

X and W are each loaded and converted on their own, so each plan is compiled for three pairs that
between them convert every X dtype and every W dtype, fp32 W with a 16-bit X among them; every
pair is compiled at hidden 1024. (All nine pairs at every plan would be 3x the compiles and check
no conversion these do not.)
"""

import re

import pytest

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
from kernel_ptx import plan_build

PTX_TYPE = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
COMBINATIONS = [(x, w) for x in ("float16", "bfloat16", "float32") for w in ("float32", "float16", "bfloat16")]
COVERING = [("float16", "bfloat16"), ("bfloat16", "float32"), ("float32", "float16")]
INSTRUCTION = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)\s+(.*);\s*$")
REGISTER = re.compile(r"%\w+")


def parse(ptx):
    """[(opcode, destination registers, source registers)] in program order."""
    out = []
    for line in ptx.splitlines():
        match = INSTRUCTION.match(line)
        if not match or match[1].startswith((".", "st.", "bar", "ret", "bra", "cp.async")):
            continue
        first, _, rest = match[2].partition("}") if match[2].lstrip().startswith("{") else match[2].partition(",")
        rest = rest.lstrip(",")
        out.append((match[1], REGISTER.findall(first), REGISTER.findall(rest)))
    return out


def backward_slice(instructions, registers, before=None):
    """Instructions the values in `registers` depend on (only those before index `before`), up to the loads."""
    defs = {}
    for index, (_, dests, _) in enumerate(instructions):
        for reg in dests:
            defs.setdefault(reg, []).append(index)
    todo, seen = list(registers), set()
    while todo:
        for index in defs.get(todo.pop(), []):
            if index in seen or (before is not None and index >= before):
                continue
            seen.add(index)
            opcode, _, sources = instructions[index]
            if not opcode.startswith("ld."):
                todo.extend(sources)
    return [instructions[i] for i in sorted(seen)]


def partial_sum_slice(ptx):
    """Instructions the first butterfly shuffle's source value depends on, up to (and including) the loads."""
    instructions = parse(ptx)
    shuffle = next(i for i, ins in enumerate(instructions) if ins[0].startswith("shfl.sync.bfly"))
    return backward_slice(instructions, instructions[shuffle][2][:1], before=shuffle)


def stored_slice(ptx):
    """Instructions the values stored to global memory (Y) depend on, up to the loads."""
    stored = [REGISTER.findall(m[1]) for m in re.finditer(r"^\s*(?:@!?%p\d+\s+)?st\.global[\w.]*\s+\[[^]]*\],\s*(.*);",
                                                          ptx, re.M)]
    assert stored, "nothing is stored to global memory"
    return backward_slice(parse(ptx), [reg for regs in stored for reg in regs])


def only_fp32_arithmetic(chain, what):
    arithmetic = [op for op, _, _ in chain if re.match(r"(add|sub|mul|fma|neg|abs|rsqrt|sqrt|div|rcp)\.", op)]
    assert arithmetic, f"no arithmetic feeds {what}"
    low = [op for op in arithmetic if not op.endswith(".f32")]
    assert not low, f"{what} depends on non-FP32 arithmetic: {sorted(set(low))}"


def check_fp32_sum_of_squares(ptx, io):
    """io: the PTX type X is converted from ("f16", "bf16"), or "f32": fp32 X is squared as loaded."""
    chain = partial_sum_slice(ptx)
    only_fp32_arithmetic(chain, "the partial sum")
    source = "ld." if io == "f32" else f"cvt.f32.{io}"
    inputs = {d for op, dests, _ in chain if op.startswith(source) for d in dests}
    squares = [srcs for op, _, srcs in chain if op.split(".")[0] in ("mul", "fma") and srcs[0] == srcs[1]]
    assert squares and all(srcs[0] in inputs for srcs in squares), "squares of the inputs, in FP32"
    assert any(op.startswith("ld.") for op, _, _ in chain), "the slice reaches the loads of X"


def check_fp32_scaling(ptx, io, w_io):
    """Y depends only on FP32 arithmetic, on W converted to FP32 (fp32 W: as loaded), and on one final
    rounding to Y's 16-bit type (fp32 Y: none)."""
    chain = stored_slice(ptx)
    only_fp32_arithmetic(chain, "Y")
    conversions = {op for op, _, _ in chain if op.startswith("cvt.")}
    widened = {f"cvt.f32.{t}" for t in (io, w_io) if t != "f32"}
    rounded = set() if io == "f32" else {f"cvt.rn.{io}x2.f32", f"cvt.rn.{io}.f32"}
    assert widened <= conversions, f"W or X is not converted to FP32: {sorted(conversions)}"
    assert conversions - widened <= rounded and (conversions & rounded or not rounded), sorted(conversions)


def kernels(dtype, w_dtype, hidden):
    """The PTX of each kernel that may run rows of `hidden`: the lesson's one plan and every plan of the
    companion's sm_90a launcher (few, mid, cluster and many rows), each compiled alone."""
    elem_bytes = lesson.DTYPES[dtype].bytes
    plans = [lesson.plan_kernel(hidden, elem_bytes)]
    plans += [plan for plan, _ in fused.token_schedule(hidden, elem_bytes)]
    return [plan_build(plan, dtype, "sm_90a", w_dtype).ptx for plan in plans]


# 1024 with every pair; 100: a ragged row in 4-element vectors; 4096: 16-bit X staged for many tokens,
# in registers for few; 16384: W late for many tokens, first for few; 32768: the lesson's W a vector
# at a time at the store, the companion's cluster of 1024 threads
SUM_CASES = ([(x, w, 1024) for x, w in COMBINATIONS]
             + [(x, w, h) for x, w in COVERING for h in (100, 4096, 16384, 32768)])
# 2048: fp32 X staged; 12288: W late or first
SCALING_CASES = ([(x, w, 1024) for x, w in COMBINATIONS]
                 + [(x, w, h) for x, w in COVERING for h in (2048, 4096, 12288, 32768)])


@pytest.mark.parametrize("dtype, w_dtype, hidden", SUM_CASES)
def test_sum_of_squares_is_fp32_from_the_loads_to_the_shuffle(dtype, w_dtype, hidden):
    for ptx in kernels(dtype, w_dtype, hidden):
        check_fp32_sum_of_squares(ptx, PTX_TYPE[dtype])


@pytest.mark.parametrize("dtype, w_dtype, hidden", SCALING_CASES)
def test_w_is_converted_to_fp32_and_y_rounded_once(dtype, w_dtype, hidden):
    for ptx in kernels(dtype, w_dtype, hidden):
        check_fp32_scaling(ptx, PTX_TYPE[dtype], PTX_TYPE[w_dtype])


LOW_PRECISION_SQUARES = """
    ld.global.v4.b32   {%r1, %r2, %r3, %r4}, [%rd1];
    mov.b32            {%rs1, %rs2}, %r1;
    mul.rn.bf16        %rs3, %rs1, %rs1;
    fma.rn.bf16        %rs4, %rs2, %rs2, %rs3;
    cvt.f32.bf16       %r5, %rs4;
    shfl.sync.bfly.b32 %r6, %r5, 16, 31, -1;
"""


def test_the_check_sees_squares_summed_in_bf16():
    """Guards the slice: bf16 squares and sums converted to FP32 only before the shuffle are refused."""
    with pytest.raises(AssertionError, match="non-FP32 arithmetic"):
        check_fp32_sum_of_squares(LOW_PRECISION_SQUARES, "bf16")


# fp32 X, fp16 W: the kernel converts W, and scales it, correctly; the variants below do not.
SCALED = """
    ld.global.v4.b32   {%r1, %r2, %r3, %r4}, [%rd1];
    ld.global.b32      %r5, [%rd2];
    mov.b32            {%rs1, %rs2}, %r5;
    cvt.f32.f16        %r6, %rs1;
    mul.f32            %r7, %r1, %r9;
    mul.f32            %r8, %r7, %r6;
    st.global.b32      [%rd3], %r8;
"""


@pytest.mark.parametrize("variant, message", [
    (SCALED.replace("cvt.f32.f16        %r6, %rs1;", "mov.b32 %r6, %rs1;"), "not converted to FP32"),
    (SCALED.replace("mul.f32            %r8, %r7, %r6;", "cvt.rn.f16.f32 %rs9, %r7;\n    mul.f16 %r8, %rs9, %rs1;"),
     "non-FP32 arithmetic"),
    (SCALED.replace("st.global.b32      [%rd3], %r8;", "cvt.rn.f16.f32 %rs8, %r8;\n    cvt.f32.f16 %r10, %rs8;\n"
                    "    st.global.b32 [%rd3], %r10;"), "cvt.rn.f16.f32"),
])
def test_the_scaling_check_sees_w_not_converted_or_used_in_16_bits(variant, message):
    """Guards the Y slice: W reinterpreted instead of converted, W scaled in fp16, or fp32 Y rounded to fp16."""
    check_fp32_scaling(SCALED, "f32", "f16")  # the correct form passes
    with pytest.raises(AssertionError, match=message):
        check_fp32_scaling(variant, "f32", "f16")
