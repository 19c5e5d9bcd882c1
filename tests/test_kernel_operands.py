"""CPU: what both kernels' index arithmetic computes, not only which instructions it contains.

Two ways, both without a GPU. The index arithmetic is plain Python that the kernels run on Int32 values (the
lesson's KernelPlan.thread_slot, owns and clamp, and the companion's FusedPlan overrides; staged_bytes; the
companion's launcher's serves): here it runs on ints and is held to a brute-force count of rows, threads and
vectors written out in the test. And where a wrong number would hang the kernel or write a row that is not
there (the bytes an mbarrier waits for, the guard of a spare slot's stores), the operands in the PTX itself are
evaluated: a small interpreter of PTX's integer instructions computes, for each CTA of a grid, the value the
kernel hands to the instruction, from the kernel's num_tokens, %ctaid and %tid.
"""

import functools
import re

import pytest

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
from kernel_ptx import kernel_of, plan_build

# -- the index arithmetic, on ints ---------------------------------------------------------------------------


def rows_of_every_thread(plan, num_tokens):
    """{row: [t of every thread that holds it]} over the whole grid, through plan.thread_slot, as the kernel
    runs it: row i of a slot is first_row + i * rows_per_cta (the companion's staged plans take rows in
    sequence, the lesson's one), and a thread past num_tokens holds no row."""
    held = {}
    for bidx in range(plan.grid(num_tokens)):
        for tidx in range(plan.cta_threads):
            row_in_cta, t, first_row = plan.thread_slot(tidx, bidx)
            assert 0 <= row_in_cta < plan.rows_per_cta and 0 <= t < plan.threads_per_row
            for i in range(getattr(plan, "rows_in_sequence", 1)):
                row = first_row + i * plan.rows_per_cta
                if row < num_tokens:
                    held.setdefault(row, []).append(t)
    return held


# The companion's plans of each kind: a cluster of 4 (16 KB rows at 1 and 32 tokens; 32 KB rows at 128), many
# 16 KB rows over two CTAs, 16 and 2 rows side by side in a CTA, two rows in sequence (cp.async and bulk), one row
# of one CTA; and the lesson's (one plan for every count): 8 and 2 rows side by side, ragged or not, one row of
# 1024 threads with W first or a vector at a time, and 4-thread rows of 7 elements.
THREAD_CASES = [(fused.plan_kernel(8192, 2, 1), 1), (fused.plan_kernel(8192, 2, 32), 32),
                (fused.plan_kernel(16384, 2, 128), 77), (fused.plan_kernel(8192, 2), 1031),
                (fused.plan_kernel(100, 2), 37), (fused.plan_kernel(1024, 2), 37),
                (fused.plan_kernel(4096, 2, 512), 391), (fused.plan_kernel(8192, 2, 512), 397),
                (fused.plan_kernel(2048, 2), 5), (fused.plan_kernel(9216, 2, 1), 3),
                (lesson.plan_kernel(100, 2), 37), (lesson.plan_kernel(1000, 2), 37),
                (lesson.plan_kernel(24576, 2), 3), (lesson.plan_kernel(32768, 4), 2),
                (lesson.plan_kernel(7, 2), 33)]


@pytest.mark.parametrize("plan, num_tokens", THREAD_CASES, ids=str)
def test_every_row_is_held_by_exactly_its_threads(plan, num_tokens):
    """Each of num_tokens rows is held by threads_per_row threads, t = 0, 1, ... once each, wherever its CTAs
    (over a cluster, consecutive ones) and slots lie; no thread holds a row past the call's last."""
    held = rows_of_every_thread(plan, num_tokens)
    assert sorted(held) == list(range(num_tokens))
    assert all(sorted(ts) == list(range(plan.threads_per_row)) for ts in held.values())


def test_a_cluster_row_takes_its_threads_from_consecutive_ctas():
    """CTA c of a row's cluster holds the row's threads c * cta_threads to (c + 1) * cta_threads - 1."""
    plan = fused.plan_kernel(16384, 2, 1)
    assert plan.cluster_ctas == 4 and plan.cta_threads == 128
    for bidx in range(8):
        ts = [plan.thread_slot(tidx, bidx)[1] for tidx in range(plan.cta_threads)]
        start = bidx % 4 * 128
        assert ts == list(range(start, start + 128)) and plan.thread_slot(0, bidx)[2] == bidx // 4


# Ragged rows of the companion (few, mid and cluster plans among them) and of the lesson (W first and W a
# vector at a time, in 16-, 8-, 4- and 2-byte vectors).
RAGGED = [fused.plan_kernel(1000, 2), fused.plan_kernel(100, 2), fused.plan_kernel(1152, 2),
          fused.plan_kernel(9216, 2, 1), fused.plan_kernel(2056, 2, 512), fused.plan_kernel(7, 2),
          fused.plan_kernel(30000, 4), lesson.plan_kernel(1000, 2), lesson.plan_kernel(100, 2),
          lesson.plan_kernel(24584, 2), lesson.plan_kernel(30002, 2), lesson.plan_kernel(30000, 4)]


@pytest.mark.parametrize("plan", RAGGED, ids=str)
def test_a_ragged_rows_bound_and_clamp(plan):
    """Over the threads and slots of a row, owns() marks each of the row's num_vecs vectors exactly once and
    nothing past them; clamp() keeps every index inside the row, past its end the last vector."""
    assert plan.ragged
    num_vecs = plan.hidden // plan.vec
    slots = [t + k * plan.threads_per_row for t in range(plan.threads_per_row) for k in range(plan.vecs_per_thread)]
    assert sorted(j for j in slots if plan.owns(j)) == list(range(num_vecs))
    assert [plan.clamp(j) for j in slots] == [j if j < num_vecs else num_vecs - 1 for j in slots]


@pytest.mark.parametrize("hidden, elem_bytes", [(8192, 2), (16384, 2), (5120, 2), (10240, 2), (4104, 2), (8192, 4)])
def test_a_bulk_copy_expects_the_bytes_of_the_rows_that_exist(hidden, elem_bytes):
    """For every CTA of every call the mid plan serves and for each row in sequence, staged_bytes is the size of
    the rows of that group that are below num_tokens, counted one by one: the last CTA's spare row brings none."""
    plan = fused.plan_kernel(hidden, elem_bytes, 512)
    assert plan.arrival == "bulk"
    for num_tokens in (385, 386, 511, 512, 1023, 1024):
        for bidx in range(plan.grid(num_tokens)):
            _, _, first_row = plan.thread_slot(0, bidx)
            for i in range(plan.rows_in_sequence):
                first = first_row + i * plan.rows_per_cta
                rows = [r for r in range(first, first + plan.rows_per_cta) if r < num_tokens]
                assert fused.staged_bytes(plan, num_tokens, first) == len(rows) * hidden * elem_bytes


@pytest.mark.parametrize("hidden, elem_bytes", [(1024, 2), (1536, 2), (4096, 2), (8192, 2), (12288, 2),
                                                (16384, 2), (32768, 2), (8192, 4), (16384, 4)])
@pytest.mark.parametrize("sm90", [True, False])
def test_the_launcher_runs_one_plan_for_every_count_the_one_plan_kernel_names(hidden, elem_bytes, sm90):
    """serves(), which the launcher calls on its Int32, called here on every count from 1 to 5000 and a few
    above: exactly one plan of the schedule serves it, and it is plan_kernel's for that count."""
    schedule = fused.token_schedule(hidden, elem_bytes, sm90)
    for n in list(range(1, 5001)) + [8191, 8192, 65536, 2**31 - 1]:
        hits = [plan for plan, counts in schedule if fused.serves(n, counts)]
        assert hits == [fused.plan_kernel(hidden, elem_bytes, n, sm90)], (hidden, n, sm90)


# -- operands in the PTX ----------------------------------------------------------------------------------------

INSTRUCTION = re.compile(r"^\s*(?:@(!?%p\d+)\s+)?([a-z][\w.:]*)\s+([^;]*);", re.M)


def kernel_text(plan, arch="sm_90a"):
    """The PTX of a plan's kernel, compiled alone by its file (16-bit X: fp16): the kernel a launcher holding the
    plan runs."""
    return kernel_of(plan_build(plan, {2: "float16", 4: "float32"}[plan.elem_bytes], arch).ptx, plan)


@functools.lru_cache(maxsize=4)
def definitions(ptx: str) -> dict:
    """{register: [(opcode, source operands)]} of the unguarded instructions that write each register; parsed once
    per kernel, as integer_value is asked about thousands of threads."""
    defs = {}
    for guard, opcode, operands in INSTRUCTION.findall(ptx):
        args = [a.strip() for a in operands.split(",")]
        if not guard and args and re.fullmatch(r"%(r|p|rd)\d+", args[0]):
            defs.setdefault(args[0], []).append((opcode, args[1:]))
    return defs


def integer_value(ptx: str, operand: str, env: dict) -> int:
    """The value of a PTX operand (a register, or an immediate) given env: %tid.x, %ctaid.x and num_tokens (the
    kernel's one 32-bit parameter). Evaluates the integer instructions that define it, each register defined once
    (index arithmetic before its use)."""
    defs = definitions(ptx)

    @functools.cache
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
    plan = fused.plan_kernel(hidden, elem_bytes, 512)
    ptx = kernel_text(plan)
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
    plan = fused.plan_kernel(hidden, elem_bytes, tokens)
    ptx = kernel_text(plan)
    assert plan.cluster_ctas > 1
    (arm,) = operands_of(ptx, r"mbarrier\.arrive\.expect_tx\.shared(::cta)?\.b64")
    assert integer_value(ptx, arm[-1], {"%tid.x": 0, "%ctaid.x": 0, "num_tokens": tokens}) == \
        4 * (plan.threads_per_row // 32)
    assert len(operands_of(ptx, r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.b32")) == 1  # 4 bytes


# The companion's plans of 2 rows a CTA, 1 row, 2 rows in sequence (cp.async and bulk), the few-token plan; the
# lesson's of 2, 8 and 4 rows a CTA and of 1024 threads with W a vector at a time.
SPARE_SLOTS = [(fused.plan_kernel(1024, 2), 37), (fused.plan_kernel(2048, 2), 5),
               (fused.plan_kernel(4096, 2, 512), 391), (fused.plan_kernel(8192, 2, 512), 397),
               (fused.plan_kernel(1536, 2, 1), 3), (fused.plan_kernel(5120, 2, 512), 385),
               (lesson.plan_kernel(1024, 2), 37), (lesson.plan_kernel(256, 2), 13),
               (lesson.plan_kernel(256, 4), 7), (lesson.plan_kernel(32768, 2), 3)]


@pytest.mark.parametrize("plan, num_tokens", SPARE_SLOTS, ids=str)
def test_a_spare_slot_of_the_last_cta_stores_nothing(plan, num_tokens):
    """Every thread of the last CTA evaluates the branch that guards its stores of Y (the nearest one before
    them): it skips them exactly where its row, found by counting slots by hand, lies past the call's last."""
    ptx = kernel_text(plan)
    assert not plan.ragged and getattr(plan, "cluster_ctas", 1) == 1  # the lesson's plans have no cluster
    lines = ptx.splitlines()
    stores = [i for i, line in enumerate(lines) if "st.global" in line]
    rows_in_sequence = getattr(plan, "rows_in_sequence", 1)  # the lesson's plans take one row a slot
    assert len(stores) == rows_in_sequence * plan.vecs_per_thread
    bidx = plan.grid(num_tokens) - 1
    for n, at in enumerate(stores):
        guard = next(m[1] for line in reversed(lines[:at]) if (m := re.match(r"\s*@(%p\d+) bra", line)))
        i = n // plan.vecs_per_thread  # which of the slot's rows in sequence this store writes
        for tidx in range(plan.cta_threads):
            row = bidx * plan.rows_per_cta * rows_in_sequence + tidx // plan.threads_per_row + i * plan.rows_per_cta
            skipped = integer_value(ptx, guard, {"%tid.x": tidx, "%ctaid.x": bidx, "num_tokens": num_tokens})
            assert skipped == (row >= num_tokens), (tidx, row)
