"""The sample's kernel, or a copy's, on torch CUDA tensors on torch's current stream: its code path
without TensorRT (the GPU tests and the benchmarks call it).

The call is built from the module's own launcher (its one `*_launch` function): each tensor
parameter mX, mW, mB, mZ, mY, mR, mS takes the tensor of that name, then num_tokens and the stream,
in the launcher's order. So a copy with other inputs runs here unchanged, e.g. a LayerNorm's

    y = norm_torch(layer_norm, {"X": x, "W": w, "B": b})

and rms_norm_torch / add_rms_norm_torch serve the lesson and the fused companion's forms.
"""

import inspect

import torch
import cuda.bindings.driver as cuda
from cutlass.cute.runtime import from_dlpack

COLUMN_TENSORS = ("W", "B")  # [hidden], read by every row; every other tensor is rows of X's shape


def argument_name(name: str) -> str:
    """A tensor's name as the functions below call their arguments: Y is `out`, X `x`."""
    return "out" if name == "Y" else name.lower()


def launcher_arguments(module) -> list:
    """The compiled launcher's run-time arguments in order: (name, optional) of each tensor
    (X, W, ...; optional where it defaults to None), then ("num_tokens", False) and ("stream",
    False) where the launcher takes them. Compile-time parameters (plan, epsilon) are left out."""
    launchers = [value for name, value in vars(module).items()
                 if name.endswith("_launch") and callable(value)
                 and getattr(value, "__module__", None) == module.__name__]
    if len(launchers) != 1:
        raise ValueError(f"{module.__name__} must define one launcher named *_launch, found "
                         f"{len(launchers)}")
    arguments = []
    for name, parameter in inspect.signature(launchers[0]).parameters.items():
        annotation = str(parameter.annotation)
        if "Constexpr" in annotation:
            continue
        if "Tensor" in annotation:
            arguments.append((name.removeprefix("m"), parameter.default is None))
        else:
            arguments.append((name, False))
    return arguments


def check_tensors(module, tensors: dict, y_scale=None):
    """One ValueError for what the launcher cannot serve, before it compiles or a driver call
    fails: W and B must be [hidden] for X [..., hidden]; every other tensor X's shape and dtype,
    but Y FP8 E4M3 with a y_scale (the FP8 form); all on one CUDA device, contiguous and aligned."""
    x = tensors["X"]
    for name, t in tensors.items():
        if name in COLUMN_TENSORS:
            if x.dim() < 1 or tuple(t.shape) != (x.shape[-1],):
                w = argument_name(name)
                raise ValueError(f"{w} must be [hidden] for x [..., hidden], got x "
                                 f"{tuple(x.shape)} and {w} {tuple(t.shape)}")
            continue
        dtype = x.dtype
        if name == "Y" and y_scale is not None:
            dtype = getattr(torch, module.DTYPES[module.Y_FP8].torch)
        if t.shape != x.shape or t.dtype != dtype:
            raise ValueError(f"{argument_name(name)} must have shape and dtype {tuple(x.shape)} "
                             f"{dtype}, got {tuple(t.shape)} {t.dtype}")
    names = ", ".join(map(argument_name, tensors))
    if not all(t.is_cuda and t.device == x.device for t in tensors.values()):
        raise ValueError(f"{names} must be CUDA tensors on one device, got "
                         + ", ".join(str(t.device) for t in tensors.values()))
    if not all(t.is_contiguous() and t.data_ptr() % module.VECTOR_BYTES == 0
               for t in tensors.values()):
        raise ValueError(f"{names} must be contiguous and {module.VECTOR_BYTES}-byte aligned")


def compiled_launcher(module, tensors: dict, epsilon: float, y_scale=None):
    """The module's compile_rms_norm for these tensors' dtypes and hidden size, in the form they
    make: R given, the residual form; a y_scale, the FP8 form (where the module has them)."""
    x = tensors["X"]
    form = {}
    if "R" in tensors:
        form["residual"] = True
    if y_scale is not None:
        form["y_scale"] = y_scale
    takes = inspect.signature(module.compile_rms_norm).parameters
    for name in form:
        if name not in takes:
            raise ValueError(f"{module.__name__}.compile_rms_norm has no {name} form")
    w_dtype = str(tensors["W"].dtype).removeprefix("torch.")
    return module.compile_rms_norm(str(x.dtype).removeprefix("torch."), x.shape[-1], epsilon,
                                   w_dtype=w_dtype, **form)


def launch(module, tensors: dict, epsilon: float, y_scale=None):
    """The compiled launcher on `tensors` by name, in the order launcher_arguments gives: rows of
    X's last axis, the columns (W, B) as they are."""
    kernel = compiled_launcher(module, tensors, epsilon, y_scale)
    hidden = tensors["X"].shape[-1]
    num_tokens = tensors["X"].numel() // hidden
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    arguments = []
    for name, optional in launcher_arguments(module):
        if name == "num_tokens":
            arguments.append(num_tokens)
        elif name == "stream":
            arguments.append(stream)
        elif name in tensors:
            t = tensors[name]
            view = t if name in COLUMN_TENSORS else t.view(-1, hidden)
            # detach(): torch exports no tensor that requires grad (a Parameter) through DLPack.
            arguments.append(from_dlpack(view.detach(), assumed_align=module.VECTOR_BYTES))
        elif not optional:
            raise ValueError(f"the launcher of {module.__name__} takes {name}, which is not "
                             f"among the tensors given ({', '.join(tensors)})")
    kernel(*arguments)


def empty_y(module, x, y_scale):
    """Y for x: x's dtype, or FP8 E4M3 in the FP8 form."""
    if y_scale is None:
        return torch.empty_like(x)
    return torch.empty_like(x, dtype=getattr(torch, module.DTYPES[module.Y_FP8].torch))


def norm_torch(module, inputs: dict, epsilon: float = 1e-5, out=None) -> torch.Tensor:
    """Y of a module's kernel on `inputs` by name (X, W and a copy's own, such as B or Z), written
    into out (else a new tensor like X)."""
    out = torch.empty_like(inputs["X"]) if out is None else out
    tensors = {**inputs, "Y": out}
    check_tensors(module, tensors)
    launch(module, tensors, epsilon)
    return out


def rms_norm_torch(module, x: torch.Tensor, w: torch.Tensor, epsilon: float = 1e-5, out=None,
                   y_scale=None) -> torch.Tensor:
    """y = RMSNorm(x) * w over x's last axis, computed by the module's compiled launcher; with
    y_scale (the fused companion), y / y_scale in FP8 E4M3."""
    out = empty_y(module, x, y_scale) if out is None else out
    tensors = {"X": x, "W": w, "Y": out}
    check_tensors(module, tensors, y_scale)
    launch(module, tensors, epsilon, y_scale)
    return out


def add_rms_norm_torch(module, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor,
                       epsilon: float = 1e-5, out=None, s=None, y_scale=None):
    """(y, s): s = x + r in x's dtype, y = RMSNorm(s) * w (FP8 with y_scale), written by the fused
    companion's residual form in one kernel."""
    out = empty_y(module, x, y_scale) if out is None else out
    s = torch.empty_like(x) if s is None else s
    tensors = {"X": x, "R": r, "W": w, "Y": out, "S": s}
    check_tensors(module, tensors, y_scale)
    launch(module, tensors, epsilon, y_scale)
    return out, s
