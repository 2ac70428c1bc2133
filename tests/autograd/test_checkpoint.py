"""ag.checkpoint: gradients bit for bit equal to the plain graph's (dropout replays the same
masks), nothing but the inputs kept between forward and backward, float64 gradcheck, the
default generator left where the plain run leaves it, parameters reached through a Module
whose input needs no grad, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd import nn
from autograd.nn import functional as F
from tests.helpers import gradcheck_on


def _block(dtype=np.float64, dropout: float = 0.1, seed: int = 3) -> nn.Module:
    cfg = nn.GPTConfig(vocab_size=17, block_size=8, n_layer=1, n_head=2, n_embd=16,
                       dropout=dropout, dtype=dtype, seed=seed)
    return nn.GPT(cfg).blocks[0]


def _grads(block: nn.Module, x: np.ndarray, device: str, use_checkpoint: bool, seed: int = 11):
    block.zero_grad()
    ag.manual_seed(seed)
    xt = ag.tensor(x, requires_grad=True, device=device)
    with ag.Tape() as tape:
        h = ag.checkpoint(block, xt) if use_checkpoint else block(xt)
        y = ag.checkpoint(block, h) if use_checkpoint else block(h)  # two calls, one module
        loss = (y * y).sum()
    tape.backward(loss)
    state = ag.random.default_generator.get_state()
    grads = {n: ag.tensor(p.grad.data).numpy() for n, p in block.named_parameters()}
    return ag.tensor(loss.data).numpy(), ag.tensor(xt.grad.data).numpy(), grads, state


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gradients_equal_the_plain_graph_bit_for_bit(device, dtype):
    block = _block(dtype).to(device)
    block.train()
    x = np.random.default_rng(0).standard_normal((2, 8, 16)).astype(dtype)
    loss0, dx0, g0, s0 = _grads(block, x, device, False)
    loss1, dx1, g1, s1 = _grads(block, x, device, True)
    assert loss0.tobytes() == loss1.tobytes()
    assert dx0.tobytes() == dx1.tobytes()
    assert g0.keys() == g1.keys() and len(g0) > 4
    for name in g0:
        assert g0[name].tobytes() == g1[name].tobytes(), name
    assert s0 == s1  # the recompute put the dropout stream back where it found it


def test_dropout_masks_are_replayed_not_redrawn():
    """With dropout on, a recompute that drew new masks would give other gradients; the
    gradient of a checkpointed dropout equals the mask the forward applied."""
    x = ag.tensor(np.ones((4, 64)), requires_grad=True)
    ag.manual_seed(5)
    with ag.Tape() as tape:
        y = ag.checkpoint(lambda t: F.dropout(t, 0.5, training=True) * 1.0, x)
        loss = y.sum()
    tape.backward(loss)
    kept = ag.tensor(y.data).numpy() != 0
    np.testing.assert_array_equal(ag.tensor(x.grad.data).numpy() != 0, kept)
    assert 0 < kept.mean() < 1


def test_only_one_node_and_no_activation_is_kept():
    block = _block(dropout=0.0)
    x = ag.tensor(np.random.default_rng(1).standard_normal((2, 8, 16)), requires_grad=True)
    with ag.Tape() as plain:
        block(x)
    with ag.Tape() as ckpt:
        y = ag.checkpoint(block, x)
    assert len(plain) > 10 and len(ckpt) == 1
    saved = ckpt.nodes[0].ctx.saved
    assert len(saved) == 1 and saved[0] is x.data  # the input only
    assert y.requires_grad and y._node is ckpt.nodes[0]


def test_gradcheck_through_a_checkpointed_function(device):
    w = np.random.default_rng(2).standard_normal((5, 3))

    def fn(a, b):
        def inner(u, v):
            return F.gelu(u @ ag.tensor(w, device=device)) * v.sum(), u.exp()
        y, z = ag.checkpoint(inner, a, b)
        return y.sum(-1) + z.mean(-1)

    rng = np.random.default_rng(3)
    gradcheck_on(device, fn, rng.standard_normal((4, 5)), rng.standard_normal((2, 2)))


def test_module_parameters_get_gradients_when_the_input_needs_none():
    lin = nn.Linear(4, 3, dtype=np.float64)
    x = ag.tensor(np.ones((2, 4)))  # data: no grad
    with ag.Tape() as tape:
        y = ag.checkpoint(lin, x)
        loss = y.sum()
    tape.backward(loss)
    np.testing.assert_allclose(ag.tensor(lin.weight.grad.data).numpy(), 2.0)
    assert x.grad is None


def test_no_grad_or_nothing_to_differentiate_runs_fn_plainly():
    x = ag.tensor(np.ones(3), requires_grad=True)
    with ag.no_grad():
        y = ag.checkpoint(lambda t: t * 2.0, x)
    assert not y.requires_grad
    z = ag.checkpoint(lambda t: t * 2.0, ag.tensor(np.ones(3)))
    assert not z.requires_grad and z._node is None


def test_bad_fn_and_bad_outputs_are_clear_errors():
    x = ag.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(TypeError, match="checkpoint: argument 'fn': expected a callable"):
        ag.checkpoint(3, x)
    with pytest.raises(TypeError, match="checkpoint: fn: expected a Tensor or a tuple of "
                                        "Tensors, given float at output 0"):
        ag.checkpoint(lambda t: 1.5, x)


def test_an_input_written_in_place_before_backward_is_refused():
    x = ag.tensor(np.ones(4), requires_grad=True)
    h = x * 1.0
    with ag.Tape() as tape:
        y = ag.checkpoint(lambda t: (t * t).sum(), h)
    h.add_(1.0)  # the array the recompute would read changed
    with pytest.raises(RuntimeError, match="modified by an inplace operation|in place"):
        tape.backward(y)
