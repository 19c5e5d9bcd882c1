"""CPU: benchmarks/experiments/persistent_ring.py builds the variant its spec names and compiles it
for sm_90a.

The counts below follow from the script's design, worked out by hand: thread 0 issues one bulk copy
per ring slot before the row loop (unrolled, one per slot) and one refill inside the loop; the
launch bound is the variant's CTAs per SM.
"""

import re

import pytest

from conftest import load_experiment

BULK_COPY = r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes"


@pytest.fixture(scope="module")
def ring():
    return load_experiment("persistent_ring")


@pytest.mark.parametrize("spec,hidden,why", [
    ("t384k4s2p2", 10240, "must cover 10240"),    # 384 x 4 x 8 = 12288
    # covers the row, but Step 3's sums need whole warps
    ("t48k32s2p1", 12288, "whole warps"),
    ("t384k4s2", 12288, "not of the form"),
])
def test_a_variant_that_cannot_serve_the_row_is_refused(ring, spec, hidden, why):
    with pytest.raises(ValueError, match=why):
        ring.parse_variant(spec, hidden)


@pytest.mark.parametrize("spec,slots,ctas", [("t384k4s2p2", 2, 2), ("t384k4s4p1", 4, 1)])
def test_one_bulk_copy_per_slot_up_front_and_one_refill_in_the_loop(ring, spec, slots, ctas):
    variant = ring.parse_variant(spec, 12288)
    assert variant == (12288, 384, 4, slots, ctas)
    ptx = ring.compile_variant("bfloat16", variant, "sm_90a", 132, keep_ptx=True).__ptx__
    assert len(re.findall(BULK_COPY, ptx)) == slots + 1
    assert re.findall(r"\.minnctapersm (\d+)", ptx) == [str(ctas)]
