"""CPU: the benchmark's shapes, ratios and issue 18's targets, on hand-made records (no GPU, no timing)."""

import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_records as br  # noqa: E402


def rec(impl, us, tokens=4096, hidden=8192, dtype="float16", rounds=None):
    out = {"impl": impl, "dtype": dtype, "tokens": tokens, "hidden": hidden, "us": us}
    if rounds is not None:
        out["rounds_us"] = rounds
    return out


def shape(tokens, hidden, **us):
    """Records of one shape: impl=us keyword arguments."""
    return [rec(impl, t, tokens, hidden) for impl, t in us.items()]


def only_row(records):
    (row,) = br.evaluate(records)
    return row


def checks_by_label(row):
    return {label: (value, met) for label, value, _, met in row["checks"]}


def test_the_parts_hold_the_issues_shapes():
    assert len(br.SHAPE_PARTS["matrix"]) == 9 * 5 + 1
    assert (32768, 8192) in br.SHAPE_PARTS["matrix"] and (16384, 1536) in br.SHAPE_PARTS["matrix"]
    assert br.SHAPE_PARTS["sweep"][0] == (4096, 512) and br.SHAPE_PARTS["sweep"][-1] == (4096, 16384)
    assert len(br.SHAPE_PARTS["sweep"]) == 32
    assert set(br.TABLE_SHAPES) <= set(br.SHAPE_PARTS["matrix"])
    # matrix and sweep share the 9 matrix hiddens at 4096 tokens: each shape is timed once
    assert len(br.shapes_of(["matrix", "mid", "sweep"])) == 46 + 2 + 32 - 9
    assert br.shapes_of(["mid", "mid"]) == [(4096, 1000), (4096, 100)]


@pytest.mark.parametrize("tokens,hidden,labels", [
    (1, 1024, {"<= fastest peer"}),
    (16384, 1536, {"<= fastest peer"}),                        # 3 KB rows: no copy_ bound
    (512, 8192, {"<= fastest peer"}),                          # 16 KB rows, but under 4096 tokens
    (4096, 3584, {"<= fastest peer", "sweep <= 1.05 x copy_"}),  # sweep only, 7 KB rows
    (4096, 4096, {"<= fastest peer", "sweep <= 1.05 x copy_", ">= 8 KB rows <= 1.02 x copy_"}),
    (16384, 10240, {"<= fastest peer", ">= 8 KB rows <= 1.02 x copy_"}),
    (32768, 8192, {"<= fastest peer", ">= 8 KB rows <= 1.02 x copy_", "<= torch.compile"}),
    (4096, 1000, {"<= 1.2 x copy_"}),
    (4096, 100, {"<= 1.15 x copy_"}),
    (7, 333, set()),
])
def test_targets_at_each_kind_of_shape(tokens, hidden, labels):
    assert {label for label, _, _ in br.targets_at(tokens, hidden)} == labels


def test_ratio_is_the_median_of_per_round_ratios():
    a = rec("this", 2.0, rounds=[1.0, 2.0, 3.0])
    b = rec("copy", 1.0, rounds=[1.0, 1.0, 4.0])
    assert br.ratio(a, b) == pytest.approx(1.0)      # per round 1, 2, 0.75: not 2.0 / 1.0
    assert br.ratio(rec("this", 3.0), rec("copy", 2.0)) == pytest.approx(1.5)  # without rounds: the medians


def test_faster_than_every_peer_meets_the_peer_target():
    row = only_row(shape(1, 1024, copy=0.9, this=1.2, torch_compile=1.25, quack=1.6, liger=1.3))
    assert row["best_peer"] == "torch_compile"
    assert row["this_best"] == pytest.approx(1.2 / 1.25)
    assert br.verdict(row["checks"]) == "met"


def test_a_tie_counts_only_near_copy():
    near = only_row(shape(4096, 8192, copy=33.5, this=34.0, torch_compile=33.8, quack=36.0))  # 1.006, 1.015
    assert checks_by_label(near)["<= fastest peer"][1] is True
    far = only_row(shape(1, 1024, copy=1.0, this=1.26, torch_compile=1.25))  # 1.008 of the peer, 1.26 of copy_
    assert checks_by_label(far)["<= fastest peer"][1] is False
    beyond = only_row(shape(4096, 8192, copy=33.5, this=34.0, quack=33.6))  # 1.012 of the peer
    assert checks_by_label(beyond)["<= fastest peer"][1] is False
    assert br.verdict(beyond["checks"]).startswith("MISSED: <= fastest peer")


def test_copy_bounds_and_torch_compile_at_32768x8192():
    row = only_row(shape(32768, 8192, copy=257.6, this=258.5, torch_compile=250.8, quack=264.7, liger=321.8))
    checks = checks_by_label(row)
    assert checks["<= fastest peer"] == (pytest.approx(258.5 / 250.8), False)
    assert checks[">= 8 KB rows <= 1.02 x copy_"] == (pytest.approx(258.5 / 257.6), True)
    assert checks["<= torch.compile"][1] is False
    assert br.verdict(row["checks"]) == "MISSED: <= fastest peer; <= torch.compile"
    mid = checks_by_label(only_row(shape(4096, 1000, copy=3.28, this=4.49, torch_compile=4.55)))
    assert mid["<= 1.2 x copy_"] == (pytest.approx(4.49 / 3.28), False)
    assert checks_by_label(only_row(shape(4096, 100, copy=1.38, this=1.55)))["<= 1.15 x copy_"][1] is True


def test_missing_peers_leave_the_target_untimed_not_met():
    row = only_row(shape(4096, 2560, copy=10.0, this=10.2))
    assert row["best_peer"] is None
    assert checks_by_label(row)["<= fastest peer"] == (None, None)
    assert br.verdict(row["checks"]) == "untimed: <= fastest peer"
    without_compile = only_row(shape(32768, 8192, copy=257.6, this=250.0, quack=264.7))
    assert checks_by_label(without_compile)["<= torch.compile"] == (None, None)


def test_host_records_and_shapes_without_the_kernel_are_left_out():
    records = (shape(128, 1024, copy=1.0, this=1.2)
               + [{"impl": "enqueue_host", "dtype": "float16", "tokens": 128, "hidden": 1024, "us": 13.0}]
               + shape(1, 2048, copy=1.0, quack=1.2))
    rows = br.evaluate(records)
    assert [(r["tokens"], r["hidden"]) for r in rows] == [(128, 1024)]


def test_summary_lines_show_ratios_and_verdicts():
    lines = br.summary_lines(br.evaluate(shape(4096, 1000, copy=3.28, this=4.49, liger=7.11)))
    assert lines[2] == ("| float16 | 4096x1000 | liger | 0.632 | 1.369 | <= 1.2 x copy_ (1.369) | "
                        "MISSED: <= 1.2 x copy_ |")


def test_interleaved_rounds_rotate_the_order():
    calls = []

    def timer(name):
        def one_round():
            calls.append(name)
            return float(len(calls))
        return one_round

    times = br.interleaved_rounds({name: timer(name) for name in "abc"}, 4)
    assert calls == list("abc" "bca" "cab" "abc")
    assert times == {"a": [1.0, 6.0, 8.0, 10.0], "b": [2.0, 4.0, 9.0, 11.0], "c": [3.0, 5.0, 7.0, 12.0]}
