"""GPT activation recomputation (`set_recompute`, train.py --recompute): the loss and every
gradient are the same bits in modes none, attention and block (dropout on), and the arrays
kept for backward shrink: block mode keeps each block's input only."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd import nn
from autograd.nn import functional as F


def _model(dtype, device: str, n_layer: int = 3) -> nn.GPT:
    cfg = nn.GPTConfig(vocab_size=31, block_size=16, n_layer=n_layer, n_head=2, n_embd=16,
                       dropout=0.1, attn_dropout=0.2, dtype=dtype, seed=4)
    model = nn.GPT(cfg).to(device)
    # The device's default embedding backward adds with atomics, in an order that varies
    # from run to run with or without recomputation: compare with its deterministic form.
    wte = model.wte
    wte.forward = lambda idx: F.embedding(idx, wte.weight, deterministic=True)
    return model


def _step(model: nn.GPT, idx: np.ndarray, tgt: np.ndarray, mode: str):
    model.set_recompute(mode)
    model.zero_grad()
    ag.manual_seed(9)
    with ag.Tape() as tape:
        loss = model.loss(idx, tgt)
    saved = sum(a.nbytes for n in tape.nodes for a in n.ctx.saved if hasattr(a, "nbytes"))
    tape.backward(loss)
    grads = {n: ag.tensor(p.grad.data).numpy().tobytes() for n, p in model.named_parameters()}
    return ag.tensor(loss.data).numpy().tobytes(), grads, saved, len(tape.nodes)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_mode_gives_the_same_bits(device, dtype):
    model = _model(dtype, device)
    model.train()
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 31, (2, 16))
    tgt = rng.integers(0, 31, (2, 16))
    loss0, g0, saved0, _ = _step(model, idx, tgt, "none")
    for mode in ("attention", "block"):
        loss1, g1, saved1, _ = _step(model, idx, tgt, mode)
        assert loss1 == loss0, mode
        assert g1.keys() == g0.keys()
        for name in g0:
            assert g1[name] == g0[name], (mode, name)
        assert saved1 < saved0, mode


def test_block_mode_keeps_far_fewer_arrays():
    model = _model(np.float32, "cpu", n_layer=8)
    idx = np.random.default_rng(1).integers(0, 31, (2, 16))
    saved = {mode: _step(model, idx, idx, mode)[2] for mode in ("none", "attention", "block")}
    assert saved["block"] < saved["attention"] < saved["none"]
    assert saved["block"] <= saved["none"] / 3


def test_unknown_mode_is_a_clear_error():
    model = _model(np.float32, "cpu", n_layer=1)
    with pytest.raises(ValueError, match="set_recompute: argument 'mode': expected one of "
                                         "none, attention, block, given 'all'"):
        model.set_recompute("all")
    assert model.recompute == "none"
