"""Context parallelism (``ProcessMesh(cp=...)``) of ParallelGPT and ParallelLlama against the
dense model in one process (float64): losses, clipped gradient norms and gradients over a
few optimizer steps, alone and with tp (and sequence parallelism), pp and dp."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import dist
from autograd import nn, optim
from dist.context_parallel_layers import PositionDropout, RingLlamaAttention, RingSelfAttention
from dist.models import ParallelGPT, ParallelLlama
from gpuplan.errors import InvalidProblem
from tests.dist.models.helpers import assert_recompute_keeps_bits, check_against_dense, rows_of

F64 = np.float64
B, T, V = 4, 16, 37
SEED, STEPS, CLIP, LR = 11, 3, 0.5, 1e-2
TOL = dict(rtol=1e-9, atol=1e-12)
MODELS = {
    "gpt": (nn.GPTConfig, nn.GPT, ParallelGPT,
            dict(vocab_size=V, block_size=T, n_layer=2, n_head=4, n_embd=32, dtype=F64,
                 seed=5, attn_dropout=0.0)),
    "llama": (nn.LlamaConfig, nn.Llama, ParallelLlama,  # grouped-query: 2 K/V heads
              dict(vocab_size=V, block_size=T, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                   ffn_hidden=48, dtype=F64, seed=7)),
}
# (dp, pp, cp, tp, sequence_parallel) of a world of n ranks; mixed layouts need n = 4.
LAYOUTS = {
    "cp": lambda n: (1, 1, n, 1, False),
    "cp2xtp2": lambda n: (1, 1, 2, 2, False),
    "cp2xtp2-sp": lambda n: (1, 1, 2, 2, True),
    "cp2xpp2": lambda n: (1, 2, 2, 1, False),
    "dp2xcp2": lambda n: (2, 1, 2, 1, False),
}


def batch(seed: int = 3, length: int = T):
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, V, (B, length)), rng.integers(0, V, (B, length))
    y[0, :3] = -100  # ignored targets: the cp ranks hold different counts of them
    return x, y


def dense_steps(name: str, x, y, dp: int, dropout: float):
    """Losses and gradient norms of STEPS AdamW steps of the dense model, each data-parallel
    rank's rows run from the generator state every rank starts the step with."""
    config_cls, dense_cls, _, cfg = MODELS[name]
    model = dense_cls(config_cls(**cfg, dropout=dropout))
    opt = optim.AdamW(model.parameters(), lr=LR)
    losses, norms = [], []
    for _ in range(STEPS):
        opt.zero_grad()
        start = ag.random.default_generator.get_state()
        step_losses = []
        for d in range(dp):
            ag.random.default_generator.set_state(start)
            loss = model.loss(rows_of(x, d, dp), rows_of(y, d, dp))
            (loss * (1.0 / dp)).backward()
            step_losses.append(float(loss.item()))
        losses.append(float(np.mean(step_losses)))
        norms.append(optim.clip_grad_norm_(model.parameters(), CLIP))
        if len(losses) == 1:
            first = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        opt.step()
    return losses, norms, first


def parallel_steps(name: str, mesh, dp: int, sp: bool, x, y, dropout: float):
    config_cls, _, parallel_cls, cfg = MODELS[name]
    model = parallel_cls(config_cls(**cfg, dropout=dropout), mesh, sequence_parallel=sp)
    opt = optim.AdamW(model.parameters(), lr=LR)
    losses, norms = [], []
    for _ in range(STEPS):
        opt.zero_grad()
        losses.append(model.train_step(rows_of(x, mesh.dp_rank, dp),
                                       rows_of(y, mesh.dp_rank, dp)))
        norms.append(dist.clip_grad_norm_(model, CLIP))
        if len(losses) == 1:
            first = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        opt.step()
    return losses, norms, first, model


@pytest.mark.mpi
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(MODELS))
def test_context_parallel_equals_one_process(world, name, layout):
    """Losses and clipped gradient norms of 3 AdamW steps, and the first step's every
    gradient, equal the dense model's (GPT with residual dropout where one process draws
    the same masks: no pipeline, whose stages start their own streams)."""
    dp, pp, cp, tp, sp = LAYOUTS[layout](world.size)
    if dp * pp * cp * tp != world.size:
        pytest.skip(f"{layout} needs 4 ranks")
    mesh = dist.ProcessMesh(dp=dp, pp=pp, cp=cp, tp=tp, world=world)
    dropout = 0.2 if name == "gpt" and pp == 1 else 0.0
    x, y = batch()
    saved = ag.random.default_generator.get_state()
    try:
        ag.random.manual_seed(SEED)
        losses, norms, grads, model = parallel_steps(name, mesh, dp, sp, x, y, dropout)
        ring = RingSelfAttention if name == "gpt" else RingLlamaAttention
        assert sum(isinstance(m, ring) for m in model.modules()) == 2 // pp
        if dropout:
            assert all(isinstance(m, PositionDropout) for m in model.modules()
                       if isinstance(m, nn.Dropout | PositionDropout))
        ag.random.manual_seed(SEED)
        want_losses, want_norms, want_grads = dense_steps(name, x, y, dp, dropout)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-9)
        np.testing.assert_allclose(norms, want_norms, rtol=1e-9)
        specs = model.shard_specs()
        for pname, g in grads.items():
            spec = specs[pname]
            np.testing.assert_allclose(g, spec.take(want_grads[spec.name]), **TOL,
                                       err_msg=pname)
        if dropout:
            ag.random.manual_seed(SEED)
            plain, _, _ = dense_steps(name, x, y, dp, 0.0)
            assert abs(plain[0] - losses[0]) > 1e-5  # dropout really acted
    finally:
        ag.random.default_generator.set_state(saved)


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(MODELS))
def test_forward_and_evaluate_gather_whole_sequences(world, name):
    """forward() returns the whole sequences' logits in order; dist.evaluate their loss."""
    config_cls, dense_cls, parallel_cls, cfg = MODELS[name]
    mesh = dist.ProcessMesh(cp=world.size, world=world)
    model = parallel_cls(config_cls(**cfg), mesh)
    dense = dense_cls(config_cls(**cfg))
    x, y = batch()
    np.testing.assert_allclose(model(x).numpy(), dense(x).numpy(), **TOL)
    with ag.no_grad():
        want = float(dense.loss(x, y).item())
    assert dist.evaluate(model, x, y) == pytest.approx(want, rel=1e-10)
    assert check_against_dense(model, dense, what="value") == len(list(model.parameters()))


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["attention", "block"])
def test_context_parallel_with_recomputation_gives_the_same_gradients(world, mode):
    """Recomputed blocks re-run the ring (and draw the same dropout masks)."""
    config_cls, _, parallel_cls, cfg = MODELS["gpt"]
    mesh = dist.ProcessMesh(cp=world.size, world=world)
    x, y = batch()
    assert_recompute_keeps_bits(lambda: parallel_cls(config_cls(**cfg, dropout=0.2), mesh),
                                mode, x, y, SEED)


@pytest.mark.mpi
def test_dp2xcp2_with_zero_equals_one_process(world):
    """ZeRO-1 over dp (its reduce-scatter after the model's sums over cp): the dense
    model's losses and clipped gradient norms over 3 steps."""
    from dist.zero import ZeroRedundancyOptimizer

    if world.size != 4:
        pytest.skip("dp2xcp2 needs 4 ranks")
    config_cls, _, parallel_cls, cfg = MODELS["gpt"]
    mesh = dist.ProcessMesh(dp=2, cp=2, world=world)
    x, y = batch()
    model = parallel_cls(config_cls(**cfg), mesh)
    model.reduce_data_parallel = False
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.AdamW,
                                  comm=mesh.dp, lr=LR)
    losses, norms = [], []
    for _ in range(STEPS):
        opt.zero_grad()
        losses.append(model.train_step(rows_of(x, mesh.dp_rank, 2), rows_of(y, mesh.dp_rank, 2)))
        opt.reduce_gradients()
        norms.append(opt.grad_norm(model))
        opt.clip_grads_with_norm_(CLIP, norms[-1])
        opt.step()
    want_losses, want_norms, _ = dense_steps("gpt", x, y, 2, 0.0)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-9)
    np.testing.assert_allclose(norms, want_norms, rtol=1e-9)


@pytest.mark.mpi
def test_context_parallel_on_the_emulated_device_matches_the_host(world):
    """Ring attention's blocks, merges and host-staged messages, and RoPE per chunk, on the
    emulated device against the same model (Llama, grouped-query) on the host (float64)."""
    import gpuplan as gp

    if world.size != 2:
        pytest.skip("cp2 only (the emulated device is slow; tests/dist/test_context_parallel.py "
                    "runs the ring on it at every world size)")
    config_cls, _, parallel_cls, cfg = MODELS["llama"]
    mesh = dist.ProcessMesh(cp=world.size, world=world)
    x, y = batch()
    runs = []
    for device in ("cpu", "emulated"):
        model = parallel_cls(config_cls(**cfg), mesh, device=device)
        runs.append((model.train_step(x, y), dict(model.named_parameters())))
    (loss, host), (got, emulated) = runs
    assert got == pytest.approx(loss, rel=1e-10)
    for pname, p in emulated.items():
        assert gp.device_of(p.data) == "emulated"
        np.testing.assert_allclose(gp.to_host(p.grad.data), host[pname].grad.numpy(), **TOL,
                                   err_msg=pname)


@pytest.mark.mpi
def test_context_parallel_refusals(world):
    config_cls, _, parallel_cls, cfg = MODELS["gpt"]
    mesh = dist.ProcessMesh(cp=world.size, world=world)
    model = parallel_cls(config_cls(**cfg), mesh)
    x, y = batch(length=2 * world.size + 2)
    with pytest.raises(InvalidProblem, match=r"ParallelGPT.train_step.*'idx'.*divisible by "
                                             r"2 \* cp"):
        model.train_step(x, y)
    with pytest.raises(InvalidProblem, match=r"ParallelGPT.forward.*'idx'"):
        model(x)
    with pytest.raises(InvalidProblem, match=r"ParallelGPT.*attn_dropout.*0 with context"):
        parallel_cls(config_cls(**{**cfg, "attn_dropout": 0.1}), mesh)
    llama_cls, _, parallel_llama, llama_cfg = MODELS["llama"]
    with pytest.raises(InvalidProblem, match=r"ParallelLlama.*dropout.*0 with context"):
        parallel_llama(llama_cls(**llama_cfg, dropout=0.1), mesh)


@pytest.mark.mpi
def test_a_context_parallel_checkpoint_records_cp_and_loads_in_its_layout(world,
                                                                          tmp_path_factory):
    """Each shard's coordinates name the cp size and this rank's cp index; the same layout
    loads its own shards back (no resharding), bit for bit."""
    from dist.checkpoint import coordinates_of

    config_cls, _, parallel_cls, cfg = MODELS["llama"]
    mesh = dist.ProcessMesh(cp=world.size, world=world)
    model = parallel_cls(config_cls(**cfg), mesh)
    coords = coordinates_of(model, world)
    assert coords["layout"] == {"dp": 1, "pp": 1, "tp": 1, "cp": world.size}
    assert coords["mesh"]["cp"] == mesh.cp_rank == world.rank
    plain = parallel_cls(config_cls(**cfg), dist.ProcessMesh(dp=world.size, world=world))
    assert "cp" not in coordinates_of(plain, world)["layout"]  # cp=1 layouts as before
    root = world.bcast_object(str(tmp_path_factory.mktemp("cp_ckpt")) if world.rank == 0
                              else None)
    x, y = batch()
    model.train_step(x, y)
    dist.save_checkpoint(root, model, world, step=1)
    again = parallel_cls(config_cls(**dict(cfg, seed=cfg["seed"] + 1)), mesh)
    dist.load_checkpoint(root, again, world)
    for (n, p), q in zip(model.named_parameters(), again.parameters(), strict=True):
        assert np.array_equal(p.numpy(), q.numpy()), n
