#!/usr/bin/env python3
"""Plot a sweep: time / copy_ of bench_rms_norm.py's hidden sizes, or time / best fused peer of a
bench_fused_sweep.py table, from the run's JSON.

The plain norm's sweep: one panel per dtype, a line per implementation against hidden. A fused
sweep: one panel per dtype and L2 state, a line per hidden size against tokens (log scale), a line
at 1.0 (and at 1.02 where L2 is warm, the most the issue lets the kernel trail there). The SVG is
written out here by hand, so the plot needs nothing beyond Python on any machine (no GPU, no
plotting library) and its text diffs in review.

    python3 benchmarks/plot_sweep.py [JSON] [-o SVG] [--ymax 1.5]

Defaults: benchmarks/results/h200.json -> benchmarks/results/h200_sweep.svg (the JSON's name with
_sweep.svg). Which sweep it draws follows from the JSON's records. Ratios above --ymax are drawn at
the top edge.
"""

import argparse
import collections
import json
import math
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_records import (IMPL_TITLES, L2_STATES, SWEEP_TOKENS, group_records,  # noqa: E402
                           peer_ratio, ratio)

COLORS = {"this": "#d62728", "lesson": "#ff7f0e", "torch_eager": "#7f7f7f",
          "torch_compile": "#1f77b4", "quack": "#2ca02c", "liger": "#9467bd"}
# A fused sweep's hidden sizes, in order, take these colors in turn (matplotlib's ten).
HIDDEN_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#7f7f7f", "#bcbd22", "#17becf")
PANEL_W, PANEL_H, LEFT, TOP, BOTTOM, GAP, LEGEND_W = 520, 300, 60, 40, 50, 30, 150
MAX_TICKS = 16  # token labels of up to 3 characters a panel holds without overlap

# A panel: its title, reference lines as (value, dash, label or None) and its lines as (title,
# color, [(x, ratio)]), drawn in order (the last on top). An axis: its label and ticks (x, text).
Panel = collections.namedtuple("Panel", "title references lines")
Axis = collections.namedtuple("Axis", "label ticks")


def sweep_ratios(records):
    """{dtype: {impl: [(hidden, time / copy_)]}} over the sweep's shapes (SWEEP_TOKENS tokens,
    hidden % 512 == 0)."""
    out = {}
    shapes = sorted(group_records(records).items(),
                    key=lambda item: (item[0][0] != "float16", item[0]))
    for (dtype, tokens, hidden), impls in shapes:  # float16 first
        if tokens != SWEEP_TOKENS or hidden % 512 or "copy" not in impls:
            continue
        for impl, rec in impls.items():
            if impl != "copy":
                points = out.setdefault(dtype, {}).setdefault(impl, [])
                points.append((hidden, ratio(rec, impls["copy"])))
    return out


def plain_figure(ratios, ymax):
    """(panels, axis) of the plain norm's sweep: a panel per dtype, a line per implementation."""
    panels = []
    for dtype, impls in ratios.items():
        # the kernel last, so that its line is drawn over the peers'
        ordered = sorted(impls.items(), key=lambda item: item[0] == "this")
        panels.append(Panel(
            f"{dtype}, {SWEEP_TOKENS} tokens: time / copy_ (above {ymax:g}: drawn at the top)",
            [(1.0, "none", None), (1.05, "4 3", "1.05 x copy_")],
            [(IMPL_TITLES[impl], COLORS.get(impl, "black"), points) for impl, points in ordered]))
    hiddens = sorted({h for impls in ratios.values() for points in impls.values()
                      for h, _ in points})
    ticks = [(h, str(h)) for h in hiddens if h % 2048 == 0 or h == hiddens[0]]
    return panels, Axis("hidden", ticks)


def fused_figure(records, ymax):
    """(panels, axis) of a fused sweep: a panel per dtype and L2 state, a line per hidden size of
    time / best fused peer against log2(tokens); no panels where no record is of a fused sweep."""
    cells = sorted((rec for rec in records if "l2" in rec and rec["best_fused_peer"]),
                   key=lambda rec: (rec["dtype"] != "float16", rec["dtype"],
                                    L2_STATES.index(rec["l2"]), rec["tokens"]))
    hiddens = sorted({rec["hidden"] for rec in cells})
    colors = {hidden: HIDDEN_COLORS[k % len(HIDDEN_COLORS)] for k, hidden in enumerate(hiddens)}
    lines = {}
    for rec in cells:
        panel = lines.setdefault((rec["form"], rec["dtype"], rec["l2"]), {h: [] for h in hiddens})
        panel[rec["hidden"]].append((math.log2(rec["tokens"]), peer_ratio(rec)))
    panels = []
    for (form, dtype, l2), by_hidden in lines.items():
        references = [(1.0, "none", None)] + ([(1.02, "4 3", "1.02")] if l2 == "warm" else [])
        panels.append(Panel(
            f"{form}, {dtype}, L2 {l2}: time / best fused peer (above {ymax:g}: at the top)",
            references,
            [(f"hidden {h}", colors[h], points) for h, points in by_hidden.items() if points]))
    tokens = sorted({rec["tokens"] for rec in cells})
    step = max(1, math.ceil(len(tokens) / MAX_TICKS))
    ticks = [(math.log2(t), f"{t >> 10}k" if t >= 1024 and t % 1024 == 0 else str(t))
             for t in tokens[::step]]
    return panels, Axis("tokens (k = 1024)", ticks)


def svg(panels, axis, ymax, per_row=1):
    """The SVG text: the panels in rows of per_row, each with its reference lines, a polyline per
    line and a legend at its right."""
    points = [p for panel in panels for _, _, line in panel.lines for p in line]
    x_lo = min([x for x, _ in points] + [x for x, _ in axis.ticks])
    x_hi = max([x for x, _ in points] + [x for x, _ in axis.ticks])
    y_lo = min(0.95, min(r for _, r in points))
    cell_w, cell_h = LEFT + PANEL_W + LEGEND_W, TOP + PANEL_H + BOTTOM
    width = min(per_row, len(panels)) * cell_w
    height = math.ceil(len(panels) / per_row) * cell_h + GAP

    def sx(x, left):
        return left + (x - x_lo) / max(1, x_hi - x_lo) * PANEL_W

    def sy(value, top):
        return top + (ymax - min(value, ymax)) / (ymax - y_lo) * PANEL_H

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>']
    for i, panel in enumerate(panels):
        left = (i % per_row) * cell_w + LEFT
        top = GAP + (i // per_row) * cell_h
        right = left + PANEL_W
        parts.append(f'<text x="{left}" y="{top - 10}" font-size="14">{panel.title}</text>')
        parts.append(f'<rect x="{left}" y="{top}" width="{PANEL_W}" height="{PANEL_H}" '
                     'fill="none" stroke="black"/>')
        for value, dash, _ in panel.references:
            y = sy(value, top)
            parts.append(f'<line x1="{left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" stroke="black" '
                         f'stroke-dasharray="{dash}" stroke-width="0.8"/>')
        for k in range(math.ceil(y_lo * 10), math.floor(ymax * 10) + 1):  # a label every 0.1
            y = sy(k / 10, top)
            parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                         f'{k / 10:.1f}</text>')
        for value, _, label in panel.references:
            if label:
                parts.append(f'<text x="{left + 4}" y="{sy(value, top) - 3:.1f}" '
                             f'font-size="10">{label}</text>')
        for x_value, text in axis.ticks:
            x = sx(x_value, left)
            bottom = top + PANEL_H
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}" '
                         'stroke="black"/>')
            parts.append(f'<text x="{x:.1f}" y="{bottom + 18}" text-anchor="middle">{text}</text>')
        parts.append(f'<text x="{left + PANEL_W / 2}" y="{top + PANEL_H + 36}" '
                     f'text-anchor="middle">{axis.label}</text>')
        for k, (title, color, line) in enumerate(panel.lines):
            coords = " ".join(f"{sx(x, left):.1f},{sy(r, top):.1f}" for x, r in line)
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" '
                         f'points="{coords}"><title>{title}</title></polyline>')
            ly = top + 14 + 18 * k
            parts.append(f'<line x1="{right + 12}" x2="{right + 32}" y1="{ly}" y2="{ly}" '
                         f'stroke="{color}" stroke-width="2"/>')
            parts.append(f'<text x="{right + 38}" y="{ly + 4}">{title}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="?", default=str(HERE / "results" / "h200.json"),
                        help="a bench_rms_norm.py or bench_fused_sweep.py JSON "
                             "(default benchmarks/results/h200.json)")
    parser.add_argument("-o", "--output", default=None,
                        help="the SVG to write (default: the JSON's name with _sweep.svg)")
    parser.add_argument("--ymax", type=float, default=1.5,
                        help="top of the ratio axis (default 1.5)")
    args = parser.parse_args()
    source = pathlib.Path(args.json)
    try:
        records = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        parser.error(f"{source}: {getattr(exc, 'strerror', None) or exc}")
    if args.ymax <= 1.05:
        parser.error("--ymax must be above 1.05 (the sweep's target line)")
    if not isinstance(records, list):
        parser.error(f"{source} holds no list of records, as the benchmarks write")
    panels, axis = fused_figure(records, args.ymax)
    per_row = len(L2_STATES)  # L2 cold and warm side by side
    if not panels:
        panels, axis = plain_figure(sweep_ratios(records), args.ymax)
        per_row = 1
    if not panels:
        parser.error(f"{source} has no sweep records ({SWEEP_TOKENS} tokens with copy_ timed, or "
                     "a fused sweep's): run bench_rms_norm.py with --only sweep, or "
                     "bench_fused_sweep.py")
    target = source.with_name(source.stem + "_sweep.svg")
    if args.output:
        target = pathlib.Path(args.output)
    target.write_text(svg(panels, axis, args.ymax, per_row))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
