"""Kernel variants that were measured against the sample's kernel on the H200 and NOT adopted.

Not part of the sample: kept so that the figures in benchmarks/NOTES.md can be
reproduced with benchmarks/experiments/compare_variants.py. Each variant
computes the same function as rms_norm_kernel (the script checks that before
timing it).

P      grid-stride row loop; W loaded once per CTA before the loop; the next
       row's X prefetched into registers while the current one is reduced.
       Launched with one CTA per row group (or a persistent grid).
S      W staged in shared memory with cp.async (no registers for W), X in
       registers; otherwise the sample's kernel.
B      the sample's kernel with another thread split (threads per row,
       rows per CTA), W early or late, optionally a ptxas CTAs-per-SM hint,
       X in registers or staged in shared memory by cp.async (suffix S; the
       XS kernel that was measured before staging was adopted, with its
       cp.async.ca option, is in commit 50ae538).
regs   the sample's kernel with X in registers at every row length: the
       kernel before rows of 4-12 KB were staged. Every variant below that
       patches the sample keeps that plan too, as it was measured against it.
chain  the sample's Step 2 as it was until the two-stage sum was adopted: one
       running sum of squares per thread (vec * vecs_per_thread dependent FMAs).
tree   the sample's kernel with that sum taken as a pairwise tree.
wfirst the sample's kernel with W's loads placed before X's in program order
       (so ptxas issues all loads back to back), made by patching the source.
xre    the sample's kernel with X read again (an L1/L2 hit) after the reduction
       instead of holding its FP32 values in registers through it
       (xre_wfirst: the same with W's loads first, as in wfirst).
xpk    the sample's kernel with X's packed 16-bit values passed through an
       identity warp shuffle after the reduction, so ptxas converts them to
       FP32 again there instead of keeping 32 FP32 registers through it.
xcs, xna, xl2, ycs, xna_ycs
       the sample's kernel with cache hints on X's loads (xcs: ld.global.cs;
       xna: L1::no_allocate; xl2: L2::256B prefetch) and/or Y's stores
       (ycs: st.global.cs, evict-first), through CuTe copy atoms.
xef, wel, wel_xef, wnc
       hints that only steer this kernel's own L1: X's loads L1::evict_first
       (xef), W's loads L1::evict_last (wel), both (wel_xef), or W's loads
       through the non-coherent path, ld.global.nc (wnc).
guard  the sample's kernel as it was before rsqrt.approx.ftz was adopted:
       plain rsqrt.approx.f32, which ptxas wraps in a subnormal-input guard.
n0, s2, t2
       a shorter path from the sum of squares to rstd: Step 3c started at the
       first warp's sum instead of 0.0 (n0), Step 2's second stage started at
       the first lane sum (s2) or added as a pairwise tree (t2).
x64    the sample's kernel with 8-byte X/Y vectors and twice as many per
       thread (same threads per row, same elements per thread), so that a
       thread's W vector is 16 bytes and a warp's W load is 512 contiguous
       bytes instead of 16 bytes at a 32-byte stride.
"""

import importlib.util
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402

import rms_norm_plugin_cutedsl as s  # noqa: E402


def _fake_args(dtype, hidden):
    elem = getattr(cutlass, s._CUTE_DTYPES[dtype])
    tokens = cute.sym_int32()
    fake = cute.runtime.make_fake_compact_tensor
    return (fake(elem, (tokens, hidden), stride_order=(1, 0), assumed_align=16),
            fake(Float32, (hidden,), assumed_align=16),
            fake(elem, (tokens, hidden), stride_order=(1, 0), assumed_align=16))


def _arch():
    import torch
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


@cute.kernel
def p_kernel(x_ptr: cute.Pointer, w_ptr: cute.Pointer, num_tokens: Int32, y_ptr: cute.Pointer,
             hidden: cutlass.Constexpr, eps: cutlass.Constexpr, vec: cutlass.Constexpr,
             tpr: cutlass.Constexpr, rpc: cutlass.Constexpr, vpt: cutlass.Constexpr):
    num_vecs = hidden // vec
    rows = cute.make_layout((num_tokens, (vec, num_vecs)), stride=(hidden, (1, vec)))
    mX = cute.make_tensor(x_ptr, rows)
    mY = cute.make_tensor(y_ptr, rows)
    mW = cute.make_tensor(w_ptr, cute.make_layout((vec, num_vecs), stride=(1, vec)))
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    row_in_cta = tidx // tpr
    t = tidx % tpr
    ragged = num_vecs % tpr != 0
    tWrW = cute.make_rmem_tensor((vec, vpt), Float32)
    tXrX = cute.make_rmem_tensor((vec, vpt), mX.element_type)
    tYrY = cute.make_rmem_tensor((vec, vpt), mY.element_type)
    tWrW.fill(0.0)
    tXrX.fill(0.0)
    # W and this CTA's first row, before the loop: the loop boundary keeps ptxas from delaying W.
    row0 = bidx * rpc + row_in_cta
    for k in cutlass.range_constexpr(vpt):
        j = t + k * tpr
        if not ragged or j < num_vecs:
            cute.autovec_copy(mW[None, j], tWrW[None, k])
            if row0 < num_tokens:
                cute.autovec_copy(mX[row0, (None, j)], tXrX[None, k])
    warps_per_row = max(1, tpr // 32)
    smem = cutlass.memory.SmemAllocator()
    sSum = smem.allocate_tensor(Float32, cute.make_layout((warps_per_row, rpc, 2)), 16)  # 2: parity of the row
    num_tiles = (num_tokens + rpc - 1) // rpc
    for tile in cutlass.range(bidx, num_tiles, gdim):
        row = tile * rpc + row_in_cta
        x = tXrX.load().to(Float32)
        nxt = row + gdim * rpc  # prefetch this thread's next row while the current one is reduced
        if nxt < num_tokens:
            for k in cutlass.range_constexpr(vpt):
                j = t + k * tpr
                if not ragged or j < num_vecs:
                    cute.autovec_copy(mX[nxt, (None, j)], tXrX[None, k])
        partial = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)
        total = cute.arch.warp_reduction_sum(partial, threads_in_group=min(tpr, 32))
        if cutlass.const_expr(tpr > 32):
            parity = ((tile - bidx) // gdim) % 2
            if t % 32 == 0:
                sSum[t // 32, row_in_cta, parity] = total
            cute.arch.barrier()
            total = Float32(0.0)
            for w in cutlass.range_constexpr(warps_per_row):
                total = total + sSum[w, row_in_cta, parity]
        rstd = cute.math.rsqrt(total * (1.0 / hidden) + eps)
        tYrY.store((x * rstd * tWrW.load()).to(mY.element_type))
        if row < num_tokens:
            for k in cutlass.range_constexpr(vpt):
                j = t + k * tpr
                if not ragged or j < num_vecs:
                    cute.autovec_copy(tYrY[None, k], mY[row, (None, j)])


@cute.jit
def p_launch(mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, num_tokens: Int32, grid: Int32,
             stream: cuda.CUstream, hidden: cutlass.Constexpr, eps: cutlass.Constexpr,
             tpr: cutlass.Constexpr, rpc: cutlass.Constexpr, vpt: cutlass.Constexpr, minb: cutlass.Constexpr):
    vec = s.plan_kernel(hidden).vec
    p_kernel(mX.iterator, mW.iterator, num_tokens, mY.iterator, hidden, eps, vec, tpr, rpc, vpt).launch(
        grid=[grid, 1, 1], block=[tpr * rpc, 1, 1], stream=stream, min_blocks_per_mp=minb)


def compile_p(dtype, hidden, tpr, rpc, vpt, arch=None, minb=0):
    """P: call as kernel(mX, mW, mY, num_tokens, grid_ctas, stream); minb > 0 asks ptxas for that many CTAs/SM."""
    return cute.compile(p_launch, *_fake_args(dtype, hidden), Int32(1), Int32(1), cute.runtime.make_fake_stream(),
                        hidden, 1e-5, tpr, rpc, vpt, minb, options=f"--gpu-arch {arch or _arch()}")


@cute.jit
def split_launch(mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, num_tokens: Int32, stream: cuda.CUstream,
                 hidden: cutlass.Constexpr, eps: cutlass.Constexpr, tpr: cutlass.Constexpr, rpc: cutlass.Constexpr,
                 early_weight: cutlass.Constexpr, minb: cutlass.Constexpr, stage_x: cutlass.Constexpr):
    vec = s.plan_kernel(hidden, mX.element_type.width // 8).vec
    vpt = (hidden // vec + tpr - 1) // tpr
    s.rms_norm_kernel(mX.iterator, mW.iterator, num_tokens, mY.iterator,
                      hidden, eps, vec, tpr, rpc, vpt, early_weight, stage_x).launch(
        grid=[(num_tokens + rpc - 1) // rpc, 1, 1], block=[tpr * rpc, 1, 1], stream=stream, min_blocks_per_mp=minb)


def compile_split(dtype, hidden, tpr, rpc, early_weight, minb=0, stage_x=False, arch=None):
    """B: the sample's own kernel with another thread split, X in registers or (stage_x) staged in shared
    memory; call as kernel(mX, mW, mY, num_tokens, stream)."""
    return cute.compile(split_launch, *_fake_args(dtype, hidden), Int32(1), cute.runtime.make_fake_stream(),
                        hidden, 1e-5, tpr, rpc, early_weight, minb, stage_x, options=f"--gpu-arch {arch or _arch()}")


@cute.kernel
def s_kernel(x_ptr: cute.Pointer, w_ptr: cute.Pointer, num_tokens: Int32, y_ptr: cute.Pointer,
             hidden: cutlass.Constexpr, eps: cutlass.Constexpr, vec: cutlass.Constexpr,
             tpr: cutlass.Constexpr, rpc: cutlass.Constexpr, vpt: cutlass.Constexpr,
             wvec: cutlass.Constexpr):
    num_vecs = hidden // vec
    rows = cute.make_layout((num_tokens, (vec, num_vecs)), stride=(hidden, (1, vec)))
    mX = cute.make_tensor(x_ptr, rows)
    mY = cute.make_tensor(y_ptr, rows)
    num_wchunks = hidden // wvec
    mWc = cute.make_tensor(w_ptr, cute.make_layout((wvec, num_wchunks), stride=(1, wvec)))
    smem = cutlass.memory.SmemAllocator()
    sWc = smem.allocate_tensor(Float32, cute.make_layout((wvec, num_wchunks), stride=(1, wvec)), 16)
    sW = cute.make_tensor(sWc.iterator, cute.make_layout((vec, num_vecs), stride=(1, vec)))
    warps_per_row = max(1, tpr // 32)
    sSum = smem.allocate_tensor(Float32, cute.make_layout((warps_per_row, rpc)), 16)

    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    cta = tpr * rpc
    row_in_cta = tidx // tpr
    t = tidx % tpr
    row = bidx * rpc + row_in_cta
    row_ok = row < num_tokens
    ragged = num_vecs % tpr != 0

    # W -> shared memory, asynchronously, by every thread of the CTA.
    # .ca: W also lands in L1; .cg would allow only 16-byte copies, and hidden % 4 != 0 needs smaller ones.
    atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.ALWAYS), Float32,
                               num_bits_per_copy=wvec * 32)
    for c in cutlass.range_constexpr((num_wchunks + cta - 1) // cta):
        ci = tidx + c * cta
        if num_wchunks % cta == 0 or ci < num_wchunks:
            cute.copy(atom, mWc[None, ci], sWc[None, ci])
    cute.arch.cp_async_commit_group()

    tXrX = cute.make_rmem_tensor((vec, vpt), mX.element_type)
    tXrX.fill(0.0)
    for k in cutlass.range_constexpr(vpt):
        j = t + k * tpr
        if not ragged or j < num_vecs:
            if row_ok:
                cute.autovec_copy(mX[row, (None, j)], tXrX[None, k])
    x = tXrX.load().to(Float32)
    partial = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)
    total = cute.arch.warp_reduction_sum(partial, threads_in_group=min(tpr, 32))
    if cutlass.const_expr(tpr > 32):
        if t % 32 == 0:
            sSum[t // 32, row_in_cta] = total
    cute.arch.cp_async_wait_group(0)
    cute.arch.barrier()
    if cutlass.const_expr(tpr > 32):
        total = Float32(0.0)
        for w in cutlass.range_constexpr(warps_per_row):
            total = total + sSum[w, row_in_cta]
    rstd = cute.math.rsqrt(total * (1.0 / hidden) + eps)
    tWrW = cute.make_rmem_tensor((vec, vpt), Float32)
    tWrW.fill(0.0)
    for k in cutlass.range_constexpr(vpt):
        j = t + k * tpr
        if not ragged or j < num_vecs:
            cute.autovec_copy(sW[None, j], tWrW[None, k])
    tYrY = cute.make_rmem_tensor((vec, vpt), mY.element_type)
    tYrY.store((x * rstd * tWrW.load()).to(mY.element_type))
    if row_ok:
        for k in cutlass.range_constexpr(vpt):
            j = t + k * tpr
            if not ragged or j < num_vecs:
                cute.autovec_copy(tYrY[None, k], mY[row, (None, j)])


@cute.jit
def s_launch(mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, num_tokens: Int32, stream: cuda.CUstream,
             hidden: cutlass.Constexpr, eps: cutlass.Constexpr, tpr: cutlass.Constexpr, rpc: cutlass.Constexpr,
             vpt: cutlass.Constexpr):
    vec = s.plan_kernel(hidden).vec
    wvec = 4 if hidden % 4 == 0 else (2 if hidden % 2 == 0 else 1)
    s_kernel(mX.iterator, mW.iterator, num_tokens, mY.iterator, hidden, eps, vec, tpr, rpc, vpt, wvec).launch(
        grid=[(num_tokens + rpc - 1) // rpc, 1, 1], block=[tpr * rpc, 1, 1], stream=stream)


def compile_s(dtype, hidden, tpr, rpc, vpt, arch=None):
    """S: call as kernel(mX, mW, mY, num_tokens, stream)."""
    return cute.compile(s_launch, *_fake_args(dtype, hidden), Int32(1), cute.runtime.make_fake_stream(),
                        hidden, 1e-5, tpr, rpc, vpt, options=f"--gpu-arch {arch or _arch()}")


_STEP1 = """    for k in cutlass.range_constexpr(vecs_per_thread):
        j = t + k * threads_per_row
        if not ragged or j < num_vecs:
            if cutlass.const_expr(early_weight):
                cute.autovec_copy(mW[None, j], tWrW[None, k])
            if cutlass.const_expr(not stage_x):
                if row_ok:
                    cute.autovec_copy(mX[row, (None, j)], tXrX[None, k])
"""
_STEP1_W_FIRST = """    if cutlass.const_expr(early_weight):
        for k in cutlass.range_constexpr(vecs_per_thread):
            j = t + k * threads_per_row
            if not ragged or j < num_vecs:
                cute.autovec_copy(mW[None, j], tWrW[None, k])
    for k in cutlass.range_constexpr(vecs_per_thread):
        j = t + k * threads_per_row
        if not ragged or j < num_vecs:
            if cutlass.const_expr(not stage_x):
                if row_ok:
                    cute.autovec_copy(mX[row, (None, j)], tXrX[None, k])
"""


_REDUCE = """    lane_sums = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=(None, 1))
    partial = lane_sums.reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)
"""
_REDUCE_CHAIN = "    partial = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)\n"
_PAIRWISE_SUM = """    for level in cutlass.range_constexpr(math.ceil(math.log2(n)) if n > 1 else 0):
        half = n // 2
        for i in cutlass.range_constexpr(half):
            sq[i] = sq[i] + sq[i + n - half]
        n = n - half
    partial = sq[0]
"""  # the first n values of sq, summed as a pairwise tree
_REDUCE_TREE = """    sq = cute.make_rmem_tensor((vec, vecs_per_thread), Float32)
    sq.store(x * x)
    n = vec * vecs_per_thread
""" + _PAIRWISE_SUM


_STAGE_X = "    stage_x = not short and row_bytes <= STAGED_ROW_BYTES and vec * elem_bytes == VECTOR_BYTES\n"


def _load_patched_sample(name, *patches):
    """The sample module with pieces of its source replaced ((old, new) pairs), X always in registers.

    These variants were measured against the register kernel (before rows of 4-12 KB were staged in
    shared memory), so they keep its plan: with stage_x off, the plan is what it was then."""
    source = open(os.path.join(ROOT, "rms_norm_plugin_cutedsl.py")).read()
    for old, new in ((_STAGE_X, "    stage_x = False\n"),) + patches:
        if old not in source:
            raise RuntimeError(f"the sample's kernel changed; update the {name} patch in variants.py")
        source = source.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), f"rms_norm_{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"rms_norm_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"rms_norm_{name}"] = module
    spec.loader.exec_module(module)
    return module


_X_LOAD = "                    cute.autovec_copy(mX[row, (None, j)], tXrX[None, k])\n"
_Y_STORE = "                    cute.autovec_copy(tYrY[None, k], mY[row, (None, j)])\n"
_BITS = "num_bits_per_copy=vec * mX.element_type.width"
_W_LOAD = "                cute.autovec_copy(mW[None, j], tWrW[None, k])\n"  # both places W is loaded
_L1 = "l1c_evict_priority=cute.nvgpu.CacheEvictionPriority."
_CACHE_HINTS = {  # name -> copy atom keywords for X's loads, W's loads, Y's stores (None: default, autovec_copy)
    "xcs": (f"{_BITS}, load_cache_mode=cute.nvgpu.LoadCacheMode.STREAMING", None, None),
    "xna": (f"{_BITS}, {_L1}NO_ALLOCATE", None, None),
    "xl2": (f"{_BITS}, l2_prefetch_size=cute.nvgpu.L2PrefetchSize.SIZE_256B", None, None),
    "ycs": (None, None, f"{_BITS}, store_cache_mode=cute.nvgpu.StoreCacheMode.STREAMING"),
    "xna_ycs": (f"{_BITS}, {_L1}NO_ALLOCATE", None, f"{_BITS}, store_cache_mode=cute.nvgpu.StoreCacheMode.STREAMING"),
    "xef": (f"{_BITS}, {_L1}EVICT_FIRST", None, None),
    "wel": (None, f"num_bits_per_copy=min(vec, 4) * 32, {_L1}EVICT_LAST", None),
    "wnc": (None, "num_bits_per_copy=min(vec, 4) * 32, invariant=True", None),
    "wel_xef": (f"{_BITS}, {_L1}EVICT_FIRST", f"num_bits_per_copy=min(vec, 4) * 32, {_L1}EVICT_LAST", None),
}


def load_cache_hint_sample(name):
    """xcs/xna/xl2/ycs/xna_ycs/xef/wel/wnc/wel_xef: the sample with cache hints on its loads and/or stores (copy atoms)."""
    load_x, load_w, store = _CACHE_HINTS[name]
    patches = []
    if load_x:
        patches.append((_X_LOAD, "                    cute.copy(cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), mX.element_type, "
                                 f"{load_x}), mX[row, (None, j)], tXrX[None, k])\n"))
    if load_w:  # W's vector is vec fp32 values: 128-bit pieces of it
        patches.append((_W_LOAD, "                cute.copy(cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), Float32, "
                                 f"{load_w}), cute.zipped_divide(mW[None, j], (min(vec, 4),)), "
                                 "cute.zipped_divide(tWrW[None, k], (min(vec, 4),)))\n"))
    if store:
        patches.append((_Y_STORE, "                    cute.copy(cute.make_copy_atom(cute.nvgpu.CopyR2GOp(), mY.element_type, "
                                  f"{store}), tYrY[None, k], mY[row, (None, j)])\n"))
    return _load_patched_sample(name, *patches)


_STEP5_SCALE = "        tYrY.store((x * rstd * tWrW.load()).to(mY.element_type))\n"
_STEP5_RELOAD = """        if row_ok:
            for k in cutlass.range_constexpr(vecs_per_thread):
                j = t + k * threads_per_row
                if not ragged or j < num_vecs:
                    cute.autovec_copy(mX[row, (None, j)], tXrX[None, k])
        tYrY.store((tXrX.load().to(Float32) * rstd * tWrW.load()).to(mY.element_type))
"""


def load_registers_sample():
    """regs: the sample module with X in registers at every row length (the kernel before staging was adopted)."""
    return _load_patched_sample("regs")


def load_reload_sample():
    """xre: the sample module with Step 5 reading X again instead of keeping it in registers through the reduction."""
    return _load_patched_sample("xre", (_STEP5_SCALE, _STEP5_RELOAD))


_IMPORT_CUTE = "    import cutlass.cute as cute\n"
_STEP5_REPACK = """        tXi = cute.recast_tensor(tXrX, Int32)
        for i in cutlass.range_constexpr(cute.size(tXi)):
            tXi[i] = Int32(llvm.inline_asm(
                Int32.mlir_type, [tXi[i].ir_value()],
                "{ .reg .u32 lane; mov.u32 lane, %laneid; shfl.sync.idx.b32 $0, $1, lane, 31, -1; }",
                "=r,r", has_side_effects=True))
        tYrY.store((tXrX.load().to(Float32) * rstd * tWrW.load()).to(mY.element_type))
"""


def load_repack_sample():
    """xpk: the sample module with X's 16-bit values made opaque after the reduction (converted to FP32 again)."""
    return _load_patched_sample("xpk", (_STEP5_SCALE, _STEP5_REPACK),
                                (_IMPORT_CUTE, _IMPORT_CUTE + "    from cutlass._mlir.dialects import llvm\n"))


def load_reload_w_first_sample():
    """xre_wfirst: xre with W's loads placed before X's in program order."""
    return _load_patched_sample("xre_wfirst", (_STEP5_SCALE, _STEP5_RELOAD), (_STEP1, _STEP1_W_FIRST))


def load_w_first_sample():
    """wfirst: the sample module with Step 1 reordered (all W loads, then all X loads)."""
    return _load_patched_sample("w_first", (_STEP1, _STEP1_W_FIRST))


def load_half_vector_sample():
    """x64: the sample module with 8-byte X/Y vectors and twice as many per thread (same thread split, same
    elements per thread), so each thread's W vector is 16 bytes and a warp's W load covers 512 contiguous bytes."""
    return _load_patched_sample("x64", ("    vec = VECTOR_BYTES // elem_bytes\n", "    vec = VECTOR_BYTES // elem_bytes // 2\n"),
                                ("    per_thread = 2 if short else 4\n", "    per_thread = 4 if short else 8\n"))


def load_chain_sample():
    """chain: the sample module with the per-thread sum of squares as one running sum (vec * vecs_per_thread deep)."""
    return _load_patched_sample("chain", (_REDUCE, _REDUCE_CHAIN))


def load_tree_sample():
    """tree: the sample module with the per-thread sum of squares taken as a pairwise tree (log depth)."""
    return _load_patched_sample("tree", (_REDUCE, _REDUCE_TREE))

_RSQRT_FTZ = """    mean_sq_eps = total * (1.0 / hidden) + eps  # 1/hidden folds to a constant
    if cutlass.const_expr(eps >= FLT_MIN):
        rstd = cute.math.rsqrt(mean_sq_eps, approx=True, ftz=True)
    else:
        rstd = cute.math.rsqrt(mean_sq_eps)
"""
_RSQRT_GUARDED = "    rstd = cute.math.rsqrt(total * (1.0 / hidden) + eps)  # 1/hidden folds to a constant\n"
_STEP3C = """        total = Float32(0.0)
        for w in cutlass.range_constexpr(warps_per_row):
            total = total + sSum[w, row_in_cta]
"""
_STEP3C_NO_ZERO = """        total = sSum[0, row_in_cta]
        for w in cutlass.range_constexpr(1, warps_per_row):
            total = total + sSum[w, row_in_cta]
"""
_REDUCE_STAGE2_TREE = """    lane_sums = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=(None, 1))
    sq = cute.make_rmem_tensor((vec,), Float32)
    sq.store(lane_sums)
    n = vec
""" + _PAIRWISE_SUM
_REDUCE_STAGE2_CHAIN = """    lane_sums = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=(None, 1))
    sq = cute.make_rmem_tensor((vec,), Float32)
    sq.store(lane_sums)
    partial = sq[0]
    for i in cutlass.range_constexpr(1, vec):
        partial = partial + sq[i]
"""


def load_guarded_rsqrt_sample():
    """guard: the sample module with plain rsqrt.approx.f32 (ptxas adds a subnormal-input guard), as before ftz."""
    return _load_patched_sample("guard", (_RSQRT_FTZ, _RSQRT_GUARDED))


def load_no_zero_sample():
    """n0: the sample module with Step 3c started at the first warp's sum instead of 0.0."""
    return _load_patched_sample("n0", (_STEP3C, _STEP3C_NO_ZERO))


def load_chain2_sample():
    """s2: the sample module with Step 2's second stage started at the first lane sum instead of 0.0 (one add fewer)."""
    return _load_patched_sample("s2", (_REDUCE, _REDUCE_STAGE2_CHAIN))


def load_tree2_sample():
    """t2: the sample module with Step 2's second stage (the vec lane sums) added as a pairwise tree."""
    return _load_patched_sample("t2", (_REDUCE, _REDUCE_STAGE2_TREE))
