"""Resharding checkpoints: model and AdamW state written by one layout continue the same
training in another (tp x pp -> dp, -> one process), and mismatches give one clear line."""

from __future__ import annotations

import numpy as np
import pytest

import dist
from autograd import nn, optim
from dist.models import ParallelGPT
from dist.reshard import ConfigMismatchError, load_resharded, read_dense_checkpoint
from gpuplan.dtypes import bfloat16

CFG = nn.GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8, seed=3,
                   activation="gelu_tanh")
B = 8


def _batch(step):
    rng = np.random.default_rng([7, step])
    idx = rng.integers(0, CFG.vocab_size, (B, CFG.block_size + 1))
    return idx[:, :-1], idx[:, 1:]


def _adamw(model):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    return optim.AdamW([{"params": decay, "weight_decay": 0.1},
                        {"params": rest, "weight_decay": 0.0}], lr=1e-2)


def _step(model, opt, step, dp_rank=0, dp=1):
    x, y = _batch(step)
    n = B // dp
    loss = model.train_step(x[dp_rank * n:(dp_rank + 1) * n], y[dp_rank * n:(dp_rank + 1) * n])
    opt.step()
    opt.zero_grad()
    return loss


@pytest.mark.parametrize("dtype", [None, bfloat16])
def test_one_process_round_trip_continues_bit_exactly(tmp_path, dtype):
    model = ParallelGPT(CFG, dtype=dtype)
    opt = _adamw(model)
    for s in range(2):
        _step(model, opt, s)
    dist.save_checkpoint(tmp_path, model, optimizer=opt, step=2, metadata={"k": 1})
    dense = read_dense_checkpoint(tmp_path, optimizer=True)
    assert dense.config["activation"] == "gelu_tanh" and dense.metadata == {"k": 1}
    keys = {"exp_avg", "exp_avg_sq", "step"} | ({"master"} if dtype else set())
    assert set(dense.optimizer["wte.weight"]) == keys  # bf16: the f32 master weights too
    other = ParallelGPT(CFG.__class__(**{**CFG.__dict__, "seed": 99}), dtype=dtype)
    other_opt = _adamw(other)
    assert load_resharded(tmp_path, other, other_opt) == {"k": 1}
    assert _step(model, opt, 2) == _step(other, other_opt, 2)
    for (n, p), (_, q) in zip(model.named_parameters(), other.named_parameters(), strict=True):
        assert p.dtype == q.dtype and np.array_equal(p.data, q.data), n


def test_config_mismatch_and_missing_optimizer_are_one_line(tmp_path):
    model = ParallelGPT(CFG)
    dist.save_checkpoint(tmp_path, model, step=1)
    wider = ParallelGPT(CFG.__class__(**{**CFG.__dict__, "n_embd": 16}))
    with pytest.raises(ConfigMismatchError, match=r"the saved model has n_embd 8, this "
                                                   r"model has n_embd 16"):
        dist.load_checkpoint(tmp_path, wider, reshard=True)
    exact = ParallelGPT(CFG.__class__(**{**CFG.__dict__, "activation": "gelu"}))
    with pytest.raises(ConfigMismatchError, match="activation gelu_tanh, this model has "
                                              "activation gelu$"):
        load_resharded(tmp_path, exact)
    with pytest.raises(dist.CheckpointError, match="holds no optimizer state"):
        load_resharded(tmp_path, ParallelGPT(CFG), _adamw(ParallelGPT(CFG)))


@pytest.mark.mpi
def test_tp_pp_checkpoint_continues_as_dp_and_as_one_process(world, tmp_path_factory):
    n = world.size
    if n not in (2, 4):
        pytest.skip("needs 2 or 4 ranks")
    root = world.bcast_object(str(tmp_path_factory.mktemp("reshard")) if world.rank == 0
                              else None)
    tp, pp = (2, 1) if n == 2 else (2, 2)
    mesh = dist.ProcessMesh(dp=1, pp=pp, tp=tp, world=world)
    model = ParallelGPT(CFG, mesh, num_micro_batches=2)
    opt = _adamw(model)
    for s in range(2):
        _step(model, opt, s)
    dist.save_checkpoint(root, model, comm=world, optimizer=opt, step=2)
    want = [_step(model, opt, s) for s in (2, 3)]

    as_dp = ParallelGPT(CFG, dist.ProcessMesh(dp=n, pp=1, tp=1, world=world))
    dp_opt = _adamw(as_dp)
    dist.load_checkpoint(root, as_dp, comm=world, optimizer=dp_opt, reshard=True)
    got = [_step(as_dp, dp_opt, s, world.rank, n) for s in (2, 3)]
    np.testing.assert_allclose(got, want, rtol=2e-6)

    if world.rank == 0:
        solo = ParallelGPT(CFG)
        solo_opt = _adamw(solo)
        dist.load_checkpoint(root, solo, optimizer=solo_opt, reshard=True)
        np.testing.assert_allclose([_step(solo, solo_opt, s) for s in (2, 3)], want,
                                   rtol=2e-6)
    world.barrier()


_TINY = dict(vocab_size=11, block_size=4, n_layer=1, n_head=1, n_embd=4)


@pytest.mark.parametrize("gpt_config,message", [
    ("{not json", "its metadata gpt_config is not a JSON object"),
    ("[" * 100000 + "]" * 100000, "its metadata gpt_config is not a JSON object"),
    ('["a list"]', "the model config must be a JSON object, given list"),
    ({**_TINY, "colour": 1}, r"the model config has fields GPTConfig does not have: \['colour'\]"),
    ({**_TINY, "vocab_size": 10**13}, "GPTConfig: vocab_size must be an integer"),
    ({**_TINY, "n_layer": "1"}, "GPTConfig: n_layer must be an integer"),
    ({**_TINY, "dtype": "no-such"}, "the model config's dtype must name a float dtype"),
])
def test_a_malformed_gpt_config_metadata_is_one_line(tmp_path, gpt_config, message):
    """--init-from a .safetensors file: before, RecursionError, JSONDecodeError and TypeError
    tracebacks (unknown key, int() of a string)."""
    import json

    import autograd as ag
    from dist.reshard import init_from

    text = gpt_config if isinstance(gpt_config, str) else json.dumps(gpt_config)
    model = nn.GPT(nn.GPTConfig(**_TINY))
    ag.save(model.state_dict(), tmp_path / "m.safetensors", metadata={"gpt_config": text})
    with pytest.raises(dist.CheckpointError, match=message) as info:
        init_from(tmp_path / "m.safetensors", nn.GPT(nn.GPTConfig(**_TINY)))
    assert str(info.value).startswith(str(tmp_path / "m.safetensors"))


def test_integer_weights_in_a_safetensors_file_are_refused(tmp_path):
    import autograd as ag
    from dist.reshard import init_from

    state = {k: v.astype(np.int64) if k == "wte.weight" else v
             for k, v in nn.GPT(nn.GPTConfig(**_TINY)).state_dict().items()}
    ag.save(state, tmp_path / "m.safetensors")
    with pytest.raises(dist.CheckpointError, match="wte.weight is stored as int64, expected "
                                                   "a float dtype"):
        init_from(tmp_path / "m.safetensors", nn.GPT(nn.GPTConfig(**_TINY)))


def test_every_model_mismatch_is_listed_at_once():
    """Before: one field per launch (vocabulary, then layers, then width, then activation:
    four failed launches for a Hugging Face folder)."""
    from dist.reshard import check_config, config_json

    saved = config_json(nn.GPTConfig(vocab_size=50, block_size=8, n_layer=3, n_head=2,
                                     n_embd=8, activation="gelu_tanh"))
    mine = nn.GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=4)
    with pytest.raises(ConfigMismatchError, match=r"^hf: the saved model has vocab_size 50, "
                       r"n_layer 3, n_embd 8, activation gelu_tanh, this model has "
                       r"vocab_size 11, n_layer 1, n_embd 4, activation gelu$"):
        check_config(saved, mine, "hf")
