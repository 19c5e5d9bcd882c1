"""CPU: what the kernel's index arithmetic computes, not only which instructions it contains.

Two ways, both without a GPU. The sample's index arithmetic is plain Python that the kernel runs on Int32 values
(KernelPlan.thread_slot, owns and clamp; staged_bytes; the launcher's serves): here it runs on ints and is held to
a brute-force count of rows, threads and vectors written out in the test. And where a wrong number would hang
the kernel rather than make it wrong (the bytes an mbarrier waits for), the operands in the PTX itself are
evaluated: a small interpreter of PTX's integer instructions computes, for each CTA of a grid, the value the
kernel hands to the instruction, from the kernel's num_tokens, %ctaid and %tid.
"""

import re

import pytest

import rms_norm_plugin_cutedsl as sample

# -- the sample's index arithmetic, on ints ---------------------------------------------------------------------


def rows_of_every_thread(plan, num_tokens):
    """{row: [t of every thread that holds it]} over the whole grid, through plan.thread_slot, as the kernel
    runs it: row i of a slot is first_row + i * rows_per_cta, and a thread past num_tokens holds no row."""
    held = {}
    for bidx in range(plan.grid(num_tokens)):
        for tidx in range(plan.cta_threads):
            row_in_cta, t, first_row = plan.thread_slot(tidx, bidx)
            assert 0 <= row_in_cta < plan.rows_per_cta and 0 <= t < plan.threads_per_row
            for i in range(plan.rows_in_sequence):
                row = first_row + i * plan.rows_per_cta
                if row < num_tokens:
                    held.setdefault(row, []).append(t)
    return held


# A plan of each kind: a cluster of 4 (16 KB rows at 1 and 32 tokens; 32 KB rows at 128), many 16 KB rows over two
# CTAs, 16 and 2 rows side by side in a CTA, two rows in sequence (cp.async and bulk), one row of one CTA.
THREAD_CASES = [(8192, 2, 1, 1), (8192, 2, 32, 32), (16384, 2, 128, 77), (8192, 2, None, 1031), (100, 2, None, 37),
                (1024, 2, None, 37), (4096, 2, 512, 391), (8192, 2, 512, 397), (2048, 2, None, 5), (9216, 2, 1, 3)]


@pytest.mark.parametrize("hidden, elem_bytes, plan_tokens, num_tokens", THREAD_CASES)
def test_every_row_is_held_by_exactly_its_threads(hidden, elem_bytes, plan_tokens, num_tokens):
    """Each of num_tokens rows is held by threads_per_row threads, t = 0, 1, ... once each, wherever its CTAs
    (over a cluster, consecutive ones) and slots lie; no thread holds a row past the call's last."""
    plan = sample.plan_kernel(hidden, elem_bytes, plan_tokens)
    held = rows_of_every_thread(plan, num_tokens)
    assert sorted(held) == list(range(num_tokens))
    assert all(sorted(ts) == list(range(plan.threads_per_row)) for ts in held.values())


def test_a_cluster_row_takes_its_threads_from_consecutive_ctas():
    """CTA c of a row's cluster holds the row's threads c * cta_threads to (c + 1) * cta_threads - 1."""
    plan = sample.plan_kernel(16384, 2, 1)
    assert plan.cluster_ctas == 4 and plan.cta_threads == 128
    for bidx in range(8):
        ts = [plan.thread_slot(tidx, bidx)[1] for tidx in range(plan.cta_threads)]
        start = bidx % 4 * 128
        assert ts == list(range(start, start + 128)) and plan.thread_slot(0, bidx)[2] == bidx // 4


@pytest.mark.parametrize("hidden, elem_bytes, tokens", [(1000, 2, None), (100, 2, None), (1152, 2, None),
                                                        (9216, 2, 1), (2056, 2, 512), (7, 2, None), (30000, 4, None)])
def test_a_ragged_rows_bound_and_clamp(hidden, elem_bytes, tokens):
    """Over the threads and slots of a row, owns() marks each of the row's num_vecs vectors exactly once and
    nothing past them; clamp() keeps every index inside the row, past its end the last vector."""
    plan = sample.plan_kernel(hidden, elem_bytes, tokens)
    assert plan.ragged
    num_vecs = hidden // plan.vec
    slots = [t + k * plan.threads_per_row for t in range(plan.threads_per_row) for k in range(plan.vecs_per_thread)]
    assert sorted(j for j in slots if plan.owns(j)) == list(range(num_vecs))
    assert [plan.clamp(j) for j in slots] == [j if j < num_vecs else num_vecs - 1 for j in slots]


@pytest.mark.parametrize("hidden, elem_bytes", [(8192, 2), (16384, 2), (5120, 2), (10240, 2), (4104, 2), (8192, 4)])
def test_a_bulk_copy_expects_the_bytes_of_the_rows_that_exist(hidden, elem_bytes):
    """For every CTA of every call the mid plan serves and for each row in sequence, staged_bytes is the size of
    the rows of that group that are below num_tokens, counted one by one: the last CTA's spare row brings none."""
    plan = sample.plan_kernel(hidden, elem_bytes, 512)
    assert plan.arrival == "bulk"
    for num_tokens in (385, 386, 511, 512, 1023, 1024):
        for bidx in range(plan.grid(num_tokens)):
            _, _, first_row = plan.thread_slot(0, bidx)
            for i in range(plan.rows_in_sequence):
                first = first_row + i * plan.rows_per_cta
                rows = [r for r in range(first, first + plan.rows_per_cta) if r < num_tokens]
                assert sample.staged_bytes(plan, num_tokens, first) == len(rows) * hidden * elem_bytes


@pytest.mark.parametrize("hidden, elem_bytes", [(1024, 2), (1536, 2), (4096, 2), (8192, 2), (12288, 2),
                                                (16384, 2), (32768, 2), (8192, 4), (16384, 4)])
@pytest.mark.parametrize("sm90", [True, False])
def test_the_launcher_runs_one_plan_for_every_count_the_one_plan_kernel_names(hidden, elem_bytes, sm90):
    """serves(), which the launcher calls on its Int32, called here on every count from 1 to 5000 and a few
    above: exactly one plan of the schedule serves it, and it is plan_kernel's for that count."""
    schedule = sample.token_schedule(hidden, elem_bytes, sm90)
    for n in list(range(1, 5001)) + [8191, 8192, 65536, 2**31 - 1]:
        hits = [plan for plan, counts in schedule if sample.serves(n, counts)]
        assert hits == [sample.plan_kernel(hidden, elem_bytes, n, sm90)], (hidden, n, sm90)


# -- operands in the PTX ----------------------------------------------------------------------------------------

INSTRUCTION = re.compile(r"^\s*(?:@(!?%p\d+)\s+)?([a-z][\w.:]*)\s+([^;]*);", re.M)


def kernel_ptx(hidden, elem_bytes, tokens, arch="sm_90a"):
    """The PTX of the launcher's kernel for `tokens` rows (the one whose name carries its plan)."""
    plan = sample.plan_kernel(hidden, elem_bytes, tokens)
    ptx = sample.compile_rms_norm({2: "float16", 4: "float32"}[elem_bytes], hidden, arch=arch, keep_ptx=True).__ptx__
    starts = [m.start() for m in re.finditer(r"^\.visible \.entry ", ptx, re.M)] + [len(ptx)]
    (text,) = (ptx[a:b] for a, b in zip(starts, starts[1:]) if f"_{plan}_" in ptx[a:a + 300])
    return plan, text


def integer_value(ptx: str, operand: str, env: dict) -> int:
    """The value of a PTX operand (a register, or an immediate) given env: %tid.x, %ctaid.x and num_tokens (the
    kernel's one 32-bit parameter). Evaluates the integer instructions that define it, each register defined once
    (index arithmetic before its use)."""
    defs = {}
    for guard, opcode, operands in INSTRUCTION.findall(ptx):
        args = [a.strip() for a in operands.split(",")]
        if not guard and args and re.fullmatch(r"%(r|p|rd)\d+", args[0]):
            defs.setdefault(args[0], []).append((opcode, args[1:]))

    def value(x):
        if re.fullmatch(r"-?\d+", x):
            return int(x)
        if x in env:
            return env[x]
        (definition,) = defs[x]  # a register defined twice would need control flow: not index arithmetic
        opcode, args = definition
        op = opcode.split(".")[0]
        if opcode == "ld.param.b32":
            return env["num_tokens"]
        if op in ("mov", "cvt"):
            return value(args[0])
        a = [value(arg) for arg in args]
        if op == "setp":
            return {"lt": a[0] < a[1], "le": a[0] <= a[1], "gt": a[0] > a[1], "ge": a[0] >= a[1],
                    "eq": a[0] == a[1], "ne": a[0] != a[1]}[opcode.split(".")[1]]
        result = {"add": lambda: a[0] + a[1], "sub": lambda: a[0] - a[1], "mul": lambda: a[0] * a[1],
                  "shl": lambda: a[0] << a[1], "shr": lambda: a[0] >> a[1], "and": lambda: a[0] & a[1],
                  "or": lambda: a[0] | a[1], "min": lambda: min(a[0], a[1]), "max": lambda: max(a[0], a[1]),
                  "selp": lambda: a[0] if a[2] else a[1]}[op]()
        return (result + 2**31) % 2**32 - 2**31 if ".s32" in opcode or ".b32" in opcode or ".u32" in opcode else result

    return value(operand)


def operands_of(ptx: str, pattern: str):
    """The operand lists of every instruction whose opcode matches `pattern`, in program order."""
    return [[a.strip() for a in operands.split(",")] for _, opcode, operands in INSTRUCTION.findall(ptx)
            if re.fullmatch(pattern, opcode)]


@pytest.mark.parametrize("hidden, elem_bytes", [(8192, 2), (16384, 2), (5120, 2), (8192, 4)])
def test_each_row_mbarrier_expects_what_its_bulk_copies_bring(hidden, elem_bytes):
    """Thread 0 of every CTA arms row i's mbarrier with the bytes of the group's rows that exist, as counted by
    hand, at the token counts the mid plan serves, the last CTA included; every bulk copy moves one whole row.
    (A wrong count does not give a wrong answer: the kernel waits forever.)"""
    plan, ptx = kernel_ptx(hidden, elem_bytes, 512)
    assert plan.arrival == "bulk"
    arms = operands_of(ptx, r"mbarrier\.arrive\.expect_tx\.shared(::cta)?\.b64")
    copies = operands_of(ptx, r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes")
    assert len(arms) == plan.rows_in_sequence and len(copies) == plan.rows_in_sequence * plan.rows_per_cta
    for num_tokens in (385, 386, 511, 1023, 1024):
        for bidx in range(plan.grid(num_tokens)):
            env = {"%tid.x": 0, "%ctaid.x": bidx, "num_tokens": num_tokens}
            for i, arm in enumerate(arms):
                first = bidx * plan.cta_rows + i * plan.rows_per_cta
                rows = [r for r in range(first, first + plan.rows_per_cta) if r < num_tokens]
                assert integer_value(ptx, arm[-1], env) == len(rows) * hidden * elem_bytes, (num_tokens, bidx, i)
    assert all(integer_value(ptx, copy[2], {}) == hidden * elem_bytes for copy in copies)


@pytest.mark.parametrize("hidden, elem_bytes, tokens", [(8192, 2, 1), (10240, 2, 1), (16384, 2, 1),
                                                        (32768, 2, 128), (8192, 2, 4096), (4096, 4, 1)])
def test_a_cluster_mbarrier_expects_four_bytes_from_each_warp_of_the_row(hidden, elem_bytes, tokens):
    """Over a cluster, each CTA's thread 0 arms its mbarrier for the row's warp sums: 4 bytes from every warp of
    the whole row (threads_per_row / 32 of them, over all CTAs), each warp sending one 32-bit st.async to each CTA."""
    plan, ptx = kernel_ptx(hidden, elem_bytes, tokens)
    assert plan.cluster_ctas > 1
    (arm,) = operands_of(ptx, r"mbarrier\.arrive\.expect_tx\.shared(::cta)?\.b64")
    assert integer_value(ptx, arm[-1], {"%tid.x": 0, "%ctaid.x": 0, "num_tokens": tokens}) == \
        4 * (plan.threads_per_row // 32)
    assert len(operands_of(ptx, r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.b32")) == 1  # 4 bytes


@pytest.mark.parametrize("hidden, elem_bytes, tokens, num_tokens", [(1024, 2, None, 37), (2048, 2, None, 5),
                                                                    (4096, 2, 512, 391), (8192, 2, 512, 397),
                                                                    (1536, 2, 1, 3), (5120, 2, 512, 385)])
def test_a_spare_slot_of_the_last_cta_stores_nothing(hidden, elem_bytes, tokens, num_tokens):
    """Every thread of the last CTA evaluates the branch that guards its stores of Y (the nearest one before
    them): it skips them exactly where its row, found by counting slots by hand, lies past the call's last."""
    plan, ptx = kernel_ptx(hidden, elem_bytes, tokens)
    assert not plan.ragged and plan.cluster_ctas == 1
    lines = ptx.splitlines()
    stores = [i for i, line in enumerate(lines) if "st.global" in line]
    assert len(stores) == plan.rows_in_sequence * plan.vecs_per_thread
    bidx = plan.grid(num_tokens) - 1
    for n, at in enumerate(stores):
        guard = next(m[1] for line in reversed(lines[:at]) if (m := re.match(r"\s*@(%p\d+) bra", line)))
        i = n // plan.vecs_per_thread  # which of the slot's rows in sequence this store writes
        for tidx in range(plan.cta_threads):
            row = bidx * plan.cta_rows + tidx // plan.threads_per_row + i * plan.rows_per_cta
            skipped = integer_value(ptx, guard, {"%tid.x": tidx, "%ctaid.x": bidx, "num_tokens": num_tokens})
            assert skipped == (row >= num_tokens), (tidx, row)
