"""The sample's kernel on torch CUDA tensors, on torch's current stream: its code path without TensorRT (the GPU
tests and the benchmark call it)."""

import torch


def rms_norm_torch(sample, x: torch.Tensor, w: torch.Tensor, epsilon: float = 1e-5, out=None) -> torch.Tensor:
    """y = RMSNorm(x) * w over x's last axis, computed by `sample`'s compiled launcher (sample: the module)."""
    out = torch.empty_like(x) if out is None else out
    kernel = sample.compile_rms_norm(str(x.dtype).removeprefix("torch."), x.shape[-1], epsilon,
                                     w_dtype=str(w.dtype).removeprefix("torch."))
    x2, y2 = x.reshape(-1, x.shape[-1]), out.view(-1, x.shape[-1])
    kernel(*(sample.from_dlpack(t, assumed_align=sample.VECTOR_BYTES) for t in (x2, w, y2)), x2.shape[0],
           sample.cuda.CUstream(torch.cuda.current_stream().cuda_stream))
    return out
