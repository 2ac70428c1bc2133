"""GEMM with an activation epilogue (C = f(alpha AB + beta C + bias), the pre-activation saved
on request) against float64 references, on every SKU of each device."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.activation.reference import gelu_reference
from gpuplan.ops.gemm.reference import (
    assert_gemm_close,
    gemm_epilogue_reference,
    gemm_operands,
    gemm_reference,
)
from gpuplan.ops.gemm.sku import EPILOGUE_ACTIVATIONS, EPILOGUES
from gpuplan.testing import check_plan, f64, on, random, run_plan
from tests.gpuplan.ops.test_gemm import TRANS, TRANS_IDS, backends
from tests.helpers import DTYPES


def check_epilogue(device: str, desc: gp.GemmDescriptor, seed: int, alpha: float = 1.0,
                   beta: float = 0.0) -> None:
    a, b, c0, bias = gemm_operands(desc, seed)
    c0 = 2 * c0  # a wider pre-activation: both sides of GELU's knee
    pre_want = gemm_reference(desc, a, b, c0, bias, alpha, beta)
    want = gemm_epilogue_reference(desc, pre_want)
    for be in backends(device):
        c = on(device, c0.copy())
        pre = on(device, np.full(desc.c_shape(), np.nan, desc.dtype)) if desc.save_preact \
            else None
        run_plan(gp.GemmPlan, desc, gp.GemmArgs(on(device, a), on(device, b), c,
                                                on(device, bias), preact=pre, alpha=alpha,
                                                beta=beta), device,
                 gp.PlanPreference(backend=be))
        assert_gemm_close(c, want, desc, c0, bias, what=f"gemm {desc.epilogue} {be}",
                          beta=beta, pre=pre_want)
        if pre is not None:
            assert_gemm_close(pre, pre_want, desc, c0, bias, what="preact", beta=beta)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("epilogue", EPILOGUE_ACTIVATIONS)
@pytest.mark.parametrize("trans_a,trans_b", TRANS, ids=TRANS_IDS)
def test_epilogue_matches_reference(device, dtype, epilogue, trans_a, trans_b):
    for i, (m, n, k, save) in enumerate([(17, 33, 65, True), (136, 40, 24, False)]):
        desc = gp.GemmDescriptor(m, n, k, batch=2, trans_a=trans_a, trans_b=trans_b,
                                 has_bias=True, dtype=dtype, epilogue=epilogue,
                                 save_preact=save)
        check_epilogue(device, desc, seed=i, alpha=1.5, beta=0.5 if i else 0.0)


@pytest.mark.parametrize("epilogue", EPILOGUE_ACTIVATIONS)
def test_k_zero_and_broadcast(device, epilogue):
    check_epilogue(device, gp.GemmDescriptor(5, 6, 0, batch=2, has_bias=True,
                                             epilogue=epilogue, save_preact=True), 3,
                   beta=0.5)
    check_epilogue(device, gp.GemmDescriptor(9, 7, 5, batch=3, broadcast_b=True,
                                             epilogue=epilogue, save_preact=True), 4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_spec_checks(device, dtype):
    """Declared operands: preact is checked like c (dtype, size, layout, side) and must be
    distinct from a, b, bias and c; results against float64."""
    desc = gp.GemmDescriptor(6, 5, 4, batch=2, has_bias=True, dtype=dtype,
                             epilogue="gelu_tanh", save_preact=True)
    a, b, c0, bias = gemm_operands(desc, seed=4)

    def reference(a, b, c, bias, preact, alpha, beta):
        pre = gemm_reference(desc, a, b, c, bias, alpha, beta)
        return {"c": gelu_reference(pre, "tanh"), "preact": pre}

    check_plan(gp.GemmPlan, desc, dict(a=a, b=b, c=c0, bias=bias, alpha=0.5, beta=-1.0),
               reference, device=device, scale=4, pref=gp.PlanPreference(
                   backend=None if device == "cpu" else gp.BackendKind.NVRTC))


def test_descriptor_errors():
    s = gp.Stream.host()
    assert EPILOGUES == ("none", *EPILOGUE_ACTIVATIONS)
    with pytest.raises(gp.Unsupported, match="gemm: argument 'epilogue'"):
        gp.GemmPlan.select(s, gp.GemmDescriptor(3, 4, 5, epilogue="relu"))
    with pytest.raises(gp.InvalidProblem, match="argument 'save_preact'"):
        gp.GemmPlan.select(s, gp.GemmDescriptor(3, 4, 5, save_preact=True))
    plan = gp.GemmPlan.select(s, gp.GemmDescriptor(3, 4, 5, broadcast_a=True,
                                                   broadcast_b=True, epilogue="gelu"))
    a, b = random((3, 5), np.float32), random((5, 4), np.float32)
    with pytest.raises(gp.InvalidProblem, match="argument 'preact'"):
        plan.run(s, None, gp.GemmArgs(a, b, np.zeros((3, 4), np.float32),
                                      preact=np.zeros((3, 4), np.float32)))


@pytest.mark.parametrize("epilogue", EPILOGUE_ACTIVATIONS)
@pytest.mark.parametrize("shapes", [((7, 5), (5, 3)), ((4, 7, 5), (5, 3)),
                                    ((2, 7, 5), (2, 5, 3))])
def test_functional_matmul_epilogue(device, epilogue, shapes):
    a, b = random(shapes[0], np.float64, seed=1), random(shapes[1], np.float64, seed=2)
    bias = random((3,), np.float64, seed=3)
    out, pre = gp.functional.matmul(on(device, a), on(device, b), bias=on(device, bias),
                                    epilogue=epilogue, save_preact=True)
    want = np.matmul(a, b) + bias
    assert out.shape == pre.shape == want.shape
    np.testing.assert_allclose(f64(pre), want, rtol=1e-13, atol=1e-13)
    approximate = "tanh" if epilogue == "gelu_tanh" else "none"
    np.testing.assert_allclose(f64(out), gelu_reference(want, approximate), rtol=1e-13,
                               atol=1e-13)
    alone = gp.functional.matmul(on(device, a), on(device, b), bias=on(device, bias),
                                 epilogue=epilogue)
    np.testing.assert_allclose(f64(alone), f64(out), rtol=1e-15, atol=0)


@pytest.mark.parametrize("epilogue", EPILOGUE_ACTIVATIONS)
def test_host_fused_equals_composed_bitwise_in_f64(epilogue):
    """f64 on the host: the fused GEMM is bit for bit the GEMM then the activation plan."""
    a, b, bias = random((9, 6), np.float64), random((6, 5), np.float64), random((5,),
                                                                                np.float64)
    F = gp.functional
    fused = F.matmul(a, b, bias=bias, epilogue=epilogue)
    composed = F.unary(epilogue, F.matmul(a, b, bias=bias))
    np.testing.assert_array_equal(fused, composed)
