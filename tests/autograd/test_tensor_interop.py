"""Interop (__array__, DLPack, __cuda_array_interface__, from_dlpack) and inference_mode."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

import autograd as ag
from gpuplan.dtypes import bfloat16

A = np.arange(12.0).reshape(3, 4)


def test_array_protocol_shares_host_memory():
    t = ag.tensor(A)
    a = np.asarray(t)
    assert a is t.data
    a[0, 0] = 42.0                                      # the same memory
    assert t.numpy()[0, 0] == 42.0
    assert not np.shares_memory(np.array(t, copy=True), t.data)
    c = np.asarray(t, dtype=np.float32)
    assert c.dtype == np.float32 and not np.shares_memory(c, t.data)
    with pytest.raises(ValueError, match=r"__array__: converting float64 to float32 needs a "
                                         r"copy, but copy=False"):
        t.__array__(np.float32, copy=False)


def test_dlpack_both_ways_is_zero_copy():
    t = ag.tensor(A)
    assert t.__dlpack_device__() == (1, 0)
    a = np.from_dlpack(t)
    assert np.shares_memory(a, t.data)
    b = A.copy()
    u = ag.from_dlpack(b)
    assert isinstance(u, ag.Tensor) and np.shares_memory(u.data, b)
    u.data[1, 1] = -1.0
    assert b[1, 1] == -1.0
    assert ag.from_dlpack(u).data is u.data
    assert np.shares_memory(ag.from_dlpack(b[:, 1]).data, b)   # strided views too
    with pytest.raises(TypeError, match=r"from_dlpack: expected an object with __dlpack__ "
                                        r".*given list"):
        ag.from_dlpack([1.0])


def test_host_tensors_have_no_cuda_array_interface():
    t = ag.tensor(A)
    assert not hasattr(t, "__cuda_array_interface__")
    with pytest.raises(AttributeError, match=r"only CUDA tensors have one.*'cpu'"):
        _ = t.__cuda_array_interface__


@pytest.mark.gpu
def test_device_tensors_refuse_implicit_host_conversion(accelerator):
    t = ag.tensor(A, device=accelerator)
    with pytest.raises(TypeError, match=r"can't convert a '(cuda|emulated)' device tensor to "
                                        r"a NumPy array implicitly; use Tensor\.cpu\(\)"):
        np.asarray(t)
    np.testing.assert_array_equal(t.numpy(), A)
    if t.device == "emulated":
        # No DLPack device type / CUDA pointer: the memory is host memory posing as a device's.
        assert not hasattr(t, "__cuda_array_interface__")
        with pytest.raises(BufferError, match=r"emulated device has no DLPack device type"):
            t.__dlpack__()
    else:
        cp = pytest.importorskip("cupy")
        assert t.__dlpack_device__()[0] == 2
        assert t.__cuda_array_interface__["data"][0] == t.data.data.ptr
        c = cp.asarray(t)                                  # through __cuda_array_interface__
        assert c.data.ptr == t.data.data.ptr
        assert ag.from_dlpack(c).data.data.ptr == c.data.ptr
        assert cp.from_dlpack(t).data.ptr == t.data.data.ptr


def test_torch_round_trip_is_zero_copy():
    torch = pytest.importorskip("torch")
    t = ag.tensor(A)
    pt = torch.from_dlpack(t)
    assert pt.data_ptr() == t.data.ctypes.data
    back = ag.from_dlpack(pt)
    assert back.data.ctypes.data == pt.data_ptr()


# -- bfloat16 over DLPack (NumPy's DLPack has no bfloat16; autograd.dlpack_bf16) ---------------

BF16 = np.arange(12, dtype=np.float32).reshape(3, 4).astype(bfloat16)


def _bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint16)


def test_bfloat16_capsules_share_memory_and_free_their_hold():
    from autograd import dlpack_bf16

    a = BF16.copy()
    for view in (a, a[:, 1::2], a.T, a[1, 2, ...]):
        held = sys.getrefcount(view)
        back = dlpack_bf16.import_capsule(dlpack_bf16.export(view))
        assert back.dtype == bfloat16 and back.shape == view.shape
        assert back.strides == view.strides and np.shares_memory(back, a)
        np.testing.assert_array_equal(_bits(back), _bits(view))
        assert sys.getrefcount(view) > held    # the capsule's holder keeps it alive
        del back
        gc.collect()
        assert sys.getrefcount(view) == held   # the deleter ran
    held = sys.getrefcount(a)
    capsule = dlpack_bf16.export(a)            # never consumed: its destructor lets go
    assert sys.getrefcount(a) > held
    del capsule
    assert sys.getrefcount(a) == held
    with pytest.raises(RuntimeError):          # NumPy refuses the capsule ...
        np.from_dlpack(ag.tensor(a))
    gc.collect()
    assert sys.getrefcount(a) == held          # ... and the refused capsule let go
    # A reversed view is copied (PyTorch aborts on negative strides), unless copy=False.
    back = dlpack_bf16.import_capsule(dlpack_bf16.export(a[::-1]))
    np.testing.assert_array_equal(_bits(back), _bits(a[::-1]))
    assert not np.shares_memory(back, a)
    with pytest.raises(BufferError, match=r"strides \(-8, 2\) .*need a copy, but copy=False"):
        dlpack_bf16.export(a[::-1], copy=False)
    with pytest.raises(BufferError, match=r"exports to the CPU \(1, 0\) only, given "
                                          r"dl_device=\(2, 0\)"):
        dlpack_bf16.export(a, dl_device=(2, 0))
    frozen = a.copy()
    frozen.flags.writeable = False             # as NumPy: DLPack cannot say read-only
    with pytest.raises(BufferError, match=r"a read-only bfloat16 array cannot be exported"):
        dlpack_bf16.export(frozen)
    copied = dlpack_bf16.import_capsule(dlpack_bf16.export(frozen, copy=True))
    assert not np.shares_memory(copied, frozen)
    with pytest.raises(BufferError, match="a host array takes stream=None, given 1"):
        dlpack_bf16.export(a, stream=1)
    f32 = np.zeros(3, np.float32)                 # not bfloat16: left to NumPy, untouched
    assert dlpack_bf16.import_capsule(f32.__dlpack__()) is None


def test_bfloat16_torch_round_trip_is_zero_copy():
    torch = pytest.importorskip("torch")
    t = ag.tensor(BF16.copy())
    pt = torch.from_dlpack(t)
    assert pt.dtype == torch.bfloat16 and pt.data_ptr() == t.data.ctypes.data
    np.testing.assert_array_equal(pt.view(torch.int16).numpy().view(np.uint16), _bits(t.data))
    pt[0, 0] = -3.5
    assert float(t.data[0, 0]) == -3.5
    back = ag.from_dlpack(pt.T)
    assert back.dtype == bfloat16 and back.data.ctypes.data == pt.data_ptr()
    np.testing.assert_array_equal(_bits(back.data), _bits(t.data.T))
    src = torch.arange(6, dtype=torch.float32).to(torch.bfloat16)
    got = ag.from_dlpack(src)
    del src
    gc.collect()
    np.testing.assert_array_equal(got.data.astype(np.float32), np.arange(6))  # still alive
    assert torch.from_dlpack(ag.tensor(np.array(2.5, bfloat16))).item() == 2.5
    assert ag.from_dlpack(torch.zeros(0, 3, dtype=torch.bfloat16)).shape == (0, 3)


# -- inference_mode -----------------------------------------------------------------------------


def test_inference_mode_records_nothing_and_marks_tensors():
    w = ag.tensor(A, requires_grad=True)
    with ag.inference_mode():
        assert ag.is_inference_mode_enabled() and not ag.is_grad_enabled()
        y = w * 2.0
        z = ag.zeros(2)
    assert not ag.is_inference_mode_enabled() and ag.is_grad_enabled()
    assert not y.requires_grad and y.is_leaf and y.is_inference() and z.is_inference()
    assert not w.is_inference()
    out = (y * 3.0).sum()                                    # reading is fine
    assert out.item() == pytest.approx(6.0 * A.sum())
    with pytest.raises(RuntimeError, match=r"add_\(\): in-place update to an inference tensor"):
        y.add_(1.0)
    with pytest.raises(RuntimeError, match=r"__setitem__: in-place update to an inference"):
        y[0] = 1.0
    with pytest.raises(RuntimeError, match=r"requires_grad_\(\): an inference tensor"):
        y.requires_grad_()
    with ag.inference_mode():
        y.add_(1.0)                                          # allowed inside
    c = y.clone()
    assert not c.is_inference()
    c.add_(1.0)
    np.testing.assert_array_equal(c.numpy(), A * 2 + 2)


def test_inference_mode_decorator_false_and_nesting():
    @ag.inference_mode()
    def run(x):
        return x * 2.0, ag.is_grad_enabled()

    x = ag.tensor(A, requires_grad=True)
    y, enabled = run(x)
    assert not enabled and y.is_inference() and not y.requires_grad
    with ag.inference_mode(False):
        assert ag.is_grad_enabled() and not (x * 1.0).is_inference()
    with ag.no_grad():
        with ag.inference_mode():
            pass
        assert not ag.is_grad_enabled() and not ag.is_inference_mode_enabled()
    assert ag.is_grad_enabled()
    try:
        with ag.inference_mode():
            raise KeyError("x")
    except KeyError:
        pass
    assert ag.is_grad_enabled() and not ag.is_inference_mode_enabled()
