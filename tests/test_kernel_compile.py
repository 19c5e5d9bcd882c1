"""CPU: both kernels compile without a GPU, and their PTX has the shape we designed for.

The lesson's kernel (rms_norm_plugin_cutedsl.py) runs one plan per row length for every token
count: X in registers, W first or, where W's registers would not fit, a vector at a time at the
store. The companion's (rms_norm_fused_cutedsl.py) is the old sample's kernel: plans by token count,
rows staged in shared memory, clusters and launch bounds. CuteDSL can target an architecture named
on the command line (--gpu-arch), so these tests read the PTX that the H200 (sm_90a) and Ampere
(sm_80) would run. Each plan is compiled once per test process (tests/kernel_ptx.py), so the tests
below that read one plan's PTX share its compile.
"""

import functools
import math
import re
import shutil

import pytest

import rms_norm_aot_cutedsl as aot
import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
from kernel_ptx import entries, kernel_of, launcher_ptx, lesson_build, plan_build, ptxas_resources
from support import check_kernel

ARCHES = ["sm_80", "sm_90a"]
ELEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# Every X x W combination; Y has X's dtype.
COMBINATIONS = [(x, w) for x in ("float16", "bfloat16", "float32") for w in ("float32", "float16", "bfloat16")]
# A launcher of one plan: the lesson's for every token count, or the companion's many-token plan
# without a cluster (compile_rms_norm(plans_by_tokens=False), the AOT flavor's).
ONE_PLAN = {"lesson": lesson.plan_kernel, "fused": functools.partial(fused.plan_kernel, sm90=False)}
# Sizes of every kind of plan of each rule: a row of 1 and of 7 elements (1-element vectors), short
# rows sharing a CTA (100: ragged in 4-element vectors, 256, 1000 ragged, 1024 over two warps), one
# row a CTA (4096, and the companion's staged, W-late and 2-CTA rows), and the lesson's rows whose W
# comes a vector at a time (19457 in 1-element vectors, 32768 in 16-byte ones).
HIDDEN = {"lesson": [1, 7, 100, 256, 1000, 1024, 4096, 19457, 32768],
          "fused": [1, 7, 100, 256, 1000, 1024, 4096, 8192, 16384]}
KERNEL_CASES = [(kernel, hidden) for kernel, sizes in HIDDEN.items() for hidden in sizes]
# Rows of whole 16-byte vectors (hidden % 8 == 0); the lesson's 8192 and 16384 are its 4096's plan
# over more threads, the companion's differ (X in registers, W late).
ALIGNED_CASES = [(kernel, hidden) for kernel, sizes in HIDDEN.items() for hidden in sizes
                 if hidden % 8 == 0 and hidden >= 256]


def staged(plan):
    return plan.arrival != "registers"


def one_plan_ptx(kernel, dtype, hidden, arch, w_dtype="float32"):
    """(plan, PTX) of the launcher of one plan of `kernel` ("lesson" or "fused")."""
    plan = ONE_PLAN[kernel](hidden, ELEM_BYTES[dtype])
    return plan, plan_build(plan, dtype, arch, w_dtype).ptx


def plans_of(hidden, elem_bytes=2):
    """The distinct plans the companion's launcher holds on sm_90a: for 1 row (cluster or few), for FEW_TOKENS
    rows (few, or the cluster plan where it serves up to 128 rows), for 1024 rows (mid, where the line has one)
    and for many."""
    return {fused.plan_kernel(hidden, elem_bytes, n) for n in (1, fused.FEW_TOKENS, 1024, None)}


def global_accesses(ptx):
    return set(re.findall(r"\b((?:ld|st)\.global(?:\.\w+)*)", ptx))


# -- both kernels ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("kernel, hidden", KERNEL_CASES)
def test_kernel_compiles_for_target(kernel, hidden, arch, dtype):
    """One kernel, named after its plan, for the target, with one FP32 rsqrt a row (the default epsilon's
    flush-to-zero form), global stores, a CTA barrier exactly where a row spans warps, and .reqntid set to the
    plan's CTA: ptxas then fits a thread's registers to what the CTA leaves it."""
    plan, ptx = one_plan_ptx(kernel, dtype, hidden, arch)
    assert re.search(rf"^\.target {arch}\b", ptx, re.M), "compiled for the wrong architecture"
    (name,) = entries(ptx)
    assert f"_{plan}_" in name
    assert "rsqrt.approx.ftz.f32" in ptx, "one FP32 reciprocal square root per row (default eps: flush-to-zero form)"
    assert any(a.startswith("st.global") for a in global_accesses(ptx))
    assert ("bar.sync" in ptx or "barrier.sync" in ptx) == (plan.threads_per_row > 32)
    assert re.findall(r"^\.reqntid (\d+), 1, 1$", ptx, re.M) == [str(plan.cta_threads)]


@pytest.mark.parametrize("dtype, w_dtype", COMBINATIONS)
@pytest.mark.parametrize("kernel, hidden", ALIGNED_CASES)
def test_aligned_rows_use_128_bit_global_accesses_only(kernel, hidden, dtype, w_dtype):
    """hidden % 8 == 0: every X/Y access is one 16-byte vector, and W is read in vectors of as many elements:
    16 bytes at a time, except under fp32 X (4-element vectors), where a 16-bit W vector is one 8-byte load.
    The lesson at 32768 loads W a vector at a time at the store, still in whole vectors.

    (A staged row of the companion reads X by 16-byte cp.async instead of ld.global: see the tests below.)"""
    _, ptx = one_plan_ptx(kernel, dtype, hidden, "sm_90a", w_dtype)
    accesses = global_accesses(ptx)
    w_load_bytes = min(16, 16 // ELEM_BYTES[dtype] * ELEM_BYTES[w_dtype])
    assert {check_kernel.access_bytes(a) for a in accesses if a.startswith("st.")} == {16}, accesses
    assert {check_kernel.access_bytes(a) for a in accesses if a.startswith("ld.")} == {16, w_load_bytes}, accesses


@pytest.mark.parametrize("kernel", ONE_PLAN)
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_every_dtype_combination_compiles_and_names_its_kernel_apart(kernel, arch, dtype):
    """One kernel per X x W combination: the entry's name differs by W, so two combinations in one engine
    (and in the AOT flavor's PTX) never collide."""
    names = {}
    for w in ("float32", "float16", "bfloat16"):
        _, ptx = one_plan_ptx(kernel, dtype, 1024, arch, w)
        assert re.search(rf"^\.target {arch}\b", ptx, re.M)
        (names[w],) = entries(ptx)
    assert len(set(names.values())) == 3, names


# -- the lesson: one plan per row, from what a thread holds ---------------------------------------------------

# (hidden, bytes per element) -> (vector, threads per row, rows per CTA, vectors per thread, W a vector at a
# time), worked out by hand from the lesson's rule: 16-byte vectors halved until they tile the row; ceil(vectors
# / 2) threads, a power of two under a warp, else whole warps, 1024 at most; rows side by side until a CTA has
# 128 threads; and what a thread holds, 26 + its X registers + W's (vec fp32 values a vector, all its vectors
# where W comes first, one where it comes at the store), against 65536 / CTA threads (64 at 1024 threads).
LESSON_PLANS = [
    (100, 2, (4, 16, 8, 2, False)),       # 25 vectors of 4: 13 -> 16 threads, 8 rows a CTA
    (1000, 2, (8, 64, 2, 2, False)),      # 125 vectors: 63 -> 64 threads, ragged
    (1024, 2, (8, 64, 2, 2, False)),      # the demo's: 128 vectors, 2 rows a CTA
    (1536, 2, (8, 96, 1, 2, False)),      # 192 vectors / 2 = 96, whole warps, not 128
    (4608, 2, (8, 288, 1, 2, False)),     # 576 / 2
    (10240, 2, (8, 640, 1, 2, False)),    # 1280 / 2
    (16384, 2, (8, 1024, 1, 2, False)),   # 2048 / 2: 26 + 8 + 16 = 50 registers
    (24576, 2, (8, 1024, 1, 3, False)),   # 3072 vectors, 3 each: 26 + 12 + 24 = 62 <= 64
    (24584, 2, (8, 1024, 1, 4, True)),    # 3073 vectors, 4 each: 26 + 16 + 32 = 74; W at the store: 50
    (32768, 2, (8, 1024, 1, 4, True)),    # 4096 vectors, 4 each: 74 -> 50
    (19455, 2, (1, 1024, 1, 19, False)),  # odd: 1-element vectors, 19 each: 26 + 19 + 19 = 64
    (19457, 2, (1, 1024, 1, 20, True)),   # 20 each: 26 + 20 + 20 = 66 -> 47
    (30002, 2, (2, 1024, 1, 15, True)),   # 15001 vectors of 2 (one register each): 26 + 15 + 30 = 71 -> 43
    (16384, 4, (4, 1024, 1, 4, False)),   # fp32: 4096 vectors of 4, 4 each: 26 + 16 + 16 = 58
    (16388, 4, (4, 1024, 1, 5, True)),    # 4097 vectors, 5 each: 26 + 20 + 20 = 66 -> 50
    (18430, 4, (2, 1024, 1, 9, False)),   # 9215 vectors of 2 (two registers each): 26 + 18 + 18 = 62
    (18434, 4, (2, 1024, 1, 10, True)),   # 9217 vectors, 10 each: 26 + 20 + 20 = 66 -> 48
    (32767, 4, (1, 1024, 1, 32, True)),   # 32 each: 26 + 32 + 32 = 90 -> 59
    (32768, 4, (4, 1024, 1, 8, True)),    # 8192 vectors of 4, 8 each: 26 + 32 + 32 = 90 -> 62
]


@pytest.mark.parametrize("hidden, elem_bytes, expected", LESSON_PLANS)
def test_the_lessons_plan_follows_its_rule(hidden, elem_bytes, expected):
    plan = lesson.plan_kernel(hidden, elem_bytes)
    assert (plan.vec, plan.threads_per_row, plan.rows_per_cta, plan.vecs_per_thread,
            plan.weight_by_vector) == expected


def test_every_lesson_plan_fits_its_registers_and_covers_its_row():
    """At every row length and element size: the estimate within the ceiling, W a vector at a time only where
    W first would not fit, at most 1024 threads a CTA, the row covered, short rows sharing CTAs of 128 threads."""
    for elem_bytes in (2, 4):
        for hidden in range(1, lesson.MAX_HIDDEN + 1):
            plan = lesson.plan_kernel(hidden, elem_bytes)
            assert plan.registers_needed() <= plan.register_ceiling(), plan
            first = lesson.KernelPlan(hidden=plan.hidden, elem_bytes=plan.elem_bytes, vec=plan.vec,
                                      threads_per_row=plan.threads_per_row, rows_per_cta=plan.rows_per_cta,
                                      vecs_per_thread=plan.vecs_per_thread)
            assert plan.weight_by_vector == (first.registers_needed() > first.register_ceiling()), plan
            assert plan.cta_threads <= 1024 and plan.threads_per_row * plan.vecs_per_thread * plan.vec >= hidden
            assert plan.rows_per_cta == 1 or plan.cta_threads == lesson.MIN_CTA_THREADS, plan


def test_the_lessons_rule_refuses_a_row_no_step_fits():
    """fit_registers never returns a plan over its ceiling: 65536 16-bit values over 1024 threads hold 32
    registers of X, 26 + 32 + 8 = 66 > 64 even with W at the store."""
    plan = lesson.KernelPlan(hidden=65536, elem_bytes=2, vec=8, threads_per_row=1024, rows_per_cta=1,
                             vecs_per_thread=8)
    with pytest.raises(lesson.PlanError, match=r"^rows of 65536 elements of 16 bits need 66 registers"):
        lesson.fit_registers(plan)


@pytest.mark.parametrize("dtype, hidden", [("float16", 1024), ("float32", 4096), ("float16", 100),
                                           ("float16", 32768), ("float32", 32767), ("bfloat16", 30002)])
def test_the_lesson_loads_w_first_or_a_vector_at_a_time_at_the_store(dtype, hidden):
    """W first: every load of W comes before the first shuffle of the row's sum, next to X's. W a vector at a
    time: every load of W comes after the rsqrt, before the stores it scales. Either way each vector of W is
    loaded once (fp32 W: vec * 4 bytes, in 16-byte loads at most)."""
    plan = lesson.plan_kernel(hidden, ELEM_BYTES[dtype])
    ptx = lesson_build(plan, dtype).ptx
    lines = ptx.splitlines()
    loads = [i for i, line in enumerate(lines) if re.search(r"\bld\.global\.", line)]
    shuffle = next(i for i, line in enumerate(lines) if "shfl.sync.bfly" in line)
    rsqrt = next(i for i, line in enumerate(lines) if "rsqrt." in line)
    x_loads, _ = check_kernel.global_access_list(ptx, 0)
    w_loads, _ = check_kernel.global_access_list(ptx, 1)  # the kernel's parameters: X, W, num_tokens, Y
    assert len(x_loads) == plan.vecs_per_thread
    assert len(w_loads) == plan.vecs_per_thread * math.ceil(plan.vec * 4 / 16)
    assert len(loads) == len(x_loads) + len(w_loads)
    if plan.weight_by_vector:
        assert sum(i < shuffle for i in loads) == len(x_loads)
        assert sum(i > rsqrt for i in loads) == len(w_loads)
    else:
        assert max(loads) < shuffle


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
@pytest.mark.parametrize("dtype, hidden", [("float16", 24576), ("float16", 24584), ("float16", 19455),
                                           ("float16", 19457), ("float16", 30002), ("float16", 32768),
                                           ("float32", 16384), ("float32", 16388), ("float32", 18430),
                                           ("float32", 18434), ("float32", 32767), ("float32", 32768)])
def test_the_lessons_tightest_plans_do_not_spill(dtype, hidden):
    """At 1024 threads a CTA leaves a thread 64 registers, and the kernel's .reqntid holds ptxas to them: the
    largest rows with W first (estimates of 62 and 64 registers) and the first rows with W a vector at a time, in
    each vector width, compile for sm_90a without a spill."""
    plan = lesson.plan_kernel(hidden, ELEM_BYTES[dtype])
    assert plan.cta_threads == 1024 and plan.register_ceiling() == 64
    (used,) = ptxas_resources(lesson_build(plan, dtype).ptx).values()
    assert (used.frame, used.spill_stores, used.spill_loads) == (0, 0, 0), (str(plan), used)
    assert used.registers <= 64


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("hidden", HIDDEN["lesson"])
def test_the_lesson_keeps_x_in_registers_with_no_bound_or_cluster(hidden, dtype):
    """One plan for every token count: X straight from global memory into registers (no cp.async, bulk copy or
    mbarrier), no launch bound and no cluster; shared memory only for the warps' sums of a row over several warps,
    4 bytes a warp and row."""
    plan = lesson.plan_kernel(hidden, ELEM_BYTES[dtype])
    build = lesson_build(plan, dtype, "sm_90a")
    for absent in ("cp.async", "mbarrier", ".minnctapersm", "barrier.cluster", "st.async"):
        assert absent not in build.ptx, absent
    warps = plan.threads_per_row // 32 if plan.threads_per_row > 32 else 0
    assert build.shared_memory == 4 * warps * plan.rows_per_cta


# -- the companion: plans by token count, staged rows, clusters, launch bounds ---------------------------------


def fused_ptx(dtype, hidden, arch, w_dtype="float32"):
    """The companion's many-token plan without a cluster, alone (compile_rms_norm(plans_by_tokens=False))."""
    return one_plan_ptx("fused", dtype, hidden, arch, w_dtype)[1]


# (hidden, threads per row when staged, else None), worked out by hand from ROW_PLANS: vectors of 8
# elements, ceil(vectors / vectors per thread) rounded up to whole warps.
STAGING = [(2048, None),      # 4 KB: registers
           (2056, 160),       # 257 vectors / 2 = 129 -> 160
           (2560, 160),       # 320 / 2
           (4096, 256),       # 512 / 2
           (5120, 160), (6144, 192),   # over 8 KB: 640 / 4, 768 / 4
           (6152, 224),       # 769 / 4 = 193 -> 224
           (4100, None),      # 4100 % 8 != 0: 8-byte vectors, which cp.async.cg cannot copy
           (8192, None),      # 16 KB: registers
           (10240, 320),      # 20 KB: 1280 / 4
           (12288, 192),      # 24 KB: 1536 / 8
           (16384, None)]     # 32 KB: registers


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("hidden,threads", STAGING)
def test_rows_over_4_kb_are_staged_in_shared_memory_by_cp_async(arch, dtype, hidden, threads):
    """Rows over 4 KB and under 32 KB with hidden % 8 == 0 (staged), except rows of 15-16 KB, copy X to shared
    memory by 16-byte cp.async.cg, one copy per vector, split over whole warps; each thread waits for its own
    copies with no barrier in between, and the only global loads are W's (2 per vector of 8 floats). Other rows
    (short, very long, or hidden % 8 != 0) load X with ld.global and use no cp.async."""
    plan, ptx = one_plan_ptx("fused", dtype, hidden, arch)
    assert staged(plan) == (threads is not None)
    copies = re.findall(r"cp\.async\.(\w+)\.shared\.global \[[^]]+\], \[[^]]+\], (\d+)", ptx)
    if threads is None:
        assert "cp.async" not in ptx
        return
    assert plan.threads_per_row == threads
    assert copies == [("cg", "16")] * plan.vecs_per_thread, copies
    commit, wait = ptx.index("cp.async.commit_group"), ptx.index("cp.async.wait_group")
    assert commit < wait and not re.search(r"bar(?:rier)?\.sync", ptx[:wait])
    assert len(re.findall(r"\bld\.global\.", ptx)) == 2 * plan.vecs_per_thread


# (hidden, threads per row, vectors per thread, rows per CTA), fp16, worked out by hand: a row of n vectors
# gets ceil(n / k) threads rounded up to whole warps (a power of two below a warp), never a power of two
# above one, so that no warp of the row idles (issue 18's cliffs at hidden 1536 and 10240).
@pytest.mark.parametrize("hidden,threads,vecs,rows", [
    (100, 16, 2, 16),      # 25 vectors of 4: 13 -> 16 threads; rows of at most 256 bytes fill 256-thread CTAs
    (1536, 96, 2, 1),      # 192 vectors / 2 = 96 (a power of two: 128 threads, a quarter of them half idle)
    (4608, 160, 4, 1),     # 576 / 4 = 144 -> 160
    (10240, 320, 4, 1),    # 1280 / 4 = 320 (a power of two: 512 threads at 2.5 vectors each)
    (16384, 512, 4, 1),    # 2048 / 4
])
def test_threads_per_row_come_in_whole_warps(hidden, threads, vecs, rows):
    plan = fused.plan_kernel(hidden)
    assert (plan.threads_per_row, plan.vecs_per_thread, plan.rows_per_cta) == (threads, vecs, rows)


@pytest.mark.parametrize("w_dtype, w_loads_per_vector", [("float32", 1), ("float16", 1), ("bfloat16", 1)])
@pytest.mark.parametrize("hidden,is_staged", [(1024, False), (1028, True), (2048, True), (3072, True), (3076, True),
                                              (1030, False), (4096, False)])
def test_fp32_rows_are_staged_by_the_same_byte_thresholds(w_dtype, w_loads_per_vector, hidden, is_staged):
    """The same row sizes in bytes hold for fp32 X (4 elements per 16-byte vector): rows of 4-15 KB (1028-3840
    elements), hidden % 4 == 0, are staged by 16-byte cp.async.cg, 16 KB rows (4096) are not; W's vector of 4
    elements is one load (16 or 8 bytes)."""
    plan, ptx = one_plan_ptx("fused", "float32", hidden, "sm_90a", w_dtype)
    assert staged(plan) == is_staged
    copies = re.findall(r"cp\.async\.(\w+)\.shared\.global \[[^]]+\], \[[^]]+\], (\d+)", ptx)
    if not is_staged:
        assert "cp.async" not in ptx
        return
    assert copies == [("cg", "16")] * plan.vecs_per_thread, copies
    assert len(re.findall(r"\bld\.global\.", ptx)) == w_loads_per_vector * plan.vecs_per_thread


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("elem_bytes", [2, 4])
@pytest.mark.parametrize("hidden", [1, 100, 1024, 2048, 2560, 3072, 4096, 6140, 8192, 12280, 16384])
def test_the_aot_shared_memory_is_what_cutedsl_allocates(hidden, elem_bytes, residual):
    """What the AOT launch asks TensorRT for, against the dynamic shared memory CuteDSL itself computes for the
    same plan's launch (its host code's launch configuration): hidden * element bytes per staged row, of X and,
    in the residual form, of R, 4 per warp of a multi-warp row (the AOT flavor's plan has no cluster and no bulk
    copy)."""
    plan = aot.aot_plan(hidden, elem_bytes, residual)
    dtype = {2: "float16", 4: "float32"}[elem_bytes]
    inferred = plan_build(plan, dtype, "sm_80").shared_memory
    rows = plan.rows_per_cta * (2 if residual else 1)
    by_hand = (rows * hidden * elem_bytes if staged(plan) else 0) + (
        4 * plan.rows_per_cta * (plan.threads_per_row // 32) if plan.threads_per_row > 32 else 0)
    assert aot.shared_memory_bytes(plan) == inferred == by_hand
    assert inferred <= 48 * 1024, "the AOT flavor's plan: more would need an opt-in launch attribute"


@pytest.mark.parametrize("hidden, elem_bytes", [(4096, 2), (8192, 2), (12288, 2), (16384, 2), (8192, 4)])
def test_the_mid_plan_stages_two_rows_and_two_sets_of_warp_sums(hidden, elem_bytes):
    """Two rows staged per CTA, two 8-byte mbarriers where the rows come by bulk copy (padded to 16 bytes), and a
    second set of warp sums so that one barrier per row suffices: as CuteDSL counts the kernel's shared memory.
    Over 48 KB (two 32 KB rows) is fine in the JIT flavor: CuteDSL gives every kernel the device's opt-in maximum
    of dynamic shared memory (cutlass_dsl/cutlass.py, _generate_cuda_kernel_op); the AOT flavor never runs it."""
    plan = fused.plan_kernel(hidden, elem_bytes, 512)
    assert plan.rows_in_sequence == 2 and staged(plan) and plan.rows_per_cta == 1
    barriers = 16 if hidden * elem_bytes > 8192 else 0
    dtype = {2: "float16", 4: "float32"}[elem_bytes]
    inferred = plan_build(plan, dtype).shared_memory
    assert inferred == 2 * hidden * elem_bytes + barriers + 2 * 4 * (plan.threads_per_row // 32)
    assert inferred <= 64 * 1024 + 1024
    assert [plan.grid(n) for n in (385, 512, 1023, 1024)] == [193, 256, 512, 512]


def test_every_plan_keeps_the_kernels_invariants():
    """What the kernel relies on, for every plan the launcher can hold (16-bit and fp32 X, sm_90 and older, every
    hidden size): rows in sequence wait in shared memory; a row split over a cluster keeps X in registers, one row
    per CTA, whole warps per CTA; a CTA has at most 1024 threads; the plan covers the row."""
    for elem_bytes in (2, 4):
        for hidden in range(1, lesson.MAX_HIDDEN + 1, 7):
            for sm90 in (True, False):
                for plan, _ in fused.token_schedule(hidden, elem_bytes, sm90):
                    assert plan.rows_in_sequence == 1 or staged(plan), plan
                    assert plan.cluster_ctas == 1 or (not staged(plan) and plan.rows_per_cta == 1 and
                                                      plan.threads_per_row % (32 * plan.cluster_ctas) == 0), plan
                    assert sm90 or (plan.cluster_ctas == 1 and plan.arrival != "bulk"), plan
                    assert plan.cta_threads <= 1024 and plan.threads_per_row * plan.vecs_per_thread * plan.vec >= hidden


ON_CHIP_CASES = (
    [(x, "float32", h) for x in ("float16", "bfloat16") for h in (1, 100, 1024, 2560, 4096, 5120, 8192, 10240,
                                                                  12288, 16384, lesson.MAX_HIDDEN)]
    + [(x, w, h) for x in ("float16", "bfloat16") for w in ("float16", "bfloat16") for h in (4096, 8192,
                                                                                            lesson.MAX_HIDDEN)]
    + [("float32", w, h) for w in ("float32", "float16", "bfloat16") for h in (1, 100, 1024, 2048, 3072, 4096,
                                                                                8192, 16384, lesson.MAX_HIDDEN)]
)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
@pytest.mark.parametrize("dtype, w_dtype, hidden", ON_CHIP_CASES)
def test_row_stays_on_chip_and_enough_threads_fit_on_an_sm(dtype, w_dtype, hidden):
    """No spills and >= 768 resident threads per SM on sm_90 (64K registers, 228 KB shared memory).

    768 is what the plan gives its register-heaviest rows (hidden 8192 with X and W in registers, 79
    registers, 6 CTAs of 128 threads, two per row; staged rows with W's FP32 vectors held through the reduction, 72-78
    registers); one more register allocation step there would drop a CTA per SM,
    i.e. fewer rows in flight on a kernel that is bound by memory latency (benchmarks/NOTES.md).
    fp32 X at MAX_HIDDEN holds 8 vectors of 4 per thread in 1024-thread CTAs: at most 64 registers each.
    """
    many = fused.plan_kernel(hidden, ELEM_BYTES[dtype])
    schedule = fused.token_schedule(hidden, ELEM_BYTES[dtype])
    assert {plan for plan, _ in schedule} == plans_of(hidden, ELEM_BYTES[dtype])  # the launcher's kernels
    for plan, _ in schedule:  # few, mid and cluster plans too, each compiled alone
        build = plan_build(plan, dtype, "sm_90a", w_dtype)
        (used,) = ptxas_resources(build.ptx).values()
        assert (used.frame, used.spill_stores, used.spill_loads) == (0, 0, 0), (str(plan), used)
        if plan == many:  # occupancy matters for the many-token kernel
            regs = used.registers
            shared_memory = build.shared_memory
    cta = many.cta_threads
    ctas_per_sm = min(65536 // (math.ceil(regs / 8) * 8 * cta),  # 8-register allocation unit
                      228 * 1024 // (shared_memory + 1024),  # 1 KB per CTA reserved by the system
                      2048 // cta, 32)
    assert ctas_per_sm * cta >= 768, f"{regs} registers x {cta} threads: {ctas_per_sm} CTAs per SM"


# (hidden, bytes per element) -> (threads per row, vectors per thread) of the plan for at most FEW_TOKENS rows,
# written from ROW_PLANS' lines; None where the many-token plan is used for every count.
FEW_TOKEN_PLANS = [
    (100, 2, None),          # <= 256 B: W late, several rows per warp
    (1024, 2, None),         # <= 2 KB: already registers, W first
    (1536, 2, None),         # 2-3 KB: already registers, W first (a 1-vector plan gained nothing)
    (2048, 2, None),         # <= 4 KB: already registers, W first
    (4096, 2, (256, 2)),     # many tokens: staged
    (5120, 2, (160, 4)),     # many tokens: staged
    (8192, 2, (256, 4)),     # 16 KB: many tokens: the same split over a cluster of 2 CTAs
    (10240, 2, (320, 4)),    # many tokens: staged, W late
    (12288, 2, (384, 4)),    # many tokens: 192 threads x 8 vectors staged, W late
    (16384, 2, (512, 4)),    # many tokens: registers, W late
    (32768, 2, None),        # 1024 threads: W's registers next to X's would spill
    (5120, 4, (320, 4)),     # fp32: many tokens staged, W late
    (16384, 4, None),        # fp32: 1024 threads
]


@pytest.mark.parametrize("hidden, elem_bytes, few", FEW_TOKEN_PLANS)
def test_few_tokens_get_x_in_registers_and_w_first(hidden, elem_bytes, few):
    """The few-token plan, as GPUs without clusters run it for every count up to FEW_TOKENS."""
    many = fused.plan_kernel(hidden, elem_bytes)
    plans = {fused.plan_kernel(hidden, elem_bytes, n, sm90=False) for n in (1, 37, fused.FEW_TOKENS)}
    assert len(plans) == 1
    (plan,) = plans
    if few is None:
        assert plan == many
        return
    assert plan != many
    assert (plan.threads_per_row, plan.vecs_per_thread) == few
    assert not staged(plan) and plan.early_weight and plan.rows_per_cta == 1 and plan.vec == many.vec


# (hidden, bytes per element) -> (most rows, threads per row, vectors per thread) of the plan for more than
# MID_TOKENS (384) rows, written from ROW_PLANS' lines; None where the many-token plan serves them.
MID_TOKEN_PLANS = [
    (100, 2, None),                 # registers lines have no mid plan
    (1536, 2, None),
    (2052, 2, None),                # 8 KB line, but 8-byte vectors (2052 % 8 == 4): nothing to stage by cp.async.cg
    (4096, 2, (1024, 256, 2)),
    (5120, 2, (1024, 160, 4)),
    (8192, 2, (1024, 256, 4)),      # the 16 KB line keeps X in registers for many rows, stages it here
    (8200, 2, (4096, 288, 4)),      # 20 KB line: 1025 vectors, 257 threads' worth -> 288 threads
    (10240, 2, (4096, 320, 4)),
    (12288, 2, (4096, 384, 4)),     # many rows: 192 threads x 8 vectors
    (16384, 2, (4096, 512, 4)),
    (32768, 2, None),               # 1024 threads: two staged 64 KB rows per CTA would be too much
    (2048, 4, (1024, 256, 2)),      # fp32 X: 8 KB rows, 512 vectors of 4
    (8192, 4, (4096, 512, 4)),      # fp32 X: 32 KB rows
    (16384, 4, None),
]


@pytest.mark.parametrize("hidden, elem_bytes, mid", MID_TOKEN_PLANS)
def test_mid_token_counts_get_two_staged_rows_in_turn_per_cta(hidden, elem_bytes, mid):
    many = fused.plan_kernel(hidden, elem_bytes)
    assert fused.MID_TOKENS == 384
    most = mid[0] if mid else 1024
    assert all(fused.plan_kernel(hidden, elem_bytes, n).rows_in_sequence == 1 for n in (384, most + 1))
    plans = {fused.plan_kernel(hidden, elem_bytes, n) for n in (385, 512, most)}
    assert len(plans) == 1
    (plan,) = plans
    if mid is None:
        assert plan == many
        return
    assert (plan.threads_per_row, plan.vecs_per_thread) == mid[1:]
    assert staged(plan) and plan.early_weight and plan.rows_in_sequence == 2 and plan.vec == many.vec


# (hidden, bytes per element, token count) -> the launch bound (CTAs per SM) of the plan for that count, written
# from ROW_PLANS and MID_BOUND: the own plans of rows of 257 B to 2 KB and of exactly 3 KB, and mid plans of at
# least 480 threads, have one, except where fit_registers drops it (odd 16-bit rows of 513-1023 elements).
LAUNCH_BOUNDS = [
    (1536, 2, None, 8),      # 3 KB: 192 vectors fill 96 threads x 2 exactly
    (1536, 2, 4096, 8),
    (1536, 2, 512, 8),       # registers lines have no mid plan: the own plan
    (1536, 2, 1, 8),         # no few-token plan: the own plan at every count
    (1536, 2, 128, 8),
    (768, 4, None, 8),       # fp32 rows of 3 KB
    (1472, 2, None, 0),      # 2944 B: 184 vectors over 96 x 2
    (1280, 2, None, 0),
    (1025, 2, None, 0),      # 2050 B: just past the 2 KB line
    (1540, 2, None, 0),      # 3080 B: the 4 KB line
    (1024, 2, None, 8),      # 2 KB: the 2 KB line's own plan serves every count
    (1024, 2, 1, 8),
    (1000, 2, 4096, 8),      # ragged rows of the 2 KB line too
    (512, 2, 128, 8),
    (512, 4, None, 8),       # fp32 rows of 2 KB
    (129, 2, None, 8),       # 258 B: the shortest rows of the 2 KB line
    (128, 2, None, 0),       # 256 B: rows of a few vectors, W after the reduction
    (8192, 2, None, 0),
    (15360, 2, 512, 2),      # mid plan: 480 threads x 4 vectors
    (15360, 2, 4096, 2),
    (15360, 2, None, 0),     # its own plan: 256 threads x 8 vectors, W late
    (14848, 2, 1024, 2),     # 1856 vectors: 464 threads' worth -> 480
    (16384, 2, 512, 2),      # 512 threads
    (14336, 2, 512, 0),      # 448 threads: two CTAs fit without a bound
    (12288, 2, 512, 0),
    (7680, 4, 512, 2),       # fp32 X: 480 threads x 4 vectors of 4
]


@pytest.mark.parametrize("hidden, elem_bytes, tokens, bound", LAUNCH_BOUNDS)
def test_launch_bound_of_each_plan(hidden, elem_bytes, tokens, bound):
    assert fused.plan_kernel(hidden, elem_bytes, tokens).min_ctas_per_sm == bound


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
@pytest.mark.parametrize("hidden, elem_bytes", [(5120, 2), (10240, 2), (12288, 2), (14336, 2), (14848, 2),
                                                (15360, 2), (16384, 2), (7680, 4), (8192, 4)])
def test_two_mid_plan_ctas_fit_on_an_sm(hidden, elem_bytes):
    """A mid-plan CTA stages two rows and works on one while the other arrives; the SM needs a second CTA to
    overlap that CTA's waits. ptxas -v of the mid kernel (sm_90a): registers and shared memory leave room for
    two. Without the plan's bound, hidden 15360 took 66 registers at 480 threads and fit one."""
    dtype = {2: "float16", 4: "float32"}[elem_bytes]
    mid = fused.plan_kernel(hidden, elem_bytes, 512)
    assert mid.rows_in_sequence == 2
    build = plan_build(mid, dtype)
    (regs,) = (used.registers for used in ptxas_resources(build.ptx).values())
    ctas_per_sm = min(65536 // (math.ceil(regs / 8) * 8 * mid.cta_threads),
                      228 * 1024 // (build.shared_memory + 1024))
    assert ctas_per_sm >= 2, f"{regs} registers x {mid.cta_threads} threads"


@pytest.mark.parametrize("hidden, bounded", [(1536, 1), (1472, 0), (1000, 1), (100, 0)])
def test_the_launch_bound_reaches_ptxas(hidden, bounded):
    """The launcher's kernel for the bounded plan carries .minnctapersm, and no other kernel does; it compiles
    without a GPU (the carveout that launch_kernel passes)."""
    kernels = entries(launcher_ptx(hidden, "float16", "sm_90a"))
    bounds = {name: re.findall(r"^\.minnctapersm (\d+)$", text, flags=re.M) for name, text in kernels.items()}
    assert sorted(b for found in bounds.values() for b in found) == ["8"] * bounded
    many = fused.plan_kernel(hidden, 2)
    assert all(bool(found) == (bool(bounded) and f"_{many}_" in name) for name, found in bounds.items())


def load_order(ptx, arch="sm_90a"):
    """(loads issued after the thread first waits for loaded data, global loads) in the SASS ptxas makes of one
    kernel's PTX, as support/check_kernel.py reads nvdisasm's listing."""
    if shutil.which("nvdisasm") is None:  # requirements-test.txt installs it; in CI this skip is a failure
        pytest.skip("nvdisasm is not on PATH (pip install nvidia-cuda-nvdisasm)")
    _, sass = check_kernel.assemble(ptx, arch, disassemble=True)
    return check_kernel.load_order(sass)


@pytest.mark.parametrize("dtype, hidden", [("float16", 1536), ("bfloat16", 1536), ("float16", 1024),
                                           ("float16", 2048), ("float16", 512), ("bfloat16", 512),
                                           ("bfloat16", 256), ("float16", 1000), ("bfloat16", 1000),
                                           ("float16", 768)])
def test_w_first_means_every_load_issues_before_x_is_read(dtype, hidden):
    """A registers plan with W first should have all of a thread's X and W loads in flight before it first
    waits for loaded data. ptxas, not the source, decides: for hidden 1536 and rows up to 2 KB only the plan's
    launch bound makes it so, and in ragged rows (1000, 768) also W's clamped loads (benchmarks/NOTES.md, fifth
    and sixth passes); 2048 gets it without either. In a ragged row X's last load is predicated, still one
    instruction."""
    plan, ptx = one_plan_ptx("fused", dtype, hidden, "sm_90a")
    assert plan.early_weight and not staged(plan)
    late, loads = load_order(ptx)
    assert loads == plan.vecs_per_thread * (1 + plan.vec * 4 // 16)  # 16 bytes of X, fp32 W in 16-byte loads
    assert late == 0


@pytest.mark.parametrize("hidden, kernels", [(1024, 1), (1536, 1), (4096, 3), (8192, 4), (12288, 4), (16384, 3),
                                             (lesson.MAX_HIDDEN, 2)])
def test_launcher_holds_one_kernel_per_distinct_plan(hidden, kernels):
    """Every plan's kernel is in the launcher's module once, named by its plan (a plan may serve two ranges of
    counts, e.g. 129-384 and over 1024; 32 KB rows and longer run the cluster plan for every few-token count);
    without the plans by token count (the AOT flavor's case) there is exactly one, the many-token plan's without
    a cluster."""
    names = list(entries(launcher_ptx(hidden, "float16", "sm_90a")))
    assert len(names) == kernels == len(plans_of(hidden))
    assert all(sum(f"_{plan}_" in name for name in names) == 1 for plan in plans_of(hidden))
    (only,) = entries(fused_ptx("float16", hidden, "sm_90a"))
    assert f"_{fused.plan_kernel(hidden, sm90=False)}_" in only


# (hidden, bytes per element) -> (most rows, threads per row, vectors per thread) of the cluster plan, written
# from ROW_PLANS' cluster column (threads in whole warps per CTA: multiples of 32 x CLUSTER_CTAS = 128); None
# where the line has none.
CLUSTER_PLANS = [
    (1024, 2, None),
    (4096, 2, None),             # 8 KB line
    (5120, 2, None),             # 15 KB line
    (8192, 2, (32, 256, 4)),     # 16 KB line: 1024 vectors at 4 per thread
    (9216, 2, (32, 640, 2)),     # 20 KB line: 1152 vectors at 2 -> 576 threads, 5 x 128 -> ragged
    (10240, 2, (32, 640, 2)),    # 1280 vectors at 2
    (12288, 2, (32, 384, 4)),    # 32 KB line (exclusive): 1536 vectors at 4
    (16384, 2, (128, 512, 4)),   # last line: 2048 vectors at 4, every few-token count
    (32768, 2, (128, 1024, 4)),  # 256 threads per CTA
    (4096, 4, (32, 256, 4)),     # fp32 X: 16 KB rows
    (16384, 4, (128, 1024, 4)),  # fp32 X: 64 KB rows
    (8190, 2, None),             # 4-byte vectors: 2048 threads at 4 each; clusters only with 16-byte vectors
    (30720, 4, None),            # fp32 X: 7680 vectors at 4 -> 1920 threads, over the 1024 a cluster keeps to
]


@pytest.mark.parametrize("hidden, elem_bytes, cluster", CLUSTER_PLANS)
def test_few_rows_of_16_kb_and_more_are_split_over_a_cluster(hidden, elem_bytes, cluster):
    """Up to the line's count, CLUSTER_CTAS CTAs share each row, X in registers, W first; one more row, or a GPU
    without clusters, and the plan has no cluster."""
    assert fused.CLUSTER_CTAS == 4
    if cluster is None:
        assert all(fused.plan_kernel(hidden, elem_bytes, n).cluster_ctas == 1 for n in (1, 32, 128, None))
        return
    most, threads, vecs = cluster
    plans = {fused.plan_kernel(hidden, elem_bytes, n) for n in (1, most)}
    assert len(plans) == 1
    (plan,) = plans
    assert (plan.cluster_ctas, plan.threads_per_row, plan.vecs_per_thread) == (4, threads, vecs)
    assert plan.cta_threads == threads // 4 and plan.rows_per_cta == 1
    assert not staged(plan) and plan.early_weight
    assert [plan.grid(n) for n in (1, 7, most)] == [4, 28, 4 * most]
    dtype = {2: "float16", 4: "float32"}[elem_bytes]  # every warp's sum of the row, and one mbarrier (one row)
    assert plan_build(plan, dtype).shared_memory == 4 * threads // 32 + 8
    assert fused.plan_kernel(hidden, elem_bytes, most + 1).cluster_ctas == 1
    assert fused.plan_kernel(hidden, elem_bytes, 1, sm90=False).cluster_ctas == 1


def test_the_16_kb_line_splits_many_rows_over_two_ctas():
    """Its own plan, 256 threads x 4 vectors with W first and X in registers, over a cluster of two 128-thread
    CTAs for more than 1024 rows (its mid plan's most) on sm_90 and newer; one CTA per row for 33-384 rows, before
    sm_90 and for the AOT flavor; no other line splits many rows."""
    plan = fused.plan_kernel(8192, 2)
    assert (plan.cluster_ctas, plan.threads_per_row, plan.cta_threads, plan.vecs_per_thread) == (2, 256, 128, 4)
    assert not staged(plan) and plan.early_weight and plan.rows_per_cta == 1
    assert [plan.grid(n) for n in (1025, 4096)] == [2050, 8192]
    assert {fused.plan_kernel(8192, 2, n) for n in (1025, 32768)} == {plan}
    unsplit = {fused.plan_kernel(8192, 2, n) for n in (33, 128, 129, 384)}
    assert unsplit == {fused.FusedPlan(hidden=8192, elem_bytes=2, vec=8, threads_per_row=256, rows_per_cta=1,
                                       vecs_per_thread=4, early_weight=True)}
    assert fused.plan_kernel(4096, 4) == fused.FusedPlan(hidden=4096, elem_bytes=4, vec=4, threads_per_row=256,
                                                         rows_per_cta=1, vecs_per_thread=4, early_weight=True,
                                                         cluster_ctas=2)  # fp32 X: also 16 KB rows
    assert fused.plan_kernel(8192, 2, sm90=False).cluster_ctas == 1
    assert all(fused.plan_kernel(h, 2).cluster_ctas == 1 for h in (1024, 4096, 7680, 8200, 12288, 16384, 32768))


def test_the_schedule_gives_every_token_count_one_plan():
    """token_schedule's ranges tile the counts from 1 up, without overlap, each to the plan plan_kernel gives."""
    for hidden, elem_bytes in [(1024, 2), (1536, 2), (4096, 2), (8192, 2), (12288, 2), (16384, 2), (16384, 4)]:
        for sm90 in (True, False):
            schedule = fused.token_schedule(hidden, elem_bytes, sm90)
            for n in [1, 2, 31, 32, 33, 127, 128, 129, 384, 385, 1024, 1025, 4096, 4097, 5000]:
                hits = [plan for plan, counts in schedule
                        for fewer, most in counts if (fewer is None or n > fewer) and (most is None or n <= most)]
                assert hits == [fused.plan_kernel(hidden, elem_bytes, n, sm90)], (hidden, n, sm90)


def test_compile_targets_before_sm_90_get_no_cluster():
    assert [fused.is_sm90(a) for a in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120f")] \
        == [False, False, False, True, True, True, True]
    names = list(entries(launcher_ptx(16384, "float16", "sm_80")))
    assert not any("c4k" in name for name in names) and len(names) == 3


@pytest.mark.parametrize("hidden", [8192, 16384])
def test_the_cluster_plan_adds_the_warp_sums_across_the_cluster(hidden):
    """The cluster kernel's PTX: the CTA's mbarrier is set up and fenced for the cluster before the relaxed
    arrive, which comes before X's loads; the cluster wait comes after them; then each warp sends its sum
    (st.async into a peer's shared memory, counted by the peer's mbarrier) and waits on its own mbarrier; no
    CTA barrier, and every store after the wait."""
    plan = fused.plan_kernel(hidden, 2, 1)
    ptx = kernel_of(launcher_ptx(hidden, "float16", "sm_90a"), plan)

    def at(pattern):
        found = [m.start() for m in re.finditer(pattern, ptx)]
        assert found, pattern
        return found

    (init,), (fence,), (arrive,), (wait,) = (at(r"mbarrier\.init\."), at(r"fence\.mbarrier_init\.release\.cluster;"),
                                            at(r"barrier\.cluster\.arrive\.relaxed;"), at(r"barrier\.cluster\.wait;"))
    loads, stores = at(r"ld\.global\.v4\.b32"), at(r"st\.global\.v4\.b32")
    sends = at(r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.b32")
    (expect,), waits = at(r"mbarrier\.arrive\.expect_tx"), at(r"mbarrier\.try_wait")
    # per vector of the thread: one 16-byte load of X, two of W (8 fp32 values), one store of Y
    assert len(loads) == 3 * plan.vecs_per_thread and len(stores) == plan.vecs_per_thread and len(sends) == 1
    assert init < fence < arrive < min(loads) and max(loads) < wait < expect < sends[0] < min(waits)
    assert max(waits) < min(stores)
    assert "bar.sync" not in ptx and "barrier.sync" not in ptx


@pytest.mark.parametrize("hidden", [2056, 4096])
def test_the_mid_plan_stores_its_first_row_before_waiting_for_the_second(hidden):
    """The point of the mid plan: both rows are requested up front (2 x vecs_per_thread 16-byte cp.async, one
    commit group each), row 1 waits for its own group only (wait_group 1), and its stores are issued before
    the wait for row 2 (wait_group 0)."""
    mid = fused.plan_kernel(hidden, 2, 512)
    assert mid.arrival == "cp.async"
    ptx = kernel_of(launcher_ptx(hidden, "float16", "sm_90a"), mid)
    copies = [m.start() for m in re.finditer(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 16\b", ptx)]
    commits = [m.start() for m in re.finditer(r"cp\.async\.commit_group;", ptx)]
    waits = {int(m[1]): m.start() for m in re.finditer(r"cp\.async\.wait_group\s+(\d+);", ptx)}
    assert len(copies) == 2 * mid.vecs_per_thread and len(commits) == 2 and list(waits) == [1, 0]
    first_wait, last_wait = waits[1], waits[0]
    assert max(copies) < commits[1] < first_wait
    stores = [m.start() for m in re.finditer(r"st\.global\.v4\.b32", ptx)]
    assert len(stores) == 2 * mid.vecs_per_thread
    assert first_wait < min(stores) and sorted(stores)[mid.vecs_per_thread - 1] < last_wait


# (hidden, bytes per element) -> whether the mid plan's rows arrive by bulk copy on sm_90 and newer: rows of more
# than 8 KB (BULK_ROW_BYTES) only; None where the line has no mid plan.
MID_BULK = [
    (1536, 2, None),
    (4096, 2, False),   # exactly 8 KB
    (4104, 2, True),    # 8208 bytes
    (5120, 2, True),
    (8192, 2, True),
    (16384, 2, True),
    (2048, 4, False),   # fp32 X: 8 KB
    (2056, 4, True),
    (8192, 4, True),
]


@pytest.mark.parametrize("hidden, elem_bytes, bulk", MID_BULK)
def test_mid_plan_rows_over_8_kb_arrive_by_one_bulk_copy_each_on_sm_90(hidden, elem_bytes, bulk):
    """Only the mid plan, only on sm_90 and newer (cp.async.bulk needs it), only for rows over 8 KB."""
    mid = fused.plan_kernel(hidden, elem_bytes, 512)
    assert mid.rows_in_sequence == (1 if bulk is None else 2)
    assert (mid.arrival == "bulk") is bool(bulk)
    assert fused.plan_kernel(hidden, elem_bytes, 512, sm90=False).arrival != "bulk"
    beyond = fused.row_plan(hidden, elem_bytes).mid[0] + 1  # MID_TOKEN_PLANS pins each line's mid[0]
    assert not any(fused.plan_kernel(hidden, elem_bytes, n).arrival == "bulk" for n in (1, 128, 384, beyond, None))


@pytest.mark.parametrize("hidden", [5120, 12288])
def test_the_bulk_mid_plan_copies_each_row_in_one_instruction_and_stores_row_1_before_waiting_for_row_2(hidden):
    """Thread 0 sets up one mbarrier per row, a barrier makes them visible, thread 0 arms each with the row's
    bytes and issues one cp.async.bulk per row (no per-vector cp.async), and row 1's stores come before the wait
    for row 2. On sm_80 the same count runs the cp.async plan."""
    mid = fused.plan_kernel(hidden, 2, 512)
    ptx = kernel_of(launcher_ptx(hidden, "float16", "sm_90a"), mid)
    inits = [m.start() for m in re.finditer(r"mbarrier\.init\.shared(::cta)?\.b64", ptx)]
    sync = ptx.index("bar.sync")
    expects = [m.start() for m in re.finditer(r"mbarrier\.arrive\.expect_tx\.shared(::cta)?\.b64", ptx)]
    copies = [m.start() for m in re.finditer(r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes",
                                             ptx)]
    waits = [m.start() for m in re.finditer(r"mbarrier\.try_wait\.parity\.shared(::cta)?\.b64", ptx)]
    stores = sorted(m.start() for m in re.finditer(r"st\.global\.v4\.b32", ptx))
    assert len(inits) == len(expects) == len(copies) == 2 and "cp.async.cg" not in ptx
    assert max(inits) < sync < expects[0] < copies[0] < expects[1] < copies[1] < min(waits)
    assert len(stores) == 2 * mid.vecs_per_thread
    assert min(waits) < stores[0] and stores[mid.vecs_per_thread - 1] < max(waits) < stores[mid.vecs_per_thread]
    before_sm90 = launcher_ptx(hidden, "float16", "sm_80")
    assert "cp.async.bulk" not in before_sm90 and "cp.async.cg" in before_sm90


# -- both kernels again: the sum, the rsqrt, the parameters, the rule's range and the compile cache -------------


def sum_of_squares_depth(ptx):
    """Length of the longest chain of dependent FP32 multiply/adds feeding the kernel's first warp shuffle."""
    depth = {}
    for line in ptx.splitlines():
        op = re.match(r"\s*(?:fma|add|mul)(?:\.rn)?\.f32\s+(%r\d+),\s*(.*);", line)
        if op:
            depth[op[1]] = 1 + max((depth.get(r, 0) for r in re.findall(r"%r\d+", op[2])), default=0)
        shuffle = re.match(r"\s*shfl\.sync\.bfly\.b32\s+%r\d+,\s*(%r\d+)", line)
        if shuffle:
            return depth.get(shuffle[1], 0)
    raise AssertionError("no warp shuffle in the PTX")


@pytest.mark.parametrize("kernel, hidden", [case for case in KERNEL_CASES if case[1] > 1])  # 1: no shuffle
def test_each_thread_sums_its_squares_in_a_short_chain(kernel, hidden):
    """Every row waits for this chain before its shuffles: vec + vecs_per_thread adds, not their product."""
    plan, ptx = one_plan_ptx(kernel, "float16", hidden, "sm_90a")
    depth = sum_of_squares_depth(ptx)
    assert 0 < depth <= plan.vec + plan.vecs_per_thread + 1, (depth, plan)


@pytest.mark.parametrize("kernel", ONE_PLAN)
@pytest.mark.parametrize("eps,ftz", [(1e-5, True), (1e-12, True), (lesson.FLT_MIN, True),
                                     (lesson.FLT_MIN / 2, False), (1e-40, False)])
def test_rsqrt_flushes_subnormals_only_when_epsilon_is_a_normal_float32(kernel, eps, ftz):
    """rsqrt's argument is at least eps: from eps >= FLT_MIN on it is never subnormal and the ftz form is exact."""
    plan = ONE_PLAN[kernel](1024, 2)
    ptx = plan_build(plan, "float16", "sm_90a", epsilon=eps).ptx
    assert re.findall(r"rsqrt\.approx(?:\.ftz)?\.f32", ptx) == ["rsqrt.approx.ftz.f32" if ftz else "rsqrt.approx.f32"]


@pytest.mark.parametrize("kernel", ONE_PLAN)
def test_sum_of_squares_is_accumulated_in_fp32(kernel):
    _, ptx = one_plan_ptx(kernel, "bfloat16", 4096, "sm_90a")
    assert re.search(r"\bfma\.rn\.f32\b|\bmul\.rn\.f32\b|\badd\.rn\.f32\b|\bmul\.f32\b|\badd\.f32\b", ptx)
    assert "cvt.rn.bf16x2.f32" in ptx or "cvt.rn.bf16.f32" in ptx, "cast to bf16 happens once, on store"


@pytest.mark.parametrize("kernel", ONE_PLAN)
def test_kernel_entry_takes_x_w_num_tokens_y_in_tensorrts_aot_order(kernel):
    """The .entry parameters are exactly (u64 X, u64 W, u32 num_tokens, u64 Y), and the row's sum is added by
    warp shuffles."""
    _, ptx = one_plan_ptx(kernel, "float16", 1024, "sm_90a")
    found = re.findall(r"\.visible \.entry (\w+)\(([^)]*)\)", ptx)
    assert len(found) == 1
    params = re.findall(r"\.param \.(\w+)", found[0][1])
    assert params == ["u64", "u64", "u32", "u64"], params
    assert "shfl.sync.bfly.b32" in ptx


@pytest.mark.parametrize("kernel", ONE_PLAN)
@pytest.mark.parametrize("hidden,vec", [(1, 1), (7, 1), (6, 2), (100, 4), (1000, 8), (16384, 8)])
def test_plan_picks_the_widest_vector_that_divides_the_row(kernel, hidden, vec):
    plan = ONE_PLAN[kernel](hidden, 2)
    assert plan.vec == vec
    assert plan.threads_per_row * plan.vecs_per_thread * plan.vec >= hidden  # the row is covered
    assert plan.cta_threads <= 1024


@pytest.mark.parametrize("kernel", ONE_PLAN)
@pytest.mark.parametrize("hidden", [0, -1, lesson.MAX_HIDDEN + 1])
def test_out_of_range_hidden_is_refused(kernel, hidden):
    with pytest.raises(ValueError, match="hidden"):
        ONE_PLAN[kernel](hidden, 2)


def test_max_hidden_is_the_longest_row_the_plan_holds_in_registers():
    """The flags check MAX_HIDDEN before the plan exists; it must be both rules' real limit, for 16-bit and
    fp32 rows alike (an fp32 row takes twice the vectors of half the elements): 1024 threads of whole vectors,
    X in registers, the lesson's W a vector at a time at the store."""
    for elem_bytes in (2, 4):
        for rule in (lesson.plan_kernel, fused.plan_kernel):
            plan = rule(lesson.MAX_HIDDEN, elem_bytes)
            assert plan.threads_per_row == 1024 and plan.vecs_per_thread * plan.vec * plan.threads_per_row == 32768
            assert plan.vec * elem_bytes == 16 and plan.cta_threads == 1024
        assert not staged(fused.plan_kernel(lesson.MAX_HIDDEN, elem_bytes))
        assert lesson.plan_kernel(lesson.MAX_HIDDEN, elem_bytes).weight_by_vector
    assert lesson.MAX_HIDDEN == 32768


# Each value compile_rms_norm bakes into a kernel, changed one at a time; then the companion's own.
BAKED_IN = [{"dtype": "bfloat16"}, {"dtype": "float32"}, {"w_dtype": "float16"}, {"w_dtype": "bfloat16"},
            {"hidden": 1000}, {"epsilon": 1e-6}, {"arch": "sm_80"}]
COMPANION_BAKED_IN = [{"plans_by_tokens": False}, {"residual": True}, {"y_scale": 0.5}]


def test_every_baked_in_value_is_in_the_compile_cache_key():
    """Each file's compile_rms_norm compiles once per process for each value its kernel bakes in, and the lesson's
    and the companion's launchers for the same arguments are two (their kernels differ)."""
    base = {"dtype": "float16", "hidden": 1024, "epsilon": 1e-5, "arch": "sm_90a"}
    for module, changes in ((lesson, BAKED_IN), (fused, BAKED_IN + COMPANION_BAKED_IN)):
        first = module.compile_rms_norm(**base)
        assert module.compile_rms_norm(**base) is first
        launchers = [first] + [module.compile_rms_norm(**{**base, **change}) for change in changes]
        assert len({id(launcher) for launcher in launchers}) == len(launchers), module.__name__
    assert lesson.compile_rms_norm(**base) is not fused.compile_rms_norm(**base)


@pytest.mark.parametrize("hidden,line", [
    (1024, "64 threads/row x 2 vectors of 8 x 16-bit, 2 rows/CTA, X in registers, W first, launch bound 8 CTAs/SM"),
    (4096, "256 threads/row x 2 vectors of 8 x 16-bit, 1 row/CTA, X staged by cp.async, W first"),
    (100, "16 threads/row x 2 vectors of 4 x 16-bit, 16 rows/CTA, X in registers, W late"),
    (1536, "96 threads/row x 2 vectors of 8 x 16-bit, 1 row/CTA, X in registers, W first, launch bound 8 CTAs/SM"),
])
def test_plan_describes_how_the_kernel_holds_a_row(hidden, line):
    """What main() and --plans print: split, vector, rows per CTA, how X arrives, when W is loaded."""
    assert fused.plan_kernel(hidden).describe() == line


@pytest.mark.parametrize("hidden, elem_bytes, line", [
    (1024, 2, "64 threads/row x 2 vectors of 8 x 16-bit, 2 rows/CTA, X in registers, W first"),
    (100, 2, "16 threads/row x 2 vectors of 4 x 16-bit, 8 rows/CTA, X in registers, W first"),
    (32768, 4, "1024 threads/row x 8 vectors of 4 x 32-bit, 1 row/CTA, X in registers, W a vector at a time at "
               "the store"),
])
def test_the_lessons_plan_describes_how_the_kernel_holds_a_row(hidden, elem_bytes, line):
    """What the lesson's main() and --plans print for every token count."""
    assert lesson.plan_kernel(hidden, elem_bytes).describe() == line


def test_the_mid_plan_describes_its_rows_in_turn():
    assert fused.plan_kernel(8192, 2, 512).describe() == ("256 threads/row x 4 vectors of 8 x 16-bit, 2 rows/CTA in "
                                                          "turn, X staged by bulk copy, W first")
    assert fused.plan_kernel(4096, 2, 512).describe() == ("256 threads/row x 2 vectors of 8 x 16-bit, 2 rows/CTA in "
                                                          "turn, X staged by cp.async, W first")


def test_the_cluster_plan_describes_its_split():
    assert fused.plan_kernel(16384, 2, 1).describe() == ("512 threads/row x 4 vectors of 8 x 16-bit, each row over a "
                                                         "cluster of 4 CTAs, X in registers, W first")


def test_dtype_table_names_the_same_type_in_every_library():
    """One row per dtype: torch, CuTe, the cupy carrier and TensorRT agree on its size, ONNX names the same
    type; a 16-bit Y's rtol (Y_TOLERANCE) is one ulp (fp32's is derived in test_tolerance.py)."""
    import cutlass
    import numpy as np
    import onnx
    import torch

    trt = pytest.importorskip("tensorrt_rtx")  # the same DataType members as tensorrt's
    for name, row in lesson.DTYPES.items():
        torch_dtype = getattr(torch, row.torch)
        assert str(torch_dtype) == f"torch.{name}"
        assert torch_dtype.itemsize == row.bytes
        assert getattr(cutlass, row.cute).width == 8 * row.bytes
        assert np.dtype(row.cupy).itemsize == row.bytes
        if hasattr(np, name):  # numpy has no bfloat16: that one's carrier only needs the width
            assert np.dtype(row.cupy) == np.dtype(name)
        assert getattr(trt.DataType, row.trt).itemsize == row.bytes
        assert str(onnx.helper.tensor_dtype_to_np_dtype(getattr(onnx.TensorProto, row.onnx))) == name
    for name in ("float16", "bfloat16"):
        assert lesson.Y_TOLERANCE[name].rtol == torch.finfo(getattr(torch, name)).eps
    assert lesson.Y_TOLERANCE["float32"].rtol == 2.0 ** -18
    assert sorted(lesson.ACTIVATION_DTYPES) == sorted(lesson.WEIGHT_DTYPES) == ["bfloat16", "float16", "float32"]
    assert lesson.WEIGHT_DTYPES[0] == "float32", "the default W"
