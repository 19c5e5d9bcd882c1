"""The benchmarks' shapes, their result records, issue 18's targets and the fused sweeps' summary,
without torch or a GPU.

A record is one implementation timed at one shape and dtype, as bench_rms_norm.py writes it to JSON:
{"impl", "dtype", "tokens", "hidden", "us" (median over rounds), "gbps", "rounds_us" (one time per
round, rounds interleaved across implementations)}. Ratios between two implementations are the
median of their per-round ratios, so that a drift of the GPU's speed between rounds cancels out.

The fused tables (bench_quantized.py) and sweeps (bench_fused_sweep.py) keep one record a cell,
every column in it: fused_record says which keys.
"""

import statistics

# The README's table; all of them are also in the matrix.
TABLE_SHAPES = [(1, 1024), (128, 1024), (512, 1024), (4096, 4096), (16384, 4096), (32768, 8192)]
MATRIX_HIDDENS = (1024, 1536, 2048, 4096, 5120, 8192, 10240, 12288, 16384)
MATRIX_TOKENS = (1, 128, 512, 4096, 16384)
SWEEP_TOKENS = 4096
SHAPE_PARTS = {
    "table": TABLE_SHAPES,
    "matrix": [(t, h) for h in MATRIX_HIDDENS for t in MATRIX_TOKENS] + [(32768, 8192)],
    "mid": [(4096, 1000), (4096, 100)],
    "sweep": [(SWEEP_TOKENS, h) for h in range(512, 16384 + 1, 512)],
}
DEFAULT_PARTS = ("matrix", "mid", "sweep")

# Implementation names in records, in table order. "copy" is torch's copy_ of X into Y (the floor),
# "this" the fused companion's plain form (the kernel users deploy), "lesson" the lesson's
# one-plan-a-row kernel; the peers are the RMSNorm forwards users pick instead of them.
IMPLS = ("copy", "this", "lesson", "torch_eager", "torch_compile", "quack", "liger")
PEERS = ("torch_compile", "quack", "liger")
IMPL_TITLES = {"copy": "copy_", "this": "this kernel", "lesson": "the lesson",
               "torch_eager": "torch eager", "torch_compile": "torch.compile", "quack": "quack",
               "liger": "liger"}

# The fused forms' sweep (bench_fused_sweep.py): every power of two of tokens, by hidden sizes of
# real LLMs, powers of two or not (896 Qwen2-0.5B, 1536 Qwen2-1.5B, 3584 Qwen2-7B, 4096
# Llama-3-8B, 5120 Llama-2-13B, 7168 DeepSeek-V3, 8192 Llama-3-70B, 16384 Llama-3.1-405B).
FUSED_SWEEP_TOKENS = tuple(1 << k for k in range(16))  # 1 ... 32768
FUSED_SWEEP_HIDDENS = (512, 896, 1536, 2048, 3584, 4096, 5120, 7168, 8192, 16384)
# cold: the graph cycles through buffer sets 256 MB apart, as a decoder's GEMMs evict a norm's
# tensors from L2 between two layers; warm: one set, reused call after call.
L2_STATES = ("cold", "warm")
FUSED_PEERS = ("flashinfer", "torch_compile")
PEER_TITLES = {"flashinfer": "FlashInfer", "torch_compile": "torch.compile"}
PEER_MARKS = {"flashinfer": "F", "torch_compile": "T"}

TIE = 1.01             # within 1 % of the fastest peer counts as level with it ...
TIE_NEAR_COPY = 1.02   # ... only where the kernel is also within 2 % of copy_


def shapes_of(parts):
    """The shapes of the named parts, each once, in the order the parts name them."""
    seen, shapes = set(), []
    for part in parts:
        for shape in SHAPE_PARTS[part]:
            if shape not in seen:
                seen.add(shape)
                shapes.append(shape)
    return shapes


def interleaved_rounds(timers, rounds):
    """{name: [one time per round]}: each round calls every timer once, starting one name later
    than the last round.

    Rotating the order keeps any one implementation from always running right after the same other
    one (or always first, right after the previous shape's work).
    """
    names = list(timers)
    times = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(timers[name]())
    return times


def traffic_bytes(tokens, hidden, elem=2):
    """Bytes one call moves: X read and Y written at `elem` bytes, W read once in fp32."""
    return 2 * tokens * hidden * elem + 4 * hidden


def median_ratio(times, base):
    """The median over rounds of times[r] / base[r]: two implementations' per-round times from
    interleaved_rounds."""
    return statistics.median(t / b for t, b in zip(times, base))


def ratio(a, b):
    """a's time over b's (two records of one shape and dtype): the median of per-round ratios where
    both have rounds."""
    ra, rb = a.get("rounds_us"), b.get("rounds_us")
    if ra and rb and len(ra) == len(rb):
        return median_ratio(ra, rb)
    return a["us"] / b["us"]


def targets_at(tokens, hidden, elem=2):
    """Issue 18's targets at one shape, as (label, against, limit): the kernel's time / `against`'s
    <= limit.

    `against` is "copy", "torch_compile" or "peer" (the fastest of PEERS, with the tie rule).
    """
    targets = []
    in_matrix = ((hidden in MATRIX_HIDDENS and tokens in MATRIX_TOKENS)
                 or (tokens, hidden) == (32768, 8192))
    in_sweep = tokens == SWEEP_TOKENS and hidden % 512 == 0 and 512 <= hidden <= 16384
    if in_matrix or in_sweep:
        targets.append(("<= fastest peer", "peer", 1.0))
    if in_sweep:
        targets.append(("sweep <= 1.05 x copy_", "copy", 1.05))
    if hidden * elem >= 8192 and tokens >= 4096:
        targets.append((">= 8 KB rows <= 1.02 x copy_", "copy", 1.02))
    if (tokens, hidden) == (32768, 8192):
        targets.append(("<= torch.compile", "torch_compile", 1.0))
    if (tokens, hidden) == (4096, 1000):
        targets.append(("<= 1.2 x copy_", "copy", 1.2))
    if (tokens, hidden) == (4096, 100):
        targets.append(("<= 1.15 x copy_", "copy", 1.15))
    return targets


def group_records(records):
    """{(dtype, tokens, hidden): {impl: record}} for the device-time records (those with a shape
    and a time)."""
    groups = {}
    for rec in records:
        if rec.get("impl") in IMPLS:  # the fused tables' records have none
            groups.setdefault((rec["dtype"], rec["tokens"], rec["hidden"]), {})[rec["impl"]] = rec
    return groups


def evaluate(records, elem=2):
    """One summary row per shape and dtype that has both "this" and "copy": ratios and the targets
    met or missed.

    Each row: dtype, tokens, hidden, best_peer (None without peers), this_best, this_copy, and
    checks, a list of (label, ratio, limit, met); met is None where the target's reference was not
    timed.
    """
    rows = []
    for (dtype, tokens, hidden), impls in group_records(records).items():
        if "this" not in impls or "copy" not in impls:
            continue
        this = impls["this"]
        peers = [impls[p] for p in PEERS if p in impls]
        best = min(peers, key=lambda r: r["us"]) if peers else None
        this_copy = ratio(this, impls["copy"])
        this_best = ratio(this, best) if best else None
        checks = []
        for label, against, limit in targets_at(tokens, hidden, elem):
            if against == "peer":
                value = this_best
                tie = value is not None and value <= TIE and this_copy <= TIE_NEAR_COPY
                met = None if value is None else (value <= limit or tie)
            else:
                value = ratio(this, impls[against]) if against in impls else None
                met = None if value is None else value <= limit
            checks.append((label, value, limit, met))
        rows.append({"dtype": dtype, "tokens": tokens, "hidden": hidden,
                     "best_peer": best["impl"] if best else None, "this_best": this_best,
                     "this_copy": this_copy, "checks": checks})
    return rows


def verdict(checks):
    """A summary row's pass/fail cell: "MISSED: <labels>", "untimed: <labels>" (a reference not
    timed), "met", or "-" where no target applies."""
    missed = [label for label, _, _, met in checks if met is False]
    untimed = [label for label, _, _, met in checks if met is None]
    if missed:
        return "MISSED: " + "; ".join(missed)
    if untimed:
        return "untimed: " + "; ".join(untimed)
    return "met" if checks else "-"


def summary_lines(rows):
    """The targets summary as Markdown table lines."""
    lines = ["| dtype | tokens x hidden | best peer | this / best peer | this / copy_ | targets | "
             "verdict |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        best = IMPL_TITLES[row["best_peer"]] if row["best_peer"] else "-"
        this_best = f"{row['this_best']:.3f}" if row["this_best"] is not None else "-"
        targets = "; ".join(f"{label} ({value:.3f})" if value is not None
                            else f"{label} (not timed)"
                            for label, value, _, _ in row["checks"]) or "-"
        lines.append(f"| {row['dtype']} | {row['tokens']}x{row['hidden']} | {best} | {this_best} | "
                     f"{row['this_copy']:.3f} | {targets} | {verdict(row['checks'])} |")
    return lines


def fused_record(where, kernel, times, wrong, against=()):
    """One cell of a fused table as the JSON keeps it: where's keys (form, dtype, shape, ...),
    each column's median ("us") and rounds ("rounds_us"), the faster fused peer ("best_fused_peer",
    None without one), the kernel column's ratios to it and to the columns `against` ("ratios",
    medians of per-round ratios) and what each checked output got wrong ("wrong", only those
    off)."""
    medians = {name: statistics.median(t) for name, t in times.items()}
    peers = [name for name in FUSED_PEERS if name in times]
    best = min(peers, key=medians.get) if peers else None
    ratios = {other: round(median_ratio(times[kernel], times[other]), 4)
              for other in (best, *against) if other in times}
    return {**where, "us": {name: round(us, 3) for name, us in medians.items()},
            "rounds_us": {name: [round(t, 4) for t in ts] for name, ts in times.items()},
            "best_fused_peer": best, "ratios": ratios,
            "wrong": {name: what for name, what in wrong.items() if what}}


def peer_ratio(rec):
    """A fused record's kernel time over its best fused peer's, None where no peer was timed."""
    best = rec["best_fused_peer"]
    return rec["ratios"][best] if best else None


def cell_name(rec) -> str:
    """A sweep cell as the summary names it: its ratio to the best fused peer, dtype, shape, L2."""
    return (f"{peer_ratio(rec):.3f} {rec['dtype']} {rec['tokens']}x{rec['hidden']} L2 {rec['l2']} "
            f"({PEER_TITLES[rec['best_fused_peer']]})")


def sweep_summary_lines(records, worst=8):
    """For each L2 state of a fused sweep: in how many cells the kernel is at or ahead of the best
    fused peer, behind by at most 1 % (TIE), or behind by more, and its `worst` slowest cells."""
    lines = []
    for l2 in L2_STATES:
        rated = [rec for rec in records if rec["l2"] == l2 and rec["best_fused_peer"]]
        if not rated:
            continue
        ahead = sum(peer_ratio(rec) <= 1.0 for rec in rated)
        level = sum(1.0 < peer_ratio(rec) <= TIE for rec in rated)
        lines.append(f"L2 {l2}: at or ahead of the best fused peer in {ahead} of {len(rated)} "
                     f"cells, behind by at most 1 % in {level}, behind by more in "
                     f"{len(rated) - ahead - level}")
        slowest = sorted(rated, key=peer_ratio, reverse=True)[:worst]
        lines.append(f"worst L2 {l2} cells: " + ", ".join(cell_name(rec) for rec in slowest))
    return lines


def sweep_grid_lines(records, dtype, l2):
    """One dtype and L2 state of a fused sweep as a Markdown grid: a row a token count, a column a
    hidden size, in each cell the kernel's time / the best fused peer's and that peer's mark (F, T),
    * where a checked output was off."""
    cells = {(rec["tokens"], rec["hidden"]): rec for rec in records
             if rec["dtype"] == dtype and rec["l2"] == l2}
    hiddens = sorted({hidden for _, hidden in cells})
    lines = ["| tokens | " + " | ".join(str(hidden) for hidden in hiddens) + " |",
             "|---|" + "---|" * len(hiddens)]
    for tokens in sorted({tokens for tokens, _ in cells}):
        row = []
        for hidden in hiddens:
            rec = cells.get((tokens, hidden))
            text = "-"
            if rec and rec["best_fused_peer"]:
                text = f"{peer_ratio(rec):.3f} {PEER_MARKS[rec['best_fused_peer']]}"
            row.append(text + ("*" if rec and rec["wrong"] else ""))
        lines.append(f"| {tokens} | " + " | ".join(row) + " |")
    return lines
