"""CPU: the sum of squares is computed in FP32, read from the PTX's data flow.

The PTX is compiled without a GPU. Starting from the value the first warp
shuffle exchanges (a thread's partial sum), every instruction it depends on is
followed back to the loads of X. On that backward slice, each add, multiply and
fma must be an .f32 operation, and the squares must be f32 products of values
converted from fp16/bf16: a kernel that squared or summed in fp16/bf16 and
converted afterwards would show .f16/.bf16 arithmetic there (and a looser test
that only looks for some .f32 instruction anywhere in the kernel would miss it).
"""

import re

import pytest

import rms_norm_plugin_cutedsl as sample

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


def partial_sum_slice(ptx):
    """Instructions the first butterfly shuffle's source value depends on, up to (and including) the loads."""
    instructions = parse(ptx)
    defs = {}
    for index, (_, dests, _) in enumerate(instructions):
        for reg in dests:
            defs.setdefault(reg, []).append(index)
    shuffle = next(i for i, ins in enumerate(instructions) if ins[0].startswith("shfl.sync.bfly"))
    todo, seen = [instructions[shuffle][2][0]], set()
    while todo:
        for index in defs.get(todo.pop(), []):
            if index in seen or index >= shuffle:
                continue
            seen.add(index)
            opcode, _, sources = instructions[index]
            if not opcode.startswith("ld."):
                todo.extend(sources)
    return [instructions[i] for i in sorted(seen)]


def check_fp32_sum_of_squares(ptx, io):
    chain = partial_sum_slice(ptx)
    arithmetic = [op for op, _, _ in chain if re.match(r"(add|sub|mul|fma|neg|abs)\.", op)]
    assert arithmetic, "no arithmetic feeds the shuffle"
    low = [op for op in arithmetic if not op.endswith(".f32")]
    assert not low, f"the partial sum depends on non-FP32 arithmetic: {sorted(set(low))}"
    converted = {d for op, dests, _ in chain if op.startswith(f"cvt.f32.{io}") for d in dests}
    squares = [srcs for op, _, srcs in chain if op.split(".")[0] in ("mul", "fma") and srcs[0] == srcs[1]]
    assert squares and all(srcs[0] in converted for srcs in squares), "squares of the converted inputs, in FP32"
    assert any(op.startswith("ld.") for op, _, _ in chain), "the slice reaches the loads of X"


@pytest.mark.parametrize("dtype, io", [("float16", "f16"), ("bfloat16", "bf16")])
@pytest.mark.parametrize("hidden", [100, 1024, 4096, 16384])  # 4096: X staged in shared memory
def test_sum_of_squares_is_fp32_from_the_loads_to_the_shuffle(dtype, io, hidden):
    ptx = sample.compile_rms_norm(dtype, hidden, arch="sm_90a", keep_ptx=True).__ptx__
    check_fp32_sum_of_squares(ptx, io)


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
