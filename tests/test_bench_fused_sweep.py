"""CPU: the fused sweeps' flags are refused in one sentence before any GPU work, their shapes are
the issue's, and their records, summary, Markdown and plot come out of hand-made records."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_fused_sweep as sweep  # noqa: E402
import bench_records as br  # noqa: E402

BENCH = ROOT / "benchmarks" / "bench_fused_sweep.py"
PLOT = ROOT / "benchmarks" / "plot_sweep.py"
SVG = "{http://www.w3.org/2000/svg}"
META = {"gpu": "NVIDIA H200", "command": "python3 benchmarks/bench_fused_sweep.py residual",
        "kernel": "rms_norm_fused_cutedsl.py", "versions": "torch 2.11.0+cu130, flashinfer -",
        "date": "2026-12-04 10:00 UTC"}


def cell(tokens, hidden, l2, this, flashinfer=None, torch_compile=None, dtype="float16",
         wrong=None):
    """A residual sweep's record: each column's per-round times from one time a column."""
    times = {"fused": [this] * 3}
    for name, us in (("flashinfer", flashinfer), ("torch_compile", torch_compile)):
        if us is not None:
            times[name] = [us] * 3
    where = {"form": "residual", "dtype": dtype, "tokens": tokens, "hidden": hidden, "l2": l2,
             "sets": 4 if l2 == "cold" else 1}
    return br.fused_record(where, "fused", times, wrong or {})


def records():
    return [
        cell(1, 896, "cold", 2.36, flashinfer=2.5, torch_compile=2.0),            # 1.18, behind
        cell(2, 896, "cold", 2.0, flashinfer=2.2, torch_compile=2.1),             # 0.952, ahead
        cell(1, 4096, "cold", 2.02, flashinfer=2.3, torch_compile=2.0),           # 1.01, within 1 %
        cell(2, 4096, "cold", 2.0, torch_compile=2.0,
             wrong={"torch_compile": "3 elements of Y out of tolerance"}),        # 1.0, at
        cell(1, 896, "warm", 2.1, flashinfer=2.0, torch_compile=2.2),             # 1.05, behind
        cell(2, 896, "warm", 1.9, flashinfer=2.0, torch_compile=2.2),             # 0.95, ahead
        cell(1, 4096, "warm", 2.0, flashinfer=2.0, torch_compile=2.5),            # 1.0, at
        cell(2, 4096, "warm", 3.2, flashinfer=2.0, torch_compile=2.5),            # 1.6, behind
    ]


def test_the_shapes_are_the_issues():
    assert br.FUSED_SWEEP_TOKENS[0] == 1 and br.FUSED_SWEEP_TOKENS[-1] == 32768
    steps = [b / a for a, b in zip(br.FUSED_SWEEP_TOKENS, br.FUSED_SWEEP_TOKENS[1:])]
    assert steps == [2] * 15  # no coarser than x2
    hiddens = br.FUSED_SWEEP_HIDDENS
    assert hiddens[0] == 512 and hiddens[-1] == 16384 and list(hiddens) == sorted(set(hiddens))
    assert {896, 1536, 3584, 5120, 7168} <= set(hiddens)  # not powers of two
    assert br.L2_STATES == ("cold", "warm")


def test_a_record_names_its_l2_state_the_best_peer_and_the_median_ratio():
    rec = br.fused_record({"form": "residual", "dtype": "bfloat16", "tokens": 8, "hidden": 512,
                           "l2": "warm", "sets": 1}, "fused",
                          {"fused": [1.0, 3.0, 2.0], "flashinfer": [2.0, 2.0, 2.0],
                           "torch_compile": [1.0, 1.5, 1.0]}, {"flashinfer": "", "fused": ""})
    assert rec["l2"] == "warm" and rec["sets"] == 1
    assert rec["best_fused_peer"] == "torch_compile"  # median 1.0 against 2.0
    assert rec["ratios"] == {"torch_compile": 2.0}    # per round 1.0, 2.0, 2.0: not 2.0 / 1.0
    assert rec["wrong"] == {}
    assert br.peer_ratio(rec) == 2.0


def test_the_summary_counts_each_l2_state_and_names_the_worst_cells():
    lines = br.sweep_summary_lines(records(), worst=2)
    assert lines == [
        "L2 cold: at or ahead of the best fused peer in 2 of 4 cells, behind by at most 1 % in 1, "
        "behind by more in 1",
        "worst L2 cold cells: 1.180 float16 1x896 L2 cold (torch.compile), "
        "1.010 float16 1x4096 L2 cold (torch.compile)",
        "L2 warm: at or ahead of the best fused peer in 2 of 4 cells, behind by at most 1 % in 0, "
        "behind by more in 2",
        "worst L2 warm cells: 1.600 float16 2x4096 L2 warm (FlashInfer), "
        "1.050 float16 1x896 L2 warm (FlashInfer)",
    ]


def test_the_grid_has_a_row_per_token_count_and_a_column_per_hidden():
    assert br.sweep_grid_lines(records(), "float16", "cold") == [
        "| tokens | 896 | 4096 |",
        "|---|---|---|",
        "| 1 | 1.180 T | 1.010 T |",
        "| 2 | 0.952 T | 1.000 T* |",
    ]
    assert br.sweep_grid_lines(records(), "bfloat16", "cold")[2:] == []


def test_the_markdown_holds_a_grid_per_dtype_and_l2_state_the_summary_and_notes():
    why = "not importable (ModuleNotFoundError: No module named 'flashinfer')"
    text = sweep.render("residual", META, 3, why, records(), ["a note"])
    lines = text.splitlines()
    assert lines[0] == "# Fused sweep, residual form, S = X + R, Y = norm(S) * W: NVIDIA H200"
    assert "kernel: `rms_norm_fused_cutedsl.py`  " in lines
    assert f"FlashInfer: {why}: not timed." in lines
    assert lines.index("## float16, L2 cold") < lines.index("## float16, L2 warm")
    assert "| 2 | 0.952 T | 1.000 T* |" in lines
    assert "- L2 warm: at or ahead of the best fused peer in 2 of 4 cells, behind by at most 1 % " \
           "in 0, behind by more in 2" in lines
    assert lines[-1] == "- a note"


def test_the_progress_line_gives_both_l2_states():
    assert sweep.cell_line(records()[:1] + records()[4:5]) == (
        "float16 1x896: cold 1.180 (torch_compile), warm 1.050 (flashinfer)")


@pytest.mark.parametrize("args,message", [
    (["nope"], "argument form: invalid choice: 'nope'"),
    (["residual", "--dtypes", "float32"], "--dtypes: unknown 'float32'"),
    (["residual", "--tokens", "1,0"], "--tokens: '0' is not a positive integer"),
    (["residual_fp8", "--hiddens", "896,x"], "--hiddens: 'x' is not a positive integer"),
    (["residual", "--rounds", "0"], "--rounds must be at least 1"),
    (["residual", "--kernel-file", "no_such_kernel.py"],
     "--kernel-file no_such_kernel.py: no such file"),
])
def test_bad_flags_are_refused_in_one_sentence(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        sweep.arguments(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]
    assert not (tmp_path / "bench-results").exists()  # refused before anything is written


def test_an_unusable_out_dir_is_refused(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        sweep.arguments(["residual", "--kernel-file", str(blocker), "--out-dir",
                         str(blocker / "out")])
    assert exit_info.value.code == 2
    assert f"--out-dir {blocker / 'out'}" in capsys.readouterr().err.splitlines()[-1]


def test_the_defaults_run_every_token_count_from_the_largest(tmp_path):
    kernel = tmp_path / "kernel.py"
    kernel.write_text("")
    _, args = sweep.arguments(["residual_fp8", "--kernel-file", str(kernel), "--out-dir",
                               str(tmp_path / "out")])
    # From the largest: torch.compile's dynamic graph is tuned at 32768.
    assert args.tokens == sorted(br.FUSED_SWEEP_TOKENS, reverse=True)
    assert args.hiddens == list(br.FUSED_SWEEP_HIDDENS)
    assert args.dtypes == ["float16", "bfloat16"] and args.rounds == 3
    assert args.name == "sweep_residual_fp8" and (tmp_path / "out").is_dir()
    assert sweep.arguments(["residual", "--kernel-file", str(kernel), "--tokens", "4,1,4",
                            "--out-dir", str(tmp_path)])[1].tokens == [4, 1]


@pytest.mark.parametrize("source,message", [
    ("compile_rms_norm = None\nY_TOLERANCE = {}\n", "lacks quantize_reference"),
    ("raise ImportError('the package cutlass is not installed')\n",
     "failed to import (ImportError: the package cutlass is not installed)"),
])
def test_a_kernel_file_without_the_companions_names_is_refused(tmp_path, capsys, source,
                                                                message):
    kernel = tmp_path / "kernel.py"
    kernel.write_text(source)
    parser, _ = sweep.arguments(["residual", "--kernel-file", str(kernel), "--out-dir",
                                 str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        sweep.kernel_module(parser, kernel)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


def test_the_script_refuses_a_kernel_file_in_one_sentence(tmp_path):
    kernel = tmp_path / "kernel.py"
    kernel.write_text("compile_rms_norm = None\n")
    proc = subprocess.run([sys.executable, str(BENCH), "residual", "--kernel-file", str(kernel)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"--kernel-file {kernel} lacks quantize_reference" in proc.stderr.splitlines()[-1]


def test_the_plot_has_a_panel_per_dtype_and_l2_state_and_a_line_per_hidden(tmp_path):
    source = tmp_path / "sweep_residual.json"
    source.write_text(json.dumps(records() + [cell(1, 896, "cold", 2.0, dtype="bfloat16",
                                                   torch_compile=2.5)]))
    proc = subprocess.run([sys.executable, str(PLOT), str(source)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    root = ET.parse(tmp_path / "sweep_residual_sweep.svg").getroot()
    titles = [text.text for text in root.iter(f"{SVG}text") if text.get("font-size") == "14"]
    assert titles == [f"residual, {dtype}, L2 {l2}: time / best fused peer (above 1.5: at the top)"
                      for dtype, l2 in (("float16", "cold"), ("float16", "warm"),
                                        ("bfloat16", "cold"))]
    lines = [(line.find(f"{SVG}title").text, line.get("points"))
             for line in root.iter(f"{SVG}polyline")]
    assert [title for title, _ in lines] == ["hidden 896", "hidden 4096"] * 2 + ["hidden 896"]
    cold_896 = [tuple(map(float, point.split(","))) for point in lines[0][1].split()]
    (x1, y1), (x2, y2) = cold_896  # 1 token at 1.18, 2 tokens at 0.952
    assert x1 < x2 and y1 < y2  # SVG's y grows downwards
    # A line at 1.0 in every panel, at 1.02 in the warm one; 1.0 lies between the two points.
    references = [float(line.get("y1")) for line in root.iter(f"{SVG}line")
                  if line.get("stroke-width") == "0.8"]
    assert len(references) == 4
    one = references[0]
    assert y1 < one < y2
    assert references[2] < references[1]  # the warm panel's 1.02 above its 1.0
