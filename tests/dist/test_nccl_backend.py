"""NCCL opt-in without NCCL: the error names the NCCL wheel matching the installed CuPy."""

from __future__ import annotations

import pytest

import dist
from dist import nccl_backend


@pytest.mark.parametrize("cupy_dist, wheel, other", [
    ("cupy-cuda12x", "nvidia-nccl-cu12", "nvidia-nccl-cu13"),
    ("cupy-cuda13x", "nvidia-nccl-cu13", "nvidia-nccl-cu12"),
])
def test_hint_names_the_nccl_wheel_of_the_installed_cupy(cupy_dist, wheel, other):
    hint = nccl_backend.nccl_install_hint([cupy_dist])
    assert f"pip install {wheel}" in hint and cupy_dist in hint
    assert other not in hint


def test_hint_without_a_known_cupy_wheel_names_both():
    for dists in ([], ["cupy"], ["cupy-cuda12x", "cupy-cuda13x"]):
        hint = nccl_backend.nccl_install_hint(dists)
        assert "nvidia-nccl-cu12" in hint and "nvidia-nccl-cu13" in hint
        assert "pip install nvidia" not in hint


def test_cupy_distributions_come_from_package_metadata(monkeypatch):
    monkeypatch.setattr(nccl_backend.importlib.metadata, "packages_distributions",
                        lambda: {"cupy": ["cupy_cuda13x"], "numpy": ["numpy"]})
    assert nccl_backend.cupy_distributions() == ["cupy-cuda13x"]
    monkeypatch.setattr(nccl_backend.importlib.metadata, "packages_distributions", lambda: {})
    assert nccl_backend.cupy_distributions() == []


def test_backend_nccl_without_nccl_names_the_matching_wheel(monkeypatch):
    monkeypatch.setattr(nccl_backend, "nccl_module", lambda: None)
    monkeypatch.setattr(nccl_backend, "cupy_distributions", lambda: ["cupy-cuda13x"])
    with pytest.raises(RuntimeError, match="backend='nccl'") as err:
        dist.Communicator(backend="nccl")
    assert "pip install nvidia-nccl-cu13" in str(err.value)
    assert "nvidia-nccl-cu12" not in str(err.value)


def test_hint_for_this_environment():
    dists = nccl_backend.cupy_distributions()
    hint = nccl_backend.nccl_install_hint()
    known = [d for d in dists if d in nccl_backend.NCCL_WHEELS]
    if len(known) == 1 and len(dists) == 1:
        assert f"pip install {nccl_backend.NCCL_WHEELS[known[0]]}" in hint
