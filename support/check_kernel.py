#!/usr/bin/env python3
"""Compile every plan of a copy of the sample's kernel without a GPU, and report what each costs.

Point it at your copy of rms_norm_plugin_cutedsl.py after changing the kernel (a bias, a second
reduction) and the rule's inputs (COLUMN_INPUTS, REDUCTIONS, ROW_INPUTS): fit_registers fits
each plan to what a thread then holds, and this check shows what ptxas makes of it. A plan that
spills without a launch bound can ask ptxas for the CTAs per SM of its estimate: put its tag in the
copy's BOUND_BY_ESTIMATE.

    python3 support/check_kernel.py --all-sizes      # the sample: about 3 minutes on 2 cores
    python3 support/check_kernel.py my_layer_norm.py --all-sizes
    python3 support/check_kernel.py my_layer_norm.py --hidden 4096,8192 --pairs float16/float32

For each plan it prints the arch, the X/W dtypes, hidden, the token counts the plan serves and its
tag, then what ptxas makes of it: registers, spilled bytes, shared memory, CTAs per SM on that arch,
whether the plan's launch bound is met, and the widths of its global X (and R) loads and of its
stores (a plan's vector width expected: 16 bytes wherever a vector is 16 bytes). Where the copy's
token_schedule takes `residual`, both forms are checked (--forms picks one): the residual form
reads R beside X and stores S beside Y. A summary line and the kernels that
fail close the listing. --all-sizes compiles, in every row-length class of the copy's tuning table,
its shortest and longest rows, rows that leave a thread short, rows of narrower vectors and its
roundest row (all_sizes says which), for every dtype pair on sm_80 and sm_90a; --hidden, --dtypes,
--pairs and --arch pick a subset. Plans compile in --jobs processes, each importing the copy.

The copy is taken through hooks it defines itself, so that a kernel with other inputs compiles as
its own launcher does: compile_launcher (each plan is compiled alone through it), DTYPE_PAIRS,
DTYPES, DEFAULT_EPSILON, MAX_HIDDEN, row_classes, token_schedule and is_sm90. X is the kernel's
first parameter and R, in the residual form, its second, as in the sample; Y (and S) are what it
stores to global memory.

Exit codes: 0 no kernel spills or misses its launch bound; 1 a kernel spills, misses its launch
bound (ptxas ignored it, or it leaves fewer CTAs on an SM) or fails to compile; 2 a usage error
(the file missing or without the hooks, ptxas not on PATH, an unknown dtype or arch), said in one
sentence. ptxas comes with a CUDA toolkit or PyPI's nvidia-cuda-nvcc; ptxas_report's load order,
which benchmarks/experiments/time_plans.py prints, also needs nvdisasm (nvidia-cuda-nvdisasm).
"""

import argparse
import collections
import concurrent.futures
import importlib.util
import inspect
import math
import multiprocessing
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

SAMPLE_PATH = pathlib.Path(__file__).resolve().parents[1] / "rms_norm_plugin_cutedsl.py"
HOOKS = ("compile_launcher", "DTYPE_PAIRS", "DTYPES", "DEFAULT_EPSILON", "MAX_HIDDEN",
         "row_classes", "token_schedule", "is_sm90")
WIDEST_ACCESS = 16  # bytes a thread moves in one global access at most (ld.global.v4.b32)
DEFAULT_HIDDEN = "1024,2048,4096,8192,12288,16384"
FORMS = {"plain": False, "residual": True}  # token_schedule's residual argument
EXIT_CLEAN = 0
EXIT_FOUND = 1
EXIT_USAGE = 2

# What one SM holds: registers, shared memory (of which RESERVED_SHARED_MEMORY per CTA is the
# system's), threads and CTAs.
SmLimits = collections.namedtuple("SmLimits", "registers shared_memory threads ctas")
SM_LIMITS = {
    "sm_80": SmLimits(65536, 164 * 1024, 2048, 32),
    "sm_90a": SmLimits(65536, 228 * 1024, 2048, 32),
}
RESERVED_SHARED_MEMORY = 1024
REGISTER_STEP = 8  # registers are allocated in steps of 8 a thread (256 a warp)
WARP_THREADS = 32

# One plan compiled: what it is and what ptxas made of it. x_loads holds (how, bytes) pairs, how
# being "ld" (ld.global), "cp.async" or "bulk" (a row copied whole: bytes 0); r_loads the same of
# R (empty in the plain form); y_stores the bytes of each width of st.global.
KernelReport = collections.namedtuple(
    "KernelReport", "arch dtype w_dtype hidden counts plan min_ctas_per_sm expected_bytes "
                    "registers spill_bytes shared_memory ctas_per_sm x_loads y_stores r_loads")


class UsageError(Exception):
    """A problem the user can fix: main() prints it as one sentence and exits 2."""


def load_module(path, name="kernel_under_check"):
    """Import a copy of the sample from its file (its main() does not run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def compile_plan(module, dtype: str, plan, arch: str = "sm_90a", w_dtype: str = "float32"):
    """One plan compiled alone, through the module's compile_launcher hook, its PTX kept."""
    schedule = ((plan, ((None, None),)),)
    return module.compile_launcher(schedule, dtype, w_dtype, module.DEFAULT_EPSILON, arch,
                                   keep_ptx=True)


def launch_shared_memory(compiled) -> int:
    """The dynamic shared memory CuteDSL itself computed for the one launch of a compiled
    single-plan launcher: the constant its host code stores into the launch configuration."""
    ir = str(compiled.ir_module)
    field = re.search(r"(%\d+) = llvm\.getelementptr %\d+\[0, 2\] : \(!llvm\.ptr\) -> !llvm\.ptr, "
                      r"!llvm\.struct<\(array<3 x i32>, array<3 x i32>, i64,", ir)
    value = re.search(rf"llvm\.store (%\d+), {re.escape(field[1])} : i64", ir)[1]
    return int(re.search(rf"{re.escape(value)} = llvm\.mlir\.constant\((\d+) : i64\)", ir)[1])


def load_order(sass: str):
    """(global loads issued after the thread first waits for loaded data, global loads) in
    nvdisasm's listing of one kernel: the first wait is the first instruction that reads a register
    an earlier load writes. With W loaded first, every load should come before it."""
    code = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]+);", sass)
    loaded = set()
    loads = []
    wait = None
    for i, instruction in enumerate(code):
        words = instruction.split()
        if words[0].startswith("@"):  # a predicate guard comes before the opcode
            words = words[1:]
        opcode = words[0]
        operands = " ".join(words[1:])
        if re.match(r"LDG(\.|$)", opcode):  # not LDGSTS (cp.async) or LDGDEPBAR
            loads.append(i)
            first = int(re.match(r"R(\d+)", operands)[1])
            width = {".128": 4, ".64": 2}.get(opcode[opcode.rfind("."):], 1)
            loaded.update(range(first, first + width))
            continue
        # A store has no destination: every register it names is read.
        sources = operands if opcode.startswith("ST") else operands.partition(",")[2]
        if wait is None and loaded & {int(r) for r in re.findall(r"\bR(\d+)\b", sources)}:
            wait = i
    return sum(wait is not None and i > wait for i in loads), len(loads)


def assemble(ptx: str, arch: str, disassemble: bool = False):
    """(ptxas -v's report, nvdisasm's listing or None) of a PTX module; the listing only where asked
    for and nvdisasm is on PATH. RuntimeError with ptxas's own words where it refuses the PTX."""
    nvdisasm = shutil.which("nvdisasm") if disassemble else None
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp, "k.ptx")
        cubin = pathlib.Path(tmp, "k.cubin")
        source.write_text(ptx)
        proc = subprocess.run(["ptxas", f"-arch={arch}", "-v", str(source), "-o", str(cubin)],
                              capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"ptxas failed: {' '.join(proc.stderr.split())[:300]}")
        sass = None
        if nvdisasm:
            sass = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True,
                                  check=True).stdout
    return proc.stderr, sass


def resources(report: str):
    """(registers a thread, spill store bytes, static shared memory) in ptxas -v's report: the most
    any one kernel of the module uses, spills summed over them."""
    registers = [int(n) for n in re.findall(r"Used (\d+) registers", report)]
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
    shared = [int(n) for n in re.findall(r"(\d+) bytes smem", report)]
    return max(registers), sum(spills), max(shared, default=0)


def ptxas_report(ptx: str, arch: str = "sm_90a"):
    """(registers a thread, spill store bytes, late loads, global loads) of a one-kernel PTX: the
    first two as `ptxas -v` reports them, the last two load_order's (None without nvdisasm)."""
    report, sass = assemble(ptx, arch, disassemble=True)
    registers, spills, _ = resources(report)
    late, loads = load_order(sass) if sass else (None, None)
    return registers, spills, late, loads


def ctas_per_sm(cta_threads: int, registers: int, shared_memory: int, arch: str = "sm_90a") -> int:
    """Resident CTAs on an SM of `arch` (SM_LIMITS): a CTA's warps take registers in steps of
    REGISTER_STEP a thread, and its shared memory RESERVED_SHARED_MEMORY more."""
    limits = SM_LIMITS[arch]
    warp_threads = math.ceil(cta_threads / WARP_THREADS) * WARP_THREADS
    cta_registers = math.ceil(registers / REGISTER_STEP) * REGISTER_STEP * warp_threads
    return min(limits.registers // cta_registers,
               limits.shared_memory // (shared_memory + RESERVED_SHARED_MEMORY),
               limits.threads // warp_threads, limits.ctas)


def access_bytes(opcode: str) -> int:
    """Bytes one access moves: ld.global.v4.b32 16, ld.global.v4.b16 8, st.global.b16 2."""
    lanes, bits = re.search(r"(?:\.v(\d+))?\.[bfsu](\d+)$", opcode).groups()
    return int(lanes or 1) * int(bits) // 8


def global_accesses(ptx: str, x_param: int = 0):
    """(X loads, Y stores) of a PTX module as sets: global_access_list's kinds, each once."""
    loads, stores = global_access_list(ptx, x_param)
    return frozenset(loads), frozenset(stores)


def global_access_list(ptx: str, x_param: int = 0):
    """(X loads, stores) of a PTX module, one item per instruction: the (how, bytes) of each global
    load whose address derives from parameter x_param ("ld"; "cp.async" with its copy size; "bulk"
    with 0, a row copied whole), and the bytes of each global store. An address is traced back
    through the registers it is computed from."""
    instructions = []
    for line in ptx.splitlines():
        match = re.match(r"\s*(?:@!?%\w+\s+)?([a-z][\w.:]*)\s+([^;]*);", line)
        if match:
            instructions.append((match[1], [operand.strip() for operand in match[2].split(",")]))
    origins = collections.defaultdict(set)  # register: the parameters its value derives from
    for opcode, operands in instructions:
        param = re.search(r"_param_(\d+)\]", operands[-1])
        if opcode.startswith("ld.param") and param:
            origins[operands[0]].add(int(param[1]))
    # A value loaded from memory starts no address here; stores and copies write no register.
    computes = [(operands[0], {r for operand in operands[1:] for r in re.findall(r"%\w+", operand)})
                for opcode, operands in instructions
                if re.fullmatch(r"%\w+", operands[0])
                and not opcode.startswith(("ld.", "st.", "cp."))]
    changed = True
    while changed:  # a loop feeds registers back into earlier instructions: repeat until settled
        changed = False
        for target, sources in computes:
            derived = set().union(*(origins[r] for r in sources)) - origins[target]
            if derived:
                origins[target] |= derived
                changed = True

    def from_x(address):
        register = re.match(r"\[\s*(%\w+)", address)
        return register is not None and x_param in origins[register[1]]

    x_loads = []
    y_stores = []
    for opcode, operands in instructions:
        global_copy = opcode.startswith("cp.async.") and ".global" in opcode
        if opcode.startswith("ld.global") and from_x(operands[-1]):
            x_loads.append(("ld", access_bytes(opcode)))
        elif global_copy and opcode.startswith("cp.async.bulk.") and from_x(operands[1]):
            x_loads.append(("bulk", 0))
        elif global_copy and from_x(operands[1]):
            x_loads.append(("cp.async", int(operands[2])))
        elif opcode.startswith("st.global"):
            y_stores.append(access_bytes(opcode))
    return x_loads, y_stores


def check_plan(module, arch: str, dtype: str, w_dtype: str, plan, counts) -> KernelReport:
    """One plan compiled through the module's hook, assembled for `arch` and measured."""
    compiled = compile_plan(module, dtype, plan, arch, w_dtype)
    report, _ = assemble(compiled.__ptx__, arch)
    registers, spills, static_shared = resources(report)
    shared = static_shared + launch_shared_memory(compiled)
    x_loads, y_stores = global_accesses(compiled.__ptx__)
    r_loads = frozenset()
    if getattr(plan, "residual", False):
        r_loads, _ = global_accesses(compiled.__ptx__, x_param=1)
    return KernelReport(arch, dtype, w_dtype, plan.hidden, counts, str(plan), plan.min_ctas_per_sm,
                        plan.vec * plan.elem_bytes, registers, spills, shared,
                        ctas_per_sm(plan.cta_threads, registers, shared, arch), x_loads, y_stores,
                        r_loads)


def schedule_of(module, hidden: int, elem_bytes: int, sm90: bool, residual: bool = False):
    """The module's token_schedule, of the residual form where asked (a copy may have none)."""
    if residual:
        return module.token_schedule(hidden, elem_bytes, sm90, residual=True)
    return module.token_schedule(hidden, elem_bytes, sm90)


def module_forms(module) -> list:
    """The forms the copy's token_schedule can plan: plain, and residual where it takes it."""
    forms = [False]
    if "residual" in inspect.signature(module.token_schedule).parameters:
        forms.append(True)
    return forms


def check(module, hidden: int, dtype: str, arch: str = "sm_90a", w_dtype: str = "float32",
          residual: bool = False):
    """[KernelReport] for every plan the module's launcher holds at this hidden size, compiled in
    this process."""
    schedule = schedule_of(module, hidden, module.DTYPES[dtype].bytes, module.is_sm90(arch),
                           residual)
    return [check_plan(module, arch, dtype, w_dtype, plan, counts) for plan, counts in schedule]


def all_sizes(module, elem_bytes: int) -> list:
    """The hidden sizes --all-sizes compiles at elem_bytes an element. In every row-length class:
    its shortest and longest row; the longest of whole vectors, and one vector shorter (a thread of
    the row holds fewer); one vector past the shortest of whole vectors (the same near the class's
    lower end); the longest of half-width vectors and the longest odd row (narrower accesses); and
    its roundest row (the last multiple of the largest power of two it holds a multiple of), where
    whole warps share the vectors evenly."""
    vector = WIDEST_ACCESS // elem_bytes
    sizes = set()
    for fewest, most in module.row_classes(elem_bytes):
        whole = most // vector * vector
        step = 1 << most.bit_length()
        while most // step * step < fewest:
            step //= 2
        candidates = (fewest, most, whole, whole - vector, -(-fewest // vector) * vector + vector,
                      most - (most - vector // 2) % vector, most - (most + 1) % 2,
                      most // step * step)
        chosen = {hidden for hidden in candidates if fewest <= hidden <= most}
        sizes.update(chosen | rarer_kinds(module, elem_bytes, fewest, most, chosen))
    return sorted(sizes)


def plan_kind(plan) -> tuple:
    """What sets a plan's code apart, hidden aside."""
    return (plan.arrival, plan.cluster_ctas > 1, plan.rows_in_sequence > 1, plan.early_weight,
            getattr(plan, "weight_by_vector", False), plan.min_ctas_per_sm > 0,
            plan.vec * plan.elem_bytes == WIDEST_ACCESS, plan.ragged,
            getattr(plan, "residual", False))


def rarer_kinds(module, elem_bytes: int, fewest: int, most: int, chosen: set) -> set:
    """For each kind of plan the file's rule gives somewhere in the class but at none of the
    chosen sizes (a launch bound the rule keeps for one size, W a vector at a time from some
    length on), the first size that gives it. Plans are plain Python: the scan costs seconds."""
    def kinds(hidden):
        return {plan_kind(plan) for sm90 in (False, True) for residual in module_forms(module)
                for plan, _ in schedule_of(module, hidden, elem_bytes, sm90, residual)}

    covered = set().union(*map(kinds, chosen))
    extra = set()
    for hidden in range(fewest, most + 1):
        new = kinds(hidden) - covered
        if new:
            extra.add(hidden)
            covered |= new
    return extra


def bound_met(row: KernelReport) -> bool:
    return row.ctas_per_sm >= row.min_ctas_per_sm


def narrow(row: KernelReport) -> bool:
    """Whether an X or R load or a store is narrower than the plan's vectors, or none was found."""
    loads = row.x_loads | row.r_loads
    widths = [size for how, size in loads if how != "bulk"] + list(row.y_stores)
    residual = row.plan.endswith("_residual")
    found = row.x_loads and row.y_stores and (row.r_loads or not residual)
    return not found or min(widths) < row.expected_bytes


def token_range(counts) -> str:
    """Token ranges as the sample's --plans prints them, but without spaces (one word a column)."""
    return ",".join(f"{(fewer or 0) + 1}-{most}" if most else f"{(fewer or 0) + 1}+"
                    for fewer, most in counts)


HEADER = (f"{'arch':<7} {'x/w dtypes':<17} {'hidden':>6} {'tokens':<17} {'plan':<53} {'regs':>4} "
          f"{'spill':>5} {'smem':>6} {'CTAs/SM':>7} {'bound':<9} {'X loads':<14} {'R loads':<14} "
          f"stores")


def row_line(row: KernelReport) -> str:
    """One plan as a line under HEADER."""
    bound = "-"
    if row.min_ctas_per_sm:
        bound = f"{row.min_ctas_per_sm} {'met' if bound_met(row) else 'MISSED'}"
    def loads(pairs):
        return " ".join(f"{how} {size} B" if size else how for how, size in sorted(pairs))

    r_loads = "-"
    if row.plan.endswith("_residual"):
        r_loads = loads(row.r_loads) or "none"
    y_stores = " ".join(f"{size} B" for size in sorted(row.y_stores))
    return (f"{row.arch:<7} {row.dtype + '/' + row.w_dtype:<17} {row.hidden:>6} "
            f"{token_range(row.counts):<17} {row.plan:<53} {row.registers:>4} {row.spill_bytes:>5} "
            f"{row.shared_memory:>6} {row.ctas_per_sm:>7} {bound:<9} "
            f"{loads(row.x_loads) or 'none':<14} {r_loads:<14} {y_stores or 'none'}")


_WORKER_MODULE = None  # the copy under check, imported once in each worker process


def start_worker(path):
    """A worker's first step: import the copy."""
    global _WORKER_MODULE
    _WORKER_MODULE = load_module(path)


def check_task(task) -> KernelReport:
    """One (arch, dtype, w_dtype, hidden, form, plan index) in a worker, which looks the plan up
    itself (a plan, an instance of the copy's own class, does not travel)."""
    arch, dtype, w_dtype, hidden, residual, index = task
    module = _WORKER_MODULE
    schedule = schedule_of(module, hidden, module.DTYPES[dtype].bytes, module.is_sm90(arch),
                           residual)
    plan, counts = schedule[index]
    return check_plan(module, arch, dtype, w_dtype, plan, counts)


def comma_list(text: str, flag: str) -> list:
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise UsageError(f"{flag} takes a comma-separated list without empty items, got {text!r}")
    return items


def selected_arches(args) -> list:
    """The compile targets --arch names, or UsageError for one not in SM_LIMITS."""
    arches = comma_list(args.arch, "--arch")
    for arch in arches:
        if arch not in SM_LIMITS:
            raise UsageError(f"--arch {arch} is not one whose SM limits check_kernel.py knows "
                             f"({', '.join(SM_LIMITS)})")
    return arches


def open_copy(path: pathlib.Path):
    """The copy imported, with every hook check_kernel.py takes it through, or UsageError."""
    if not path.is_file():
        raise UsageError(f"{path} is not a file")
    try:
        module = load_module(path)
    except Exception as exc:  # whatever stops the user's file from running is theirs to fix
        detail = " ".join(str(exc).split())[:300]
        raise UsageError(f"{path} failed to import ({type(exc).__name__}: {detail})") from None
    missing = [hook for hook in HOOKS if not hasattr(module, hook)]
    if missing:
        raise UsageError(f"{path} does not define {', '.join(missing)}, the hook"
                         f"{'s' if len(missing) > 1 else ''} check_kernel.py takes a copy through "
                         f"({', '.join(HOOKS)})")
    return module


def selected_pairs(module, args) -> list:
    """The (X, W) dtype pairs to compile: DTYPE_PAIRS, narrowed by --pairs and --dtypes."""
    pairs = [tuple(pair) for pair in module.DTYPE_PAIRS]
    if args.pairs:
        wanted = [tuple(item.split("/")) for item in comma_list(args.pairs, "--pairs")]
        for pair in wanted:
            if pair not in pairs:
                raise UsageError(f"--pairs {'/'.join(pair)} is not a pair the copy claims "
                                 f"({', '.join(x + '/' + w for x, w in pairs)})")
        pairs = [pair for pair in pairs if pair in wanted]
    if args.dtypes:
        x_dtypes = sorted({x for x, _ in pairs})
        wanted = comma_list(args.dtypes, "--dtypes")
        for dtype in wanted:
            if dtype not in x_dtypes:
                raise UsageError(f"--dtypes {dtype} is not an X dtype of the pairs selected "
                                 f"({', '.join(x_dtypes)})")
        pairs = [pair for pair in pairs if pair[0] in wanted]
    return pairs


def selected_sizes(module, args, pairs) -> dict:
    """{bytes an X element: the hidden sizes to compile} for these pairs, or UsageError."""
    sizes = {}
    for dtype, _ in pairs:
        elem_bytes = module.DTYPES[dtype].bytes
        if args.all_sizes:
            sizes[elem_bytes] = all_sizes(module, elem_bytes)
            continue
        sizes[elem_bytes] = []
        for item in comma_list(args.hidden or DEFAULT_HIDDEN, "--hidden"):
            if not item.isdigit() or not 1 <= int(item) <= module.MAX_HIDDEN:
                raise UsageError(f"--hidden takes sizes in [1, {module.MAX_HIDDEN}], got {item!r}")
            sizes[elem_bytes].append(int(item))
    return sizes


def selected_forms(module, args) -> list:
    """The forms to compile: every one the copy plans, narrowed by --forms, or UsageError."""
    forms = module_forms(module)
    if not args.forms:
        return forms
    wanted = []
    for name in comma_list(args.forms, "--forms"):
        if FORMS.get(name) not in forms:
            known = ", ".join(name for name, residual in FORMS.items() if residual in forms)
            raise UsageError(f"--forms {name} is not a form the copy plans ({known})")
        wanted.append(FORMS[name])
    return wanted


def plan_tasks(module, args, arches) -> list:
    """Every (arch, dtype, w_dtype, hidden, form, plan index) the arguments select, or
    UsageError."""
    pairs = selected_pairs(module, args)
    sizes = selected_sizes(module, args, pairs)
    forms = selected_forms(module, args)
    tasks = []
    for arch in arches:
        sm90 = module.is_sm90(arch)
        for dtype, w_dtype in pairs:
            elem_bytes = module.DTYPES[dtype].bytes
            for hidden in sizes[elem_bytes]:
                for residual in forms:
                    plans = len(schedule_of(module, hidden, elem_bytes, sm90, residual))
                    tasks.extend((arch, dtype, w_dtype, hidden, residual, index)
                                 for index in range(plans))
    return tasks


def run_tasks(path: pathlib.Path, tasks: list, jobs: int) -> list:
    """Each task's line, printed in order as the pool of `jobs` processes gets through them: a
    KernelReport, or for a plan that failed to compile the line that says so."""
    results = []
    # spawn: a worker imports the copy and CuteDSL afresh rather than fork a compiler's state
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=start_worker,
                                                initargs=(path,)) as pool:
        futures = [pool.submit(check_task, task) for task in tasks]
        print(HEADER, flush=True)
        for task, future in zip(tasks, futures):
            try:
                row = future.result()
            except Exception as exc:  # a plan that fails to compile is a finding: go on
                arch, dtype, w_dtype, hidden, residual, index = task
                form = "residual" if residual else "plain"
                detail = " ".join(str(exc).split())[:300]
                row = (f"FAILED {arch} {dtype}/{w_dtype} hidden {hidden}, {form} form, plan "
                       f"{index} of its schedule: {type(exc).__name__}: {detail}")
            print(row_line(row) if isinstance(row, KernelReport) else row, flush=True)
            results.append(row)
    return results


def summarize(results: list, seconds: float, jobs: int) -> int:
    """The summary line, then the kernels that fail the check again; the exit code."""
    rows = [row for row in results if isinstance(row, KernelReport)]
    failed = [row for row in results if not isinstance(row, KernelReport)]
    spilled = sum(row.spill_bytes > 0 for row in rows)
    missed = sum(not bound_met(row) for row in rows)
    narrower = sum(narrow(row) for row in rows)
    print(f"{len(rows)} kernels compiled, {len(failed)} failed to compile; {spilled} spill, "
          f"{missed} miss their launch bound, {narrower} have loads or stores narrower than "
          f"expected; {seconds:.0f} s wall time on {jobs} jobs")
    problems = [row for row in rows if row.spill_bytes or not bound_met(row)]
    if problems:
        print("Kernels that spill or miss their launch bound:", HEADER, *map(row_line, problems),
              sep="\n")
    if failed:
        print("Kernels that failed to compile:", *failed, sep="\n")
    return EXIT_FOUND if problems or failed else EXIT_CLEAN


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="exit codes: 0 clean, 1 a kernel spills, misses its launch bound or fails to "
               "compile, 2 usage error")
    parser.error = lambda message: parser.exit(EXIT_USAGE, f"error: {message} (see --help)\n")
    parser.add_argument("path", nargs="?", type=pathlib.Path, default=SAMPLE_PATH,
                        help="a copy of rms_norm_plugin_cutedsl.py (default: the sample)")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--all-sizes", action="store_true",
                       help="rows at the edges of every row-length class, ragged and round ones")
    sizes.add_argument("--hidden", help=f"comma-separated hidden sizes (default {DEFAULT_HIDDEN})")
    parser.add_argument("--dtypes", help="comma-separated X dtypes (default: all of DTYPE_PAIRS)")
    parser.add_argument("--pairs", help="comma-separated X/W dtype pairs, e.g. float16/float32 "
                                        "(default: DTYPE_PAIRS)")
    parser.add_argument("--forms", help="comma-separated forms: plain, residual (default: every "
                                        "form the copy's token_schedule plans)")
    parser.add_argument("--arch", default=",".join(SM_LIMITS),
                        help=f"comma-separated compile targets (default {','.join(SM_LIMITS)})")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(),
                        help="compiler processes (default: one a CPU)")
    return parser


def main() -> int:
    start = time.perf_counter()
    args = make_parser().parse_args()
    try:
        if args.jobs < 1:
            raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
        arches = selected_arches(args)
        if shutil.which("ptxas") is None:
            raise UsageError("ptxas is not on PATH (pip install nvidia-cuda-nvcc, or a CUDA "
                             "toolkit)")
        path = args.path.resolve()
        module = open_copy(path)
        tasks = plan_tasks(module, args, arches)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    results = run_tasks(path, tasks, args.jobs)
    return summarize(results, time.perf_counter() - start, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
