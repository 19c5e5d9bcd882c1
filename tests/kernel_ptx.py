"""The kernels of the lesson and of the fused companion compiled without a GPU, each once per test
process: the kernel test files read the same plans' PTX, and one compile costs about a second.

A compile is kept as its PTX and its launch's dynamic shared memory, not as the compiled object
(about 2 MB each).
"""

import collections
import functools
import re

import rms_norm_fused_cutedsl as fused
import rms_norm_plugin_cutedsl as lesson
from support import check_kernel

Build = collections.namedtuple("Build", "ptx shared_memory")
EPSILON = lesson.DEFAULT_EPSILON


@functools.cache
def lesson_build(plan, dtype, arch="sm_90a", w_dtype="float32", epsilon=EPSILON) -> Build:
    """The lesson's launcher for one plan, as compile_rms_norm compiles plan_kernel's plan."""
    compiled = lesson.compile_launcher(plan, dtype, w_dtype, epsilon, arch, keep_ptx=True)
    return Build(compiled.__ptx__, check_kernel.launch_shared_memory(compiled))


@functools.cache
def fused_build(schedule, dtype, arch="sm_90a", w_dtype="float32", epsilon=EPSILON,
                y_scale=None) -> Build:
    """The companion's launcher for a schedule; the shared memory only where it holds one plan
    (launch_shared_memory reads a launcher's one launch)."""
    compiled = fused.compile_launcher(schedule, dtype, w_dtype, epsilon, arch, keep_ptx=True,
                                      y_scale=y_scale)
    shared_memory = None
    if len(schedule) == 1:
        shared_memory = check_kernel.launch_shared_memory(compiled)
    return Build(compiled.__ptx__, shared_memory)


def alone(plan) -> tuple:
    """A schedule of one plan for every token count, as support/check_kernel.py compiles a plan."""
    return ((plan, ((None, None),)),)


def plan_build(plan, dtype, arch="sm_90a", w_dtype="float32", epsilon=EPSILON,
               y_scale=None) -> Build:
    """One plan compiled alone by the file whose kernel it plans: a FusedPlan by the companion,
    a KernelPlan by the lesson (which has no FP8 form)."""
    if isinstance(plan, fused.FusedPlan):
        return fused_build(alone(plan), dtype, arch, w_dtype, epsilon, y_scale)
    assert y_scale is None, "the lesson has no FP8 form"
    return lesson_build(plan, dtype, arch, w_dtype, epsilon)


def launcher_ptx(hidden, dtype, arch="sm_90a", w_dtype="float32", residual=False) -> str:
    """The PTX of the companion's launcher for every token count: every plan of its schedule."""
    elem_bytes = lesson.DTYPES[dtype].bytes
    schedule = fused.token_schedule(hidden, elem_bytes, fused.is_sm90(arch), residual)
    return fused_build(schedule, dtype, arch, w_dtype).ptx


def entries(ptx) -> dict:
    """{kernel name: its PTX text} for each .entry of a module."""
    starts = [m.start() for m in re.finditer(r"^\.visible \.entry ", ptx, flags=re.M)]
    starts.append(len(ptx))
    return {re.match(r"\.visible \.entry (\w+)\(", ptx[a:])[1]: ptx[a:b]
            for a, b in zip(starts, starts[1:])}


def kernel_of(ptx, plan) -> str:
    """The PTX of the one kernel of a module named after `plan` (CuteDSL names it by the tag)."""
    (text,) = (text for name, text in entries(ptx).items() if f"_{plan}_" in name)
    return text


Resources = collections.namedtuple("Resources", "registers frame spill_stores spill_loads")


def ptxas_resources(ptx, arch="sm_90a") -> dict:
    """{kernel name: Resources} as `ptxas -v` reports each kernel of a module."""
    report, _ = check_kernel.assemble(ptx, arch)
    found = re.findall(r"Compiling entry function '(\w+)'.*?\n(.*?Used \d+ registers[^\n]*)",
                       report, flags=re.S)
    resources = {}
    for name, text in found:
        frame, stores, loads = map(int, re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
            text).groups())
        registers = int(re.search(r"Used (\d+) registers", text)[1])
        resources[name] = Resources(registers, frame, stores, loads)
    return resources
