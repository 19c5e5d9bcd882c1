#!/usr/bin/env python3
"""Plot the hidden-size sweep of a bench_rms_norm.py run: time / copy_ against hidden, one panel per dtype.

Reads the run's JSON and writes an SVG written out here by hand, so the plot needs nothing beyond Python on
any machine (no GPU, no plotting library) and its text diffs in review.

    python3 benchmarks/plot_sweep.py [JSON] [-o SVG] [--ymax 1.5]

Defaults: benchmarks/results/h200.json -> benchmarks/results/h200_sweep.svg. Ratios above --ymax are drawn
at the top edge.
"""

import argparse
import json
import math
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_records import IMPL_TITLES, SWEEP_TOKENS, group_records, ratio  # noqa: E402

COLORS = {"this": "#d62728", "torch_eager": "#7f7f7f", "torch_compile": "#1f77b4", "quack": "#2ca02c",
          "liger": "#9467bd"}
PANEL_W, PANEL_H, LEFT, TOP, BOTTOM, GAP = 520, 300, 60, 40, 50, 30


def sweep_ratios(records):
    """{dtype: {impl: [(hidden, time / copy_)]}} over the sweep's shapes (SWEEP_TOKENS tokens, hidden % 512 == 0)."""
    out = {}
    shapes = sorted(group_records(records).items(), key=lambda item: (item[0][0] != "float16", item[0]))
    for (dtype, tokens, hidden), impls in shapes:  # float16 first
        if tokens != SWEEP_TOKENS or hidden % 512 or "copy" not in impls:
            continue
        for impl, rec in impls.items():
            if impl != "copy":
                out.setdefault(dtype, {}).setdefault(impl, []).append((hidden, ratio(rec, impls["copy"])))
    return out


def svg(ratios, ymax):
    """The SVG text: one panel per dtype, one polyline per implementation, reference lines at 1.0 and 1.05."""
    dtypes = list(ratios)
    hiddens = sorted({h for impls in ratios.values() for points in impls.values() for h, _ in points})
    x_lo, x_hi = hiddens[0], hiddens[-1]
    y_lo = min(0.95, min(r for impls in ratios.values() for points in impls.values() for _, r in points))
    width, height = LEFT + PANEL_W + 150, len(dtypes) * (TOP + PANEL_H + BOTTOM) + GAP

    def sx(hidden):
        return LEFT + (hidden - x_lo) / max(1, x_hi - x_lo) * PANEL_W

    def sy(value, top):
        return top + (ymax - min(value, ymax)) / (ymax - y_lo) * PANEL_H

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>']
    for i, dtype in enumerate(dtypes):
        top = GAP + i * (TOP + PANEL_H + BOTTOM)
        parts.append(f'<text x="{LEFT}" y="{top - 10}" font-size="14">{dtype}, {SWEEP_TOKENS} tokens: '
                     f'time / copy_ (above {ymax:g}: drawn at the top)</text>')
        parts.append(f'<rect x="{LEFT}" y="{top}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="black"/>')
        for value, dash in ((1.0, "none"), (1.05, "4 3")):
            y = sy(value, top)
            parts.append(f'<line x1="{LEFT}" x2="{LEFT + PANEL_W}" y1="{y:.1f}" y2="{y:.1f}" stroke="black" '
                         f'stroke-dasharray="{dash}" stroke-width="0.8"/>')
        for k in range(math.ceil(y_lo * 10), math.floor(ymax * 10) + 1):  # a label every 0.1
            y = sy(k / 10, top)
            parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{k / 10:.1f}</text>')
        parts.append(f'<text x="{LEFT + 4}" y="{sy(1.05, top) - 3:.1f}" font-size="10">1.05 x copy_</text>')
        for hidden in hiddens:
            if hidden % 2048 == 0 or hidden == x_lo:
                x = sx(hidden)
                parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + PANEL_H}" y2="{top + PANEL_H + 4}" '
                             'stroke="black"/>')
                parts.append(f'<text x="{x:.1f}" y="{top + PANEL_H + 18}" text-anchor="middle">{hidden}</text>')
        parts.append(f'<text x="{LEFT + PANEL_W / 2}" y="{top + PANEL_H + 36}" text-anchor="middle">hidden</text>')
        # the kernel last, so that its line is drawn over the peers'
        impls = sorted(ratios[dtype].items(), key=lambda item: item[0] == "this")
        for k, (impl, points) in enumerate(impls):
            color = COLORS.get(impl, "black")
            coords = " ".join(f"{sx(h):.1f},{sy(r, top):.1f}" for h, r in points)
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{coords}">'
                         f'<title>{IMPL_TITLES[impl]}</title></polyline>')
            ly = top + 14 + 18 * k
            parts.append(f'<line x1="{LEFT + PANEL_W + 12}" x2="{LEFT + PANEL_W + 32}" y1="{ly}" y2="{ly}" '
                         f'stroke="{color}" stroke-width="2"/>')
            parts.append(f'<text x="{LEFT + PANEL_W + 38}" y="{ly + 4}">{IMPL_TITLES[impl]}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="?", default=str(HERE / "results" / "h200.json"),
                        help="a bench_rms_norm.py JSON (default benchmarks/results/h200.json)")
    parser.add_argument("-o", "--output", default=None,
                        help="the SVG to write (default: the JSON's name with _sweep.svg)")
    parser.add_argument("--ymax", type=float, default=1.5, help="top of the ratio axis (default 1.5)")
    args = parser.parse_args()
    source = pathlib.Path(args.json)
    try:
        records = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        parser.error(f"{source}: {getattr(exc, 'strerror', None) or exc}")
    ratios = sweep_ratios(records)
    if not ratios:
        parser.error(f"{source} has no sweep records ({SWEEP_TOKENS} tokens with copy_ timed): run "
                     "bench_rms_norm.py with --only sweep")
    if args.ymax <= 1.05:
        parser.error("--ymax must be above 1.05 (the sweep's target line)")
    target = pathlib.Path(args.output) if args.output else source.with_name(source.stem + "_sweep.svg")
    target.write_text(svg(ratios, args.ymax))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
