"""CPU: benchmarks/plot_sweep.py draws the sweep of a results JSON, and refuses a JSON without one."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conftest import ROOT

PLOT = ROOT / "benchmarks" / "plot_sweep.py"
SVG = "{http://www.w3.org/2000/svg}"


def records():
    out = []
    for hidden, copy, this, quack in ((512, 2.0, 2.2, 2.1), (1024, 4.0, 4.0, 4.4), (1536, 6.0, 7.2, 6.3)):
        for impl, us in (("copy", copy), ("this", this), ("quack", quack)):
            out.append({"impl": impl, "dtype": "bfloat16", "tokens": 4096, "hidden": hidden, "us": us})
    out.append({"impl": "this", "dtype": "bfloat16", "tokens": 1, "hidden": 1024, "us": 1.2})  # not the sweep
    out.append({"impl": "copy", "dtype": "bfloat16", "tokens": 1, "hidden": 1024, "us": 1.0})
    return out


def run_plot(*args):
    return subprocess.run([sys.executable, str(PLOT), *args], capture_output=True, text=True, timeout=120)


def test_sweep_ratios_are_time_over_copy_per_hidden():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import plot_sweep

    ratios = plot_sweep.sweep_ratios(records())
    assert list(ratios) == ["bfloat16"]
    assert ratios["bfloat16"]["this"] == [(512, pytest.approx(1.1)), (1024, pytest.approx(1.0)),
                                          (1536, pytest.approx(1.2))]
    assert ratios["bfloat16"]["quack"] == [(512, pytest.approx(1.05)), (1024, pytest.approx(1.1)),
                                           (1536, pytest.approx(1.05))]


def test_the_svg_has_a_line_per_implementation(tmp_path):
    source = tmp_path / "run.json"
    source.write_text(json.dumps(records()))
    proc = run_plot(str(source))
    assert proc.returncode == 0, proc.stderr
    root = ET.parse(tmp_path / "run_sweep.svg").getroot()
    lines = {line.find(f"{SVG}title").text: line.get("points") for line in root.iter(f"{SVG}polyline")}
    assert set(lines) == {"this kernel", "quack"}
    xs = [float(point.split(",")[0]) for point in lines["this kernel"].split()]
    ys = [float(point.split(",")[1]) for point in lines["this kernel"].split()]
    assert len(xs) == 3 and xs == sorted(xs)
    assert ys[2] < ys[0] < ys[1]  # 1.2 highest on the page, then 1.1, then 1.0 (SVG's y grows downwards)


@pytest.mark.parametrize("content,message", [
    (None, "No such file or directory"),
    ("not json", "run.json"),
    (json.dumps([r for r in records() if r["tokens"] == 1]), "has no sweep records"),
    # A decoder table's records: no "impl", no L2 state.
    (json.dumps([{"dtype": "float16", "tokens": 1, "hidden": 2048, "us": {"fused": 1.4}}]),
     "has no sweep records"),
    (json.dumps({"impl": "this"}), "holds no list of records"),
])
def test_a_json_without_a_sweep_is_refused_in_one_line(tmp_path, content, message):
    source = tmp_path / "run.json"
    if content is not None:
        source.write_text(content)
    proc = run_plot(str(source))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert message in proc.stderr.splitlines()[-1]
