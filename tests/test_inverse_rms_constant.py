"""CPU: Step 4 scales the row's sum of squares by float32(1/hidden) and adds float32(epsilon), in
the lesson's plans and in every plan the companion's launcher holds, read from the PTX's data flow.

Step 4 computes rsqrt(sum * (1/hidden) + epsilon). The threads of a row cover a padded width
(threads_per_row * vecs_per_thread * vec elements, 128 at hidden 100 in fp16), and a kernel that
divided by that width instead of hidden would be off by 13 % at hidden 100 while every other CPU
test passes. So each plan is compiled alone, without a GPU, and the constants are read where the
kernel uses them: from each rsqrt, its operand is followed back (through register copies) to the
f32 multiply-add, or multiply then add, that makes it; the immediate the sum is multiplied by must
equal float32(1/hidden) bit for bit, and the immediate added must equal float32(epsilon). A search
of the whole PTX for 1/hidden would not do: the padded width's reciprocal, or 1/hidden used for
something else, can sit elsewhere in the kernel.

The expected bits come from hidden and epsilon alone (struct), never from the kernels' code. The
sizes give every kind of plan (the lesson's W first and W a vector at a time; the companion's
registers, cp.async and bulk arrivals, clusters of 2 and 4 CTAs, two rows in sequence, W first and
late) and ragged rows, where the padded width is not hidden. Every plan is compiled with the
default epsilon. A second normal epsilon and a subnormal one (the plain rsqrt, not the
flush-to-zero one) are compiled at the plans of two sizes, 100 (ragged) and 8192 (every arrival and
cluster of the companion), of both kernels, dtypes and targets: epsilon is added by the same line
of inverse_rms in every plan, while 1/hidden is what a plan's width could get wrong: 52 plans, 84
compiles (108 for the old sample's 36 plans before).
"""

import re
import struct

import pytest

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
from kernel_ptx import plan_build

HIDDEN = (100, 1000, 1536, 4097, 4100, 8192, 16384, 20000)
DTYPES = ("float16", "float32")
ARCHES = ("sm_90a", "sm_80")  # the sm_90+ schedule (clusters, bulk copies) and the older one
OTHER_EPSILONS = (1e-6, 1e-40)  # 1e-40: subnormal in float32
OTHER_EPSILON_HIDDEN = (100, 8192)

INSTRUCTION = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.]*)\s+([^;]*);", re.M)
OPERAND = re.compile(r"\{[^}]*\}|\[[^\]]*\]|[^,\s]+")
REGISTER = re.compile(r"%\w+")
F32_IMMEDIATE = re.compile(r"0[fF]([0-9A-Fa-f]{8})")


def launcher_plans():
    """[(dtype, arch, plan)]: each distinct plan the companion's launcher holds at HIDDEN, DTYPES and
    ARCHES, and the lesson's plan (for every target) at HIDDEN and DTYPES, compiled for sm_90a."""
    first_seen = {}
    for dtype in DTYPES:
        elem_bytes = lesson.DTYPES[dtype].bytes
        for hidden in HIDDEN:
            first_seen.setdefault(lesson.plan_kernel(hidden, elem_bytes), (dtype, "sm_90a"))
            for arch in ARCHES:
                for plan, _ in fused.token_schedule(hidden, elem_bytes, fused.is_sm90(arch)):
                    first_seen.setdefault(plan, (dtype, arch))
    return [(dtype, arch, plan) for plan, (dtype, arch) in first_seen.items()]


PLANS = launcher_plans()
EPSILON_CASES = ([(dtype, arch, plan, lesson.DEFAULT_EPSILON) for dtype, arch, plan in PLANS]
                 + [(dtype, arch, plan, epsilon) for dtype, arch, plan in PLANS
                    if plan.hidden in OTHER_EPSILON_HIDDEN for epsilon in OTHER_EPSILONS])


def padded_width(plan):
    """The elements the threads of a row cover: hidden, rounded up to whole vectors per thread."""
    return plan.threads_per_row * plan.vecs_per_thread * plan.vec


def f32_bits(value):
    """The bits of float32(value), rounded to nearest as the compiler rounds a constant."""
    return struct.unpack("<I", struct.pack("<f", value))[0]


def f32_value(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def definitions(ptx):
    """{register: [(opcode, operands)]}: every instruction that writes each register."""
    defs = {}
    for match in INSTRUCTION.finditer(ptx):
        operands = OPERAND.findall(match[2])
        if not operands or operands[0].startswith("["):
            continue
        for register in REGISTER.findall(operands[0].split("|")[0]):
            defs.setdefault(register, []).append((match[1], operands))
    return defs


def writer(defs, operand):
    """(opcode, operands) of the one instruction computing `operand`, through register copies."""
    while True:
        found = defs.get(operand, [])
        assert len(found) == 1, f"{operand} is written {len(found)} times: no single data flow"
        opcode, operands = found[0]
        if not (opcode.startswith("mov.") and REGISTER.fullmatch(operands[1])):
            return opcode, operands
        operand = operands[1]


def immediate(defs, operand):
    """The f32 bits of an immediate operand, or of a register set to one by mov; else None."""
    while REGISTER.fullmatch(operand):
        found = defs.get(operand, [])
        if len(found) != 1 or not found[0][0].startswith("mov."):
            return None
        operand = found[0][1][1]
    match = F32_IMMEDIATE.fullmatch(operand)
    return int(match[1], 16) if match else None


def scaled(defs, a, b):
    """(the constant's bits, the other operand) of a product a * b with one f32 constant factor."""
    factors = [(immediate(defs, x), y) for x, y in ((a, b), (b, a))]
    found = [(bits, other) for bits, other in factors if bits is not None]
    assert len(found) == 1, f"{a} * {b}: not a value times one constant"
    bits, other = found[0]
    assert REGISTER.fullmatch(other), f"{a} * {b}: the scaled value is a constant"
    return bits, other


def step4_constants(ptx):
    """[(scale bits, epsilon bits)] for each rsqrt: its operand's scale * value + epsilon."""
    defs = definitions(ptx)
    rsqrts = [m for m in INSTRUCTION.finditer(ptx) if m[1].startswith("rsqrt.")]
    out = []
    for match in rsqrts:
        opcode, operands = writer(defs, OPERAND.findall(match[2])[1])
        assert opcode.endswith(".f32"), f"the rsqrt's operand comes from {opcode}"
        if opcode.startswith("fma."):  # d = a * b + c
            scale, _ = scaled(defs, operands[1], operands[2])
            epsilon = immediate(defs, operands[3])
        elif opcode.startswith("add."):  # d = a + b, one of them a * b, the other a constant
            summands = [immediate(defs, x) for x in operands[1:3]]
            assert summands.count(None) == 1, f"{opcode} {operands}: not a value plus a constant"
            epsilon = next(s for s in summands if s is not None)
            product = operands[1 + summands.index(None)]
            mul, factors = writer(defs, product)
            assert mul.startswith("mul.") and mul.endswith(".f32"), f"{product} comes from {mul}"
            scale, _ = scaled(defs, factors[1], factors[2])
        else:
            raise AssertionError(f"the rsqrt's operand comes from {opcode}, not a multiply-add")
        assert epsilon is not None, f"{opcode} {operands}: nothing constant is added"
        out.append((scale, epsilon))
    return out


def check_step4(ptx, hidden, epsilon):
    """Each rsqrt's operand is sum * float32(1/hidden) + float32(epsilon), bit for bit."""
    found = step4_constants(ptx)
    assert found, "the kernel has no rsqrt"
    want = f32_bits(1.0 / hidden)
    for scale, added in found:
        assert scale == want, (
            f"the sum is scaled by {f32_value(scale)!r} (0f{scale:08X})"
            f" = 1/{1 / f32_value(scale):.6g}, not float32(1/{hidden}) = 0f{want:08X}")
        assert added == f32_bits(epsilon), (
            f"{f32_value(added)!r} (0f{added:08X}) is added, not float32({epsilon!r})"
            f" = 0f{f32_bits(epsilon):08X}")


@pytest.mark.parametrize("dtype, arch, plan, epsilon", EPSILON_CASES,
                         ids=[f"{d}-{a}-{p}-eps{e:g}" for d, a, p, e in EPSILON_CASES])
def test_rsqrt_takes_the_sum_times_one_over_hidden_plus_epsilon(dtype, arch, plan, epsilon):
    check_step4(plan_build(plan, dtype, arch, epsilon=epsilon).ptx, plan.hidden, epsilon)


@pytest.mark.parametrize("elem_bytes", sorted({lesson.DTYPES[d].bytes for d in DTYPES}))
def test_the_sizes_have_plans_whose_padded_width_is_not_hidden(elem_bytes):
    """Guards the sizes: for each element size, some plan's threads cover more than hidden, so a
    kernel that divided by the padded width would show a different constant."""
    for owner in (lesson.KernelPlan, fused.FusedPlan):
        ragged = [p for d, _, p in PLANS if lesson.DTYPES[d].bytes == elem_bytes
                  and type(p) is owner and padded_width(p) != p.hidden]
        assert ragged, f"no ragged {owner.__name__} among {len(PLANS)} at {elem_bytes} bytes per element"


# hidden 100 in fp16: the threads cover 128 elements. 0f3C23D70A = float32(1/100),
# 0f3C000000 = 1/128, 0f3727C5AC = float32(1e-5).
STEP4 = """
    shfl.sync.bfly.b32   %r2, %r1, 1, 31, -1;
    add.f32              %r3, %r1, %r2;
    mov.b32              %r7, %r3;
    fma.rn.f32           %r4, %r7, 0f3C23D70A, 0f3727C5AC;
    rsqrt.approx.ftz.f32 %r5, %r4;
    mul.f32              %r6, %r8, %r5;
"""
PADDED = STEP4.replace("0f3C23D70A, 0f3727C5AC", "0f3C000000, 0f3727C5AC")
SPLIT = STEP4.replace("fma.rn.f32           %r4, %r7, 0f3C23D70A, 0f3727C5AC;",
                      "mov.b32 %r10, 0f3C23D70A;\n    mul.f32 %r9, %r10, %r7;\n"
                      "    add.f32 %r4, %r9, 0f3727C5AC;")


def test_the_check_reads_the_constants_of_the_rsqrts_operand():
    """Guards the walk: it reads fma and mul-then-add forms, and refuses the padded width's
    reciprocal feeding the rsqrt even where 1/hidden appears elsewhere in the kernel."""
    check_step4(STEP4, 100, 1e-5)
    check_step4(SPLIT, 100, 1e-5)
    elsewhere = PADDED + "    mul.f32              %r11, %r3, 0f3C23D70A;\n"
    with pytest.raises(AssertionError, match=r"= 1/128, not float32\(1/100\)"):
        check_step4(elsewhere, 100, 1e-5)
    with pytest.raises(AssertionError, match=r"not float32\(1e-06\)"):
        check_step4(STEP4, 100, 1e-6)
