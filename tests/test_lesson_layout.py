"""The lesson reads in data-flow order, and the handoff it exists to teach comes early (issue 44):
its nine sections in order, each once, and the first hop of the zero-copy handoff (cupy's
UnownedMemory) before line 600."""

import pathlib
import re

LESSON = pathlib.Path(__file__).resolve().parent.parent / "rms_norm_plugin_cutedsl.py"


def lesson_lines():
    return LESSON.read_text().splitlines()


def test_the_nine_sections_come_once_each_in_order():
    numbers = [int(m.group(1)) for line in lesson_lines()
               if (m := re.match(r"# %% \[(\d)\] ", line))]
    assert numbers == list(range(1, 10))


def test_the_handoff_starts_before_line_600():
    lines = lesson_lines()
    first_hop = next(i + 1 for i, line in enumerate(lines) if "cp.cuda.UnownedMemory(" in line)
    section = next(i + 1 for i, line in enumerate(lines) if line.startswith("# %% [5]"))
    assert section < first_hop < 600
