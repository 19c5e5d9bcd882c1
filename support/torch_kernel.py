"""The sample's kernel on torch CUDA tensors, on torch's current stream: its code path without TensorRT (the GPU
tests call it)."""

import torch


def rms_norm_torch(sample, x: torch.Tensor, w: torch.Tensor, epsilon: float = 1e-5, out=None) -> torch.Tensor:
    """y = RMSNorm(x) * w over x's last axis, computed by `sample`'s compiled launcher (sample: the module).

    What the launcher cannot serve is one ValueError here, before it compiles or a driver call fails."""
    if x.dim() < 1 or tuple(w.shape) != (x.shape[-1],):
        raise ValueError(f"w must be [hidden] for x [..., hidden], got x {tuple(x.shape)} and w {tuple(w.shape)}")
    out = torch.empty_like(x) if out is None else out
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"out must have x's shape and dtype {tuple(x.shape)} {x.dtype}, got {tuple(out.shape)} "
                         f"{out.dtype}")
    if not all(t.is_cuda and t.device == x.device for t in (x, w, out)):
        raise ValueError("x, w and out must be CUDA tensors on one device, got "
                         + ", ".join(str(t.device) for t in (x, w, out)))
    if not all(t.is_contiguous() and t.data_ptr() % sample.VECTOR_BYTES == 0 for t in (x, w, out)):
        raise ValueError(f"x, w and out must be contiguous and {sample.VECTOR_BYTES}-byte aligned")
    kernel = sample.compile_rms_norm(str(x.dtype).removeprefix("torch."), x.shape[-1], epsilon,
                                     w_dtype=str(w.dtype).removeprefix("torch."))
    x2, y2 = x.reshape(-1, x.shape[-1]), out.view(-1, x.shape[-1])
    kernel(*(sample.from_dlpack(t, assumed_align=sample.VECTOR_BYTES) for t in (x2, w, y2)), x2.shape[0],
           sample.cuda.CUstream(torch.cuda.current_stream().cuda_stream))
    return out
