#!/usr/bin/env python3
"""The quantized table: the fused companion's FP8 form against norm-then-quantize peers on one GPU.

An FP8 GEMM after the norm reads Y as FP8 E4M3, y_q = saturate(RNE(y / y_scale)), one byte an
element. Two tables at each shape and dtype, every output checked once before it is timed (Y_q
against the FP8 of the float64 norm, S bit for bit against torch's x + r):

(a) plain, y = norm(x) * w:
* fp8 (this): the companion's FP8 form (rms_norm_fused_cutedsl.py), one kernel writing Y_q;
* this + quantize: the companion's plain kernel writing Y in X's dtype, then a torch.compile'd
  quantize reading it back (the plugin where the quantize stays a layer of its own);
* FlashInfer rmsnorm_quant: flashinfer.norm.kernels.rmsnorm.rmsnorm_quant_cute (CuteDSL; W in
  X's dtype, the scale a device tensor whose reciprocal it multiplies by);
* torch.compile norm+quantize: one compiled function, FP32 inside, returning Y_q.

(b) residual (decoder), s = x + r in X's dtype, y = norm(s) * w:
* fp8 fused (this): the companion's residual FP8 form, one kernel reading X and R, writing S and
  Y_q;
* add + this + quantize: torch's add writing S, the plain kernel, the compiled quantize;
* FlashInfer fused_add_rmsnorm_quant: flashinfer.norm.kernels.fused_add_rmsnorm (R becomes S in
  place, X is only read, Y_q goes to a tensor of its own);
* torch.compile add+norm+quantize: one compiled function returning (Y_q, S).

Device time per call: CUDA-graph replay timed with CUDA events, each graph cycling through enough
buffer sets that a set comes back only after 256 MB of other traffic (bench_decoder.py says why);
R rounds (--rounds), each timing every column of a table once in a rotating order; medians, and
ratios as medians of per-round ratios (bench_records.py). torch.compile compiles per dtype and
hidden size: the first token count in a graph of its own, the later ones in one graph with the
token count dynamic (dynamo's automatic dynamic shapes), as a serving stack compiles it; a graph
per shape would spend most of the run compiling.

    python3 benchmarks/bench_quantized.py [--shapes NxH,...] [--dtypes D,...] [--rounds R]
        [--out-dir DIR] [--name NAME]

Results go to DIR/NAME.md and DIR/NAME.json (default ./bench-results/quantized.*), rewritten
after every shape and form. Table (b) at every token count 1-32768 by LLM hidden sizes, L2 cold and
warm: `python3 benchmarks/bench_fused_sweep.py residual_fp8`.
"""

import functools
import json
import pathlib
import sys
import time
import types

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_decoder import (EPS, buffer_sets, checked_calls, cycling, norm_of,  # noqa: E402
                           table_args, table_parser)
from bench_records import fused_record, interleaved_rounds  # noqa: E402
from bench_rms_norm import current_stream, cute_tensors, graph_timer, package_version  # noqa: E402

# |y| = |norm(x) * w| with W in [0.5, 1.5) is below 3 in 99 % of elements and past 7 in about one
# in five million: y / 2^-6 spreads over FP8's range (normal from 2^-6, largest 448) and
# saturates past 7 only.
# A power of two makes y / y_scale and y * (1 / y_scale) the same number: the companion folds
# 1 / y_scale into rstd, FlashInfer multiplies by rcp.approx of its scale, inductor may turn the
# division into a product; so every column is asked for the very same y_q.
Y_SCALE = 2.0**-6
E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max
# One rounding of an FP32 y, which is off the float64 y by a few 2^-24: either FP8 neighbour is
# right within 2^-16 of a rounding midpoint, and only there.
SINGLE_ROUNDING = (2.0**-16, 0.0)  # (rtol, atol)
# Columns whose y may be off by one ulp of X's dtype (Y_TOLERANCE) before its quantize: Y stored in
# X's dtype first, or the norm taken of x + r before the sum is rounded to X's dtype (FlashInfer's
# fused kernel does; inductor may keep the sum in FP32).
X_DTYPE_ROUNDING = {("plain", "this_quantize"), ("residual", "this_quantize"),
                    ("residual", "flashinfer"), ("residual", "torch_compile")}
RESOLVE_LIMIT = 1 << 24  # past this many differing elements the output is off: no host pass
FORMS = {
    "plain": ("(a) Plain: Y_q = FP8 of norm(X) * W / y_scale",
              {"fp8": "fp8 (this)", "this_quantize": "this + quantize",
               "flashinfer": "FlashInfer rmsnorm_quant",
               "torch_compile": "torch.compile norm+quantize"}),
    "residual": ("(b) Residual (decoder): S = X + R, Y_q = FP8 of norm(S) * W / y_scale",
                 {"fp8": "fp8 fused (this)", "this_quantize": "add + this + quantize",
                  "flashinfer": "FlashInfer fused_add_rmsnorm_quant",
                  "torch_compile": "torch.compile add+norm+quantize"}),
}
# Bytes the companion's FP8 form moves per element of X: X and Y_q; X, R, S and Y_q (16-bit X).
FORM_ELEMENT_BYTES = {"plain": 3, "residual": 7}
# The companion's launchers a table calls, by the compile_rms_norm arguments of each.
LAUNCHERS = {"fp8": {"y_scale": Y_SCALE}, "fused_fp8": {"residual": True, "y_scale": Y_SCALE},
             "plain": {}}


def quantize(y):
    """Y_q of y in any float dtype; clamped first, as torch's cast to E4M3 does not saturate."""
    return (y.float() / Y_SCALE).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def norm_fp32(x, w):
    """RMSNorm as torch.compile is given it: FP32 throughout."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w


def norm_then_quantize(x, w):
    return quantize(norm_fp32(x, w))


def add_norm_quantize(x, r, w):
    s = x + r
    return quantize(norm_fp32(s, w)), s


def fp8_misses(y_q, ref, quantize_reference, rtol, atol) -> int:
    """How many elements of the FP8 tensor y_q are not quantize_reference(v, Y_SCALE) for any v
    from ref - tol to ref + tol (ref: float64, tol = atol + rtol * |ref|)."""
    got = y_q.float()  # exact, as is every comparison below
    # A pass on ref's device first: this cast goes through FP32, which moves ref / Y_SCALE by at
    # most 2^-24 of itself, so it can pick the other neighbour only where both are accepted: an
    # element equal to it is right. The others go to the exact reference on the host.
    cast = (ref / Y_SCALE).float().clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float()
    differ = got != cast  # NaN differs
    count = int(differ.sum())
    if count > RESOLVE_LIMIT:
        return count
    ref_d = ref[differ].cpu().numpy()
    got_d = got[differ].double().cpu().numpy()
    tol = atol + rtol * np.abs(ref_d)
    # Rounding is monotonic: every value from the one end's FP8 to the other's is accepted.
    low = quantize_reference(ref_d - tol, Y_SCALE)
    high = quantize_reference(ref_d + tol, Y_SCALE)
    return int(np.count_nonzero(~((low <= got_d) & (got_d <= high))))


def load_flashinfer():
    """({form: FlashInfer's CuteDSL norm-and-quantize}, None), or (None, why not)."""
    try:
        from flashinfer.norm.kernels.fused_add_rmsnorm import fused_add_rmsnorm_quant_cute
        from flashinfer.norm.kernels.rmsnorm import rmsnorm_quant_cute
    except Exception as exc:  # another CuteDSL version can fail with more than ImportError
        return None, f"not importable ({type(exc).__name__}: {exc})"
    return {"plain": rmsnorm_quant_cute, "residual": fused_add_rmsnorm_quant_cute}, None


def make_cell(kernel, dtype, tokens, hidden, compiled, flashinfer):
    """What both forms' columns share at one shape and dtype: W, the scale, the compiled calls
    (launcher(name) compiles one of LAUNCHERS by the kernel module's compile_rms_norm when a column
    first asks for it), its quantize_reference."""
    from rms_norm_plugin_cutedsl import Y_TOLERANCE

    # W exact in bf16, so in fp16 too: FlashInfer's W in X's dtype is the others' W.
    w = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16).float()

    @functools.cache
    def launcher(name):
        return kernel.compile_rms_norm(dtype, hidden, EPS, **LAUNCHERS[name])

    return types.SimpleNamespace(
        dtype=dtype, tokens=tokens, hidden=hidden, w=w, w_lp=w.to(getattr(torch, dtype)),
        scale=torch.full((1,), Y_SCALE, device="cuda"),  # FlashInfer reads it from a tensor
        launcher=launcher, compiled=compiled, flashinfer=flashinfer,
        quantize_reference=kernel.quantize_reference, x_dtype_tolerance=tuple(Y_TOLERANCE[dtype]))


def plain_makers(cell, keep):
    """{column: make(x) -> (call, result)} of table (a); result() is (Y_q,) after a call. keep
    gets every buffer a graph uses: it must live until the form is timed (a graph holds raw
    addresses only)."""

    def fp8(x):
        launch = cell.launcher("fp8")
        y = torch.empty(x.shape, device="cuda", dtype=E4M3)
        keep.append(y)
        fx, fw, fy = cute_tensors(x, cell.w, y)
        return (lambda: launch(fx, fw, fy, cell.tokens, current_stream())), lambda: (y,)

    def this_quantize(x):
        launch = cell.launcher("plain")
        y = torch.empty_like(x)
        held = [None]  # the compiled quantize's last output
        keep.append((y, held))
        fx, fw, fy = cute_tensors(x, cell.w, y)

        def call():
            launch(fx, fw, fy, cell.tokens, current_stream())
            held[0] = cell.compiled["quantize"](y)

        return call, lambda: (held[0],)

    def flashinfer(x):
        y = torch.empty(x.shape, device="cuda", dtype=E4M3)
        keep.append(y)
        norm = cell.flashinfer["plain"]
        return (lambda: norm(y, x, cell.w_lp, cell.scale, EPS)), lambda: (y,)

    def torch_compile(x):
        held = [None]
        keep.append(held)

        def call():
            held[0] = cell.compiled["plain"](x, cell.w)

        return call, lambda: (held[0],)

    return {"fp8": fp8, "this_quantize": this_quantize, "flashinfer": flashinfer,
            "torch_compile": torch_compile}


def residual_makers(cell, keep):
    """{column: make(x, r) -> (call, result)} of table (b); result() is (Y_q, S) after a call."""

    def fp8(x, r):
        launch = cell.launcher("fused_fp8")
        y = torch.empty(x.shape, device="cuda", dtype=E4M3)
        s = torch.empty_like(x)
        keep.append((y, s))
        fx, fw, fy, fr, fs = cute_tensors(x, cell.w, y, r, s)

        def call():
            launch(fx, fw, fy, cell.tokens, current_stream(), fr, fs)

        return call, lambda: (y, s)

    def this_quantize(x, r):
        launch = cell.launcher("plain")
        s, y = torch.empty_like(x), torch.empty_like(x)
        held = [None]
        keep.append((s, y, held))
        fs, fw, fy = cute_tensors(s, cell.w, y)

        def call():
            torch.add(x, r, out=s)
            launch(fs, fw, fy, cell.tokens, current_stream())
            held[0] = cell.compiled["quantize"](y)

        return call, lambda: (held[0], s)

    def flashinfer(x, r):
        ri = r.clone()  # R becomes S in place; the set's R stays as drawn for the other columns
        y = torch.empty(x.shape, device="cuda", dtype=E4M3)
        keep.append((ri, y))
        fused = cell.flashinfer["residual"]
        return (lambda: fused(y, x, ri, cell.w_lp, cell.scale, EPS)), lambda: (y, ri)

    def torch_compile(x, r):
        held = [None]
        keep.append(held)

        def call():
            held[0] = cell.compiled["residual"](x, r, cell.w)

        return call, lambda: held[0]

    return {"fp8": fp8, "this_quantize": this_quantize, "flashinfer": flashinfer,
            "torch_compile": torch_compile}


def misses(outputs, ref, expected_s, quantize_reference, tolerance) -> str:
    """'' if Y_q is the FP8 of ref within tolerance (rtol, atol) and S, if given, is expected_s
    bit for bit; else what is off."""
    y_q, *s = outputs
    found = []
    if s and not torch.equal(s[0], expected_s):
        found.append(f"S differs from x + r at {int((s[0] != expected_s).sum())} elements")
    bad = fp8_misses(y_q, ref, quantize_reference, *tolerance)
    if bad:
        found.append(f"{bad} elements of Y_q off the FP8 of the float64 norm")
    return "; ".join(found)


def form_check(form, cell, inputs):
    """check(name, result) of one form's columns on inputs, the first buffer set: what the column's
    output got wrong ('' if nothing)."""
    expected_s = inputs[0] + inputs[1] if form == "residual" else None
    ref = norm_of(inputs[0] if expected_s is None else expected_s, cell.w)

    def check(name, result):
        tolerance = SINGLE_ROUNDING
        if (form, name) in X_DTYPE_ROUNDING:
            tolerance = cell.x_dtype_tolerance
        return misses(result(), ref, expected_s, cell.quantize_reference, tolerance)

    return check


def failure_line(exc) -> str:
    """A column's failure as one line of the notes."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def form_timers(form, cell):
    """({column: timer}, {column: what its checked output got wrong}, {column: why it is not
    timed}, the buffers the graphs use)."""
    keep = []
    count = buffer_sets(cell.tokens, cell.hidden, FORM_ELEMENT_BYTES[form])
    width = 1 if form == "plain" else 2  # X, or X and R
    tdt = getattr(torch, cell.dtype)
    sets = [tuple(torch.randn(cell.tokens, cell.hidden, device="cuda", dtype=tdt)
                  for _ in range(width)) for _ in range(count)]
    keep.append(sets)
    makers = (plain_makers if form == "plain" else residual_makers)(cell, keep)
    if cell.flashinfer is None:
        del makers["flashinfer"]
    check = form_check(form, cell, sets[0])
    timers, wrong, failed = {}, {}, {}
    for name, make in makers.items():
        try:
            calls, what = checked_calls(make, sets, functools.partial(check, name))
            timers[name] = graph_timer(cycling(calls), cell.tokens, cell.hidden, len(calls))
            wrong[name] = what
        except Exception as exc:  # a peer that fails leaves its column empty, not the table
            if name == "fp8":
                raise
            failed[name] = failure_line(exc)
    return timers, wrong, failed, keep


def shape_record(form, dtype, tokens, hidden, times, wrong):
    """One row of a table as the JSON keeps it: medians, rounds, best fused peer, ratios."""
    where = {"form": form, "dtype": dtype, "tokens": tokens, "hidden": hidden}
    return fused_record(where, "fp8", times, wrong, against=("this_quantize",))


def row_line(rec) -> str:
    """A record as a Markdown table row."""
    columns = FORMS[rec["form"]][1]
    cells = [rec["dtype"], f"{rec['tokens']}x{rec['hidden']}"]
    for name in columns:
        star = "*" if name in rec["wrong"] else ""
        cells.append(f"{rec['us'][name]:.2f}{star}" if name in rec["us"] else "-")
    best = rec["best_fused_peer"]
    cells.append(f"{rec['ratios'][best]:.3f} ({columns[best]})" if best else "-")
    unfused = rec["ratios"].get("this_quantize")
    cells.append("-" if unfused is None else f"{unfused:.3f}")
    return "| " + " | ".join(cells) + " |"


def table_lines(form, records):
    """One form's table, and in how many cells its FP8 form is at or ahead of its best peer."""
    title, columns = FORMS[form]
    header = ["dtype", "tokens x hidden", *columns.values(), f"{columns['fp8']} / best fused peer",
              f"{columns['fp8']} / {columns['this_quantize']}"]
    rows = [rec for rec in records if rec["form"] == form]
    lines = [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [row_line(rec) for rec in rows]
    rated = [rec for rec in rows if rec["best_fused_peer"]]
    behind = [rec for rec in rated if rec["ratios"][rec["best_fused_peer"]] > 1.0]
    summary = (f"{columns['fp8']} at or ahead of the best fused peer in "
               f"{len(rated) - len(behind)} of {len(rated)} cells")
    if behind:
        summary += "; behind in " + ", ".join(
            f"{rec['dtype']} {rec['tokens']}x{rec['hidden']} "
            f"({rec['ratios'][rec['best_fused_peer']]:.3f})" for rec in behind)
    return lines + ["", summary]


def render(meta, rounds, flashinfer_why, records, notes) -> str:
    """The results as Markdown: meta's gpu, command, versions and date, both tables, the notes."""
    lines = [f"# Quantized table (RMSNorm to FP8 E4M3): {meta['gpu']}", "",
             f"command: `{meta['command']}`  ", f"versions: {meta['versions']}  ",
             f"date: {meta['date']}", ""]
    if flashinfer_why:
        lines += [f"FlashInfer: {flashinfer_why}: not timed.", ""]
    lines += ["Device time per call in us, CUDA-graph replay cycling through buffer sets 256 MB "
              f"apart (inputs not in L2), median of {rounds} interleaved rounds; ratios are "
              "medians of per-round ratios. Every column computes y_q = saturate(RNE(y / "
              "y_scale)) in FP8 E4M3, y_scale = 2^-6. Best fused peer: the faster of FlashInfer "
              "and torch.compile. "
              "*: output checked and found off (see the notes).", ""]
    for form in FORMS:
        lines += table_lines(form, records) + [""]
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def main():
    parser = table_parser(__doc__.split("\n\n")[0], "quantized")
    args = parser.parse_args()
    shapes, dtypes, out = table_args(parser, args)

    import rms_norm_fused_cutedsl as fused

    flashinfer, why = load_flashinfer()
    meta = {"gpu": torch.cuda.get_device_name(),
            "command": " ".join(["python3 benchmarks/bench_quantized.py", *sys.argv[1:]]),
            "versions": f"torch {torch.__version__}, "
                        f"cutlass-dsl {package_version('nvidia-cutlass-dsl')}, "
                        f"flashinfer {package_version('flashinfer-python')}",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    compiled = {"quantize": torch.compile(quantize), "plain": torch.compile(norm_then_quantize),
                "residual": torch.compile(add_norm_quantize)}
    records, notes = [], []
    group = None
    for dtype in dtypes:
        for tokens, hidden in shapes:
            if (dtype, hidden) != group:
                # A fresh start per dtype and hidden: dynamo then marks only the token count
                # dynamic (at its second count), and no function outgrows its recompile limit.
                torch._dynamo.reset()
                group = (dtype, hidden)
            cell = make_cell(fused, dtype, tokens, hidden, compiled, flashinfer)
            for form, (_, columns) in FORMS.items():
                timers, wrong, failed, keep = form_timers(form, cell)
                times = interleaved_rounds(timers, args.rounds)
                del keep, timers
                where = f"at {dtype} {tokens}x{hidden}"
                notes += [f"{columns[name]} {where}: {why_not}; not timed"
                          for name, why_not in failed.items()]
                notes += [f"{columns[name]} {where}: {what}; timed, marked *"
                          for name, what in wrong.items() if what]
                records.append(shape_record(form, dtype, tokens, hidden, times, wrong))
                print(f"{form}: {row_line(records[-1])}", flush=True)
                (out / f"{args.name}.md").write_text(render(meta, args.rounds, why, records, notes))
                (out / f"{args.name}.json").write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {out / args.name}.md and .json")
    if any("fp8" in rec["wrong"] for rec in records):
        sys.exit("error: the companion's FP8 form's output was wrong (see the notes)")


if __name__ == "__main__":
    main()
