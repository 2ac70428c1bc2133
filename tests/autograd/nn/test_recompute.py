"""Activation recomputation (`set_recompute`, train.py --recompute) of nn.GPT and nn.Llama
(`RecomputeLayers`): the loss and every gradient are the same bits in modes none, attention
and block (dropout on: the recomputed forward draws the same masks), and the arrays kept for
backward shrink: block mode keeps each block's input only."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd import nn
from autograd.nn import functional as F

MODELS = ["gpt", "llama"]


def _model(name: str, dtype, device: str, n_layer: int = 3):
    shape = dict(vocab_size=31, block_size=16, n_layer=n_layer, n_head=2, n_embd=16,
                 dtype=dtype, seed=4)
    if name == "gpt":
        model = nn.GPT(nn.GPTConfig(**shape, dropout=0.1, attn_dropout=0.2))
        emb = "wte"
    else:  # Llama's one dropout is on the attention probabilities; GQA: 2 query heads, 1 K/V
        model = nn.Llama(nn.LlamaConfig(**shape, n_kv_head=1, dropout=0.2))
        emb = "embed_tokens"
    model = model.to(device)
    # The device's default embedding backward adds with atomics, in an order that varies
    # from run to run with or without recomputation: compare with its deterministic form.
    table = getattr(model, emb)
    table.forward = lambda idx: F.embedding(idx, table.weight, deterministic=True)
    return model.train()


def _step(model, idx: np.ndarray, tgt: np.ndarray, mode: str):
    model.set_recompute(mode)
    model.zero_grad()
    ag.manual_seed(9)
    with ag.Tape() as tape:
        loss = model.loss(idx, tgt)
    saved = sum(a.nbytes for n in tape.nodes for a in n.ctx.saved if hasattr(a, "nbytes"))
    tape.backward(loss)
    grads = {n: ag.tensor(p.grad.data).numpy().tobytes() for n, p in model.named_parameters()}
    return ag.tensor(loss.data).numpy().tobytes(), grads, saved, len(tape.nodes)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_mode_gives_the_same_bits(device, dtype, name):
    model = _model(name, dtype, device)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 31, (2, 16))
    tgt = rng.integers(0, 31, (2, 16))
    loss0, g0, saved0, _ = _step(model, idx, tgt, "none")
    # Dropout is drawn: another seed gives another loss (so the replay is exercised).
    ag.manual_seed(10)
    with ag.no_grad():
        assert ag.tensor(model.loss(idx, tgt).data).numpy().tobytes() != loss0
    for mode in ("attention", "block"):
        loss1, g1, saved1, _ = _step(model, idx, tgt, mode)
        assert loss1 == loss0, mode
        assert g1.keys() == g0.keys()
        for pname in g0:
            assert g1[pname] == g0[pname], (mode, pname)
        assert saved1 < saved0, mode


@pytest.mark.parametrize("name", MODELS)
def test_block_mode_keeps_far_fewer_arrays(name):
    model = _model(name, np.float32, "cpu", n_layer=8)
    idx = np.random.default_rng(1).integers(0, 31, (2, 16))
    saved = {mode: _step(model, idx, idx, mode)[2] for mode in ("none", "attention", "block")}
    assert saved["block"] < saved["attention"] < saved["none"]
    assert saved["block"] <= saved["none"] / 3


def test_llama_generation_ignores_recompute():
    """A KV cache is appended to by the attention: with a cache it is never recomputed, and
    cached generation gives the tokens of the plain model."""
    model = _model("llama", np.float64, "cpu").eval()
    prompt = np.random.default_rng(2).integers(0, 31, (1, 5))
    plain = model.generate(prompt, 6, temperature=0.0)
    model.set_recompute("attention")
    assert all(block.recompute_attention for block in model.layers)
    np.testing.assert_array_equal(model.generate(prompt, 6, temperature=0.0), plain)


@pytest.mark.parametrize("name", MODELS)
def test_unknown_mode_is_a_clear_error(name):
    model = _model(name, np.float32, "cpu", n_layer=1)
    with pytest.raises(ValueError, match="set_recompute: argument 'mode': expected one of "
                                         "none, attention, block, given 'all'"):
        model.set_recompute("all")
    assert model.recompute == "none"
