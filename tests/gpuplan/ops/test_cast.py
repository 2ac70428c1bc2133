"""Cast plans (f32, f64, f16, bf16, int32, int64 to each other) against the family's exact
reference (gpuplan.ops.cast.reference) and float64, on host and device."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.cast.reference import cast_reference
from gpuplan.testing import assert_close, assert_rejected, f64, on, random, run_plan, stream_for

CAST_DTYPES = [pytest.param(np.dtype(d), id=gp.dtypes.short_name(d))
               for d in gp.FLOAT_DTYPES + (np.int32, np.int64)]


@pytest.mark.parametrize("src", CAST_DTYPES)
@pytest.mark.parametrize("dst", CAST_DTYPES)
def test_cast(device, src, dst):
    n = 1031
    vals = random((n,), np.float64, low=-100, high=100)
    x = np.trunc(vals).astype(src) if src.kind == "i" else vals.astype(src)
    y = on(device, np.full((n,), 7, dst))
    run_plan(gp.CastPlan, gp.CastDescriptor(n, src, dst), gp.CastArgs(on(device, x), y), device)
    expect = cast_reference(x, dst)
    if dst.kind == "i":  # truncation toward zero is exact
        np.testing.assert_array_equal(gp.to_host(y), expect)
    else:  # rounded once to nearest even: bit for bit, and within the dtype's tolerance
        np.testing.assert_array_equal(gp.to_host(y).view(np.uint8), expect.view(np.uint8))
        assert_close(y, f64(x), dst)


def test_empty_extents(device, monkeypatch):
    """numel 0: `run` returns before any kernel or NumPy body (both replaced by a failure)."""
    def launched(*_):
        raise AssertionError("CastPlan launched an empty problem")

    for name in dir(gp.CastPlan):
        if name.startswith("_run_"):
            monkeypatch.setattr(gp.CastPlan, name, launched)
    z = on(device, np.zeros((0,), np.float32))
    run_plan(gp.CastPlan, gp.CastDescriptor(0, np.float32, gp.bfloat16),
             gp.CastArgs(z, z.astype(gp.bfloat16)), device)


def test_descriptor_errors():
    s = gp.Stream.host()
    with pytest.raises(gp.Unsupported, match="'out_dtype'"):
        gp.CastPlan.select(s, gp.CastDescriptor(3, np.float32, np.int8))
    with pytest.raises(gp.Unsupported, match="cast: argument 'dtype'"):
        gp.CastPlan.select(s, gp.CastDescriptor(3, np.uint8, np.float32))
    with pytest.raises(gp.InvalidProblem, match="'numel'"):
        gp.CastPlan.select(s, gp.CastDescriptor(-1))


def test_argument_errors_leave_outputs_untouched(device):
    s = stream_for(device)
    x = on(device, random((8,), np.float32))
    cast = gp.CastPlan.select(s, gp.CastDescriptor(8, np.float32, gp.bfloat16))
    out = on(device, np.zeros((8,), gp.bfloat16))
    none = gp.Workspace.none()
    assert_rejected(lambda: cast.run(s, none, gp.CastArgs(x, out.astype(np.float16))),
                    gp.Unsupported, [out], "cast", "'y'", "bf16", "f16")
    assert_rejected(lambda: cast.run(s, none, gp.CastArgs(x.astype(np.float64), out)),
                    gp.Unsupported, [out], "cast", "'x'", "f32", "f64")
    assert_rejected(lambda: cast.run(s, none, gp.CastArgs(x, out[:7])),
                    gp.BufferTooSmall, [out], "'y'", "8", "7")


def test_functional_api(device):
    x = on(device, random((3, 5, 7), gp.bfloat16))
    y = gp.functional.cast(x.transpose(2, 0, 1), np.float32)  # strided input made contiguous
    assert y.shape == (7, 3, 5) and y.dtype == np.float32 and gp.device_of(y) == device
    np.testing.assert_array_equal(gp.to_host(y), f64(x).transpose(2, 0, 1))


def test_cast_to_bf16_rounds_once(device):
    """f64 and integers to bf16: nearest even of the exact value (NumPy's astype goes through
    f32 and rounds twice; the kernel's __double2bfloat16 / __ll2bfloat16_rn round once)."""
    x = np.array([1 + 2**-8 + 2**-40, -(1 + 2**-8 + 2**-40), 2.0**-140, 1e40])
    got = gp.to_host(gp.functional.cast(on(device, x), gp.bfloat16)).astype(np.float64)
    np.testing.assert_array_equal(got, [1.0078125, -1.0078125, 0.0, np.inf])
    i = np.array([2**24 + 2**16 + 1, -(2**30 + 2**22 + 1)], np.int32)
    got = gp.to_host(gp.functional.cast(on(device, i), gp.bfloat16)).astype(np.float64)
    np.testing.assert_array_equal(got, [2**24 + 2**17, -(2**30 + 2**23)])
    j = np.array([2**40 + 2**32 + 1, 2**62 + 2**54 + 1], np.int64)
    got = gp.to_host(gp.functional.cast(on(device, j), gp.bfloat16)).astype(np.float64)
    np.testing.assert_array_equal(got, [2.0**40 + 2.0**33, 2.0**62 + 2.0**55])
