"""CPU: benchmarks/experiments/fused_plans.py's check of a plan's first output, which decides
whether the plan's time is marked * and the script exits 1, passes a right output and catches a
wrong one; and a command line it cannot serve is refused in one line (exit 2) before any GPU work.

The right outputs are built here from the float64 formula with torch alone (not from the kernel or
the check): S = x + r in X's dtype, N = S * rsqrt(mean(S^2) + 1e-5) * W in float64 (of x alone in
the plain FP8 form), Y = N rounded once to fp16, Y_q = the E4M3 cast of N / 2^-6 clamped to E4M3's
range (cast through fp32).
"""

import argparse

import pytest
import torch

from conftest import load_experiment

EPS = 1e-5
Y_SCALE = 2.0**-6


@pytest.fixture(scope="module")
def fused_plans():
    return load_experiment("fused_plans")


def inputs(tokens=4, hidden=256):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen).half()
    r = torch.randn(tokens, hidden, generator=gen).half()
    w = (torch.rand(hidden, generator=gen) + 0.5).to(torch.bfloat16).float()
    return x, r, w


def norm64(s, w):
    sd = s.double()
    return sd * torch.rsqrt(sd.pow(2).mean(-1, keepdim=True) + EPS) * w.double()


def args(fp8, residual=True):
    return argparse.Namespace(fp8=fp8, residual=residual, dtype="float16")


def test_a_right_16_bit_output_passes_and_a_wrong_y_or_s_is_named(fused_plans):
    x, r, w = inputs()
    s = x + r
    y = norm64(s, w).half()
    assert fused_plans.output_misses(args(False), y, s, x, r, w) == ""
    wrong_y = y.clone()
    wrong_y[1, 7] *= 1.01
    assert "1 elements of Y" in fused_plans.output_misses(args(False), wrong_y, s, x, r, w)
    wrong_s = s.clone()
    wrong_s[0, 0] += 1
    assert "S differs" in fused_plans.output_misses(args(False), y, wrong_s, x, r, w)


@pytest.mark.parametrize("residual", [True, False])
def test_a_right_fp8_output_passes_and_a_wrong_y_q_is_named(fused_plans, residual):
    x, r, w = inputs()
    s = x + r if residual else torch.empty_like(x)  # the plain form leaves S alone
    ref = norm64(x + r if residual else x, w)
    y_q = (ref / Y_SCALE).float().clamp(-448, 448).to(torch.float8_e4m3fn)
    assert fused_plans.output_misses(args(True, residual), y_q, s, x, r, w) == ""
    wrong = y_q.float()
    wrong[2, 3] = -wrong[2, 3] + 1
    wrong = wrong.to(torch.float8_e4m3fn)
    assert "Y_q" in fused_plans.output_misses(args(True, residual), wrong, s, x, r, w)


@pytest.mark.parametrize("argv, why", [
    (["--residual", "--shapes", "512x4096", "--plans", "own,bogus"], "plan 'bogus' is not of"),
    (["--residual", "--shapes", "512x4096", "--plans", "t8k8s"], "covers 512 elements"),
    (["--fp8", "--shapes", "512x40000"], "hidden must be in [1, 32768]"),
    (["--residual", "--shapes", "512x4096", "--rounds", "0"], "--rounds must be at least 1"),
    (["--shapes", "512x4096"], "time_plans.py --plans"),
])
def test_a_command_line_that_cannot_be_served_is_refused_in_one_line(fused_plans, capsys, argv,
                                                                      why):
    with pytest.raises(SystemExit) as exit_:
        fused_plans.arguments(argv)
    out, err = capsys.readouterr()
    assert (exit_.value.code, out) == (2, "")
    assert why in err.splitlines()[-1] and "Traceback" not in err
