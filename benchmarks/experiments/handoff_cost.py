#!/usr/bin/env python3
"""Where the plugin's first enqueue spends its host time, on one GPU without TensorRT.

Times each hop of the handoff (cupy UnownedMemory, cupy ndarray, torch.as_tensor,
from_dlpack, CuteDSL's memref descriptor) on addresses it has not seen before,
the first and second call of the compiled kernel with those new tensors, and
the plugin's first and second enqueue (fresh plugin, fresh buffers) driven
through the labelled TensorRT stand-in of support/trt_standin.py. 128 x 1024 fp16.

bench_rms_norm.py times a new context's first enqueue right after thousands of
steady enqueues, and gets about 3x what the back-to-back loop here gets. The
last part repeats the hops and the first enqueue in that setting ("cold"), with
the garbage collector off, on buffers already wrapped by another plugin, and
after a pass over 256 MB of host memory instead of the enqueues (which evicts
the CPU caches without touching CUDA), to show where the difference comes from.

    python3 benchmarks/experiments/handoff_cost.py
"""

import gc
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_rms_norm import standin_plugin_args  # noqa: E402
from support import trt_standin  # noqa: E402
from support.sample_loader import load_fused, load_sample  # noqa: E402

TOKENS, HIDDEN, EPS = 128, 1024, 1e-5


def us(t0):
    return (time.perf_counter() - t0) * 1e6


def main():
    s = load_sample(trt_standin, "handoff_cost_lesson")
    fused = load_fused(trt_standin, "handoff_cost_fused", s)
    from_dlpack = s.from_dlpack
    buffers = [(torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.float16),
                torch.rand(HIDDEN, device="cuda"),
                torch.empty(TOKENS, HIDDEN, device="cuda", dtype=torch.float16))
               for _ in range(150)]
    stream = torch.cuda.Stream()
    cu_stream = s.cuda.CUstream(stream.cuda_stream)
    kernel = fused.compile_rms_norm("float16", HIDDEN, EPS)

    x, w, y = buffers[0]
    prepared = [from_dlpack(t, assumed_align=16) for t in (x, w, y)]
    for _ in range(300):
        kernel(*prepared, TOKENS, cu_stream)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3000):
        kernel(*prepared, TOKENS, cu_stream)
    bare = us(t0) / 3000
    torch.cuda.synchronize()

    names = ("UnownedMemory (new address)", "cupy ndarray", "torch.as_tensor", "from_dlpack",
             "memref descriptor", "first kernel call with the 3 new tensors", "second kernel call")
    hops = {k: [] for k in names}

    def time_hops(x, w, y, hops):
        t0 = time.perf_counter()
        memory = cp.cuda.UnownedMemory(x.data_ptr(), x.nbytes, owner=None, device_id=0)
        hops["UnownedMemory (new address)"].append(us(t0))
        t0 = time.perf_counter()
        array = cp.ndarray((TOKENS, HIDDEN), dtype=np.float16,
                           memptr=cp.cuda.MemoryPointer(memory, 0))
        hops["cupy ndarray"].append(us(t0))
        t0 = time.perf_counter()
        view = torch.as_tensor(array, device="cuda:0")
        hops["torch.as_tensor"].append(us(t0))
        t0 = time.perf_counter()
        cx = from_dlpack(view, assumed_align=16)
        hops["from_dlpack"].append(us(t0))
        t0 = time.perf_counter()
        cx.__c_pointers__()
        hops["memref descriptor"].append(us(t0))
        cw = s.cute_tensor_from_pointer(w.data_ptr(), (HIDDEN,), "float32", 0)
        cy = s.cute_tensor_from_pointer(y.data_ptr(), (TOKENS, HIDDEN), "float16", 0)
        t0 = time.perf_counter()
        kernel(cx, cw, cy, TOKENS, cu_stream)
        hops["first kernel call with the 3 new tensors"].append(us(t0))
        t0 = time.perf_counter()
        kernel(cx, cw, cy, TOKENS, cu_stream)
        hops["second kernel call"].append(us(t0))

    for x, w, y in buffers[1:31]:
        time_hops(x, w, y, hops)
    torch.cuda.synchronize()

    fields, in_desc, out_desc = standin_plugin_args(TOKENS, HIDDEN, EPS)
    creator = fused.FusedRmsNormPluginCreator()

    def new_plugin():
        plugin = creator.create_plugin("rms_norm", fields, trt_standin.TensorRTPhase.RUNTIME)
        plugin = plugin.attach_to_context(None)
        plugin.on_shape_change(in_desc, out_desc)
        return plugin

    def enqueue(plugin, x, w, y):
        plugin.enqueue(in_desc, out_desc, [x.data_ptr(), w.data_ptr()], [y.data_ptr()], 0,
                       stream.cuda_stream)

    first, second = [], []
    for x, w, y in buffers[31:60]:
        plugin = new_plugin()
        torch.cuda.synchronize()
        for out in (first, second):
            t0 = time.perf_counter()
            enqueue(plugin, x, w, y)
            out.append(us(t0))
        torch.cuda.synchronize()

    busy = new_plugin()
    host_memory = np.ones(256 << 20, dtype=np.uint8)

    def run_steady():
        for _ in range(3000):
            enqueue(busy, *buffers[0])
        torch.cuda.synchronize()

    def walk_host_memory():
        host_memory.sum()
        torch.cuda.synchronize()

    fresh = iter(buffers[60:])
    cold_hops = {k: [] for k in names}
    cold = {}
    for _ in range(15):
        run_steady()
        time_hops(*next(fresh), cold_hops)
    for label, before, gc_off, same_buffers in (
            ("after 3000 steady enqueues", run_steady, False, False),
            ("after 3000 steady enqueues, gc off", run_steady, True, False),
            ("after 3000 steady enqueues, buffers another plugin wrapped", run_steady, False, True),
            ("after a pass over 256 MB of host memory", walk_host_memory, False, False)):
        times = []
        for _ in range(15):
            before()
            plugin = new_plugin()
            x, w, y = buffers[0] if same_buffers else next(fresh)
            if gc_off:
                gc.disable()
            t0 = time.perf_counter()
            enqueue(plugin, x, w, y)
            times.append(us(t0))
            gc.enable()
        cold[label] = statistics.median(times)

    print(f"# host microseconds, median, {torch.cuda.get_device_name()}, {TOKENS}x{HIDDEN} fp16")
    print(f"bare compiled call, prepared arguments: {bare:.1f}")
    for name, values in hops.items():
        print(f"{name}: {statistics.median(values):.1f}")
    print(f"plugin enqueue, first (new plugin, new addresses): {statistics.median(first):.1f}")
    print(f"plugin enqueue, second (cached handoff): {statistics.median(second):.1f}")
    print("# cold: right after 3000 steady enqueues of another plugin "
          "(as bench_rms_norm.py measures)")
    for name, values in cold_hops.items():
        print(f"cold {name}: {statistics.median(values):.1f}")
    for label, value in cold.items():
        print(f"plugin enqueue, first (new plugin), {label}: {value:.1f}")


if __name__ == "__main__":
    main()
