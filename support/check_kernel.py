#!/usr/bin/env python3
"""What each plan of the sample's kernel compiles to on sm_90a, without a GPU: registers, spills, shared memory,
CTAs per SM, and how many global loads ptxas issues only after the thread first waits for loaded data.

Point it at your copy of rms_norm_plugin_cutedsl.py after changing the kernel (a second input, more registers
per element): the numbers ROW_PLANS marks R were tuned to RMSNorm's register budget, and a plan that now spills,
or fits fewer CTAs on an SM, needs them re-tuned. It exits 1 if any plan spills.

    python3 support/check_kernel.py                                   # the sample itself
    python3 support/check_kernel.py my_layer_norm.py --hidden 4096,8192 --dtypes float16,bfloat16

It needs ptxas (CUDA toolkit, or PyPI's nvidia-cuda-nvcc) and, for the load order, nvdisasm
(nvidia-cuda-nvdisasm) on PATH. The tests use the same functions (tests/test_kernel_compile.py).
"""

import argparse
import importlib.util
import math
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import cutlass
import cutlass.cute as cute
from cutlass import Int32

SAMPLE_PATH = pathlib.Path(__file__).resolve().parents[1] / "rms_norm_plugin_cutedsl.py"


def load_module(path, name="kernel_under_check"):
    """Import a copy of the sample from its file (its main() does not run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def compile_plan(module, dtype: str, plan, arch: str = "sm_90a", w_dtype: str = "float32"):
    """One plan of the module's kernel, compiled alone with the module's own launch_kernel, PTX kept."""
    @cute.jit
    def one_plan(mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, num_tokens: Int32, stream,
                 plan: cutlass.Constexpr, epsilon: cutlass.Constexpr):
        module.launch_kernel(plan, mX, mW, mY, num_tokens, stream, epsilon)

    fake, tokens = cute.runtime.make_fake_compact_tensor, cute.sym_int32()
    x, y = (fake(getattr(cutlass, module.DTYPES[dtype].cute), (tokens, plan.hidden), stride_order=(1, 0),
                 assumed_align=16) for _ in range(2))
    w = fake(getattr(cutlass, module.DTYPES[w_dtype].cute), (plan.hidden,), assumed_align=16)
    with tempfile.TemporaryDirectory() as dump_dir:
        return cute.compile(one_plan, x, w, y, Int32(1), cute.runtime.make_fake_stream(), plan,
                            module.DEFAULT_EPSILON, options=f"--gpu-arch {arch} --keep-ptx --dump-dir {dump_dir}")


def launch_shared_memory(compiled) -> int:
    """The dynamic shared memory CuteDSL itself computed for the one launch of a compiled single-plan launcher:
    the constant its host code stores into the launch configuration's shared-memory field."""
    ir = str(compiled.ir_module)
    field = re.search(r"(%\d+) = llvm\.getelementptr %\d+\[0, 2\] : \(!llvm\.ptr\) -> !llvm\.ptr, "
                      r"!llvm\.struct<\(array<3 x i32>, array<3 x i32>, i64,", ir)
    value = re.search(rf"llvm\.store (%\d+), {re.escape(field[1])} : i64", ir)[1]
    return int(re.search(rf"{re.escape(value)} = llvm\.mlir\.constant\((\d+) : i64\)", ir)[1])


def load_order(sass: str):
    """(global loads issued after the thread first waits for loaded data, global loads) in nvdisasm's listing of one
    kernel: the first wait is the first instruction that reads a register an earlier load writes. With W loaded first,
    every load should come before it."""
    code = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]+);", sass)
    loaded, loads, wait = set(), [], None
    for i, instruction in enumerate(code):
        words = instruction.split()
        opcode, operands = (words[1], words[2:]) if words[0].startswith("@") else (words[0], words[1:])
        operands = " ".join(operands)
        if re.match(r"LDG(\.|$)", opcode):  # not LDGSTS (cp.async) or LDGDEPBAR
            loads.append(i)
            first = int(re.match(r"R(\d+)", operands)[1])
            loaded.update(range(first, first + {".128": 4, ".64": 2}.get(opcode[opcode.rfind("."):], 1)))
            continue
        sources = operands if opcode.startswith("ST") else operands.partition(",")[2]  # a store has no destination
        if wait is None and loaded & {int(r) for r in re.findall(r"\bR(\d+)\b", sources)}:
            wait = i
    return sum(wait is not None and i > wait for i in loads), len(loads)


def ptxas_report(ptx: str, arch: str = "sm_90a"):
    """(registers per thread, spill store bytes, late loads, global loads) of a one-kernel PTX: the first two as
    `ptxas -v` reports them, the last two load_order's (None where nvdisasm is not on PATH)."""
    nvdisasm = shutil.which("nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp, "k.ptx")
        path.write_text(ptx)
        err = subprocess.run(["ptxas", f"-arch={arch}", "-v", str(path), "-o", str(path.with_suffix(".cubin"))],
                             capture_output=True, text=True, check=True).stderr
        sass = nvdisasm and subprocess.run([nvdisasm, "-c", str(path.with_suffix(".cubin"))], capture_output=True,
                                           text=True, check=True).stdout
    late, loads = load_order(sass) if sass else (None, None)
    return (int(re.search(r"Used (\d+) registers", err)[1]), int(re.search(r"(\d+) bytes spill stores", err)[1]),
            late, loads)


def ctas_per_sm(cta_threads: int, registers: int, shared_memory: int) -> int:
    """Resident CTAs on an sm_90 SM: 64K registers (allocated in steps of 8 per thread), 228 KB of shared memory
    (1 KB of it reserved per CTA), 2048 threads, 32 CTAs."""
    return min(65536 // (math.ceil(registers / 8) * 8 * cta_threads), 228 * 1024 // (shared_memory + 1024),
               2048 // cta_threads, 32)


def check(module, hidden: int, dtype: str, arch: str = "sm_90a"):
    """[(plan, the token counts it serves, registers, spill bytes, shared memory, CTAs per SM, late loads, loads)]
    for every plan the module's launcher holds at this hidden size."""
    rows = []
    for plan, counts in module.token_schedule(hidden, module.DTYPES[dtype].bytes, sm90=module.is_sm90(arch)):
        compiled = compile_plan(module, dtype, plan, arch)
        registers, spills, late, loads = ptxas_report(compiled.__ptx__, arch)
        smem = launch_shared_memory(compiled)
        rows.append((plan, counts, registers, spills, smem, ctas_per_sm(plan.cta_threads, registers, smem), late,
                     loads))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default=SAMPLE_PATH, help="a copy of rms_norm_plugin_cutedsl.py")
    parser.add_argument("--hidden", default="1024,2048,4096,8192,12288,16384", help="comma-separated hidden sizes")
    parser.add_argument("--dtypes", default="float16,bfloat16,float32", help="comma-separated X dtypes")
    args = parser.parse_args()
    if shutil.which("ptxas") is None:
        sys.exit("error: ptxas is not on PATH (pip install nvidia-cuda-nvcc, or a CUDA toolkit)")
    module, spilled = load_module(args.path), 0
    for dtype in args.dtypes.split(","):
        for hidden in map(int, args.hidden.split(",")):
            for plan, counts, registers, spills, smem, ctas, late, loads in check(module, hidden, dtype):
                spans = ", ".join(f"{(fewer or 0) + 1}-{most or ''}" for fewer, most in counts)
                order = f", {late} of {loads} loads after the first wait" if loads is not None else ""
                print(f"{dtype} hidden {hidden} tokens {spans}: {plan} {registers} registers, {spills} bytes spilled, "
                      f"{smem} B shared, {ctas} CTAs of {plan.cta_threads} threads per SM{order}", flush=True)
                spilled += spills > 0
    sys.exit(1 if spilled else 0)


if __name__ == "__main__":
    main()
