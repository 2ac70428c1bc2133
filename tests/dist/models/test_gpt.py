"""ParallelGPT against the single-process nn.GPT built from the same seed (float64)."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import dist
import gpuplan as gp
from autograd import nn, optim
from dist.models import ParallelGPT, ShardSpec, consolidate
from tests.dist.models.helpers import ATOL, LAYOUTS, RTOL, check_against_dense, rows_of

F64 = np.float64
CFG = dict(vocab_size=37, block_size=8, n_layer=4, n_head=4, n_embd=16, dtype=F64, seed=5)
BATCH = 8


def batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, CFG["vocab_size"], (BATCH, CFG["block_size"])),
            rng.integers(0, CFG["vocab_size"], (BATCH, CFG["block_size"])))


def dense_reference(cfg: nn.GPTConfig, x, y, clip: float | None = None):
    model = nn.GPT(cfg)
    loss = model.loss(x, y)
    loss.backward()
    norm = optim.clip_grad_norm_(model.parameters(), clip) if clip else None
    return model, float(loss.item()), norm


@pytest.mark.parametrize("micro", [1, 2, 4])
def test_single_process_matches_dense_gpt(micro):
    cfg = nn.GPTConfig(**CFG)
    x, y = batch()
    dense, loss, _ = dense_reference(cfg, x, y)
    pg = ParallelGPT(cfg, num_micro_batches=micro)
    # The dense model's parts with parallel layers substituted (composition, no subclass).
    assert not isinstance(pg, nn.GPT) and all(isinstance(b, nn.Block) for b in pg.blocks)
    assert isinstance(pg.blocks[0].mlp.fc, dist.ColumnParallelLinear)
    assert [n for n, _ in pg.named_parameters()] == [n for n, _ in dense.named_parameters()]
    assert abs(pg.train_step(x, y) - loss) <= 1e-12 * abs(loss)
    assert check_against_dense(pg, dense) == len(list(dense.parameters()))
    assert abs(dist.evaluate(pg, x, y) - loss) <= 1e-12 * abs(loss)


@pytest.mark.parametrize("fused", [True, False])
def test_fused_mlp_is_a_model_option_dense_and_parallel_alike(monkeypatch, fused):
    """config.fused_mlp runs each MLP's GELU in its fc GEMM's epilogue in nn.GPT and in
    ParallelGPT (on the column-parallel shard), or fc then GELU in both; the values agree."""
    from autograd.functions.matmul import LinearGelu

    calls = []
    real = LinearGelu.apply
    monkeypatch.setattr(LinearGelu, "apply", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    cfg = nn.GPTConfig(**CFG, fused_mlp=fused)
    x, y = batch()
    dense, loss, _ = dense_reference(cfg, x, y)
    assert len(calls) == (cfg.n_layer if fused else 0)
    calls.clear()
    pg = ParallelGPT(cfg)
    assert abs(pg.train_step(x, y) - loss) <= 1e-12 * abs(loss)
    assert len(calls) == (cfg.n_layer if fused else 0)
    assert check_against_dense(pg, dense) == len(list(dense.parameters()))
    other, other_loss, _ = dense_reference(nn.GPTConfig(**CFG, fused_mlp=not fused), x, y)
    assert abs(other_loss - loss) <= 1e-12 * abs(loss)


def test_untied_head_and_consolidation_round_trip():
    cfg = nn.GPTConfig(**{**CFG, "tie_weights": False})
    x, y = batch()
    dense, loss, _ = dense_reference(cfg, x, y)
    pg = ParallelGPT(cfg)
    assert pg.train_step(x, y) == loss
    assert check_against_dense(pg, dense) == len(list(dense.parameters()))
    state = dist.gather_dense_state_dict(pg, None)
    ref = dense.state_dict()
    assert list(state) == list(ref)
    for k in ref:
        np.testing.assert_array_equal(state[k], ref[k])


def test_consolidate_reports_missing_shards():
    cfg = nn.GPTConfig(**CFG)
    pg = ParallelGPT(cfg)
    parts = [(p.numpy(), p.shard_spec.to_json()) for p in pg.parameters()][:-1]
    with pytest.raises(ValueError, match="incomplete shards"):
        consolidate(cfg, parts)
    spec = ShardSpec("blocks.0.attn.qkv.weight", 1, (3, 1, 2), True)
    assert ShardSpec.from_json(spec.to_json()) == spec


def test_shape_errors_name_the_argument(world):
    with pytest.raises(dist.ProcessMesh.__init__.__globals__["InvalidProblem"],
                       match="n_layer"):
        ParallelGPT(nn.GPTConfig(**{**CFG, "n_layer": 3}), pp=_FakeComm(2))
    with pytest.raises(Exception, match="n_head"):
        ParallelGPT(nn.GPTConfig(**{**CFG, "n_head": 4, "n_embd": 16}), tp=_FakeComm(3))


class _FakeComm:
    """Only .size and .rank: construction checks run before any communication."""

    def __init__(self, size: int) -> None:
        self.size, self.rank = size, 0


@pytest.mark.mpi
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_single_process(world, layout, schedule):
    dp, pp, tp = LAYOUTS[layout](world.size)
    if dp * pp * tp != world.size:
        pytest.skip(f"{layout} needs 4 ranks")
    if schedule == "gpipe" and pp == 1:
        pytest.skip("the schedule only matters with pipeline stages")
    mesh = dist.ProcessMesh(dp=dp, pp=pp, tp=tp, world=world)
    cfg = nn.GPTConfig(**CFG)
    x, y = batch(1)
    dense, loss, norm = dense_reference(cfg, x, y, clip=0.05)
    pg = ParallelGPT(cfg, mesh, num_micro_batches=2, schedule=schedule)
    got = pg.train_step(rows_of(x, mesh.dp_rank, dp), rows_of(y, mesh.dp_rank, dp))
    assert got == pytest.approx(loss, rel=1e-12)
    got_norm = dist.clip_grad_norm_(pg, 0.05)
    assert got_norm == pytest.approx(norm, rel=1e-10)
    check_against_dense(pg, dense)  # clipped gradients
    for name, p in pg.named_parameters():  # dense names; the tied copy is the head's
        assert name == (p.shard_spec.name if not p.shard_spec.duplicate else "head.weight")
    # One AdamW step on both: the shards stay exact slices of the dense weights.
    for model in (dense, pg):
        opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        opt.step()
    check_against_dense(pg, dense, what="value")
    state = dist.gather_dense_state_dict(pg, world)
    if world.rank == 0:
        for k, v in dense.state_dict().items():
            np.testing.assert_allclose(state[k], v, rtol=RTOL, atol=ATOL, err_msg=k)
    assert dist.evaluate(pg, rows_of(x, mesh.dp_rank, dp), rows_of(y, mesh.dp_rank, dp)) == \
        pytest.approx(float(dense.loss(x, y).item()), rel=1e-12)


@pytest.mark.mpi
@pytest.mark.parametrize("layout", ["tp", "pp", "pp2xtp2", "dp2xtp2"])
def test_untied_head_layout_matches_single_process(world, layout):
    """The untied head is split by vocab_range blocks (37 rows: uneven over 2 or 4 ranks)."""
    dp, pp, tp = LAYOUTS[layout](world.size)
    if dp * pp * tp != world.size:
        pytest.skip(f"{layout} needs 4 ranks")
    mesh = dist.ProcessMesh(dp=dp, pp=pp, tp=tp, world=world)
    cfg = nn.GPTConfig(**{**CFG, "tie_weights": False})
    x, y = batch(4)
    dense, loss, norm = dense_reference(cfg, x, y, clip=0.05)
    pg = ParallelGPT(cfg, mesh, num_micro_batches=2)
    got = pg.train_step(rows_of(x, mesh.dp_rank, dp), rows_of(y, mesh.dp_rank, dp))
    assert got == pytest.approx(loss, rel=1e-12)
    assert dist.clip_grad_norm_(pg, 0.05) == pytest.approx(norm, rel=1e-10)
    check_against_dense(pg, dense)
    state = dist.gather_dense_state_dict(pg, world)
    if world.rank == 0:
        assert list(state) == list(dense.state_dict())


@pytest.mark.mpi
@pytest.mark.parametrize("drop", [{"dropout": 0.3}, {"attn_dropout": 0.3}],
                         ids=["all", "attention-only"])
def test_tensor_parallel_dropout_masks_agree_with_the_dense_model(world, drop):
    """With the same default seed on every TP rank, a TP model with dropout gives exactly
    the dense model's loss and gradients: replicated activations draw the same masks, and
    each rank's attention probabilities (its heads) draw the dense model's bits for those
    heads (the fused plans' head layout)."""
    cfg = nn.GPTConfig(**{**CFG, **drop})
    x, y = batch(2)
    saved = ag.random.default_generator.get_state()
    try:
        ag.random.manual_seed(11)
        dense, loss, _ = dense_reference(cfg, x, y)
        ag.random.manual_seed(11)
        pg = ParallelGPT(cfg, tp=world)
        assert pg.train_step(x, y) == pytest.approx(loss, rel=1e-12)
        check_against_dense(pg, dense)
        ag.random.manual_seed(11)
        plain = nn.GPT(nn.GPTConfig(**CFG)).loss(x, y).item()
        # dropout really acted (attention dropout alone moves this small model's loss ~1e-4)
        assert abs(plain - loss) > 1e-5
    finally:
        ag.random.default_generator.set_state(saved)


@pytest.mark.mpi
@pytest.mark.parametrize("layout", ["tp", "pp", "pp2xtp2"])
def test_layout_on_the_emulated_device_matches_the_host(world, layout):
    """ParallelGPT with every kernel on the emulated device (device arrays take the
    host-staged MPI path) against the dense model on the host backend, float64."""
    dp, pp, tp = LAYOUTS[layout](world.size)
    if dp * pp * tp != world.size:
        pytest.skip(f"{layout} needs 4 ranks")
    mesh = dist.ProcessMesh(dp=dp, pp=pp, tp=tp, world=world)
    cfg = nn.GPTConfig(**CFG)
    x, y = batch(3)
    dense, loss, norm = dense_reference(cfg, x, y, clip=0.05)
    pg = ParallelGPT(cfg, mesh, num_micro_batches=2, device="emulated")
    assert all(gp.device_of(p.data) == "emulated" for p in pg.parameters())
    assert pg.train_step(x, y) == pytest.approx(loss, rel=1e-10)
    assert dist.clip_grad_norm_(pg, 0.05) == pytest.approx(norm, rel=1e-9)
    ref = dict(dense.named_parameters())
    for name, p in pg.named_parameters():
        want = p.shard_spec.take(ref[p.shard_spec.name].grad.numpy())
        np.testing.assert_allclose(gp.to_host(p.grad.data), want, rtol=1e-9, atol=1e-12,
                                   err_msg=name)
