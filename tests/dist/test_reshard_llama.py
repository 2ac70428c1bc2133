"""Llama checkpoints: model and AdamW state saved by one ParallelLlama layout continue the same
training in another (tp -> pp x dp, -> one process), and Llama configs are checked on load."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import dist
from autograd import nn, optim
from dist.models import ParallelGPT, ParallelLlama
from dist.models.configs import config_differences, config_json
from dist.reshard import ConfigMismatchError, load_resharded, read_dense_checkpoint

CFG = nn.LlamaConfig(vocab_size=19, block_size=8, n_layer=2, n_head=4, n_embd=16,
                     n_kv_head=2, ffn_hidden=24, dtype=np.float64, seed=3)
B = 8


def _batch(step):
    rng = np.random.default_rng([5, step])
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


def test_one_process_round_trip_continues_bit_exactly(tmp_path):
    model = ParallelLlama(CFG)
    opt = _adamw(model)
    _step(model, opt, 0)
    dist.save_checkpoint(tmp_path, model, optimizer=opt, step=1)
    dense = read_dense_checkpoint(tmp_path, optimizer=True)
    assert dense.config == config_json(CFG) and dense.config["model"] == "llama"
    assert list(dense.params) == [n for n, _ in nn.Llama(CFG).named_parameters()]
    other = ParallelLlama(dataclasses.replace(CFG, seed=99))
    other_opt = _adamw(other)
    load_resharded(tmp_path, other, other_opt)
    assert _step(model, opt, 1) == _step(other, other_opt, 1)
    for (n, p), (_, q) in zip(model.named_parameters(), other.named_parameters(), strict=True):
        assert np.array_equal(p.data, q.data), n


def test_config_checks_name_the_model_kind_and_the_llama_fields(tmp_path):
    dist.save_checkpoint(tmp_path, ParallelLlama(CFG), step=1)
    gpt = ParallelGPT(nn.GPTConfig(vocab_size=19, block_size=8, n_layer=2, n_head=4,
                                   n_embd=16))
    with pytest.raises(ConfigMismatchError, match="the saved model has model llama, this "
                                                  "model has model gpt"):
        dist.load_checkpoint(tmp_path, gpt, reshard=True)
    mqa = ParallelLlama(dataclasses.replace(CFG, n_kv_head=1, rope_theta=500.0))
    with pytest.raises(ConfigMismatchError, match="the saved model has n_kv_head 2.*, this "
                                                  "model has n_kv_head 1"):
        load_resharded(tmp_path, mqa)
    # None means the rule's value: n_kv_head None is n_head, ffn_hidden None Llama's width.
    mha = dataclasses.replace(CFG, n_kv_head=None, ffn_hidden=None)
    same = dataclasses.replace(CFG, n_kv_head=4, ffn_hidden=mha.hidden)
    assert config_differences(config_json(mha), same) == []
    with pytest.raises(ValueError, match="fields LlamaConfig does not have: \\['bias'\\]"):
        config_differences({**config_json(CFG), "bias": True}, CFG)


@pytest.mark.mpi
def test_tp_checkpoint_resumes_as_pp_and_as_one_process_with_equal_losses(world,
                                                                          tmp_path_factory):
    """tp = N with K/V heads replicated (n_kv_head 1 at tp 2, 2 at tp 4) -> pp 2 x dp N/2,
    and -> one process, in float64: the next two losses equal the saving layout's."""
    n = world.size
    if n not in (2, 4):
        pytest.skip("needs 2 or 4 ranks")
    cfg = dataclasses.replace(CFG, n_kv_head=n // 2)
    root = world.bcast_object(str(tmp_path_factory.mktemp("llama")) if world.rank == 0
                              else None)
    model = ParallelLlama(cfg, dist.ProcessMesh(tp=n, world=world), num_micro_batches=2)
    opt = _adamw(model)
    _step(model, opt, 0)
    dist.save_checkpoint(root, model, comm=world, optimizer=opt, step=1)
    want = [_step(model, opt, s) for s in (1, 2)]

    mesh = dist.ProcessMesh(dp=n // 2, pp=2, world=world)
    as_pp = ParallelLlama(cfg, mesh, num_micro_batches=2)
    pp_opt = _adamw(as_pp)
    dist.load_checkpoint(root, as_pp, comm=world, optimizer=pp_opt, reshard=True)
    got = [_step(as_pp, pp_opt, s, mesh.dp_rank, n // 2) for s in (1, 2)]
    np.testing.assert_allclose(got, want, rtol=1e-12)

    if world.rank == 0:
        solo = ParallelLlama(cfg)
        solo_opt = _adamw(solo)
        dist.load_checkpoint(root, solo, optimizer=solo_opt, reshard=True)
        np.testing.assert_allclose([_step(solo, solo_opt, s) for s in (1, 2)], want,
                                   rtol=1e-12)
    world.barrier()
