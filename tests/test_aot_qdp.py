"""CPU: the AOT flavor's op driven by TensorRT's own ``tensorrt.plugin`` code, as a build drives it.

``tensorrt.plugin`` is pure Python inside the tensorrt-cu12-bindings wheel on
PyPI. It cannot be imported as a whole without libnvinfer, so the wheel is
downloaded once per session (pip download, into the pytest cache), and its
``tensorrt/plugin`` modules are loaded from it with the labelled double of
tests/trt_qdp_double.py as their ``tensorrt`` (only the C++-backed enums,
structs and symbolic-shape classes are doubles). The calls below are what
TensorRT makes during a build of an AOT plugin (network.add_plugin with
aot=True): the creator's create_plugin with the serialized attributes,
get_output_data_types, get_output_shapes with a symbolic token count and a
constant hidden size, get_supported_format_combinations, configure_plugin,
set_tactic, get_launch_params and get_kernel.

The expected launch dimensions are derived by hand below from the kernel's
design (docs/design.md, "Kernel design"), not read from the companion.
"""

import functools
import importlib.util
import pathlib
import re
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import pytest

import rms_norm_aot_cutedsl as aot
import rms_norm_plugin_cutedsl as sample
import trt_qdp_double

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The wheels' own modules warn of invalid escape sequences.
pytestmark = pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
ARCH = "sm_90a"
EPS = 2.0 ** -15  # exact in float32; PTX writes it as 0f38000000


def pinned_tensorrt_version() -> str:
    requirements = (ROOT / "requirements.txt").read_text()
    (version,) = re.findall(r"^tensorrt-cu12==([\d.]+)$", requirements, re.M)
    return version


PINNED = pinned_tensorrt_version()
# 10.9 is the first release with AOT plugins; 11.1 the last whose float attributes break on NumPy
# 2.4.
VERSIONS = [PINNED, "11.1.0.106", "10.9.0.34"]


@pytest.fixture(scope="session")
def bindings_wheels(pytestconfig):
    """version -> the tensorrt/plugin directory of that tensorrt-cu12-bindings wheel, downloaded
    once.

    Only the wheel's Python files are used, so the wheel for Python 3.11 on Linux x86_64 serves any
    machine.
    """
    if getattr(pytestconfig, "cache", None) is not None:
        cache = pathlib.Path(pytestconfig.cache.mkdir("tensorrt-bindings-wheels"))
    else:  # -p no:cacheprovider
        cache = pathlib.Path(tempfile.gettempdir()) / "rms-norm-tensorrt-bindings-wheels"
    found = {}

    def plugin_dir(version):
        if version in found:
            return found[version]
        target = cache / version
        if not list(target.glob("*.whl")):
            cmd = [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps",
                   "--only-binary=:all:", "--python-version", "3.11",
                   "--platform", "manylinux_2_28_x86_64",
                   f"tensorrt-cu12-bindings=={version}", "-d", str(target)]
            if pathlib.Path("/etc/ssl/certs/ca-certificates.crt").exists():
                cmd[4:4] = ["--cert", "/etc/ssl/certs/ca-certificates.crt"]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                pytest.skip(f"cannot download tensorrt-cu12-bindings=={version} from PyPI: "
                            f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        (wheel,) = target.glob("*.whl")
        unpacked = target / "unpacked"
        if not unpacked.exists():
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(unpacked)
        (found[version],) = unpacked.glob("*/plugin/__init__.py")
        found[version] = found[version].parent
        return found[version]

    return plugin_dir


def load_tensorrt_plugin(plugin_dir: pathlib.Path, trt, monkeypatch):
    """Import the wheel's plugin package as ``tensorrt.plugin`` on top of the double ``trt`` (for
    one test)."""
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    for name in [m for m in sys.modules if m.startswith("tensorrt.plugin")]:
        monkeypatch.delitem(sys.modules, name)
    spec = importlib.util.spec_from_file_location("tensorrt.plugin", plugin_dir / "__init__.py",
                                                  submodule_search_locations=[str(plugin_dir)])
    package = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tensorrt.plugin", package)
    trt.plugin = package
    spec.loader.exec_module(package)
    for name in [m for m in sys.modules if m.startswith("tensorrt.plugin.")]:
        monkeypatch.setitem(sys.modules, name, sys.modules[name])  # removed again after the test
    return package


def registered(plugin_dir, version, arch, monkeypatch):
    """(double tensorrt, real tensorrt.plugin) with the AOT ops registered for `arch`."""
    trt = trt_qdp_double.make_tensorrt(version)
    package = load_tensorrt_plugin(plugin_dir, trt, monkeypatch)
    monkeypatch.setattr(aot, "_REGISTERED", False)
    aot.register_aot_op(arch)
    return trt, package


# aot_kernel's result depends on its arguments alone (test_aot_ptx.py reads its PTX): each kernel
# is compiled once for the builds of all three versions, which differ in tensorrt.plugin alone.
AOT_KERNELS = functools.cache(aot.aot_kernel)


@pytest.fixture(params=VERSIONS)
def trtp(request, bindings_wheels, monkeypatch):
    """(double tensorrt, real tensorrt.plugin) with the AOT op registered, for each TensorRT
    version."""
    monkeypatch.setattr(aot, "aot_kernel", AOT_KERNELS)
    return registered(bindings_wheels(request.param), request.param, ARCH, monkeypatch)


def built_aot_plugin(trt, trtp, epsilon, residual=False, y_scale=None):
    """What network.add_plugin(op(x, w, epsilon=...), aot=True) makes: the creator's plugin for
    STRICT_AOT. residual: the fused op's, op(x, r, w, epsilon=...); y_scale: the FP8 op's,
    op(..., epsilon=..., y_scale=...)."""
    ops = trtp.op.rms_norm_cutedsl
    if y_scale is None:
        op = ops.add_rms_norm if residual else ops.rms_norm
        attrs = {"epsilon": np.array([epsilon], dtype=np.float32)}
    else:
        op = ops.add_rms_norm_fp8 if residual else ops.rms_norm_fp8
        attrs = {"epsilon": np.array([epsilon], dtype=np.float32),
                 "y_scale": np.array([y_scale], dtype=np.float32)}
    make = op(*(trt.ITensor() for _ in range(3 if residual else 2)), **attrs)
    _, _, plugin = make(trt.QuickPluginCreationRequest.STRICT_AOT)
    return plugin


def io_desc(trt, dtype, dims, lo=None, opt=None, hi=None):
    desc = trt.DynamicPluginTensorDesc()
    desc.desc.type, desc.desc.format, desc.desc.dims = dtype, trt.TensorFormat.LINEAR, dims
    desc.min, desc.opt, desc.max = lo or dims, opt or dims, hi or dims
    return desc


def build(trt, plugin, hidden, io_type, x_shape=None, w_type=None, residual=False, r_shape=None,
          y_type=None):
    """Drive the plugin through a build's calls; returns (output shape exprs, formats, launch
    params, extra args, kernel). residual: the fused op's inputs (X, R, W) and outputs (Y, S); R
    has X's shape unless r_shape. y_type: Y's dtype where it is not X's (the FP8 ops)."""
    y_type = io_type if y_type is None else y_type
    w_type = trt.DataType.FLOAT if w_type is None else w_type
    builder = trt.IExprBuilder()
    tokens = trt_qdp_double.SymbolicDim("num_tokens")
    x_dims = x_shape if x_shape is not None else trt.DimsExprs([tokens, builder.constant(hidden)])
    row_dims = [x_dims]
    if residual:
        row_dims.append(r_shape if r_shape is not None else trt.DimsExprs(x_dims))
    in_dims = row_dims + [trt.DimsExprs([builder.constant(hidden)])]
    num_inputs, num_outputs = len(in_dims), len(row_dims)
    types = [io_type] * len(row_dims) + [w_type]
    out_types = [y_type] + [io_type] * (num_outputs - 1)
    assert plugin.get_output_data_types(types, [len(d) for d in in_dims]) == out_types
    out_dims = plugin.get_output_shapes(in_dims, [], builder)

    def rows(dtype=io_type):
        return io_desc(trt, dtype, (-1, hidden), (1, hidden), (128, hidden), (512, hidden))

    in_out = ([rows() for _ in row_dims] + [io_desc(trt, w_type, (hidden,))]
              + [rows(t) for t in out_types])
    formats = plugin.get_supported_format_combinations(in_out, num_inputs)
    plugin.configure_plugin(in_out[:num_inputs], in_out[num_inputs:])
    plugin.set_tactic(0)
    launch, extra = trt.KernelLaunchParams(), trt.ISymExprs()
    plugin.get_launch_params(in_dims, in_out, num_inputs, launch, extra, builder)
    name, ptx = plugin.get_kernel([d.desc for d in in_out[:num_inputs]],
                                  [d.desc for d in in_out[num_inputs:]])
    return out_dims, formats, launch, extra, (name, ptx)


def f32_literal(value):
    return "0f" + np.float32(value).tobytes()[::-1].hex().upper()


# Hand-derived launch shapes, by (hidden, bytes per X element). A 16-byte vector holds 8 fp16/bf16
# or 4 fp32 elements. hidden 1024, 16-bit (2 KB rows): 128 vectors per row, short row -> 2 per
# thread -> 64 threads per row, 2 rows per 128-thread CTA, 2 warps per row -> 4 bytes x 2 warps x 2
# rows of shared memory. hidden 1024, fp32 (4 KB, still short): 256 vectors -> 128 threads, 1 row
# per CTA, 4 warps -> 16 bytes. hidden 4096, 16-bit, and hidden 2048, fp32 (8 KB rows, staged): 256
# threads per row, 1 row per CTA, the row in shared memory (8192 bytes) plus 4 bytes x 8 warps.
LAUNCH = {(1024, 2): (2, 128, 16), (1024, 4): (1, 128, 16), (4096, 2): (1, 256, 8192 + 32),
          (2048, 4): (1, 256, 8192 + 32)}
TYPES = ["HALF", "BF16", "FLOAT"]
# Every X x W combination at hidden 1024, and a staged row for some.
CASES = ([(1024, io, w) for io in TYPES for w in TYPES]
         + [(4096, "HALF", "FLOAT"), (4096, "BF16", "BF16"), (2048, "FLOAT", "HALF")])


@pytest.mark.parametrize("hidden, io, w", CASES)
def test_tensorrt_plugin_builds_the_aot_op(trtp, hidden, io, w):
    trt, package = trtp
    io_type, w_type = getattr(trt.DataType, io), getattr(trt.DataType, w)
    plugin = built_aot_plugin(trt, package, EPS)
    built = build(trt, plugin, hidden, io_type, w_type=w_type)
    (y_dims,), formats, launch, extra, (name, ptx) = built

    assert y_dims[1].is_constant() and y_dims[1].get_constant_value() == hidden
    assert not y_dims[0].is_constant()
    combos = {tuple(d.type for d in formats[i:i + 3]) for i in range(0, len(formats), 3)}
    dtype = {name_: getattr(trt.DataType, name_) for name_ in TYPES}
    expected = {(dtype[x], dtype[w_], dtype[x]) for x in TYPES for w_ in TYPES}
    assert combos == expected, "X and Y of one dtype, any W: nine combinations"
    assert {d.format for d in formats} == {trt.TensorFormat.LINEAR}

    ptx = ptx.decode()
    assert re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.M) == [name]
    assert re.search(rf"^\.target {ARCH}\b", ptx, re.M)
    assert re.search(r"^\.version 8\.0$", ptx, re.M)
    assert f32_literal(EPS) in ptx, "epsilon is baked into the PTX"
    assert "ld.global.v4.b32" in ptx or "cp.async" in ptx
    ptx_type = {"HALF": "f16", "BF16": "bf16", "FLOAT": "f32"}
    # Y is rounded to X's 16-bit type (fp32: not at all), and a 16-bit W is widened to FP32.
    rounded_to = {t for t in ("f16", "bf16") if re.search(rf"cvt\.rn\.{t}(x2)?\.f32", ptx)}
    assert rounded_to == {ptx_type[io]} - {"f32"}
    assert w == "FLOAT" or f"cvt.f32.{ptx_type[w]}" in ptx

    rows_per_cta, block, smem = LAUNCH[hidden, 4 if io == "FLOAT" else 2]
    assert launch.block_x.expr.get_constant_value() == block
    assert re.search(rf"\.reqntid {block}, 1, 1", ptx)
    assert launch.shared_mem.expr.get_constant_value() == smem
    for name_ in ("grid_y", "grid_z", "block_y", "block_z"):
        assert getattr(launch, name_).expr.get_constant_value() == 1
    for tokens in (1, 2, 37, 128, 511, 512):
        assert launch.grid_x.expr.evaluate(num_tokens=tokens) == -(-tokens // rows_per_cta)
    assert extra.nbSymExprs == 1
    assert extra[0].dtype == trt.PluginArgDataType.INT32 and extra[0].type == trt.PluginArgType.INT
    assert [extra[0].expr.evaluate(num_tokens=n) for n in (1, 37, 512)] == [1, 37, 512]


# The fused op's launch shapes, by (hidden, bytes per X element), derived as LAUNCH above but with R
# staged beside X: hidden 1024 keeps its rows in registers (2 KB and 4 KB rows), so its launch is
# the plain op's; hidden 4096, 16-bit, and 2048, fp32, stage X and R (2 x 8192 bytes) plus 4 bytes
# x 8 warps. hidden 12288, 16-bit (24 KB rows): 1536 vectors, 8 per thread -> 192 threads; staging
# X and R would take 48 KB + 24 bytes, more than an AOT launch gets, so both rows stay in registers
# and only 4 bytes x 6 warps remain.
FUSED_LAUNCH = {(1024, 2): (2, 128, 16), (1024, 4): (1, 128, 16),
                (4096, 2): (1, 256, 2 * 8192 + 32), (2048, 4): (1, 256, 2 * 8192 + 32),
                (12288, 2): (1, 192, 24)}
FUSED_CASES = ([(1024, io, "FLOAT") for io in TYPES]
               + [(1024, "HALF", "BF16"), (4096, "BF16", "FLOAT"), (2048, "FLOAT", "HALF"),
                  (12288, "HALF", "FLOAT")])


@pytest.mark.parametrize("hidden, io, w", FUSED_CASES)
def test_tensorrt_plugin_builds_the_fused_aot_op(trtp, hidden, io, w):
    """rms_norm_cutedsl::add_rms_norm: (X, R, W) -> (Y, S), both outputs X's shape and dtype, X,
    R, Y and S of one dtype, and a PTX entry with R and S in TensorRT's order (inputs,
    num_tokens, outputs)."""
    trt, package = trtp
    io_type, w_type = getattr(trt.DataType, io), getattr(trt.DataType, w)
    plugin = built_aot_plugin(trt, package, EPS, residual=True)
    built = build(trt, plugin, hidden, io_type, w_type=w_type, residual=True)
    out_dims, formats, launch, extra, (name, ptx) = built

    assert len(out_dims) == 2, "Y and S"
    for dims in out_dims:
        assert dims[1].is_constant() and dims[1].get_constant_value() == hidden
        assert not dims[0].is_constant()
    combos = {tuple(d.type for d in formats[i:i + 5]) for i in range(0, len(formats), 5)}
    assert combos == {tuple(getattr(trt.DataType, t) for t in (x, x, w_, x, x))
                      for x in TYPES for w_ in TYPES}
    assert {d.format for d in formats} == {trt.TensorFormat.LINEAR}

    ptx = ptx.decode()
    (entry,) = re.findall(rf"^\.visible \.entry {name}\(([^)]*)\)", ptx, re.M)
    assert re.findall(r"\.param \.(\w+)", entry) == ["u64", "u64", "u64", "u32", "u64", "u64"]
    assert name.count("_residual") == 1, "the residual form's plan"
    assert re.search(r"^\.version 8\.0$", ptx, re.M) and f32_literal(EPS) in ptx

    rows_per_cta, block, smem = FUSED_LAUNCH[hidden, 4 if io == "FLOAT" else 2]
    staged = smem > 2 * 8192
    assert ("cp.async" in ptx) == staged, "rows staged exactly where the shared memory says so"
    assert launch.block_x.expr.get_constant_value() == block
    assert re.search(rf"\.reqntid {block}, 1, 1", ptx)
    assert launch.shared_mem.expr.get_constant_value() == smem
    for tokens in (1, 37, 512):
        assert launch.grid_x.expr.evaluate(num_tokens=tokens) == -(-tokens // rows_per_cta)
    assert extra.nbSymExprs == 1 and extra[0].dtype == trt.PluginArgDataType.INT32
    assert extra[0].expr.evaluate(num_tokens=37) == 37


def test_the_fused_op_refuses_an_r_of_another_hidden_size(trtp):
    """The kernel reads R with X's row layout: an R of another hidden size would be read out of
    bounds."""
    trt, package = trtp
    plugin = built_aot_plugin(trt, package, EPS, residual=True)
    builder = trt.IExprBuilder()
    r_dims = trt.DimsExprs([trt_qdp_double.SymbolicDim("num_tokens"), builder.constant(512)])
    refusal = r"add_rms_norm: R must have X's shape \[num_tokens, 1024\]"
    with pytest.raises(ValueError, match=refusal):
        build(trt, plugin, 1024, trt.DataType.HALF, residual=True, r_shape=r_dims)


def test_a_dynamic_hidden_size_is_refused(trtp):
    trt, package = trtp
    plugin = built_aot_plugin(trt, package, EPS)
    dynamic = trt.DimsExprs([trt_qdp_double.SymbolicDim("num_tokens"),
                             trt_qdp_double.SymbolicDim("hidden")])
    with pytest.raises(ValueError, match="hidden dimension must be static"):
        build(trt, plugin, 1024, trt.DataType.HALF, x_shape=dynamic)


@pytest.mark.parametrize("op, attrs", [(aot.OP_NAME, ["epsilon"]), (aot.FUSED_OP_NAME, ["epsilon"]),
                                       (aot.FP8_OP_NAME, ["epsilon", "y_scale"]),
                                       (aot.FUSED_FP8_OP_NAME, ["epsilon", "y_scale"])])
def test_every_registered_attribute_reaches_aot_impl(trtp, op, attrs):
    """get_launch_params passes all registered attributes positionally: the lists must stay
    equal."""
    trt, package = trtp
    definition = package._lib.QDP_REGISTRY[op]
    assert (list(definition.input_attrs) == definition.aot_impl_attr_names
            == definition.autotune_attr_names)
    assert list(definition.input_attrs) == attrs


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "fused"])
def test_the_epsilon_attribute_reaches_the_kernel_as_float32(trtp, residual):
    trt, package = trtp
    plugin = built_aot_plugin(trt, package, 0.1, residual)
    _, _, _, _, (_, ptx) = build(trt, plugin, 1024, trt.DataType.HALF, residual=residual)
    assert f32_literal(0.1) in ptx.decode()


def test_tensorrt_10_8_is_refused_with_the_version_needed(bindings_wheels, monkeypatch):
    """10.8 has tensorrt.plugin but no aot_impl: one sentence naming 10.9, before any build."""
    trt = trt_qdp_double.make_tensorrt("10.8.0.43", aot=False)
    load_tensorrt_plugin(bindings_wheels("10.8.0.43"), trt, monkeypatch)
    with pytest.raises(sample.UsageError, match=r"TensorRT 10\.8\.0\.43 .*10\.9 or newer"):
        aot.check_aot_support()


# The FP8 ops: Y as FP8 E4M3 of y / y_scale, launched as the other ops (Y is not staged: same plan).
Y_SCALE = 0.375  # 1 / y_scale = 8 / 3, not a power of two: an immediate only this form's PTX holds
FP8_CASES = [(1024, "HALF", "FLOAT"), (1024, "BF16", "BF16"), (1024, "FLOAT", "HALF"),
             (4096, "HALF", "FLOAT"), (2048, "FLOAT", "FLOAT")]


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("hidden, io, w", FP8_CASES)
def test_tensorrt_plugin_builds_the_fp8_aot_ops(trtp, residual, hidden, io, w):
    """rms_norm_fp8: (X, W) -> Y in FP8; add_rms_norm_fp8: (X, R, W) -> (Y in FP8, S in X's dtype).
    Y is FP8 in every format combination, stored by the saturating E4M3 cvt, y_scale baked in."""
    trt, package = trtp
    io_type, w_type, fp8 = getattr(trt.DataType, io), getattr(trt.DataType, w), trt.DataType.FP8
    plugin = built_aot_plugin(trt, package, EPS, residual, y_scale=Y_SCALE)
    built = build(trt, plugin, hidden, io_type, w_type=w_type, residual=residual, y_type=fp8)
    out_dims, formats, launch, extra, (name, ptx) = built

    assert len(out_dims) == (2 if residual else 1)
    for dims in out_dims:
        assert dims[1].is_constant() and dims[1].get_constant_value() == hidden
        assert not dims[0].is_constant()
    width = 5 if residual else 3
    combos = {tuple(d.type for d in formats[i:i + width]) for i in range(0, len(formats), width)}
    dtype = {name_: getattr(trt.DataType, name_) for name_ in TYPES}
    if residual:
        expected = {(dtype[x], dtype[x], dtype[w_], fp8, dtype[x]) for x in TYPES for w_ in TYPES}
    else:
        expected = {(dtype[x], dtype[w_], fp8) for x in TYPES for w_ in TYPES}
    assert combos == expected, "X (R, S) of one dtype, any W, Y FP8: nine combinations"
    assert {d.format for d in formats} == {trt.TensorFormat.LINEAR}

    ptx = ptx.decode()
    (entry,) = re.findall(rf"^\.visible \.entry {name}\(([^)]*)\)", ptx, re.M)
    pointers = ["u64"] * (3 if residual else 2) + ["u32"] + ["u64"] * (2 if residual else 1)
    assert re.findall(r"\.param \.(\w+)", entry) == pointers
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert f32_literal(1 / Y_SCALE) in ptx and f32_literal(EPS) in ptx, "both baked in"
    assert re.search(rf"^\.target {ARCH}\b", ptx, re.M)
    assert re.search(r"^\.version 8\.0$", ptx, re.M)

    table = FUSED_LAUNCH if residual else LAUNCH
    rows_per_cta, block, smem = table[hidden, 4 if io == "FLOAT" else 2]
    assert launch.block_x.expr.get_constant_value() == block
    assert launch.shared_mem.expr.get_constant_value() == smem
    for tokens in (1, 37, 512):
        assert launch.grid_x.expr.evaluate(num_tokens=tokens) == -(-tokens // rows_per_cta)
    assert extra.nbSymExprs == 1 and extra[0].dtype == trt.PluginArgDataType.INT32
    assert extra[0].expr.evaluate(num_tokens=37) == 37


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "fused"])
def test_the_fp8_ops_refuse_a_gpu_without_fp8_in_one_sentence(bindings_wheels, monkeypatch,
                                                              residual):
    """Registered for sm_80, the FP8 op's aot_impl refuses with one sentence naming sm_89 (a build
    on such a GPU stops before this: build_aot_engine asks check_aot_arch first)."""
    trt, package = registered(bindings_wheels(PINNED), PINNED, "sm_80", monkeypatch)
    plugin = built_aot_plugin(trt, package, EPS, residual, y_scale=Y_SCALE)
    sentence = (r"^the FP8 form \(--y-scale\) needs sm_89 or newer, which convert to FP8 in "
                r"hardware, got sm_80$")
    with pytest.raises(sample.UsageError, match=sentence):
        build(trt, plugin, 1024, trt.DataType.HALF, residual=residual, y_type=trt.DataType.FP8)


@pytest.mark.parametrize("y_scale", [0.5, None], ids=["fp8", "plain"])
def test_build_aot_engine_refuses_the_fp8_form_on_sm_80_before_building(bindings_wheels,
                                                                         monkeypatch, y_scale):
    """On a GPU without FP8, build_aot_engine refuses the FP8 op in one sentence before it registers
    an op or makes a network (TensorRT would only log aot_impl's error); the plain op builds on."""
    trt, _ = registered(bindings_wheels(PINNED), PINNED, ARCH, monkeypatch)
    monkeypatch.setattr(sample, "gpu_arch", lambda: "sm_80")  # double: there is no GPU to ask

    def register_aot_op(arch):  # double: the first step of a build
        raise RuntimeError(f"building for {arch}")

    monkeypatch.setattr(aot, "register_aot_op", register_aot_op)
    if y_scale is None:
        expected = (RuntimeError, "building for sm_80")
    else:
        expected = (sample.UsageError, "the FP8 form")
    with pytest.raises(expected[0], match=expected[1]):
        aot.build_aot_engine(1024, "float16", 1, 128, 512, 1e-5, y_scale=y_scale)
