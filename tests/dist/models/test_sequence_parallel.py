"""Sequence parallelism (``sequence_parallel=True``) of ParallelGPT and ParallelLlama against
the dense model and the tensor-parallel model without it (float64, dropout on)."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import dist
from autograd import nn, optim
from dist.models import ParallelGPT, ParallelLlama
from dist.tensor_parallel.sequence import SequenceParallelDropout
from gpuplan.errors import InvalidProblem
from tests.dist.models.helpers import (
    LAYOUTS,
    assert_recompute_keeps_bits,
    check_against_dense,
    layout_mesh,
    rows_of,
)

F64 = np.float64
B, T = 4, 8
SEED = 11
TOL = dict(rtol=1e-9, atol=1e-12)
MODELS = {
    "gpt": (nn.GPTConfig, nn.GPT, ParallelGPT,
            dict(vocab_size=37, block_size=T, n_layer=2, n_head=4, n_embd=16, dtype=F64,
                 seed=5)),
    "llama": (nn.LlamaConfig, nn.Llama, ParallelLlama,  # grouped-query: 2 K/V heads
              dict(vocab_size=37, block_size=T, n_layer=2, n_head=4, n_kv_head=2, n_embd=16,
                   ffn_hidden=24, dtype=F64, seed=7)),
}


def batch(seed: int = 3, length: int = T):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 37, (B, length)), rng.integers(0, 37, (B, length)))


def norms_of(model) -> list:
    """The model's LayerNorm / RMSNorm modules."""
    return [m for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))]


def record_lengths(model) -> list[int]:
    """Sequence lengths every norm of `model` is run on (its forward wrapped)."""
    seen: list[int] = []

    def recording(forward):
        def run(x, *rest):
            seen.append(x.shape[1])
            return forward(x, *rest)
        return run

    for norm in norms_of(model):
        for attr in ("forward", "forward_residual"):  # the latter: a norm fused with an add
            if hasattr(norm, attr):
                object.__setattr__(norm, attr, recording(getattr(norm, attr)))
    return seen


def dense_run(name: str, x, y, dp: int, dropout: float, clip: float):
    """The dense model's loss, clipped gradient norm and model, the batch's rows of each
    data-parallel rank run with the default generator seeded alike (as every rank is)."""
    config_cls, dense_cls, _, cfg = MODELS[name]
    model = dense_cls(config_cls(**cfg, dropout=dropout))
    losses = []
    for d in range(dp):
        ag.random.manual_seed(SEED)
        loss = model.loss(rows_of(x, d, dp), rows_of(y, d, dp))
        (loss * (1.0 / dp)).backward()
        losses.append(float(loss.item()))
    norm = optim.clip_grad_norm_(model.parameters(), clip)
    return float(np.mean(losses)), norm, model


def parallel_run(name: str, mesh, dp: int, x, y, dropout: float, clip: float, sp: bool):
    """A parallel model's loss, clipped gradient norm, model and the norms' input lengths."""
    config_cls, _, parallel_cls, cfg = MODELS[name]
    ag.random.manual_seed(SEED)
    model = parallel_cls(config_cls(**cfg, dropout=dropout), mesh, sequence_parallel=sp)
    lengths = record_lengths(model)
    loss = model.train_step(rows_of(x, mesh.dp_rank, dp), rows_of(y, mesh.dp_rank, dp))
    return loss, dist.clip_grad_norm_(model, clip), model, lengths


@pytest.mark.mpi
@pytest.mark.parametrize("layout", ["tp", "pp2xtp2", "dp2xtp2"])
@pytest.mark.parametrize("name", list(MODELS))
def test_sequence_parallel_equals_dense_and_tensor_parallel(world, name, layout):
    """Loss, clipped gradient norm and every clipped gradient of the sequence-parallel model
    equal the tensor-parallel model's with dropout on (same masks), and the dense model's:
    with dropout where one process draws the same masks (no pipeline: each pipeline stage
    starts its own stream), without it otherwise. Norms really run on T / tp tokens."""
    mesh, dp = layout_mesh(world, layout)
    tp, pp = LAYOUTS[layout](world.size)[2], LAYOUTS[layout](world.size)[1]
    x, y = batch()
    clip = 0.05
    saved = ag.random.default_generator.get_state()
    try:
        loss, norm, model, lengths = parallel_run(name, mesh, dp, x, y, 0.2, clip, sp=True)
        assert model.sequence_parallel and lengths and set(lengths) == {T // tp}
        assert all(isinstance(m, SequenceParallelDropout) for m in model.modules()
                   if isinstance(m, nn.Dropout | SequenceParallelDropout))
        tp_loss, tp_norm, tp_model, tp_lengths = parallel_run(name, mesh, dp, x, y, 0.2, clip,
                                                              sp=False)
        assert set(tp_lengths) == {T}
        assert loss == pytest.approx(tp_loss, rel=1e-9)
        assert norm == pytest.approx(tp_norm, rel=1e-9)
        want = dict(tp_model.named_parameters())
        for pname, p in model.named_parameters():
            np.testing.assert_allclose(p.grad.numpy(), want[pname].grad.numpy(), **TOL,
                                       err_msg=pname)
        dropout = 0.2 if pp == 1 else 0.0
        if dropout == 0.0:
            loss, norm, model, _ = parallel_run(name, mesh, dp, x, y, 0.0, clip, sp=True)
        dense_loss, dense_norm, dense = dense_run(name, x, y, dp, dropout, clip)
        assert loss == pytest.approx(dense_loss, rel=1e-9)
        assert norm == pytest.approx(dense_norm, rel=1e-9)
        assert check_against_dense(model, dense, **TOL) == len(list(model.parameters()))
        if dropout:
            plain, _, _ = dense_run(name, x, y, dp, 0.0, clip)
            assert abs(plain - loss) > 1e-5  # dropout really acted
    finally:
        ag.random.default_generator.set_state(saved)


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(MODELS))
def test_sequence_length_not_divisible_by_tp_is_refused(world, name):
    config_cls, _, parallel_cls, cfg = MODELS[name]
    model = parallel_cls(config_cls(**cfg), tp=world, sequence_parallel=True)
    x, y = batch(length=T - 1)
    with pytest.raises(InvalidProblem, match=r"train_step.*idx.*divisible by the tensor-"
                                             r"parallel size"):
        model.train_step(x, y)
    with pytest.raises(InvalidProblem, match=r"forward.*idx"):
        model(x)


@pytest.mark.parametrize("name", list(MODELS))
def test_sequence_parallel_on_one_process_changes_nothing(name):
    """Without a tensor-parallel group there is no sequence to split: the option is a no-op."""
    config_cls, _, parallel_cls, cfg = MODELS[name]
    x, y = batch()
    plain = parallel_cls(config_cls(**cfg))
    model = parallel_cls(config_cls(**cfg), sequence_parallel=True)
    assert not model.sequence_parallel
    assert model.train_step(x, y) == plain.train_step(x, y)


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["attention", "block"])
def test_sequence_parallel_with_recomputation_gives_the_same_gradients(world, mode):
    """Recomputed blocks re-run their collectives and draw the same dropout masks."""
    config_cls, _, _, cfg = MODELS["gpt"]
    x, y = batch()
    assert_recompute_keeps_bits(lambda: ParallelGPT(config_cls(**cfg, dropout=0.2), tp=world,
                                                    sequence_parallel=True), mode, x, y, SEED)


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(MODELS))
def test_sequence_parallel_on_the_emulated_device_matches_the_host(world, name):
    """Every kernel on the emulated device (dropout's pad and slice included; device arrays
    take the host-staged MPI path) against the same model on the host, float64."""
    import gpuplan as gp

    config_cls, _, parallel_cls, cfg = MODELS[name]
    x, y = batch()
    saved = ag.random.default_generator.get_state()
    try:
        runs = []
        for device in ("cpu", "emulated"):
            ag.random.manual_seed(SEED)
            model = parallel_cls(config_cls(**cfg, dropout=0.2), tp=world, device=device,
                                 sequence_parallel=True)
            runs.append((model.train_step(x, y), dict(model.named_parameters())))
        (loss, host), (got, emulated) = runs
        assert got == pytest.approx(loss, rel=1e-10)
        for pname, p in emulated.items():
            assert gp.device_of(p.data) == "emulated"
            np.testing.assert_allclose(gp.to_host(p.grad.data), host[pname].grad.numpy(), **TOL,
                                       err_msg=pname)
    finally:
        ag.random.default_generator.set_state(saved)
