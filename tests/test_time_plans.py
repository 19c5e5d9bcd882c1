"""CPU: benchmarks/experiments/time_plans.py builds the plans its specs name, and its launch bound reaches ptxas.

The plans below are worked out by hand from the spec grammar in the script's docstring (not from plan_kernel).
"""

import re
import shutil

import pytest

from conftest import load_experiment


@pytest.fixture(scope="module")
def time_plans():
    return load_experiment("time_plans")


@pytest.mark.parametrize("spec,hidden,fields,min_ctas", [
    # (threads, rows per CTA, vectors per thread, W early, how X arrives)
    ("t96k2", 1536, (96, 1, 2, True, "registers"), 0),
    ("t160k4sl", 5120, (160, 1, 4, False, "cp.async"), 0),
    ("t16k2lr16m8", 100, (16, 16, 2, False, "registers"), 8),   # 100 % 8 != 0: vectors of 4, 25 of them
    ("t32k4", 1000, (32, 4, 4, True, "registers"), 0),           # 128 threads per CTA: 4 rows
])
def test_a_spec_names_the_plan(time_plans, spec, hidden, fields, min_ctas):
    plan = time_plans.parse_plan(spec, hidden, 2)
    assert (plan.threads_per_row, plan.rows_per_cta, plan.vecs_per_thread, plan.early_weight, plan.arrival) == fields
    assert plan.min_ctas_per_sm == min_ctas
    assert plan.rows_in_sequence == 1


def test_a_spec_puts_rows_in_sequence(time_plans):
    plan = time_plans.parse_plan("t384k4sq2", 12288, 2)
    assert (plan.threads_per_row, plan.vecs_per_thread, plan.arrival, plan.early_weight) == (384, 4, "cp.async", True)
    assert (plan.rows_per_cta, plan.rows_in_sequence, plan.cta_rows, plan.min_ctas_per_sm) == (1, 2, 2, 0)
    bulk = time_plans.parse_plan("t384k4sbq2", 12288, 2)
    assert (bulk.arrival, bulk.threads_per_row, bulk.vecs_per_thread, bulk.rows_in_sequence) == ("bulk", 384, 4, 2)


@pytest.mark.parametrize("spec,hidden,why", [
    ("t64k1", 1024, "covers 512 elements"),
    ("t32k4s", 100, "8-byte vectors"),
    ("64k2", 1024, "not of the form"),
    ("t48k4", 1536, "whole warps"),        # 48 threads: Step 3 would sum one warp of the row's two
    ("t96k2q2", 1536, "needs s"),
    ("t256k4b", 8192, "copies rows in bulk, which needs s"),  # a bulk copy writes to shared memory only
    ("t256k4sc2", 8192, "splits a row over a cluster"),       # a cluster's row stays in registers
    ("t256k4r2c2", 8192, "splits a row over a cluster"),      # one row per CTA of a cluster
    ("t96k2c4", 1536, "splits a row over a cluster"),         # 24 threads per CTA: not whole warps
])
def test_a_spec_that_cannot_serve_the_row_is_refused(time_plans, spec, hidden, why):
    with pytest.raises(ValueError, match=why):
        time_plans.parse_plan(spec, hidden, 2)


def test_the_launch_bound_reaches_the_ptx(time_plans):
    plan = time_plans.parse_plan("t64k2lm16", 1024, 2)
    ptx = time_plans.compile_plan(time_plans.sample, "float16", plan, "sm_90a").__ptx__
    assert re.search(r"\.minnctapersm 16\b", ptx)
    unbounded = time_plans.compile_plan(time_plans.sample, "float16", time_plans.parse_plan("t64k2l", 1024, 2),
                                        "sm_90a").__ptx__
    assert ".minnctapersm" not in unbounded


@pytest.mark.parametrize("spec, hidden, order", [
    ("t96k2", 1536, (4, 6)),    # 2 X loads, 4 W loads (fp32, 16 bytes each); W's come after X is first read
    ("t96k2m8", 1536, (0, 6)),  # under 8 CTAs per SM every load comes first
    ("t64k2", 1000, (4, 6)),    # ragged, unbounded: X's two (predicated) loads first, all four W loads after
])
def test_the_register_report_counts_loads_issued_after_the_first_wait(time_plans, spec, hidden, order):
    """Counts read off nvdisasm's listings by hand (CUDA 13.0 and 13.5 ptxas agree)."""
    if shutil.which("nvdisasm") is None:  # requirements-test.txt installs it; in CI a failure
        pytest.skip("nvdisasm is not on PATH (pip install nvidia-cuda-nvdisasm)")
    plan = time_plans.parse_plan(spec, hidden, 2)
    ptx = time_plans.compile_plan(time_plans.sample, "float16", plan, "sm_90a").__ptx__
    assert time_plans.ptxas_report(ptx)[2:] == order
