"""GEMM plans and gpuplan.functional.matmul against float64 NumPy references, host and device."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.gemm.reference import assert_gemm_close, gemm_operands, gemm_reference
from gpuplan.testing import assert_rejected, check_plan, f64, on, random, run_plan, stream_for, tol
from tests.helpers import DTYPES

SHAPES = [(1, 1, 1), (17, 33, 65), (129, 7, 300), (136, 264, 72)]  # (m, n, k)
TRANS = [(False, False), (False, True), (True, False), (True, True)]
TRANS_IDS = ["nn", "nt", "tn", "tt"]


def backends(device: str) -> list[gp.BackendKind | None]:
    """Every SKU to check: the host SKU on cpu, both device SKUs on cuda, ours (no cuBLAS
    there) on the emulated device."""
    if device == "cpu":
        return [None]
    if gp.backend.resolve_device(device) == "emulated":
        return [gp.BackendKind.NVRTC]
    return [gp.BackendKind.CUBLAS, gp.BackendKind.NVRTC]


def check_all_skus(device: str, desc: gp.GemmDescriptor, seed: int = 0, alpha: float = 1.0,
                   beta: float = 0.0) -> None:
    a, b, c0, bias = gemm_operands(desc, seed)
    expected = gemm_reference(desc, a, b, c0, bias, alpha, beta)
    for be in backends(device):
        c = on(device, c0.copy())
        plan = run_plan(gp.GemmPlan, desc, gp.GemmArgs(on(device, a), on(device, b), c,
                                                       on(device, bias), alpha=alpha,
                                                       beta=beta), device,
                        gp.PlanPreference(backend=be))
        assert plan.precision_guarantee().deterministic
        assert_gemm_close(c, expected, desc, c0, bias, beta=beta)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("trans_a,trans_b", TRANS, ids=TRANS_IDS)
def test_matches_reference(device, dtype, m, n, k, trans_a, trans_b):
    check_all_skus(device, gp.GemmDescriptor(m, n, k, trans_a=trans_a, trans_b=trans_b,
                                             dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("broadcast", ["none", "a", "b", "both"])
@pytest.mark.parametrize("trans_a,trans_b", TRANS, ids=TRANS_IDS)
def test_batch_broadcast_alpha_beta_bias(device, dtype, broadcast, trans_a, trans_b):
    desc = gp.GemmDescriptor(
        23, 41, 37, batch=1 if broadcast == "both" else 3, trans_a=trans_a, trans_b=trans_b,
        has_bias=True, broadcast_a=broadcast in ("a", "both"),
        broadcast_b=broadcast in ("b", "both"), dtype=dtype)
    check_all_skus(device, desc, seed=7, alpha=-1.25, beta=0.75)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta,has_bias", [(0.0, True), (1.0, False), (-0.5, True)])
def test_beta_and_bias_epilogue(device, dtype, beta, has_bias):
    check_all_skus(device, gp.GemmDescriptor(40, 24, 16, batch=2, has_bias=has_bias,
                                             dtype=dtype), seed=11, alpha=0.5, beta=beta)


@pytest.mark.parametrize("dtype", DTYPES)
def test_beta_zero_never_reads_c(device, dtype):
    desc = gp.GemmDescriptor(9, 10, 11, batch=2, dtype=dtype)
    a, b, _, _ = gemm_operands(desc)
    for be in backends(device):
        c = on(device, np.full(desc.c_shape(), np.nan, dtype=dtype))
        run_plan(gp.GemmPlan, desc, gp.GemmArgs(on(device, a), on(device, b), c), device,
                 gp.PlanPreference(backend=be))
        assert np.all(np.isfinite(f64(c)))
        assert_gemm_close(c, gemm_reference(desc, a, b, None, None), desc)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta,has_bias", [(0.0, False), (0.5, True), (2.0, False)])
def test_k_zero_gives_beta_c_plus_bias(device, dtype, beta, has_bias):
    desc = gp.GemmDescriptor(5, 6, 0, batch=2, has_bias=has_bias, dtype=dtype)
    check_all_skus(device, desc, seed=3, beta=beta)


@pytest.mark.parametrize("m,n,batch", [(0, 4, 2), (3, 0, 2), (3, 4, 0)])
def test_empty_extents_leave_c_untouched(device, m, n, batch):
    desc = gp.GemmDescriptor(m, n, 5, batch=batch, has_bias=True)
    a, b, c0, bias = gemm_operands(desc)
    for be in backends(device):
        c = on(device, c0.copy())
        run_plan(gp.GemmPlan, desc, gp.GemmArgs(on(device, a), on(device, b), c,
                                                on(device, bias), beta=1.0), device,
                 gp.PlanPreference(backend=be))
        np.testing.assert_array_equal(gp.to_host(c), c0)


def test_descriptor_errors():
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match="gemm: argument 'k'"):
        gp.GemmPlan.select(s, gp.GemmDescriptor(3, 4, -1))
    with pytest.raises(gp.InvalidProblem, match="argument 'batch'"):
        gp.GemmPlan.select(s, gp.GemmDescriptor(3, 4, 5, batch=2, broadcast_a=True,
                                                broadcast_b=True))
    with pytest.raises(gp.Unsupported, match="argument 'm'"):
        gp.GemmPlan.select(s, gp.GemmDescriptor(2**31, 4, 5))
    with pytest.raises(gp.Unsupported, match="argument 'dtype'.*i32"):
        gp.GemmPlan.select(s, gp.GemmDescriptor(3, 4, 5, dtype=np.int32))
    with pytest.raises(gp.Unsupported, match="nvrtc requested"):
        gp.GemmPlan.select(s, gp.GemmDescriptor(3, 4, 5),
                           gp.PlanPreference(backend=gp.BackendKind.NVRTC))
    with pytest.raises(gp.InvalidProblem, match="argument 'trans_a'"):
        gp.GemmPlan.select(s, gp.GemmDescriptor(3, 4, 5, trans_a="yes"))


def test_alpha_beta_are_run_arguments():
    """A new alpha or beta reuses the plan; a non-number is rejected at run, nothing written."""
    from gpuplan.execute import _PLANS
    s = gp.Stream.host()
    desc = gp.GemmDescriptor(3, 4, 5)
    a, b, c0, _ = gemm_operands(desc)
    plan = gp.GemmPlan.select(s, desc)
    for alpha, beta in ((-2, -1.0), (np.float32(0.5), 2), (3.0, 0.0)):
        c = c0.copy()
        plan.run(s, None, gp.GemmArgs(a, b, c, alpha=alpha, beta=beta))
        assert_gemm_close(c, gemm_reference(desc, a, b, c0, None, alpha, beta), desc, c0,
                          beta=beta)
    c = c0.copy()
    for bad in ("2", None, True):
        assert_rejected(lambda bad=bad: plan.run(s, None, gp.GemmArgs(a, b, c, alpha=bad)),
                        gp.InvalidProblem, [c], "gemm: argument 'alpha'", "a real number")
    assert_rejected(lambda: plan.run(s, None, gp.GemmArgs(a, b, c, beta=[1.0])),
                    gp.InvalidProblem, [c], "argument 'beta'")
    x = random((6, 5), np.float32)
    before = len(_PLANS)
    for alpha in (0.5, 0.25, -3.0):
        np.testing.assert_allclose(gp.functional.matmul(x, x, trans_b=True, alpha=alpha),
                                   alpha * (x @ x.T), rtol=1e-5, atol=1e-6)
    assert len(_PLANS) - before <= 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_spec_checks(device, dtype):
    """The declared operands' checks (gpuplan.testing.check_plan): dtype, short/long buffers,
    strided views, wrong side, missing bias, C overlapping an input; results against float64."""
    desc = gp.GemmDescriptor(6, 5, 4, batch=2, trans_b=True, has_bias=True, dtype=dtype)
    a, b, c0, bias = gemm_operands(desc, seed=4)

    def reference(a, b, c, bias, alpha, beta):
        return {"c": gemm_reference(desc, a, b, c, bias, alpha, beta)}


    check_plan(gp.GemmPlan, desc, dict(a=a, b=b, c=c0, bias=bias, alpha=0.5, beta=-1.0),
               reference, device=device, scale=4, pref=gp.PlanPreference(
                   backend=None if device == "cpu" else gp.BackendKind.NVRTC))


def test_argument_errors_leave_c_untouched(device):
    s = stream_for(device)
    desc = gp.GemmDescriptor(6, 5, 4, batch=2, has_bias=True, dtype=np.float32)
    a, b, c0, bias = (on(device, x) for x in gemm_operands(desc))
    c = on(device, c0.copy())
    plan = gp.GemmPlan.select(s, desc)

    def run(**kw):
        args = dict(a=a, b=b, c=c, bias=bias) | kw
        return lambda: plan.run(s, gp.Workspace.none(), gp.GemmArgs(**args))

    assert_rejected(run(a=a.astype(np.float64)), gp.Unsupported, [c], "gemm", "'a'", "f32",
                    "f64")
    assert_rejected(run(bias=bias.astype(np.float16)), gp.Unsupported, [c], "'bias'", "f16")
    assert_rejected(run(b=b[:, :3]), gp.BufferTooSmall, [c], "'b'", "40", "30")
    assert_rejected(run(a=a.reshape(2, 4, 6)), gp.InvalidProblem, [c], "'a'", "(2, 6, 4)",
                    "(2, 4, 6)")
    assert_rejected(run(c=on(device, np.zeros((2, 6, 10), np.float32))[:, :, ::2]),
                    gp.InvalidProblem, [c], "'c'", "contiguous")
    assert_rejected(run(bias=None), gp.InvalidProblem, [c], "'bias'", "an array")
    assert_rejected(run(c=a[:, :, :1].copy()), gp.BufferTooSmall, [c], "'c'", "60")
    if device == "cuda":
        assert_rejected(run(b=gp.to_host(b)), gp.InvalidProblem, [c], "'b'", "device")


def test_bias_without_has_bias_and_aliasing_are_rejected():
    s = gp.Stream.host()
    desc = gp.GemmDescriptor(4, 4, 4, batch=1)
    a, b, c, _ = gemm_operands(desc)
    plan = gp.GemmPlan.select(s, desc)
    assert_rejected(lambda: plan.run(s, None, gp.GemmArgs(a, b, c, np.zeros(4, np.float32))),
                    gp.InvalidProblem, [c], "'bias'", "absent")
    assert_rejected(lambda: plan.run(s, None, gp.GemmArgs(c, b, c)), gp.InvalidProblem, [c],
                    "'c'", "distinct", "'a'")


def test_host_sku_and_preferences():
    s = gp.Stream.host()
    desc = gp.GemmDescriptor(3, 4, 5, dtype=gp.bfloat16)
    plan = gp.GemmPlan.select(s, desc, gp.PlanPreference(deterministic=True,
                                                         max_workspace_bytes=0))
    sku = plan.sku()
    assert (sku.op, sku.dtype, sku.backend, sku.variant) == (
        "gemm", "bf16", gp.BackendKind.NUMPY, "numpy")
    g = plan.precision_guarantee()
    assert (g.math_precision, g.accumulator, g.deterministic) == ("bf16", "f32", True)
    assert plan.workspace_size() == 0
    with pytest.raises(gp.Unsupported, match="cublas requested"):
        gp.GemmPlan.select(s, desc, gp.PlanPreference(backend=gp.BackendKind.CUBLAS))


# -- functional ---------------------------------------------------------------------------

FUNCTIONAL_CASES = [  # (a shape, b shape, trans_a, trans_b)
    ((7, 5), (5, 3), False, False),
    ((5, 7), (3, 5), True, True),
    ((4, 7, 5), (5, 3), False, False),   # folded into one [28, 5] @ [5, 3]
    ((4, 5, 7), (5, 3), True, False),
    ((7, 5), (4, 5, 3), False, False),
    ((4, 7, 5), (4, 3, 5), False, True),
    ((2, 3, 7, 5), (2, 3, 5, 6), False, False),
    ((2, 3, 7, 5), (6, 5), False, True),
    ((0, 7, 5), (5, 3), False, False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_shape,b_shape,trans_a,trans_b", FUNCTIONAL_CASES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_functional_matmul(device, dtype, a_shape, b_shape, trans_a, trans_b, with_bias):
    a = random(a_shape, dtype, seed=1)
    b = random(b_shape, dtype, seed=2)
    n = b_shape[-2] if trans_b else b_shape[-1]
    bias = random((n,), dtype, seed=3) if with_bias else None
    out = gp.functional.matmul(on(device, a), on(device, b), trans_a=trans_a, trans_b=trans_b,
                               alpha=0.5, bias=on(device, bias))
    a64 = np.swapaxes(f64(a), -1, -2) if trans_a else f64(a)
    b64 = np.swapaxes(f64(b), -1, -2) if trans_b else f64(b)
    expected = 0.5 * np.matmul(a64, b64) + (0 if bias is None else f64(bias))
    assert gp.device_of(out) == device and out.dtype == dtype
    assert out.shape == expected.shape
    k = a_shape[-2] if trans_a else a_shape[-1]
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(f64(out), expected, rtol=2 * rtol, atol=atol * math.sqrt(k))


def test_functional_matmul_errors():
    a = random((4, 5), np.float32)
    with pytest.raises(gp.InvalidProblem, match="matmul: argument 'b'.*contraction"):
        gp.functional.matmul(a, random((6, 3), np.float32))
    with pytest.raises(gp.InvalidProblem, match="batch axes"):
        gp.functional.matmul(random((2, 4, 5), np.float32), random((3, 5, 6), np.float32))
    with pytest.raises(gp.Unsupported, match="argument 'b'.*f64"):
        gp.functional.matmul(a, random((5, 3), np.float64))
    with pytest.raises(gp.InvalidProblem, match="argument 'a'.*rank"):
        gp.functional.matmul(random((5,), np.float32), random((5, 3), np.float32))
    with pytest.raises(gp.InvalidProblem, match="argument 'bias'"):
        gp.functional.matmul(a, random((5, 3), np.float32), bias=random((4,), np.float32))


def test_functional_accepts_strided_views():
    a = random((5, 8), np.float64)[:, ::2]  # non-contiguous [5, 4]
    b = random((4, 3), np.float64)
    np.testing.assert_allclose(gp.functional.matmul(a, b), a @ b, rtol=1e-12)


# -- device-only behaviour -----------------------------------------------------------------


@pytest.mark.gpu
def test_device_sku_selection_and_guarantees():
    s = gp.Stream.current()
    for dtype in (np.float32, np.float64, np.float16, gp.bfloat16):
        desc = gp.GemmDescriptor(64, 64, 64, dtype=dtype)
        default = gp.GemmPlan.select(s, desc)
        if s.is_emulated:  # no cuBLAS there: our kernels are the default
            assert default.sku().variant == "tiled"
            with pytest.raises(gp.Unsupported, match="cuBLAS does not run on the emulated"):
                gp.GemmPlan.select(s, desc, gp.PlanPreference(backend=gp.BackendKind.CUBLAS))
        else:
            assert default.sku().variant == "cublas"
            assert not default.precision_guarantee().bit_stable
        assert default.precision_guarantee().deterministic
        tiled = gp.GemmPlan.select(s, desc, gp.PlanPreference(backend=gp.BackendKind.NVRTC))
        g = tiled.precision_guarantee()
        assert tiled.sku().variant == "tiled" and g.deterministic
        assert g.bit_stable == (np.dtype(dtype).itemsize >= 4)
        assert g.accumulator == ("f32" if np.dtype(dtype).itemsize <= 4 else "f64")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trans_a,trans_b", TRANS, ids=TRANS_IDS)
def test_tiled_unaligned_operands_use_scalar_loads(dtype, trans_a, trans_b):
    # Operands starting one element into their buffer: not 16-byte aligned (scalar path).
    desc = gp.GemmDescriptor(136, 80, 64, batch=2, trans_a=trans_a, trans_b=trans_b,
                             has_bias=True, dtype=dtype)
    a, b, c0, bias = gemm_operands(desc, seed=5)
    a_buf = gp.to_device(np.concatenate([a.reshape(-1)[:1], a.reshape(-1)]), "cuda")
    b_buf = gp.to_device(np.concatenate([b.reshape(-1)[:1], b.reshape(-1)]), "cuda")
    a_dev = a_buf[1:].reshape(a.shape)
    b_dev = b_buf[1:].reshape(b.shape)
    c = on("cuda", c0.copy())
    run_plan(gp.GemmPlan, desc, gp.GemmArgs(a_dev, b_dev, c, on("cuda", bias), alpha=2.0,
                                            beta=-1.0), "cuda",
             gp.PlanPreference(backend=gp.BackendKind.NVRTC))
    assert_gemm_close(c, gemm_reference(desc, a, b, c0, bias, 2.0, -1.0), desc, c0, bias,
                      beta=-1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_tiled_is_deterministic_and_close_to_cublas(dtype, accelerator):
    emulated = accelerator == "emulated"
    # the emulated device runs every thread on the CPU: a smaller problem, no cuBLAS
    desc = gp.GemmDescriptor(*((130, 136, 72) if emulated else (300, 520, 1000)), batch=2,
                             broadcast_b=True, dtype=dtype)
    a, b, c0, _ = (on(accelerator, x) for x in gemm_operands(desc, seed=9))
    outs = {}
    runs = (("t1", gp.BackendKind.NVRTC), ("t2", gp.BackendKind.NVRTC))
    for name, be in runs + (() if emulated else (("cublas", gp.BackendKind.CUBLAS),)):
        c = c0.copy()
        run_plan(gp.GemmPlan, desc, gp.GemmArgs(a, b, c), accelerator,
                 gp.PlanPreference(backend=be))
        outs[name] = gp.to_host(c)
    np.testing.assert_array_equal(outs["t1"].view(np.uint8), outs["t2"].view(np.uint8))
    assert_gemm_close(outs["t1"], gemm_reference(desc, gp.to_host(a), gp.to_host(b), None, None),
                      desc)
    if not emulated:
        assert_gemm_close(outs["cublas"], f64(outs["t1"]), desc)


@pytest.mark.gpu
def test_batch_beyond_grid_z_limit(monkeypatch):
    """More batch entries than grid z holds: the kernels loop over blockIdx.z in steps of
    gridDim.z. On a GPU with the real limit (65535); on the emulated device, where 70000
    emulated blocks take minutes, with the plan's cap lowered to 7, which runs the same
    loop (several entries per block, a last partial round) on 20 entries."""
    device = gp.backend.resolve_device("cuda")
    batch = 70000
    if device == "emulated":
        from gpuplan.ops.gemm import plans as gemm_plans

        monkeypatch.setattr(gemm_plans, "_GRID_YZ_MAX", 7)
        batch = 20
    desc = gp.GemmDescriptor(3, 5, 4, batch=batch, has_bias=True, dtype=np.float16)
    check_all_skus(device, desc, seed=13)


@pytest.mark.parametrize("alpha, beta", [(float("nan"), 0.0), (1.0, float("inf")),
                                         (np.float32("nan"), 0.0)])
def test_non_finite_alpha_beta_are_rejected(alpha, beta):
    """Some plans accepted NaN scales and others rejected them: now every one rejects."""
    x = np.ones((2, 3), np.float32)
    with pytest.raises(gp.InvalidProblem, match="a finite number"):
        gp.functional.matmul(x, x, trans_b=True, alpha=alpha) if beta == 0.0 else \
            gp.GemmPlan.select(gp.Stream.host(), gp.GemmDescriptor(2, 2, 3, trans_b=True)).run(
                gp.Stream.host(), None, gp.GemmArgs(x[None], x[None],
                                                    np.zeros((1, 2, 2), np.float32),
                                                    alpha=alpha, beta=beta))
