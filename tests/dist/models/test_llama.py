"""ParallelLlama against the single-process nn.Llama built from the same seed (float64), in
every layout, with multi-head, grouped-query and multi-query attention."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import dist
import gpuplan as gp
from autograd import nn, optim
from dist.models import ParallelLlama, kv_column_order
from gpuplan.errors import InvalidProblem
from tests.dist.models.helpers import (
    ATOL,
    RTOL,
    check_against_dense,
    layout_mesh,
    rows_of,
)

CFG = dict(vocab_size=37, block_size=8, n_layer=4, n_head=4, n_embd=16, ffn_hidden=24,
           dtype=np.float64, seed=7)
BATCH = 8


def config(**changes) -> nn.LlamaConfig:
    return nn.LlamaConfig(**{**CFG, **changes})


def batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, CFG["vocab_size"], (BATCH, CFG["block_size"])),
            rng.integers(0, CFG["vocab_size"], (BATCH, CFG["block_size"])))


def dense_reference(cfg: nn.LlamaConfig, x, y, clip: float | None = None):
    model = nn.Llama(cfg)
    loss = model.loss(x, y)
    loss.backward()
    norm = optim.clip_grad_norm_(model.parameters(), clip) if clip else None
    return model, float(loss.item()), norm


@pytest.mark.parametrize("micro", [1, 2])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("kv", [4, 2, 1])
def test_single_process_matches_dense_llama(kv, tied, micro):
    cfg = config(n_kv_head=kv, tie_weights=tied)
    x, y = batch()
    dense, loss, _ = dense_reference(cfg, x, y)
    pm = ParallelLlama(cfg, num_micro_batches=micro)
    # The dense model's parts with parallel layers substituted (composition, no subclass).
    assert not isinstance(pm, nn.Llama)
    assert all(isinstance(b, nn.LlamaBlock) for b in pm.layers)
    assert isinstance(pm.layers[0].self_attn.k_proj, dist.ColumnParallelLinear)
    assert isinstance(pm.layers[0].mlp.down_proj, dist.RowParallelLinear)
    assert [n for n, _ in pm.named_parameters()] == [n for n, _ in dense.named_parameters()]
    assert pm.train_step(x, y) == pytest.approx(loss, rel=1e-12)
    assert check_against_dense(pm, dense) == len(list(dense.parameters()))
    assert dist.evaluate(pm, x, y) == pytest.approx(loss, rel=1e-12)
    state = dist.gather_dense_state_dict(pm, None)
    assert list(state) == list(dense.state_dict())
    for k, v in dense.state_dict().items():
        np.testing.assert_array_equal(state[k], v, err_msg=k)


def test_kv_column_order_gives_each_rank_the_heads_its_queries_read():
    np.testing.assert_array_equal(kv_column_order(4, 2, 2), np.arange(8))  # 2 heads a rank
    np.testing.assert_array_equal(kv_column_order(2, 2, 4), [0, 1, 0, 1, 2, 3, 2, 3])
    np.testing.assert_array_equal(kv_column_order(1, 3, 2), [0, 1, 2, 0, 1, 2])
    # Query head h reads K/V head h // (H / Hkv): rank r's query heads all read block r.
    H, Hkv, tp, dh = 8, 2, 4, 2
    order = kv_column_order(Hkv, dh, tp).reshape(tp, -1)
    for r in range(tp):
        read = {h // (H // Hkv) for h in range(r * H // tp, (r + 1) * H // tp)}
        assert set(order[r] // dh) == read


class _FakeComm:
    """Only .size and .rank: construction checks run before any communication."""

    def __init__(self, size: int) -> None:
        self.size, self.rank = size, 0


@pytest.mark.parametrize("changes, tp, pp, arg", [
    (dict(n_head=6, n_embd=24, n_kv_head=2, ffn_hidden=24), 3, 1, "n_kv_head"),
    (dict(n_kv_head=2), 3, 1, "n_head"),
    (dict(n_kv_head=2, ffn_hidden=26), 4, 1, "ffn_hidden"),
    (dict(n_layer=3), 1, 2, "n_layer"),
])
def test_layout_errors_name_the_config_field(changes, tp, pp, arg):
    with pytest.raises(InvalidProblem, match=f"ParallelLlama.*{arg}"):
        ParallelLlama(config(**changes), tp=_FakeComm(tp), pp=_FakeComm(pp))


# (layout, n_kv_head, tied, schedule): n_kv_head 4 = n_head, 2 = n_head / 2, 1 (MQA); with
# tp = 2 a rank holds 2 K/V heads, 1, or a copy of the only one; with tp = 4 one, or a copy.
CASES = [("tp", 4, False, "1f1b"), ("tp", 2, True, "1f1b"), ("tp", 1, False, "1f1b"),
         ("pp", 2, True, "1f1b"), ("pp", 1, False, "gpipe"), ("dp", 2, False, "1f1b"),
         ("pp2xtp2", 4, True, "1f1b"), ("pp2xtp2", 2, False, "gpipe"),
         ("pp2xtp2", 1, True, "1f1b"), ("dp2xtp2", 4, False, "1f1b"),
         ("dp2xtp2", 2, True, "1f1b"), ("dp2xtp2", 1, False, "1f1b"),
         ("dp2xpp2", 2, True, "1f1b")]


@pytest.mark.mpi
@pytest.mark.parametrize("layout, kv, tied, schedule", CASES,
                         ids=[f"{c[0]}-kv{c[1]}-{'tied' if c[2] else 'untied'}-{c[3]}"
                              for c in CASES])
def test_layout_matches_single_process(world, layout, kv, tied, schedule):
    mesh, dp = layout_mesh(world, layout)
    cfg = config(n_kv_head=kv, tie_weights=tied)
    x, y = batch(1)
    dense, loss, norm = dense_reference(cfg, x, y, clip=0.05)
    pm = ParallelLlama(cfg, mesh, num_micro_batches=2, schedule=schedule)
    xs, ys = rows_of(x, mesh.dp_rank, dp), rows_of(y, mesh.dp_rank, dp)
    assert pm.train_step(xs, ys) == pytest.approx(loss, rel=1e-12)
    assert dist.clip_grad_norm_(pm, 0.05) == pytest.approx(norm, rel=1e-10)
    check_against_dense(pm, dense)  # clipped gradients, K/V copies summed over their ranks
    for name, p in pm.named_parameters():  # dense names; the tied copy is the head's
        spec = p.shard_spec
        assert name == spec.name or (spec.duplicate and name == "lm_head.weight"), name
    # One AdamW step on both: the shards (and K/V copies) stay exact slices of the dense.
    for model in (dense, pm):
        optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1).step()
    check_against_dense(pm, dense, what="value")
    state = dist.gather_dense_state_dict(pm, world)
    if world.rank == 0:
        assert list(state) == list(dense.state_dict())
        for k, v in dense.state_dict().items():
            np.testing.assert_allclose(state[k], v, rtol=RTOL, atol=ATOL, err_msg=k)
    assert dist.evaluate(pm, xs, ys) == \
        pytest.approx(float(dense.loss(x, y).item()), rel=1e-12)


@pytest.mark.mpi
@pytest.mark.parametrize("layout", ["tp", "pp2xtp2"])
def test_layout_on_the_emulated_device_matches_the_host(world, layout):
    """ParallelLlama with every kernel on the emulated device (rope_split_heads, swiglu,
    rms_norm and the fused attention on the local heads; device arrays take the host-staged
    MPI path) against the dense model on the host backend, float64; one K/V head, so that
    at tp 2 and 4 ranks hold copies of it."""
    mesh, dp = layout_mesh(world, layout)
    cfg = config(n_kv_head=1)
    x, y = batch(3)
    dense, loss, norm = dense_reference(cfg, x, y, clip=0.05)
    pm = ParallelLlama(cfg, mesh, num_micro_batches=2, device="emulated")
    assert all(gp.device_of(p.data) == "emulated" for p in pm.parameters())
    assert pm.train_step(x, y) == pytest.approx(loss, rel=1e-10)
    assert dist.clip_grad_norm_(pm, 0.05) == pytest.approx(norm, rel=1e-9)
    ref = dict(dense.named_parameters())
    for name, p in pm.named_parameters():
        want = p.shard_spec.take(ref[p.shard_spec.name].grad.numpy())
        np.testing.assert_allclose(gp.to_host(p.grad.data), want, rtol=1e-9, atol=1e-12,
                                   err_msg=name)


@pytest.mark.mpi
@pytest.mark.parametrize("kv", [2, 1])
def test_tensor_parallel_attention_dropout_agrees_with_the_dense_model(world, kv):
    """With the same default seed on every TP rank, a TP Llama with attention dropout gives
    exactly the dense model's loss and gradients: each rank's attention drops, for its query
    heads, the entries one process drops for them (its K/V heads whole or copies)."""
    cfg = config(n_kv_head=kv, dropout=0.3)
    x, y = batch(2)
    saved = ag.random.default_generator.get_state()
    try:
        ag.random.manual_seed(11)
        dense, loss, _ = dense_reference(cfg, x, y)
        ag.random.manual_seed(11)
        pm = ParallelLlama(cfg, tp=world)
        assert pm.train_step(x, y) == pytest.approx(loss, rel=1e-12)
        check_against_dense(pm, dense)
        plain = nn.Llama(config(n_kv_head=kv)).loss(x, y).item()
        assert abs(plain - loss) > 1e-5  # dropout really acted
    finally:
        ag.random.default_generator.set_state(saved)
