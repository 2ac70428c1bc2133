"""The plan framework itself: streams, workspaces, preferences, SKUs, errors and checks."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

import gpuplan as gp
from gpuplan import backend
from gpuplan.execute import cached_plan, clear_plan_cache, execute
from gpuplan.plan import Candidate, check_dtype, check_operand, host_candidate
from gpuplan.spec import DType, Extent, Flag, In, Index, OpSpec, Out
from gpuplan.testing import assert_rejected

# -- a tiny test-only plan family: y = 2 * x, one SKU staging through the workspace ------------


DOUBLE = OpSpec(
    "double_test",
    fields=(Extent("n"), DType("dtype", (np.float32, np.float64), default=np.float32),
            Flag("allow_plain", default=True),
            Index("padding_idx", default=None)),  # a signed field: may be negative
    operands=(In("x", ("n",)), Out("y", ("n",))),
)
DoubleDescriptor = DOUBLE.descriptor("DoubleDescriptor")
DoubleArgs = DOUBLE.args("DoubleArgs")


class DoublePlan(gp.Plan):
    """SKUs: 'staged' (non-deterministic by declaration, 256 workspace bytes) and 'plain'."""

    op = "double_test"
    category = "test"
    spec = DOUBLE
    STAGED_BYTES = 256

    @classmethod
    def _candidates(cls, desc: Any, stream: gp.Stream) -> list[Candidate]:
        kind = gp.BackendKind.NUMPY if stream.is_host else gp.BackendKind.NVRTC
        cands = [Candidate("staged", kind, False, False, "f32", "f32", cls.STAGED_BYTES)]
        if desc.allow_plain:
            cands.append(Candidate("plain", kind, True, True, "f32", "f32"))
        return cands

    def _run_staged(self, stream: gp.Stream, ws: gp.Workspace, args: DoubleArgs) -> None:
        tmp = ws.view(args.x.dtype, min(args.x.size, ws.nbytes // args.x.dtype.itemsize))
        for start in range(0, args.x.size, tmp.size):
            chunk = args.x[start:start + tmp.size]
            tmp[:chunk.size] = chunk
            args.y[start:start + chunk.size] = 2 * tmp[:chunk.size]

    def _run_plain(self, stream: gp.Stream, ws: gp.Workspace, args: DoubleArgs) -> None:
        args.y[...] = 2 * args.x


def _run(desc, pref=None, ws=None, x=None, y=None):
    s = gp.Stream.host()
    plan = DoublePlan.select(s, desc, pref)
    x = np.arange(desc.n, dtype=desc.dtype) if x is None else x
    y = np.zeros(desc.n, desc.dtype) if y is None else y
    ws = gp.Workspace.allocate(s, plan.workspace_size()) if ws is None else ws
    plan.run(s, ws, DoubleArgs(x, y))
    return plan, y


# -- streams and workspaces --------------------------------------------------------------------


def test_host_stream():
    s = gp.Stream.host()
    assert s is gp.Stream.host() and s.is_host and s.cuda_stream is None
    assert s.arch == "host" and s.device_id is None and repr(s) == "Stream.host()"
    s.synchronize()  # a no-op, not an error
    assert gp.Stream.for_array(np.zeros(3)) == s


def test_current_stream_without_a_gpu_is_host(monkeypatch):
    monkeypatch.setattr(backend, "device_available", lambda: False)
    assert gp.Stream.current() is gp.Stream.host()


def test_workspace_allocate_and_none():
    s = gp.Stream.host()
    none = gp.Workspace.none()
    assert none.nbytes == 0 and none.buffer is None
    assert gp.Workspace.allocate(s, 0).buffer is None
    ws = gp.Workspace.allocate(s, 100)
    assert ws.nbytes == 100 and ws.buffer.dtype == np.uint8 and ws.buffer.size == 100
    v = ws.view(np.float32, 5, offset_bytes=8)
    v[:] = 1.5
    assert v.shape == (5,) and np.all(ws.view(np.float32, 7)[2:7] == 1.5)
    with pytest.raises(gp.InvalidProblem, match="Workspace.allocate: argument 'nbytes'"):
        gp.Workspace.allocate(s, -1)


def test_workspace_too_small_is_rejected_and_outputs_untouched():
    s = gp.Stream.host()
    plan = DoublePlan.select(s, DoubleDescriptor(10))
    assert plan.sku().variant == "staged" and plan.workspace_size() == 256
    x, y = np.ones(10, np.float32), np.full(10, 7, np.float32)
    for ws in (gp.Workspace.none(), gp.Workspace.allocate(s, 255), None):
        assert_rejected(lambda ws=ws: plan.run(s, ws, DoubleArgs(x, y)), gp.WorkspaceTooSmall,
                        [y], "double_test", "'ws'", ">= 256 bytes",
                        f"{0 if ws is None else ws.nbytes} bytes")
    _, y = _run(DoubleDescriptor(1000))  # larger than the workspace: staged in chunks
    np.testing.assert_array_equal(y, 2 * np.arange(1000, dtype=np.float32))


# -- preferences -------------------------------------------------------------------------------


def test_preference_filtering():
    d = DoubleDescriptor(8)
    assert _run(d)[0].sku().variant == "staged"
    assert _run(d, gp.PlanPreference(deterministic=True))[0].sku().variant == "plain"
    assert _run(d, gp.PlanPreference(max_workspace_bytes=255))[0].sku().variant == "plain"
    assert _run(d, gp.PlanPreference(max_workspace_bytes=256))[0].sku().variant == "staged"
    plan, y = _run(d, gp.PlanPreference(backend=gp.BackendKind.NUMPY))
    np.testing.assert_array_equal(y, 2 * np.arange(8, dtype=np.float32))


@pytest.mark.parametrize("pref,reason", [
    (gp.PlanPreference(deterministic=True), "staged/numpy: not deterministic"),
    (gp.PlanPreference(max_workspace_bytes=10), "needs 256 workspace bytes > 10"),
    (gp.PlanPreference(backend=gp.BackendKind.NVRTC), "backend is numpy, nvrtc requested"),
    (gp.PlanPreference(backend=gp.BackendKind.CUBLAS), "cublas requested"),
])
def test_unmet_preference_is_unsupported_with_reasons(pref, reason):
    with pytest.raises(gp.Unsupported) as info:
        DoublePlan.select(gp.Stream.host(), DoubleDescriptor(8, allow_plain=False), pref)
    msg = str(info.value)
    assert msg.startswith("double_test: argument 'pref': expected a preference some host SKU")
    assert reason in msg and str(pref) in msg


def test_descriptor_checks():
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match="double_test: argument 'n': expected an extent "
                                                ">= 0, given -2"):
        DoublePlan.select(s, DoubleDescriptor(-2))
    assert DoublePlan.select(s, DoubleDescriptor(2, padding_idx=-1))  # signed field
    with pytest.raises(gp.Unsupported, match="'dtype': expected dtype in \\(f32, f64\\), "
                                             "given f16"):
        DoublePlan.select(s, DoubleDescriptor(2, np.float16))


# -- SKUs, guarantees, errors ------------------------------------------------------------------


def test_kernel_sku_fields_and_str():
    plan = DoublePlan.select(gp.Stream.host(), DoubleDescriptor(4))
    sku = plan.sku()
    assert isinstance(sku, gp.KernelSku)
    assert (sku.op, sku.category, sku.dtype, sku.index_dtype, sku.backend, sku.arch,
            sku.variant) == ("double_test", "test", "f32", None, gp.BackendKind.NUMPY, "host",
                             "staged")
    assert str(sku) == "double_test.staged[f32]@numpy/host"
    dev = gp.KernelSku("embedding", "gather", "bf16", "i64", gp.BackendKind.NVRTC, "90", "gather")
    assert str(dev) == "embedding.gather[bf16,i64]@nvrtc/sm_90"
    with pytest.raises(AttributeError):
        sku.op = "other"  # frozen
    assert repr(plan) == "<DoublePlan double_test.staged[f32]@numpy/host>"


def test_precision_guarantee_and_host_candidate():
    g = DoublePlan.select(gp.Stream.host(), DoubleDescriptor(4)).precision_guarantee()
    assert g == gp.PrecisionGuarantee("f32", "f32", False, False)
    c = host_candidate(gp.bfloat16)
    assert (c.backend, c.deterministic, c.bit_stable, c.math_precision, c.accumulator,
            c.workspace_bytes) == (gp.BackendKind.NUMPY, True, True, "bf16", "f32", 0)
    assert host_candidate(np.float64).accumulator == "f64"


def test_error_hierarchy():
    assert issubclass(gp.GpuPlanError, ValueError)
    for cls in (gp.Unsupported, gp.InvalidProblem, gp.BufferTooSmall, gp.WorkspaceTooSmall,
                gp.MisalignedOperand):
        assert issubclass(cls, gp.GpuPlanError)
    with pytest.raises(ValueError):
        DoublePlan.select(gp.Stream.host(), DoubleDescriptor(-1))


def test_operand_checks():
    op = "check"
    a = np.zeros((2, 3), np.float32)
    check_operand(op, "a", a, (2, 3), (np.float32, np.float64))
    with pytest.raises(gp.InvalidProblem, match="'a': expected an array, given list"):
        check_operand(op, "a", [1, 2], (2,), np.float32)
    with pytest.raises(gp.Unsupported, match="expected dtype f64, given f32"):
        check_operand(op, "a", a, (2, 3), np.float64)
    with pytest.raises(gp.BufferTooSmall, match="at least 8 elements"):
        check_operand(op, "a", a, (2, 4), np.float32)
    with pytest.raises(gp.InvalidProblem, match="contiguous"):
        check_operand(op, "a", a.T, (3, 2), np.float32)
    buf = np.zeros(17, np.uint8)
    misaligned = buf[1:].view(np.float32)
    with pytest.raises(gp.MisalignedOperand, match="aligned to 4 bytes"):
        check_operand(op, "m", misaligned, (4,), np.float32)
    assert check_dtype(op, "d", np.float32, (np.float32, np.float64)) == np.float32
    with pytest.raises(gp.Unsupported, match="'d': expected dtype in \\(f32\\), given f16"):
        check_dtype(op, "d", np.float16, (np.float32,))


def test_run_checks_operands_and_empty_extent():
    s = gp.Stream.host()
    plan = DoublePlan.select(s, DoubleDescriptor(4), gp.PlanPreference(deterministic=True))
    y = np.full(4, 5, np.float32)
    assert_rejected(lambda: plan.run(s, None, DoubleArgs(np.zeros(3, np.float32), y)),
                    gp.BufferTooSmall, [y], "double_test", "'x'", "at least 4", "3 elements")
    x = np.ones(4, np.float32)
    assert_rejected(lambda: plan.run(s, None, DoubleArgs(x, np.full(4, 5, np.float64))),
                    gp.Unsupported, [], "double_test", "'y'", "dtype f32", "given f64")
    assert_rejected(lambda: plan.run(s, None, DoubleArgs(np.ones(8, np.float32)[::2], y)),
                    gp.InvalidProblem, [y], "'x'", "C-contiguous")
    misaligned = np.zeros(17, np.uint8)[1:].view(np.float32)
    assert_rejected(lambda: plan.run(s, None, DoubleArgs(misaligned, y)),
                    gp.MisalignedOperand, [y], "'x'", "aligned to 4 bytes")
    assert_rejected(lambda: plan.run(s, None, DoubleArgs(x, None)),
                    gp.InvalidProblem, [], "'y'", "expected an array, given None")
    assert_rejected(lambda: plan.run(s, None, DoubleArgs([1.0] * 4, y)),
                    gp.InvalidProblem, [y], "'x'", "expected an array", "list")
    assert_rejected(lambda: plan.run(s, None, DoubleArgs(x, x)),
                    gp.InvalidProblem, [], "'y'", "distinct from 'x'")
    frozen = np.full(4, 5, np.float32)
    frozen.flags.writeable = False  # e.g. np.broadcast_to output, a read-only memmap
    assert_rejected(lambda: plan.run(s, None, DoubleArgs(x, frozen)),
                    gp.InvalidProblem, [frozen], "'y'", "a writable array", "read-only")
    empty, _ = _run(DoubleDescriptor(0))
    assert empty.workspace_size() == 256  # empty problems still declare the SKU's workspace


def test_run_on_a_stream_of_the_other_kind_is_rejected():
    host_plan = DoublePlan.select(gp.Stream.host(), DoubleDescriptor(4),
                                  gp.PlanPreference(deterministic=True))
    fake_device = gp.Stream(types.SimpleNamespace(ptr=0x1234), 0)  # never touched by run()
    y = np.full(4, 5, np.float32)
    assert_rejected(lambda: host_plan.run(fake_device, None, DoubleArgs(np.ones(4, np.float32),
                                                                        y)),
                    gp.InvalidProblem, [y], "double_test", "'stream'", "Stream.host()", "0x1234")


def test_execute_caches_the_selected_plan():
    clear_plan_cache()
    d = DoubleDescriptor(6)
    x, y = np.ones(6, np.float32), np.zeros(6, np.float32)
    p1 = execute(DoublePlan, d, DoubleArgs(x, y), like=x)
    p2 = execute(DoublePlan, d, DoubleArgs(x, y), like=x)
    assert p1 is p2 and p1 is cached_plan(DoublePlan, gp.Stream.host(), d)
    np.testing.assert_array_equal(y, 2)  # execute allocated the 256-byte workspace itself
    det = execute(DoublePlan, d, DoubleArgs(x, y), like=x,
                  pref=gp.PlanPreference(deterministic=True))
    assert det is not p1 and det.sku().variant == "plain"
    clear_plan_cache()
    assert execute(DoublePlan, d, DoubleArgs(x, y), like=x) is not p1


# -- mixed host and device (GPU only) ----------------------------------------------------------


@pytest.mark.gpu
def test_mixed_host_and_device_arrays_are_rejected(accelerator):
    dev = gp.Stream.current()
    assert not dev.is_host and (dev.arch.isdigit() or dev.arch == "emulated")
    side = "emulated-device" if dev.is_emulated else "device (CuPy)"
    det = gp.PlanPreference(deterministic=True)
    host_plan = DoublePlan.select(gp.Stream.host(), DoubleDescriptor(4), det)
    dev_plan = DoublePlan.select(dev, DoubleDescriptor(4), det)
    assert dev_plan.sku().backend is gp.BackendKind.NVRTC
    hx, hy = np.ones(4, np.float32), np.full(4, 5, np.float32)
    dx, dy = gp.to_device(hx, accelerator), gp.to_device(hy, accelerator)
    assert_rejected(lambda: host_plan.run(gp.Stream.host(), None, DoubleArgs(dx, hy)),
                    gp.InvalidProblem, [hy], "'x'", "host (NumPy)", side)
    assert_rejected(lambda: dev_plan.run(dev, None, DoubleArgs(dx, hy)),
                    gp.InvalidProblem, [hy, dy], "'y'", f"{side} array")
    assert_rejected(lambda: host_plan.run(dev, None, DoubleArgs(hx, hy)),
                    gp.InvalidProblem, [hy], "'stream'")
    assert_rejected(lambda: dev_plan.run(gp.Stream.host(), None, DoubleArgs(dx, dy)),
                    gp.InvalidProblem, [dy], "'stream'")
    ws = gp.Workspace.allocate(dev, 64)
    assert ws.nbytes == 64 and gp.is_device_array(ws.buffer)
