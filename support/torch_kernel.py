"""The sample's kernel on torch CUDA tensors, on torch's current stream: its code path without TensorRT (the GPU
tests and the benchmark call it)."""

import torch


def check_tensors(sample, x: torch.Tensor, w: torch.Tensor, outputs: dict, y_scale=None):
    """One ValueError for what the launcher cannot serve, before it compiles or a driver call fails. outputs
    maps each other row tensor's name (out, r, s) to it: each must have x's shape and dtype, but out is FP8
    E4M3 with a y_scale (the FP8 form)."""
    if x.dim() < 1 or tuple(w.shape) != (x.shape[-1],):
        raise ValueError(f"w must be [hidden] for x [..., hidden], got x {tuple(x.shape)} and w {tuple(w.shape)}")
    for name, t in outputs.items():
        dtype = x.dtype
        if name == "out" and y_scale is not None:
            dtype = getattr(torch, sample.DTYPES[sample.Y_FP8].torch)
        if t.shape != x.shape or t.dtype != dtype:
            raise ValueError(f"{name} must have shape and dtype {tuple(x.shape)} {dtype}, got "
                             f"{tuple(t.shape)} {t.dtype}")
    tensors = (x, w, *outputs.values())
    if not all(t.is_cuda and t.device == x.device for t in tensors):
        raise ValueError("x, w, " + ", ".join(outputs) + " must be CUDA tensors on one device, got "
                         + ", ".join(str(t.device) for t in tensors))
    if not all(t.is_contiguous() and t.data_ptr() % sample.VECTOR_BYTES == 0 for t in tensors):
        raise ValueError(f"x, w, {', '.join(outputs)} must be contiguous and {sample.VECTOR_BYTES}-byte aligned")


def launch(sample, x, w, y, epsilon, residual=(), y_scale=None):
    """The compiled launcher on (x, w, y) and, in the residual form, (r, s): rows of x's last axis. y_scale:
    the FP8 form (y FP8 E4M3)."""
    kernel = sample.compile_rms_norm(str(x.dtype).removeprefix("torch."), x.shape[-1], epsilon,
                                     w_dtype=str(w.dtype).removeprefix("torch."), residual=bool(residual),
                                     y_scale=y_scale)
    hidden = x.shape[-1]
    rows = [t.view(-1, hidden) for t in (x, y, *residual)]
    x2, y2, *residual2 = (sample.from_dlpack(t, assumed_align=sample.VECTOR_BYTES) for t in rows)
    w2 = sample.from_dlpack(w, assumed_align=sample.VECTOR_BYTES)
    kernel(x2, w2, y2, rows[0].shape[0], sample.cuda.CUstream(torch.cuda.current_stream().cuda_stream),
           *residual2)


def empty_y(sample, x, y_scale):
    """Y for x: x's dtype, or FP8 E4M3 in the FP8 form."""
    if y_scale is None:
        return torch.empty_like(x)
    return torch.empty_like(x, dtype=getattr(torch, sample.DTYPES[sample.Y_FP8].torch))


def rms_norm_torch(sample, x: torch.Tensor, w: torch.Tensor, epsilon: float = 1e-5, out=None,
                   y_scale=None) -> torch.Tensor:
    """y = RMSNorm(x) * w over x's last axis, computed by `sample`'s compiled launcher (sample: the module);
    with y_scale, y / y_scale in FP8 E4M3."""
    out = empty_y(sample, x, y_scale) if out is None else out
    check_tensors(sample, x, w, {"out": out}, y_scale)
    launch(sample, x, w, out, epsilon, y_scale=y_scale)
    return out


def add_rms_norm_torch(sample, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, epsilon: float = 1e-5,
                       out=None, s=None, y_scale=None):
    """(y, s): s = x + r in x's dtype, y = RMSNorm(s) * w (FP8 with y_scale), written by the residual form's
    one kernel."""
    out = empty_y(sample, x, y_scale) if out is None else out
    s = torch.empty_like(x) if s is None else s
    check_tensors(sample, x, w, {"r": r, "out": out, "s": s}, y_scale)
    launch(sample, x, w, out, epsilon, (r, s), y_scale)
    return out, s
