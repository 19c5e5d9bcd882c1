"""CPU: benchmarks/experiments/compile_hints.py deletes exactly the eviction hints each of its variants names.

The source below is written by hand in the form torch 2.11's inductor printed for RMSNorm at 16384 x 12288
(three loads: X for the sum of squares, X again and W for the output); the expected lines are written out.
"""


import pytest

from conftest import load_experiment

X_SUM = "tmp0 = tl.load(in_ptr0 + (r0_1 + 12288*x0), r0_mask, eviction_policy='evict_last', other=0.0)"
X_OUT = "tmp6 = tl.load(in_ptr0 + (r0_1 + 12288*x0), r0_mask, eviction_policy='evict_first', other=0.0)"
W_OUT = "tmp14 = tl.load(in_ptr1 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0)"
STORE = "tl.store(out_ptr1 + (r0_1 + 12288*x0), tmp16, r0_mask)"
SOURCE = "\n".join([X_SUM, X_OUT, W_OUT, STORE])

X_SUM_BARE = "tmp0 = tl.load(in_ptr0 + (r0_1 + 12288*x0), r0_mask, other=0.0)"
X_OUT_BARE = "tmp6 = tl.load(in_ptr0 + (r0_1 + 12288*x0), r0_mask, other=0.0)"
W_OUT_BARE = "tmp14 = tl.load(in_ptr1 + (r0_1), r0_mask, other=0.0)"


@pytest.fixture(scope="module")
def compile_hints():
    return load_experiment("compile_hints")


@pytest.mark.parametrize("variant,expected", [
    ("no hints", [X_SUM_BARE, X_OUT_BARE, W_OUT_BARE, STORE]),
    ("no evict_first", [X_SUM, X_OUT_BARE, W_OUT, STORE]),
    ("no evict_last", [X_SUM_BARE, X_OUT, W_OUT_BARE, STORE]),
    ("no evict_last on X", [X_SUM_BARE, X_OUT, W_OUT, STORE]),
    ("no evict_last on W", [X_SUM, X_OUT, W_OUT_BARE, STORE]),
])
def test_each_variant_drops_its_hints(compile_hints, variant, expected):
    policies, pointer = compile_hints.EDITS[variant]
    assert compile_hints.drop_hints(SOURCE, policies, pointer).split("\n") == expected
