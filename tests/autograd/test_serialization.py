"""autograd.save / autograd.load: safetensors files, bit-exact for every dtype we use."""

from __future__ import annotations

import numpy as np
import pytest
import safetensors

import autograd as ag
import gpuplan as gp
from autograd import nn
from gpuplan.dtypes import bfloat16


def _state():
    rng = np.random.default_rng(0)
    return {"f32": rng.standard_normal((3, 5)).astype(np.float32),
            "f64": ag.tensor(rng.standard_normal(4)),
            "f16": rng.standard_normal((2, 2)).astype(np.float16),
            "bf16": rng.standard_normal((7,)).astype(bfloat16),
            "i64": np.arange(6, dtype=np.int64).reshape(2, 3),
            "i32": np.array([-1, 2], np.int32), "u8": np.array([255], np.uint8),
            "flag": np.array([True, False]), "scalar": np.array(2.5, np.float32),
            "empty": np.zeros((0, 3), np.float32)}


def test_every_dtype_round_trips_bit_exactly_with_metadata(tmp_path):
    state = _state()
    ag.save(state, tmp_path / "s.safetensors", metadata={"step": "7"})
    back = {n: t.data for n, t in ag.load(tmp_path / "s.safetensors").items()}
    assert sorted(back) == sorted(state)
    for name, value in state.items():
        value = value.data if isinstance(value, ag.Tensor) else value
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        assert back[name].tobytes() == np.ascontiguousarray(value).tobytes(), name
    assert ag.serialization.load_metadata(tmp_path / "s.safetensors") == {"step": "7"}
    with safetensors.safe_open(str(tmp_path / "s.safetensors"), framework="np") as f:
        assert f.get_tensor("f32").dtype == np.float32  # a plain safetensors file


def test_module_state_dict_round_trip(tmp_path, device):
    model = nn.GPT(nn.GPTConfig(vocab_size=11, block_size=4, n_layer=1, n_head=1, n_embd=4,
                                seed=5)).to(device=device)
    ag.save(model.state_dict(), tmp_path / "m.safetensors")
    other = nn.GPT(nn.GPTConfig(vocab_size=11, block_size=4, n_layer=1, n_head=1, n_embd=4))
    other.load_state_dict(ag.load(tmp_path / "m.safetensors"))
    for (n, p), (_, q) in zip(model.named_parameters(), other.named_parameters(), strict=True):
        assert np.array_equal(gp.to_host(p.data), q.data), n
    on_device = ag.load(tmp_path / "m.safetensors", device=device)
    assert isinstance(on_device["wte.weight"], ag.Tensor)
    assert gp.device_of(on_device["wte.weight"].data) == gp.backend.resolve_device(device)


def test_non_tensor_values_and_bad_files_raise_and_write_nothing(tmp_path):
    path = tmp_path / "bad.safetensors"
    with pytest.raises(TypeError, match="entry 'lr' must be a Tensor or an array, given float"):
        ag.save({"w": np.ones(2), "lr": 0.1}, path)
    with pytest.raises(TypeError, match="entry 'c' has dtype complex128"):
        ag.save({"c": np.ones(2, complex)}, path)
    with pytest.raises(TypeError, match="metadata must map str to str"):
        ag.save({"w": np.ones(2)}, path, metadata={"step": 3})
    with pytest.raises(TypeError, match="must be a mapping"):
        ag.save([np.ones(2)], path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError, match="no such file"):
        ag.load(path)
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        ag.load(path)
