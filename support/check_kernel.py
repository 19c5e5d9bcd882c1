#!/usr/bin/env python3
"""Prove a copy of the sample's kernel at every hidden size without a GPU: its rule, then its code.

Point it at your copy of rms_norm_plugin_cutedsl.py after changing the kernel (a bias, a gate, a
second reduction) and the rule's inputs (ROW_INPUTS, COLUMN_INPUTS, REDUCTIONS, FIT_STEPS):

    python3 support/check_kernel.py                           # the lesson, every size
    python3 support/check_kernel.py layer_norm_cutedsl.py     # a copy, every size
    python3 support/check_kernel.py rms_norm_fused_cutedsl.py --forms plain,residual
    python3 support/check_kernel.py my_copy.py --hidden 4096,8192 --pairs float16/float32

It proves two things.

1. The rule, at every hidden size 1 ... MAX_HIDDEN, for every target and form: the file's
   plan_kernel(hidden, elem_bytes) (a lesson or a copy of it), or its token_schedule(hidden,
   elem_bytes, sm90[, residual][, fp8]) (the fused companion) where it has one. A size the rule
   refuses (it raises, as fit_registers' PlanError does after its last step) is a finding, reported
   as one sentence naming the sizes; so is a plan whose registers_needed() is over its
   register_ceiling(). The rule takes X's element size and the target's family (sm_90+ or not), not
   W's dtype, so evaluating each X element size covers every dtype pair.
2. The code: every distinct plan the rule gave, compiled through the file's own compile_launcher
   and assembled by ptxas for each target. Plans are distinct by every dataclass field of the file's
   own plan class but hidden (a field a copy adds, such as a gate loaded a vector at a time, makes
   new ones) and by whether they are ragged; each is compiled at the longest row that gives it. For
   each it prints the target, the X/W dtypes, hidden, the token counts the plan serves and its tag,
   then what ptxas makes of it: registers, spilled bytes, shared memory, CTAs per SM, whether the
   plan's launch bound is met (a plan without one must fit one CTA), and the widths of its global X
   (and R) loads and of its stores, against its vector width. A summary closes the listing.

Dtype pairs. Every pair of the file's DTYPE_PAIRS is compiled: a plan's registers move with W's
dtype and X's, not only with X's element size. On the lesson's 443 distinct plans, all nine pairs
on both targets (4,092 kernels), a 16-bit W took up to 12 registers more than an fp32 W (it is
widened where it is used) and bfloat16 X up to 8 more or fewer than float16 X; none spilled, but
the widest W is no upper bound. --pairs float16/float32,float32/float32 (one X dtype of each
element size) is the quick pass CI runs. Targets: sm_80 and sm_90a, the two plan families. A form
compiles on the targets that run it: the FP8 forms need sm_89+, so by default they compile for
sm_90a only; --arch sm_89 compiles them on the sm_80 family's plans under sm_89's SM limits (its
100 KB of shared memory misses a mid plan's launch bound of 2 CTAs that sm_80's 164 KB holds, as
the companion accepts).

--hidden checks the rule and compiles every plan at the sizes given instead; --dtypes, --pairs,
--arch and --forms (plain, residual, fp8, residual-fp8: those the file's token_schedule takes) pick
subsets. The rule's sizes and the plans compile in --jobs processes, each importing the file.
Measured on 2 idle cores, --jobs 2: the lesson 6 minutes (the quick pass 1), each worked example
COPYCOST, the fused companion's four forms FUSEDCOST.

Exit codes: 0 the rule fits every size and no kernel spills, misses its launch bound or fails to
compile; 1 a finding; 2 a usage error (the file missing or without the hooks, ptxas not on PATH, an
unknown dtype, target or form), said in one sentence. ptxas comes with a CUDA toolkit or PyPI's
nvidia-cuda-nvcc; ptxas_report's load order, which benchmarks/experiments/time_plans.py prints, also
needs nvdisasm (nvidia-cuda-nvdisasm).
"""

import argparse
import collections
import concurrent.futures
import dataclasses
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
HOOKS = ("compile_launcher", "DTYPE_PAIRS", "DTYPES", "DEFAULT_EPSILON", "MAX_HIDDEN")
# The rule: a lesson's plan_kernel, or a companion's token_schedule and the targets' families.
RULE_HOOKS = (("plan_kernel",), ("token_schedule", "is_sm90"))
# A form: (token_schedule's residual, its fp8). The FP8 forms store Y in one byte an element.
FORMS = {"plain": (False, False), "residual": (True, False), "fp8": (False, True),
         "residual-fp8": (True, True)}
FP8_Y_SCALE = 1.5  # any normal value: the FP8 forms fold 1 / y_scale into one factor of the row
EXIT_CLEAN = 0
EXIT_FOUND = 1
EXIT_USAGE = 2

# What one SM holds: registers, shared memory (of which RESERVED_SHARED_MEMORY per CTA is the
# system's), threads and CTAs; and whether the target converts to FP8 (the FP8 forms run there).
SmLimits = collections.namedtuple("SmLimits", "registers shared_memory threads ctas fp8")
SM_LIMITS = {
    "sm_80": SmLimits(65536, 164 * 1024, 2048, 32, False),
    "sm_89": SmLimits(65536, 100 * 1024, 1536, 24, True),
    "sm_90a": SmLimits(65536, 228 * 1024, 2048, 32, True),
}
DEFAULT_ARCHES = ("sm_80", "sm_90a")
RESERVED_SHARED_MEMORY = 1024
REGISTER_STEP = 8  # registers are allocated in steps of 8 a thread (256 a warp)
WARP_THREADS = 32

# One plan compiled: what it is and what ptxas made of it. x_loads holds (how, bytes) pairs, how
# being "ld" (ld.global), "cp.async" or "bulk" (a row copied whole: bytes 0); r_loads the same of
# R (empty but in the residual forms); y_stores the bytes of each width of st.global. load_bytes
# and store_bytes: the widths the plan's vectors give X's loads and Y's stores.
KernelReport = collections.namedtuple(
    "KernelReport", "arch form dtype w_dtype hidden counts plan min_ctas_per_sm load_bytes "
                    "store_bytes registers spill_bytes shared_memory ctas_per_sm x_loads y_stores "
                    "r_loads")
# The rule at the sizes of one X element size, plan family and form: how many sizes and plans,
# {kind: (hidden, index in its schedule, token counts)} of the plans to compile, the sizes it
# refused ((hidden, why)) and the plans over their own register ceiling ((hidden, tag, needed,
# ceiling)).
RuleReport = collections.namedtuple("RuleReport",
                                    "elem_bytes family form sizes count plans refused over")


class UsageError(Exception):
    """A problem the user can fix: main() prints it as one sentence and exits 2."""


def load_module(path, name="kernel_under_check"):
    """Import a copy of the sample from its file (its main() does not run); the file's folder
    goes on sys.path, so a copy of the companion imports the lesson beside it."""
    folder = str(pathlib.Path(path).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def hook(module, name: str):
    """The file's hook `name`, or, in a companion that extends the lesson by import (the module
    it names `lesson`), the lesson's; AttributeError where neither has it."""
    if hasattr(module, name):
        return getattr(module, name)
    return getattr(getattr(module, "lesson", None), name)


def by_schedule(module) -> bool:
    """Whether the module's compile_launcher takes a schedule of plans (the companion's) rather
    than one plan (the lesson's)."""
    return next(iter(inspect.signature(module.compile_launcher).parameters)) == "schedule"


def compile_plan(module, dtype: str, plan, arch: str = "sm_90a", w_dtype: str = "float32",
                 y_scale=None):
    """One plan compiled alone, through the module's compile_launcher hook, its PTX kept; y_scale:
    the FP8 form."""
    fp8 = {} if y_scale is None else {"y_scale": y_scale}
    if by_schedule(module):
        plan = ((plan, ((None, None),)),)
    return module.compile_launcher(plan, dtype, w_dtype, hook(module, "DEFAULT_EPSILON"), arch,
                                   keep_ptx=True, **fp8)


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


def check_plan(module, arch: str, dtype: str, w_dtype: str, plan, counts,
               form: str = "plain") -> KernelReport:
    """One plan of a form compiled through the module's hook, assembled for `arch` and measured."""
    residual, fp8 = FORMS[form]
    compiled = compile_plan(module, dtype, plan, arch, w_dtype, FP8_Y_SCALE if fp8 else None)
    report, _ = assemble(compiled.__ptx__, arch)
    registers, spills, static_shared = resources(report)
    shared = static_shared + launch_shared_memory(compiled)
    x_loads, y_stores = global_accesses(compiled.__ptx__)
    r_loads = frozenset()
    if residual:
        r_loads, _ = global_accesses(compiled.__ptx__, x_param=1)
    load_bytes = plan.vec * plan.elem_bytes
    return KernelReport(arch, form, dtype, w_dtype, plan.hidden, counts, str(plan),
                        getattr(plan, "min_ctas_per_sm", 0), load_bytes,
                        plan.vec if fp8 else load_bytes, registers, spills, shared,
                        ctas_per_sm(plan.cta_threads, registers, shared, arch), x_loads, y_stores,
                        r_loads)


def schedule_of(module, hidden: int, elem_bytes: int, family, form: str = "plain"):
    """((plan, token counts), ...) the module's rule gives: its token_schedule for the family
    (sm90 or not) and form, or its one plan_kernel plan for every count (family None)."""
    if family is None:
        return ((module.plan_kernel(hidden, elem_bytes), ((None, None),)),)
    residual, fp8 = FORMS[form]
    form_args = {}
    if residual:
        form_args["residual"] = True
    if fp8:
        form_args["fp8"] = True
    return module.token_schedule(hidden, elem_bytes, family, **form_args)


def family_of(module, arch: str):
    """The plan family a target runs: is_sm90(arch) where the rule has families, else None."""
    return module.is_sm90(arch) if hasattr(module, "token_schedule") else None


def module_forms(module) -> list:
    """The forms the module's rule plans, in FORMS' order: plain, and those its token_schedule
    takes (the FP8 ones only where compile_launcher takes a y_scale)."""
    if not hasattr(module, "token_schedule"):
        return ["plain"]
    takes = set(inspect.signature(module.token_schedule).parameters)
    if "y_scale" not in inspect.signature(module.compile_launcher).parameters:
        takes.discard("fp8")
    return [name for name, (residual, fp8) in FORMS.items()
            if (not residual or "residual" in takes) and (not fp8 or "fp8" in takes)]


def plan_kind(plan) -> tuple:
    """What sets a plan's code apart, hidden aside: every field of its own dataclass (a copy's
    included) and whether it is ragged."""
    fields = tuple((field.name, getattr(plan, field.name)) for field in dataclasses.fields(plan)
                   if field.name != "hidden")
    return (type(plan).__qualname__, *fields, ("ragged", plan.ragged))


def check_rule(module, elem_bytes: int, family, form: str, sizes, distinct: bool) -> RuleReport:
    """The rule at every size of `sizes`: the plans to compile (distinct: one of each kind, at the
    longest row that gives it; else every plan at every size), the refusals and plans over their
    ceiling. A plan is plain Python: a size costs microseconds, a schedule's several plans more."""
    plans = {}
    count = 0
    refused = []
    over = []
    for hidden in sizes:
        try:
            schedule = schedule_of(module, hidden, elem_bytes, family, form)
        except Exception as exc:  # the rule's refusal (a PlanError) or its bug: both findings
            refused.append((hidden, f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
            continue
        for index, (plan, counts) in enumerate(schedule):
            count += 1
            needed = plan.registers_needed()
            ceiling = plan.register_ceiling()
            if needed > ceiling:
                over.append((hidden, str(plan), needed, ceiling))
            key = plan_kind(plan) if distinct else (hidden, index)
            plans[key] = (hidden, index, counts)  # sizes ascend: the longest row stays
    return RuleReport(elem_bytes, family, form, len(sizes), count, plans, refused, over)


def token_range(counts) -> str:
    """Token ranges as the sample's --plans prints them, but without spaces (one word a column)."""
    return ",".join(f"{(fewer or 0) + 1}-{most}" if most else f"{(fewer or 0) + 1}+"
                    for fewer, most in counts)


def counted(number: int, noun: str) -> str:
    """"no findings", "1 finding", "2 findings"."""
    return f"{number or 'no'} {noun}{'s' * (number != 1)}"


def size_range(sizes) -> str:
    """Sizes in words: "1 size (100)", "12 sizes, 100-111", "1024 sizes from 28676 to 32768"."""
    if len(sizes) == 1:
        return f"1 size ({sizes[0]})"
    joined = ", " if sizes[-1] - sizes[0] + 1 == len(sizes) else " from "
    return f"{len(sizes)} sizes{joined}{sizes[0]}{'-' if joined == ', ' else ' to '}{sizes[-1]}"


def rule_findings(rule: RuleReport, dtypes: list, targets: list) -> list:
    """One sentence for the sizes the rule refuses, one for the plans over their ceiling."""
    where = f"{'/'.join(dtypes)} X, {rule.form} form, {', '.join(targets)}"
    lines = []
    if rule.refused:
        sizes = [hidden for hidden, _ in rule.refused]
        lines.append(f"the rule refuses {size_range(sizes)} ({where}): at {sizes[0]}, "
                     f"{rule.refused[0][1]}")
    if rule.over:
        hidden, tag, needed, ceiling = rule.over[0]
        sizes = sorted({size for size, *_ in rule.over})
        lines.append(f"the rule gives plans over their own register ceiling at {size_range(sizes)} "
                     f"({where}): at {hidden}, {tag} needs {needed} of {ceiling}")
    return lines


def bound_met(row: KernelReport) -> bool:
    """Whether an SM holds the CTAs the plan's launch bound asks for (one, without a bound)."""
    return row.ctas_per_sm >= max(1, row.min_ctas_per_sm)


def narrow(row: KernelReport) -> bool:
    """Whether an X or R load or a store is narrower than the plan's vectors, or none was found."""
    loads = [size for how, size in row.x_loads | row.r_loads if how != "bulk"]
    found = row.x_loads and row.y_stores and (row.r_loads or not FORMS[row.form][0])
    if not found:
        return True
    narrow_loads = min(loads, default=row.load_bytes) < row.load_bytes
    return narrow_loads or min(row.y_stores) < row.store_bytes


HEADER = (f"{'arch':<7} {'x/w dtypes':<17} {'hidden':>6} {'tokens':<17} {'plan':<53} {'regs':>4} "
          f"{'spill':>5} {'smem':>6} {'CTAs/SM':>7} {'bound':<9} {'X loads':<14} {'R loads':<14} "
          f"stores")


def row_line(row: KernelReport) -> str:
    """One plan as a line under HEADER."""
    bound = "-"
    if row.min_ctas_per_sm or not bound_met(row):
        bound = f"{max(1, row.min_ctas_per_sm)} {'met' if bound_met(row) else 'MISSED'}"

    def loads(pairs):
        return " ".join(f"{how} {size} B" if size else how for how, size in sorted(pairs))

    r_loads = "-"
    if FORMS[row.form][0]:
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


def rule_task(task) -> RuleReport:
    """check_rule in a worker for (X element size, family, form, sizes, distinct)."""
    return check_rule(_WORKER_MODULE, *task)


def compile_task(task) -> KernelReport:
    """One (arch, form, dtype, w_dtype, hidden, plan index) in a worker, which looks the plan up
    itself (a plan, an instance of the copy's own class, does not travel)."""
    arch, form, dtype, w_dtype, hidden, index = task
    module = _WORKER_MODULE
    elem_bytes = hook(module, "DTYPES")[dtype].bytes
    schedule = schedule_of(module, hidden, elem_bytes, family_of(module, arch), form)
    plan, counts = schedule[index]
    return check_plan(module, arch, dtype, w_dtype, plan, counts, form)


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
    missing = [name for name in HOOKS if not hasattr(module, name)
               and not hasattr(getattr(module, "lesson", None), name)]
    rules = [names for names in RULE_HOOKS if all(hasattr(module, name) for name in names)]
    if not rules:
        missing.append(" or ".join(" and ".join(names) for names in RULE_HOOKS))
    if missing:
        raise UsageError(f"{path} does not define {', '.join(missing)}, the hook"
                         f"{'s' if len(missing) > 1 else ''} check_kernel.py takes a copy through "
                         f"({', '.join(HOOKS)}; plan_kernel, or token_schedule and is_sm90)")
    return module


def selected_pairs(module, args) -> list:
    """The (X, W) dtype pairs to compile: DTYPE_PAIRS, narrowed by --pairs and --dtypes."""
    pairs = [tuple(pair) for pair in hook(module, "DTYPE_PAIRS")]
    if args.pairs:
        wanted = [tuple(item.split("/")) for item in comma_list(args.pairs, "--pairs")]
        for pair in wanted:
            if pair not in pairs:
                raise UsageError(f"--pairs {'/'.join(pair)} is not a pair the copy claims "
                                 f"({', '.join(x + '/' + w for x, w in pairs)})")
        pairs = [pair for pair in pairs if pair in wanted]
    if args.dtypes:
        x_dtypes = list(dict.fromkeys(x for x, _ in pairs))
        wanted = comma_list(args.dtypes, "--dtypes")
        for dtype in wanted:
            if dtype not in x_dtypes:
                raise UsageError(f"--dtypes {dtype} is not an X dtype of the pairs selected "
                                 f"({', '.join(x_dtypes)})")
        pairs = [pair for pair in pairs if pair[0] in wanted]
    return pairs


def selected_sizes(module, args) -> list:
    """The hidden sizes: --hidden's, or every one up to MAX_HIDDEN; UsageError for one outside."""
    most = hook(module, "MAX_HIDDEN")
    if not args.hidden:
        return list(range(1, most + 1))
    sizes = []
    for item in comma_list(args.hidden, "--hidden"):
        if not item.isdigit() or not 1 <= int(item) <= most:
            raise UsageError(f"--hidden takes sizes in [1, {most}], got {item!r}")
        sizes.append(int(item))
    return sorted(set(sizes))


def selected_forms(module, args) -> list:
    """The forms to check: every one the copy plans, narrowed by --forms, or UsageError."""
    forms = module_forms(module)
    if not args.forms:
        return forms
    wanted = comma_list(args.forms, "--forms")
    for name in wanted:
        if name not in forms:
            raise UsageError(f"--forms {name} is not a form the copy plans ({', '.join(forms)})")
    return [name for name in forms if name in wanted]


def runs(arch: str, form: str) -> bool:
    """Whether a target runs a form: the FP8 ones need FP8 conversions."""
    return SM_LIMITS[arch].fp8 or not FORMS[form][1]


Check = collections.namedtuple("Check", "pairs sizes forms arches")


def plan_check(module, args) -> Check:
    """What the arguments select, or UsageError (checked before any work)."""
    arches = selected_arches(args)
    pairs = selected_pairs(module, args)
    sizes = selected_sizes(module, args)
    forms = selected_forms(module, args)
    if not any(runs(arch, form) for arch in arches for form in forms):
        raise UsageError(f"no target of --arch {args.arch} runs the forms selected "
                         f"({', '.join(forms)}): the FP8 forms need sm_89 or sm_90a")
    return Check(pairs, sizes, forms, arches)


def rule_groups(module, check: Check) -> dict:
    """{(X element size, family, form): the targets it serves}: one evaluation of the rule each."""
    groups = {}
    elem_sizes = sorted({hook(module, "DTYPES")[x].bytes for x, _ in check.pairs})
    for arch in check.arches:
        for form in check.forms:
            if runs(arch, form):
                for elem_bytes in elem_sizes:
                    key = (elem_bytes, family_of(module, arch), form)
                    groups.setdefault(key, []).append(arch)
    return groups


def compile_tasks(module, check: Check, rules: dict) -> list:
    """Every (arch, form, dtype, w_dtype, hidden, plan index) to compile, from the rule's plans."""
    tasks = []
    for arch in check.arches:
        for form in check.forms:
            if not runs(arch, form):
                continue
            for dtype, w_dtype in check.pairs:
                key = (hook(module, "DTYPES")[dtype].bytes, family_of(module, arch), form)
                for hidden, index, _ in sorted(rules[key].plans.values()):
                    tasks.append((arch, form, dtype, w_dtype, hidden, index))
    return tasks


def run_check(path: pathlib.Path, module, check: Check, jobs: int, distinct: bool):
    """(rule findings, compile results): the rule in the pool of `jobs` processes, then every plan
    it gave, each line printed in order as the pool gets through them: a KernelReport, or for a
    plan that failed to compile the line that says so."""
    groups = rule_groups(module, check)
    results = []
    # spawn: a worker imports the copy and CuteDSL afresh rather than fork a compiler's state
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=start_worker,
                                                initargs=(path,)) as pool:
        rule_list = list(pool.map(rule_task, [(*key, check.sizes, distinct) for key in groups]))
        rules = dict(zip(groups, rule_list))
        findings = []
        for key, rule in rules.items():
            dtypes = [x for x, _ in check.pairs if hook(module, "DTYPES")[x].bytes == key[0]]
            findings.extend(rule_findings(rule, dtypes, groups[key]))
        plans = sum(rule.count for rule in rules.values())
        kinds = sum(len(rule.plans) for rule in rules.values())
        what = "distinct" if distinct else "of them"
        print(f"The rule at {size_range(check.sizes)}: {counted(plans, 'plan')}, {kinds} {what} "
              f"to compile; {counted(len(findings), 'finding')}", flush=True)
        if findings:
            print(*findings, sep="\n", flush=True)
        tasks = compile_tasks(module, check, rules)
        futures = [pool.submit(compile_task, task) for task in tasks]
        print(HEADER, flush=True)
        for task, future in zip(tasks, futures):
            try:
                row = future.result()
            except Exception as exc:  # a plan that fails to compile is a finding: go on
                arch, form, dtype, w_dtype, hidden, index = task
                detail = " ".join(str(exc).split())[:300]
                row = (f"FAILED {arch} {dtype}/{w_dtype} hidden {hidden}, {form} form, plan "
                       f"{index} of its schedule: {type(exc).__name__}: {detail}")
            print(row_line(row) if isinstance(row, KernelReport) else row, flush=True)
            results.append(row)
    return findings, results


def summarize(findings: list, results: list, seconds: float, jobs: int) -> int:
    """The summary line, then the findings again; the exit code."""
    rows = [row for row in results if isinstance(row, KernelReport)]
    failed = [row for row in results if not isinstance(row, KernelReport)]
    spilled = sum(row.spill_bytes > 0 for row in rows)
    missed = sum(not bound_met(row) for row in rows)
    narrower = sum(narrow(row) for row in rows)
    print(f"{len(rows)} kernels compiled, {len(failed)} failed to compile; {spilled} spill, "
          f"{missed} miss their launch bound, {narrower} have loads or stores narrower than "
          f"expected; the rule: {counted(len(findings), 'finding')}; "
          f"{seconds:.0f} s wall time on {jobs} jobs")
    problems = [row for row in rows if row.spill_bytes or not bound_met(row)]
    if problems:
        print("Kernels that spill or miss their launch bound:", HEADER, *map(row_line, problems),
              sep="\n")
    if failed:
        print("Kernels that failed to compile:", *failed, sep="\n")
    if findings:
        print("What the rule does not fit:", *findings, sep="\n")
    return EXIT_FOUND if problems or failed or findings else EXIT_CLEAN


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="exit codes: 0 clean, 1 a size the rule refuses or a kernel that spills, misses "
               "its launch bound or fails to compile, 2 usage error")
    parser.error = lambda message: parser.exit(EXIT_USAGE, f"error: {message} (see --help)\n")
    parser.add_argument("path", nargs="?", type=pathlib.Path, default=SAMPLE_PATH,
                        help="a copy of rms_norm_plugin_cutedsl.py (default: the sample)")
    parser.add_argument("--hidden", help="comma-separated hidden sizes: the rule and every plan "
                                         "at these alone (default: every size, distinct plans)")
    parser.add_argument("--dtypes", help="comma-separated X dtypes (default: all of DTYPE_PAIRS)")
    parser.add_argument("--pairs", help="comma-separated X/W dtype pairs, e.g. float16/float32 "
                                        "(default: DTYPE_PAIRS)")
    parser.add_argument("--forms", help="comma-separated forms of plain, residual, fp8, "
                                        "residual-fp8 (default: every form the file plans)")
    parser.add_argument("--arch", default=",".join(DEFAULT_ARCHES),
                        help=f"comma-separated compile targets of {', '.join(SM_LIMITS)} "
                             f"(default {','.join(DEFAULT_ARCHES)})")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(),
                        help="compiler processes (default: one a CPU)")
    return parser


def main() -> int:
    start = time.perf_counter()
    args = make_parser().parse_args()
    try:
        if args.jobs < 1:
            raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
        selected_arches(args)
        if shutil.which("ptxas") is None:
            raise UsageError("ptxas is not on PATH (pip install nvidia-cuda-nvcc, or a CUDA "
                             "toolkit)")
        path = args.path.resolve()
        module = open_copy(path)
        check = plan_check(module, args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    findings, results = run_check(path, module, check, args.jobs, distinct=not args.hidden)
    return summarize(findings, results, time.perf_counter() - start, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
