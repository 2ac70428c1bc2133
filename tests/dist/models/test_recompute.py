"""Activation recomputation (`set_recompute`) of ParallelGPT and ParallelLlama: under tensor,
pipeline and data parallelism, with dropout on, the loss and every gradient are the same bits
as without recomputation, and equal the dense single-process model's (float64)."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd import nn
from dist.models import ParallelGPT, ParallelLlama
from tests.dist.models.helpers import LAYOUTS, check_against_dense, layout_mesh, rows_of

B, T, SEED, DROPOUT = 4, 8, 13, 0.2
MODELS = {
    "gpt": (nn.GPTConfig, nn.GPT, ParallelGPT,
            dict(vocab_size=37, block_size=T, n_layer=2, n_head=4, n_embd=16)),
    "llama": (nn.LlamaConfig, nn.Llama, ParallelLlama,  # grouped-query: 2 K/V heads
              dict(vocab_size=37, block_size=T, n_layer=2, n_head=4, n_kv_head=2, n_embd=16,
                   ffn_hidden=24)),
}


def _config(name: str, dropout: float = DROPOUT):
    config_cls, _, _, shape = MODELS[name]
    return config_cls(**shape, dropout=dropout, dtype=np.float64, seed=5)


def _parallel(name: str, mesh, dp: int, x, y, mode: str):
    ag.random.manual_seed(SEED)
    model = MODELS[name][2](_config(name), mesh, num_micro_batches=2 if mesh.pp.size > 1
                            else 1)
    model.set_recompute(mode)
    loss = model.train_step(rows_of(x, mesh.dp_rank, dp), rows_of(y, mesh.dp_rank, dp))
    return loss, model


def _dense(name: str, x, y, dp: int, mode: str, dropout: float = DROPOUT):
    """The dense model's loss and gradients, each data-parallel rank's rows run with the
    default generator seeded as every rank seeds it."""
    model = MODELS[name][1](_config(name, dropout))
    model.set_recompute(mode)
    losses = []
    for d in range(dp):
        ag.random.manual_seed(SEED)
        loss = model.loss(rows_of(x, d, dp), rows_of(y, d, dp))
        (loss * (1.0 / dp)).backward()
        losses.append(float(loss.item()))
    return float(np.mean(losses)), model


@pytest.mark.mpi
@pytest.mark.parametrize("layout", ["tp", "pp2xtp2", "dp2xtp2"])
@pytest.mark.parametrize("name", list(MODELS))
def test_recomputation_gives_the_same_bits_in_every_layout(world, name, layout):
    mesh, dp = layout_mesh(world, layout)
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 37, (B, T)), rng.integers(0, 37, (B, T))
    saved = ag.random.default_generator.get_state()
    try:
        loss, plain = _parallel(name, mesh, dp, x, y, "none")
        want = dict(plain.named_parameters())
        for mode in ("attention", "block"):
            again, model = _parallel(name, mesh, dp, x, y, mode)
            assert again == loss, mode
            for pname, p in model.named_parameters():
                np.testing.assert_array_equal(p.grad.numpy(), want[pname].grad.numpy(),
                                              err_msg=f"{mode} {pname}")
        if LAYOUTS[layout](world.size)[1] == 1:  # one stream: the dense model's masks
            dense_loss, dense = _dense(name, x, y, dp, "block")
            assert loss == pytest.approx(dense_loss, rel=1e-9)
            assert check_against_dense(model, dense, rtol=1e-9, atol=1e-12) == \
                len(list(model.parameters()))
            assert abs(_dense(name, x, y, dp, "none", 0.0)[0] - dense_loss) > 1e-5  # it acted
    finally:
        ag.random.default_generator.set_state(saved)
