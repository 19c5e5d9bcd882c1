"""CPU: benchmarks/experiments/compare_checkouts.py checks every output of every form it times, and
refuses a command line it cannot serve in one sentence before any GPU work.

The outputs below are made by hand from the float64 formula: Y rounded once to X's dtype, S = X + R
in X's dtype, Y_q the FP8 of y / y_scale by the companion's quantize_reference; each check must
pass them and name one element set off.
"""

import pytest
import torch

from conftest import FUSED_PATH, load_experiment


@pytest.fixture(scope="module")
def compare():
    return load_experiment("compare_checkouts")


def norm64(x, w):
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()


@pytest.fixture(scope="module")
def inputs():
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(16, 512, generator=gen).to(torch.bfloat16)
    r = torch.randn(16, 512, generator=gen).to(torch.bfloat16)
    w = torch.rand(512, generator=gen) + 0.5
    return x, r, w


def expected_outputs(form, x, r, w, fused):
    """(Y, S) as a correct kernel writes them; S is None in a form without R."""
    s = x + r if "residual" in form else None
    y = norm64(x if s is None else s, w)
    if "fp8" in form:
        scale = 2.0**-6  # bench_quantized.py's y_scale
        y_q = fused.quantize_reference(y.numpy(), scale)
        return torch.from_numpy(y_q).to(torch.float8_e4m3fn), s
    return y.to(x.dtype), s


@pytest.mark.parametrize("form", ["plain", "residual", "fp8", "residual_fp8"])
def test_each_forms_check_passes_a_right_output_and_names_a_wrong_one(compare, inputs, form,
                                                                      fused_standin,
                                                                      sample_standin):
    x, r, w = inputs
    check = compare.output_check(form, x, r, w, sample_standin.Y_TOLERANCE["bfloat16"],
                                 fused_standin.quantize_reference)
    y, s = expected_outputs(form, x, r, w, fused_standin)
    assert check(y, s) == ""
    y_off = y.float()
    y_off[3, 5] = y_off[3, 5] * 1.5 + 1.0  # far past one rounding either way
    assert "1 elements of Y" in check(y_off.to(y.dtype), s)
    if s is not None:
        s_off = s.clone()
        s_off[0, 0] += 1
        assert check(y, s_off) == "S differs from x + r at 1 elements"


@pytest.mark.parametrize("args,message", [
    (["--forms", "plain,int4"],
     "--forms: unknown 'int4' (choose from plain, residual, fp8, residual_fp8)"),
    (["--only", "table,nope"],
     "--only: unknown 'nope' (choose from table, matrix, mid, sweep, decoder)"),
    (["--shapes", "4096x"],
     "--shapes '4096x': expected comma-separated TOKENSxHIDDEN, e.g. 4096x8192,1x1024"),
    (["--dtypes", "float64"],
     "--dtypes: unknown 'float64' (choose from float16, bfloat16, float32)"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    ([], "no CUDA GPU is visible: the comparison times kernels on one"),
])
def test_a_command_line_it_cannot_serve_is_refused_in_one_sentence(compare, capsys, monkeypatch,
                                                                   args, message):
    monkeypatch.setattr(compare.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        compare.parse_args(["--base-file", str(FUSED_PATH), *args])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(" error: " + message)


def test_the_fp8_forms_are_refused_before_sm_89(compare, capsys, monkeypatch):
    monkeypatch.setattr(compare.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(compare.torch.cuda, "get_device_capability", lambda: (8, 0))
    assert compare.parse_args(["--base-file", str(FUSED_PATH), "--forms", "plain,residual"])
    with pytest.raises(SystemExit) as exit_info:
        compare.parse_args(["--base-file", str(FUSED_PATH), "--forms", "plain,fp8"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        " error: the FP8 forms need sm_89 or newer, this GPU is sm_80: pass --forms plain,residual")


def test_the_decoder_part_is_the_decoder_tables_shapes(compare):
    assert len(compare.PARTS["decoder"]) == 25
    assert compare.PARTS["decoder"][:2] == [(1, 2048), (128, 2048)]
    assert (16384, 16384) in compare.PARTS["decoder"]
