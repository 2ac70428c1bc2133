"""The emulated device's strict mode: as CuPy, a NumPy call that mixes a device array with a
host array, or a host array assigned into a device array, raises TypeError (a GPU would);
scalars and device arrays mix freely; captures keep their own rules; it can be turned off."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.emulator import array as emu_array
from gpuplan.emulator.capture import GraphCaptureError


@pytest.fixture(autouse=True)
def _strict():
    """Strict mode for these tests whatever GPUPLAN_EMULATOR_STRICT says; restored after."""
    was = emu_array.EmulatedArray.__dict__.get("__setitem__") is emu_array._strict_setitem
    emu_array.set_strict(True)
    yield
    emu_array.set_strict(was)


def _dev(a):
    return gp.to_device(np.asarray(a, np.float32), "emulated")


def test_host_operands_are_refused_and_scalars_are_not():
    x, host = _dev([1, 2, 3]), np.ones(3, np.float32)
    for mix in (lambda: x + host, lambda: np.maximum(host, x),
                lambda: np.concatenate([x, host]), lambda: np.where(x > 1, x, host),
                lambda: np.add(x, x, out=host)):
        with pytest.raises(TypeError, match="host NumPy array .* emulated-device array"):
            mix()
    with pytest.raises(TypeError, match=r"ndarray.__setitem__: a host NumPy array \(shape"):
        x[...] = host
    y = x * 2 + np.float32(1) + 1.5 + np.array(0.5, np.float32)  # scalars and 0-d: fine
    assert gp.device_of(y) == "emulated"
    np.testing.assert_array_equal(gp.to_host(y), [5, 7, 9])
    x[1] = 7.0
    x[...] = _dev([4, 5, 6])  # device to device
    np.testing.assert_array_equal(gp.to_host(np.concatenate([x, x])), [4, 5, 6] * 2)
    assert float(x.sum()) == 15.0


def test_uploads_and_set_still_copy_host_data_in():
    x = gp.to_device(np.arange(3, dtype=np.float32), "emulated")
    x.set(np.full(3, 2.0, np.float32))
    np.testing.assert_array_equal(gp.to_host(x), [2, 2, 2])


def test_a_capture_keeps_its_own_refusal():
    x = _dev([0, 0, 0, 0])
    with pytest.raises(GraphCaptureError):
        with gp.graphs.graph(gp.graphs.CUDAGraph()):
            gp.asarray(np.ones(4, np.float32), device="emulated")
    with pytest.raises(TypeError):  # strict again after the capture
        x[...] = np.ones(4, np.float32)


def test_strict_mode_can_be_turned_off():
    x, host = _dev([1, 2]), np.ones(2, np.float32)
    emu_array.set_strict(False)
    try:
        np.testing.assert_array_equal(np.asarray(x + host), [2, 3])
    finally:
        emu_array.set_strict(True)
    with pytest.raises(TypeError):
        x + host
