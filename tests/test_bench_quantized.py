"""CPU: the quantized table's selections are refused before any GPU work, its FP8 check accepts
either neighbour only near a rounding midpoint, and its tables come out of hand-made records."""

import subprocess
import sys

import pytest
import torch

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_decoder  # noqa: E402
import bench_rms_norm  # noqa: E402
import bench_quantized as bq  # noqa: E402

BENCH = ROOT / "benchmarks" / "bench_quantized.py"
META = {"gpu": "NVIDIA H200", "command": "python3 benchmarks/bench_quantized.py --rounds 3",
        "versions": "torch 2.11.0+cu130, cutlass-dsl 4.8.1, flashinfer -",
        "date": "2026-12-02 10:00 UTC"}


def run_bench(*args, cwd):
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd,
                          env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("args,message", [
    (("--dtypes", "float32"), "--dtypes: unknown 'float32'"),
    (("--shapes", "4096x"), "--shapes '4096x': expected comma-separated TOKENSxHIDDEN"),
    (("--rounds", "0"), "--rounds must be at least 1"),
])
def test_bad_selections_are_refused_in_one_line(tmp_path, args, message):
    proc = run_bench(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert message in proc.stderr.splitlines()[-1]
    assert not (tmp_path / "bench-results").exists()


def test_an_unusable_out_dir_is_refused_at_once(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = run_bench("--out-dir", str(blocker / "results"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"--out-dir {blocker / 'results'}" in proc.stderr.splitlines()[-1]


def test_help_names_the_default_results(tmp_path):
    proc = run_bench("--help", cwd=tmp_path)
    assert proc.returncode == 0
    text = "".join(proc.stdout.split())  # argparse wraps lines, also at hyphens
    assert "default./bench-results" in text and "defaultquantized" in text


def exact_fp8(fused, ref):
    return torch.from_numpy(fused.quantize_reference(ref.numpy(), bq.Y_SCALE)).to(bq.E4M3)


def test_the_fp8_check_takes_the_exact_values_and_counts_a_step_off(fused_standin):
    ref = torch.randn(64, 512, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    # Zero, below FP8's smallest step, saturated both ways.
    ref[0, :4] = torch.tensor([0.0, 1e-7, 20.0, -20.0], dtype=torch.float64)
    y_q = exact_fp8(fused_standin, ref)
    assert bq.fp8_misses(y_q, ref, fused_standin.quantize_reference, *bq.SINGLE_ROUNDING) == 0
    off = y_q.float()
    off[5, 7] *= 1.125  # 12.5 %: at least one FP8 step away
    off[9, 1] = float("nan")
    assert bq.fp8_misses(off.to(bq.E4M3), ref, fused_standin.quantize_reference,
                         *bq.SINGLE_ROUNDING) == 2


def test_the_fp8_check_takes_either_neighbour_only_near_a_midpoint(fused_standin):
    """1.0625 x y_scale lies halfway between the FP8 values 1.0 and 1.125 (x y_scale)."""
    mid = 1.0625 * bq.Y_SCALE
    ref = torch.tensor([mid * (1 + 2.0**-20), mid * (1 - 2.0**-20), mid * (1 + 2.0**-12)],
                       dtype=torch.float64)
    quantize_reference = fused_standin.quantize_reference
    for got in ([1.0, 1.0, 1.125], [1.125, 1.125, 1.125]):
        y_q = torch.tensor(got).to(bq.E4M3)
        assert bq.fp8_misses(y_q, ref, quantize_reference, *bq.SINGLE_ROUNDING) == 0
    y_q = torch.tensor([1.0, 1.0, 1.0]).to(bq.E4M3)  # the third is 2^-12 past the midpoint
    assert bq.fp8_misses(y_q, ref, quantize_reference, *bq.SINGLE_ROUNDING) == 1
    # With a 16-bit Y in between, its one ulp is the margin.
    assert bq.fp8_misses(y_q, ref, quantize_reference, 2.0**-10, 1e-6) == 0


def test_the_check_passes_torch_compiles_formula_on_the_cpu(fused_standin):
    """The torch.compile columns' functions, run eagerly: the plain one within one rounding, the
    residual one with S bit for bit."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(33, 1024, generator=gen).to(torch.bfloat16)
    r = torch.randn(33, 1024, generator=gen).to(torch.bfloat16)
    w = (torch.rand(1024, generator=gen) + 0.5).to(torch.bfloat16).float()
    ref = bench_decoder.norm_of(x, w)
    y_q = bq.norm_then_quantize(x, w)
    assert bq.misses((y_q,), ref, None, fused_standin.quantize_reference,
                     bq.SINGLE_ROUNDING) == ""
    y_q, s = bq.add_norm_quantize(x, r, w)
    s_ref = x + r
    found = bq.misses((y_q, s), bench_decoder.norm_of(s_ref, w), s_ref,
                      fused_standin.quantize_reference, bq.SINGLE_ROUNDING)
    assert found == ""
    s_off = s.clone()
    s_off[3, 3] += 1
    found = bq.misses((y_q, s_off), bench_decoder.norm_of(s_ref, w), s_ref,
                      fused_standin.quantize_reference, bq.SINGLE_ROUNDING)
    assert found == "S differs from x + r at 1 elements"


def test_a_form_moving_fewer_bytes_cycles_through_more_sets():
    assert bench_decoder.buffer_sets(16384, 4096) == 1  # the decoder's 8 bytes an element
    assert bench_decoder.buffer_sets(16384, 4096, bq.FORM_ELEMENT_BYTES["residual"]) == 1
    assert bench_decoder.buffer_sets(16384, 4096, bq.FORM_ELEMENT_BYTES["plain"]) == 2
    assert bench_decoder.buffer_sets(1, 2048, bq.FORM_ELEMENT_BYTES["plain"]) == 16384  # the cap


def test_small_calls_come_back_to_a_set_after_256_mib_not_after_a_graph_of_200_calls():
    """L2 cold means 256 MiB moved between two uses of a set. A graph of 200 calls of 64 x 512 (the
    fused form: 4 tensors of 64 KiB) came back after 50 MiB, about the H200's L2: the fused form's 4
    tensors spilled while an in-place peer's 2 stayed, and such cells read as L2 cold."""
    assert bench_decoder.buffer_sets(64, 512) == 1024  # 256 MiB / 256 KiB
    assert bench_decoder.buffer_sets(32, 896) == 1171  # 256 MiB / 224 KiB, rounded up
    assert bench_decoder.buffer_sets(1, 512) == 16384  # 65536 wanted; a graph that long is the cap
    per_graph, replays = bench_rms_norm.graph_calls(64, 512, at_least=1024)
    assert per_graph == 1024 and replays == 3  # each set called once a replay


def records():
    plain = bq.shape_record(
        "plain", "float16", 1, 2048,
        {"fp8": [1.0, 1.1, 0.9], "this_quantize": [2.0, 2.0, 2.0],
         "flashinfer": [1.2, 1.2, 1.2], "torch_compile": [1.5, 1.5, 1.5]},
        {"fp8": "", "this_quantize": "", "flashinfer": "3 elements of Y_q off",
         "torch_compile": ""})
    residual = bq.shape_record(
        "residual", "float16", 1, 2048,
        {"fp8": [2.0, 2.0, 2.0], "this_quantize": [4.0, 4.0, 4.0],
         "torch_compile": [1.6, 1.6, 1.6]},
        {"fp8": "", "this_quantize": "", "torch_compile": ""})
    return [plain, residual]


def test_a_record_holds_the_best_fused_peer_and_median_ratios():
    plain, residual = records()
    assert plain["best_fused_peer"] == "flashinfer"
    assert plain["ratios"] == {"flashinfer": round(1.0 / 1.2, 4), "this_quantize": 0.5}
    assert plain["wrong"] == {"flashinfer": "3 elements of Y_q off"}
    assert residual["best_fused_peer"] == "torch_compile"
    assert residual["ratios"]["torch_compile"] == 1.25


def test_the_tables_name_each_forms_columns_marks_and_gaps():
    why = "not importable (ModuleNotFoundError: No module named 'flashinfer')"
    text = bq.render(META, 3, why, records(), ["a note"])
    lines = text.splitlines()
    assert lines[0] == "# Quantized table (RMSNorm to FP8 E4M3): NVIDIA H200"
    assert "command: `python3 benchmarks/bench_quantized.py --rounds 3`  " in lines
    assert f"FlashInfer: {why}: not timed." in lines
    assert ("| dtype | tokens x hidden | fp8 (this) | this + quantize | FlashInfer rmsnorm_quant | "
            "torch.compile norm+quantize | fp8 (this) / best fused peer | "
            "fp8 (this) / this + quantize |") in lines
    assert ("| float16 | 1x2048 | 1.00 | 2.00 | 1.20* | 1.50 | 0.833 (FlashInfer rmsnorm_quant) "
            "| 0.500 |") in lines
    assert ("| float16 | 1x2048 | 2.00 | 4.00 | - | 1.60 | 1.250 (torch.compile add+norm+quantize) "
            "| 0.500 |") in lines
    assert "fp8 (this) at or ahead of the best fused peer in 1 of 1 cells" in lines
    assert ("fp8 fused (this) at or ahead of the best fused peer in 0 of 1 cells; behind in "
            "float16 1x2048 (1.250)") in lines
    assert lines.index("## (a) Plain: Y_q = FP8 of norm(X) * W / y_scale") < lines.index(
        "## (b) Residual (decoder): S = X + R, Y_q = FP8 of norm(S) * W / y_scale")
    assert lines[-1] == "- a note"
