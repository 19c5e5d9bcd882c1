#!/usr/bin/env python3
"""Compare this checkout's kernel with another checkout's as compiled code, without a GPU.

For each hidden size, dtype and target, both samples compile their kernel
(compile_rms_norm(..., arch=..., keep_ptx=True)); the PTX is compared with the
kernel's symbol renamed (the name carries the compile-time arguments, which a
refactor may spell differently). With --sass, ptxas assembles each PTX and
nvdisasm (e.g. from PyPI's nvidia-cuda-nvdisasm) disassembles it; the SASS is
compared too.

    python3 benchmarks/experiments/compare_ptx.py /tmp/base [--sass] [--arch sm_90a sm_80]
"""

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from compare_checkouts import ROOT, load  # noqa: E402

HIDDEN = [1, 7, 100, 256, 1000, 1024, 2048, 2056, 2560, 4096, 4100, 5120, 6144, 6152, 8192, 12288, 16384, 32768]


def sass_of(ptx: str, arch: str, nvdisasm: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = pathlib.Path(tmp, "k.ptx"), pathlib.Path(tmp, "k.cubin")
        src.write_text(ptx)
        subprocess.run(["ptxas", f"-arch={arch}", str(src), "-o", str(obj)], check=True)
        return subprocess.run([nvdisasm, "-c", str(obj)], check=True, capture_output=True, text=True).stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=pathlib.Path, help="root of the other checkout")
    parser.add_argument("--arch", nargs="+", default=["sm_90a"])
    parser.add_argument("--sass", action="store_true", help="also compare ptxas + nvdisasm output")
    args = parser.parse_args()
    nvdisasm = shutil.which("nvdisasm")
    if args.sass and (shutil.which("ptxas") is None or nvdisasm is None):
        sys.exit("error: --sass needs ptxas and nvdisasm on PATH")
    samples = {"base": load(args.base.resolve(), "sample_base"), "new": load(ROOT, "sample_new")}
    differ = 0
    cases = [(a, d, h, 1e-5) for a in args.arch for d in ("float16", "bfloat16") for h in HIDDEN]
    cases += [(a, d, h, 1e-40) for a in args.arch for d in ("float16", "bfloat16") for h in (1024, 4096)]
    for arch, dtype, hidden, epsilon in cases:
        ptx = {name: s.compile_rms_norm(dtype, hidden, epsilon, arch=arch, keep_ptx=True).__ptx__
               for name, s in samples.items()}
        texts = {name: re.sub(r"\w*rms_norm_kernel\w*", "KERNEL", p) for name, p in ptx.items()}
        same = texts["base"] == texts["new"]
        if same and args.sass:
            sass = {name: re.sub(r"\w*rms_norm_kernel\w*", "KERNEL", sass_of(p, arch, nvdisasm))
                    for name, p in ptx.items()}
            same = sass["base"] == sass["new"]
        differ += not same
        verdict = "same" if same else "DIFFERENT"
        print(f"{arch} {dtype:8s} hidden {hidden:5d} epsilon {epsilon:g}: {verdict}", flush=True)
    print(f"{len(cases) - differ} of {len(cases)} identical" + (" (PTX and SASS)" if args.sass else " (PTX)"))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
