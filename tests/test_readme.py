"""CPU: README.md says what the code does.

The README is read next to the sample, so it must not drift from it: its
Python snippets are copied from the sample files, its flags table lists
the script's flags, its test command is the one CI runs, its performance
table quotes the committed results, and the files it names exist. Each check
reads the README and the code as they are; none keeps its own copy of either.
"""

import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE_PATH = ROOT / "rms_norm_plugin_cutedsl.py"
FUSED_PATH = ROOT / "rms_norm_fused_cutedsl.py"
README = ROOT / "README.md"
SNIPPET_SOURCES = (SAMPLE_PATH, FUSED_PATH, ROOT / "rms_norm_aot_cutedsl.py",
                   ROOT / "rms_norm_onnx_model.py", ROOT / "rms_norm_saved_engine.py")
CI_SCRIPT = ROOT / ".ci" / "run"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def fenced_blocks(text, language):
    """The bodies of the ```<language> blocks of a Markdown text."""
    return [body for lang, body in FENCE.findall(text) if lang == language]


def snippet_segments(block):
    """A README snippet as runs of lines; a line that is only `...` stands for omitted lines."""
    segments, current = [], []
    for line in textwrap.dedent(block).splitlines():
        if line.strip() == "...":
            segments.append(current)
            current = []
        else:
            current.append(line.rstrip())
    segments.append(current)
    return [segment for segment in segments if any(line.strip() for line in segment)]


def find_segment(segment, lines, start):
    """Index of the first line at or after `start` where `segment` occurs with one common indent, or -1."""
    first = segment[0]
    for i in range(start, len(lines) - len(segment) + 1):
        if not lines[i].endswith(first) or lines[i][: len(lines[i]) - len(first)].strip():
            continue
        indent = lines[i][: len(lines[i]) - len(first)]
        if all(
            (lines[i + k].strip() == "" if not want.strip() else lines[i + k] == indent + want)
            for k, want in enumerate(segment)
        ):
            return i
    return -1


def occurs_in(block, source_text):
    """Whether every segment of `block` occurs in `source_text`, in order."""
    lines = [line.rstrip() for line in source_text.splitlines()]
    position = 0
    for segment in snippet_segments(block):
        found = find_segment(segment, lines, position)
        if found < 0:
            return False
        position = found + len(segment)
    return True


def flags_table_flags(text):
    """Every --flag named in the first column of the README table whose header starts with `flag`."""
    flags, in_table = set(), False
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            in_table = False
        elif cells[0].lower() == "flag":
            in_table = True
        elif in_table and not set(cells[0]) <= set("-: "):
            flags.update(FLAG.findall(cells[0]))
    return flags


def pytest_lines(text):
    """The uncommented lines of a shell text that run pytest, whitespace-normalized."""
    return [" ".join(line.split()) for line in text.splitlines()
            if "pytest" in line and not line.lstrip().startswith("#")]


def readme_test_commands(text):
    """The pytest lines of the README's ```bash blocks under its `## Tests` heading."""
    section = re.search(r"^## Tests\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, "README.md has no '## Tests' section"
    return [line for block in fenced_blocks(section.group(1), "bash") for line in pytest_lines(block)]


@pytest.fixture(scope="module")
def readme():
    return README.read_text()


@pytest.fixture(scope="module")
def help_flags():
    """The flags of the lesson's script and of its fused companion's."""
    flags = set()
    for script in (SAMPLE_PATH, FUSED_PATH):
        proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        flags |= set(FLAG.findall(proc.stdout)) - {"--help"}
    return flags


# -- the checks, as functions of the texts, so each can be shown to fail on a drifted copy --------


def snippets_not_in_sources(readme_text, sources):
    return [block for block in fenced_blocks(readme_text, "python")
            if not any(occurs_in(block, source) for source in sources)]


def test_readme_walks_through_the_file_with_python_snippets(readme):
    assert len(fenced_blocks(readme, "python")) >= 4


def test_every_python_snippet_is_copied_verbatim_from_a_sample_file(readme):
    sources = [path.read_text() for path in SNIPPET_SOURCES]
    missing = snippets_not_in_sources(readme, sources)
    assert not missing, "README snippets not found verbatim in the sample files:\n\n" + "\n---\n".join(missing)


def test_every_flag_in_the_readme_table_is_a_flag_of_the_script(readme, help_flags):
    table = flags_table_flags(readme)
    assert table, "README.md has no flags table (a table whose first header cell is 'flag')"
    assert table <= help_flags, f"in the README's table but not in --help: {sorted(table - help_flags)}"


def test_every_flag_of_the_script_is_in_the_readme_table(readme, help_flags):
    table = flags_table_flags(readme)
    assert help_flags <= table, f"in --help but not in the README's table: {sorted(help_flags - table)}"


def test_readme_test_command_is_the_one_ci_runs(readme):
    in_readme, in_ci = readme_test_commands(readme), pytest_lines(CI_SCRIPT.read_text())
    assert in_readme, "README.md's Tests section shows no pytest command"
    assert in_readme == in_ci, f"README runs {in_readme}, .ci/run runs {in_ci}"


def test_run_output_shows_the_plan_the_lesson_compiles(readme):
    import rms_norm_plugin_cutedsl as lesson

    section = re.search(r"^## Run it\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    assert section, "README.md has no '## Run it' section"
    (output,) = [block for block in fenced_blocks(section.group(1), "") if "Inference result correct!" in block]
    dtype, hidden = re.search(r"^RMSNorm (\w+), hidden (\d+),", output, re.M).groups()
    plan = lesson.plan_kernel(int(hidden), lesson.DTYPES[dtype].bytes)
    assert f"every token count: {plan.describe()}" in output.splitlines()


def plan_table_row(hidden, counts, plan):
    """The README's row for one plan of the schedule, its cells spelled from the plan's fields."""
    tokens = ", ".join(f"{(fewer or 0) + 1}-{most}" if most else f"{(fewer or 0) + 1}+" for fewer, most in counts)
    split = (f"cluster of {plan.cluster_ctas} CTAs" if plan.cluster_ctas > 1 else
             f"{plan.cta_rows} rows/CTA in turn" if plan.rows_in_sequence > 1 else
             f"{plan.rows_per_cta} row{'s' if plan.rows_per_cta > 1 else ''}/CTA")
    arrival = {"registers": "registers", "cp.async": "cp.async", "bulk": "bulk copy"}[plan.arrival]
    weight = ("first" if plan.early_weight else "late") + (f", bound {plan.min_ctas_per_sm}"
                                                            if plan.min_ctas_per_sm else "")
    return (str(hidden), tokens, f"{plan.threads_per_row} × {plan.vecs_per_thread}", split, arrival, weight)


def plan_rows_not_scheduled(readme_text, sample):
    """Rows of the README's `hidden | tokens | ...` table that the sample's sm_90 fp16 schedule lacks, and rows of
    that schedule, for each hidden size the table shows, that the table lacks."""
    section = re.search(r"^## Which kernel runs\n(.*?)(?=^## |\Z)", readme_text, re.M | re.S)
    assert section, "README.md has no '## Which kernel runs' section"
    (header, rows), = [table for table in markdown_tables(section.group(1)) if table[0][:2] == ["hidden", "tokens"]]
    shown = {tuple(row) for row in rows}
    scheduled = {plan_table_row(hidden, counts, plan) for hidden in {int(row[0]) for row in rows}
                 for plan, counts in sample.token_schedule(hidden, 2, sm90=True)}
    return shown ^ scheduled


def test_the_plan_table_is_what_the_launcher_schedules(readme):
    import rms_norm_fused_cutedsl as sample

    assert not plan_rows_not_scheduled(readme, sample)


def markdown_tables(text):
    """Each Markdown table of `text` as (header cells, body rows of cells), its separator row left out."""
    tables, lines = [], text.splitlines() + [""]
    start = None
    for i, line in enumerate(lines):
        if line.startswith("|") and start is None:
            start = i
        elif not line.startswith("|") and start is not None:
            rows = [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in lines[start:i]]
            tables.append((rows[0], [row for row in rows[1:] if not set("".join(row)) <= set("-: ")]))
            start = None
    return tables


def performance_cells_not_in_results(readme_text, results_text):
    """README performance cells that differ from the committed results' float16 cell under the same header.

    The README shows some of the results' columns (its first is `tokens × hidden`); the results' device-time
    table is their first table whose header starts `dtype | tokens x hidden`.
    """
    section = re.search(r"^## Performance\n(.*?)(?=^## |\Z)", readme_text, re.M | re.S)
    assert section, "README.md has no '## Performance' section"
    readme_tables = [table for table in markdown_tables(section.group(1)) if table[0][0] == "tokens × hidden"]
    assert readme_tables, "README.md's performance section has no table headed 'tokens × hidden'"
    header, rows = readme_tables[0]
    assert rows, "README.md's performance table has no rows"
    results_header, results_rows = next(table for table in markdown_tables(results_text)
                                        if table[0][:2] == ["dtype", "tokens x hidden"])
    results = {(row[0], row[1]): dict(zip(results_header, row)) for row in results_rows}
    differing = []
    for row in rows:
        want = results.get(("float16", row[0].replace(" × ", "x")), {})
        differing += [(row[0], title, cell, want.get(title)) for title, cell in zip(header[1:], row[1:])
                      if want.get(title) != cell]
    return differing


def test_performance_table_quotes_the_committed_results(readme):
    results = (ROOT / "benchmarks" / "results" / "h200.md").read_text()
    differing = performance_cells_not_in_results(readme, results)
    assert not differing, ("README performance cells (shape, column, README, results) that differ from "
                           f"benchmarks/results/h200.md (float16): {differing}")


def test_every_relative_link_and_named_file_exists(readme):
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    files = re.findall(r"`((?:[\w.-]+/)*[\w-]+\.(?:py|txt|md))`", readme)
    relative = [target for target in links + files if "://" not in target]
    assert relative
    missing = sorted({target for target in relative if not (ROOT / target).exists()})
    assert not missing, f"README.md names files that do not exist: {missing}"


# -- the checker itself, on small texts: a test that cannot fail guards nothing -------------------

SOURCE = '''\
class Plugin:
    def enqueue(self, stream):
        """Run time."""
        key = 1

        launch(key, stream)
'''


@pytest.mark.parametrize("block,found", [
    ('def enqueue(self, stream):\n    """Run time."""\n    key = 1\n\n    launch(key, stream)\n', True),
    ('class Plugin:\n    ...\n        launch(key, stream)\n', True),
    ('    def enqueue(self, stream):\n        key = 1\n', False),           # a line left out without `...`
    ('def enqueue(self, stream):\n    """Run time."""\n    key = 2\n', False),  # a changed value
    ('launch(key, stream)\n...\nclass Plugin:\n', False),                    # segments out of order
    ('def enqueue(self, stream):\n  """Run time."""\n', False),              # a changed indent
])
def test_snippet_matching(block, found):
    assert occurs_in(block, SOURCE) is found


def test_flags_table_parsing():
    text = "| flag | default |\n|---|---|\n| `--a-b N` | 1 |\n| `--c / --d` | 2 |\n\n| x |\n|---|\n| `--e` |\n"
    assert flags_table_flags(text) == {"--a-b", "--c", "--d"}


RESULTS = """\
| dtype | tokens x hidden | copy_ | this kernel | quack | this / best peer |
|---|---|---|---|---|---|
| float16 | 1x1024 | 0.83 | 1.23 | 1.61 | 0.990 (torch.compile) |
| bfloat16 | 1x1024 | 1.03 | 1.25 | 1.60 | 1.000 (torch.compile) |

| dtype | tokens x hidden | best peer | this / best peer |
|---|---|---|---|
| float16 | 1x1024 | torch.compile | 0.990 |
"""


@pytest.mark.parametrize("table,differing", [
    ("| tokens × hidden | copy_ | quack | this / best peer |\n|---|---|---|---|\n| 1 × 1024 | 0.83 | 1.61 | "
     "0.990 (torch.compile) |\n", []),                                                      # a subset of columns
    ("| tokens × hidden | copy_ | quack |\n|---|---|---|\n| 1 × 1024 | 0.83 | 1.60 |\n",
     [("1 × 1024", "quack", "1.60", "1.61")]),                                             # the bf16 figure
    ("| tokens × hidden | liger |\n|---|---|\n| 1 × 1024 | 1.31 |\n",
     [("1 × 1024", "liger", "1.31", None)]),                                               # a column not timed
    ("| tokens × hidden | copy_ |\n|---|---|\n| 4 × 1024 | 0.83 |\n",
     [("4 × 1024", "copy_", "0.83", None)]),                                               # a shape not timed
])
def test_performance_cell_matching(table, differing):
    readme_text = f"## Performance\n\nText.\n\n{table}\nMore text.\n\n## Next\n"
    assert performance_cells_not_in_results(readme_text, RESULTS) == differing


@pytest.mark.parametrize("old,new", [
    ("| 8192 | 1-32 | 256 × 4 | cluster of 4 CTAs |", "| 8192 | 1-64 | 256 × 4 | cluster of 4 CTAs |"),  # a bound
    ("| 385-4096 | 512 × 4 | 2 rows/CTA in turn | bulk copy | first, bound 2 |",
     "| 385-4096 | 512 × 4 | 2 rows/CTA in turn | bulk copy | first |"),                            # a launch bound
    ("| 4096 | 1-128 | 256 × 2 | 1 row/CTA | registers | first |\n", ""),                          # a row left out
])
def test_plan_table_matching(readme, old, new):
    import rms_norm_fused_cutedsl as sample

    assert old in readme
    assert plan_rows_not_scheduled(readme.replace(old, new), sample)
