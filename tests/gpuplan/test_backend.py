"""Device selection: CuPy is imported only when a CUDA device is asked for and a driver
exists; GPUPLAN_DEVICE=emulated makes the emulated device the device."""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest

import gpuplan as gp
from gpuplan import devices

PROBE = """
import sys, numpy as np, gpuplan as gp, autograd, dist
world = dist.init()
x = gp.asarray(np.ones((2, 3), np.float32), device=gp.backend.default_device())
gp.functional.softmax(x)
gp.functional.matmul(x, x, trans_b=True)  # gemm asks about cuBLAS only with a GPU
print("cupy" in sys.modules, gp.backend.default_device(), world.backend, gp.Stream.current())
"""


def _probe(env_extra: dict[str, str]) -> list[str]:
    import os

    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(gp.backend._cuda_driver_present(), reason="a CUDA driver is present")
def test_no_cupy_import_without_a_driver():
    imported, device, backend, stream = _probe({"GPUPLAN_DEVICE": ""})
    assert (imported, device, backend, stream) == ("False", "cpu", "mpi-host", "Stream.host()")


@pytest.mark.skipif(gp.backend._cuda_driver_present(), reason="a CUDA driver is present")
def test_emulated_default_device():
    imported, device, backend, stream = _probe({"GPUPLAN_DEVICE": "emulated"})
    assert (imported, device, backend, stream) == \
        ("False", "emulated", "mpi-host-staged", "Stream.emulated()")


def test_emulated_arrays_stay_on_the_emulated_device():
    x = gp.to_device(np.arange(6.0).reshape(2, 3), "emulated")
    assert gp.device_of(x) == "emulated" and gp.device_of(x * 2 + 1) == "emulated"
    assert gp.device_of(gp.backend.array_namespace(x).zeros(3)) == "emulated"
    assert gp.backend.data_ptr(gp.backend.array_namespace(x).empty(5)) % 256 == 0
    host = gp.to_host(x)
    assert type(host) is np.ndarray and not np.shares_memory(host, x.view(np.ndarray))
    with pytest.raises(ValueError, match="device"):
        gp.backend.resolve_device("tpu")


def test_dynamic_smem_cap_is_raised_once_with_the_kernels_device_current(monkeypatch):
    """A CuPy RawKernel sets max_dynamic_shared_size_bytes on its function for the *current*
    device, so the cap must be raised with the launch's device current (a process that
    uses several devices would otherwise raise it on another device's copy)."""
    from gpuplan import nvrtc

    current = [0]

    class Device:
        def __init__(self, i):
            self.i = i

        def __enter__(self):
            self.prev, current[0] = current[0], self.i

        def __exit__(self, *exc):
            current[0] = self.prev

    class Kernel:
        raised: list = []

        def __setattr__(self, name, value):
            Kernel.raised.append((name, value, current[0]))

    monkeypatch.setattr(devices, "cupy_module",
                        lambda: types.SimpleNamespace(cuda=types.SimpleNamespace(Device=Device)))
    monkeypatch.setattr(nvrtc, "_SMEM_CAPS", {})
    fn = Kernel()
    nvrtc.allow_dynamic_smem(fn, 48 * 1024, 1)  # within the default 48 KB: nothing to raise
    nvrtc.allow_dynamic_smem(fn, 80 * 1024, 1)
    nvrtc.allow_dynamic_smem(fn, 64 * 1024, 1)  # already above that
    nvrtc.allow_dynamic_smem(fn, 96 * 1024, 1)
    assert Kernel.raised == [("max_dynamic_shared_size_bytes", 80 * 1024, 1),
                             ("max_dynamic_shared_size_bytes", 96 * 1024, 1)]
    assert current[0] == 0  # the caller's device again


def test_an_unknown_device_is_a_gpu_plan_error_wherever_it_is_given():
    """Before: a bare ValueError (the plan API's errors are all GpuPlanError subclasses)."""
    import autograd as ag
    from autograd import nn

    for call in (lambda: gp.backend.resolve_device("tpu"),
                 lambda: ag.tensor(np.ones(3), device="tpu"),
                 lambda: nn.Linear(2, 3).to(device="tpu"),
                 lambda: gp.to_device(np.ones(3), "tpu")):
        with pytest.raises(gp.Unsupported, match=r"^device: expected one of \('cpu', 'cuda', "
                                                 r"'emulated'\), given 'tpu'$"):
            call()
