"""dist.memory: the bytes per rank train.py reports, exact for tiny models: parameters (their
arrays), gradients (with the f32 sums of bf16 ones), optimizer state (AdamW moments, f32
masters of half parameters; ZeRO-1 at dp=2 holds half), activations kept for backward (one
micro-batch times those in flight, the random state put back)."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import dist
import gpuplan as gp
from autograd import nn, optim
from dist import memory
from dist.models import ParallelGPT, ParallelLlama

SHAPE = dict(vocab_size=29, block_size=8, n_layer=2, n_head=2, n_embd=8, seed=3)


def _elements(params) -> int:
    return sum(int(np.prod(p.shape)) for p in params)


def _batch(rows: int = 4):
    rng = np.random.default_rng(0)
    return rng.integers(0, 29, (rows, 8)), rng.integers(0, 29, (rows, 8))


def _stepped(model, opt):
    x, y = _batch()
    model.train_step(x, y)
    grads = memory.gradient_bytes(model.parameters())
    opt.step()
    return grads


@pytest.mark.parametrize("dtype, width", [(np.float64, 8), (np.float32, 4)])
def test_parameters_gradients_and_adamw_moments(dtype, width):
    model = ParallelGPT(nn.GPTConfig(**SHAPE, dtype=dtype))
    n = _elements(model.parameters())
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    assert memory.parameter_bytes(model.parameters()) == n * width
    assert memory.gradient_bytes(model.parameters()) == 0  # none yet
    assert memory.optimizer_bytes(opt) == 0  # created at the first step
    assert _stepped(model, opt) == n * width
    assert memory.optimizer_bytes(opt) == 2 * n * width  # exp_avg, exp_avg_sq
    opt.zero_grad()
    assert memory.gradient_bytes(model.parameters()) == 0


def test_bf16_counts_f32_masters_and_gradient_sums():
    """bf16 parameters: 2 bytes each; over two micro-batches each gradient (2 bytes) keeps
    its f32 running sum (4); AdamW keeps f32 masters and two f32 moments (12)."""
    model = ParallelGPT(nn.GPTConfig(**SHAPE), num_micro_batches=2, dtype=gp.bfloat16)
    n = _elements(model.parameters())
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    assert memory.parameter_bytes(model.parameters()) == 2 * n
    assert _stepped(model, opt) == 6 * n
    assert memory.optimizer_bytes(opt) == 12 * n


@pytest.mark.parametrize("cls, config", [(ParallelGPT, nn.GPTConfig),
                                         (ParallelLlama, nn.LlamaConfig)])
def test_activations_are_one_micro_batch_kept_and_leave_the_random_state(cls, config, device):
    x, y = _batch()
    whole = cls(config(**SHAPE, dropout=0.1), device=device)
    halves = cls(config(**SHAPE, dropout=0.1), num_micro_batches=2, device=device)
    ag.manual_seed(5)
    state = ag.random.default_generator.get_state()
    kept = memory.activation_bytes(whole, x, y)
    assert ag.random.default_generator.get_state() == state
    assert kept > 0
    # Two micro-batches of two rows keep what one batch of two rows keeps, at one stage.
    assert memory.activation_bytes(halves, x, y) == memory.activation_bytes(whole, x[:2], y[:2])
    assert memory.activation_bytes(halves, x, y) < kept
    whole.set_recompute("block")
    assert memory.activation_bytes(whole, x, y) < kept
    assert all(p.grad is None for p in whole.parameters())  # a forward only: no gradient


def test_report_line_and_metrics():
    report = memory.MemoryReport(params=3 * 2**20, grads=3 * 2**20, optimizer=6 * 2**20,
                                 activations=1536)
    assert report.line() == ("memory/rank: params 3 MiB, grads 3 MiB, optimizer 6 MiB, "
                             "activations (peak) 1.5 KiB")
    assert report.metrics() == {
        "memory_params_bytes": 3 * 2**20, "memory_grads_bytes": 3 * 2**20,
        "memory_optimizer_bytes": 6 * 2**20, "memory_activations_bytes": 1536,
        "memory_pool_used_bytes": None, "memory_pool_held_bytes": None}
    gpu = memory.MemoryReport(1, 2, 3, 4, pool_used=5 * 2**20, pool_held=8 * 2**20)
    assert gpu.line().endswith("| CuPy pool: 5 MiB used, 8 MiB held")
    assert gpu.most_over(None) == gpu
    assert memory.pool_bytes("cpu") is None and memory.pool_bytes("emulated") is None


@pytest.mark.mpi
def test_zero_at_dp2_halves_the_optimizer_state(world):
    if world.size != 2:
        pytest.skip("needs 2 ranks")
    cfg = nn.GPTConfig(**SHAPE)
    plain_model, zero_model = ParallelGPT(cfg), ParallelGPT(cfg)
    plain = optim.AdamW(plain_model.parameters(), lr=1e-3)
    zero = dist.ZeroRedundancyOptimizer(zero_model.parameters(), optimizer_class=optim.AdamW,
                                        comm=world, lr=1e-3)
    _stepped(plain_model, plain)
    _stepped(zero_model, zero)
    replicated, mine = memory.optimizer_bytes(plain), memory.optimizer_bytes(zero)
    assert replicated == 8 * _elements(plain_model.parameters())
    assert int(world.all_reduce(np.array([mine]), "sum")[0]) == replicated
    most = memory.MemoryReport(0, 0, mine, 0).most_over(world).optimizer
    assert replicated / 2 <= most <= replicated / 2 + 8  # slices of ceil(n / 2) elements


@pytest.mark.mpi
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_activations_count_the_micro_batches_in_flight(world, schedule):
    """At pp = the world and 4 micro-batches the multiplier is what the runner counted in a
    real step (`peak_live_activations`): 1F1B holds pp - stage, GPipe all four."""
    x, y = _batch(8)
    model = ParallelLlama(nn.LlamaConfig(**{**SHAPE, "n_layer": 4}), pp=world,
                          num_micro_batches=4,
                          schedule=schedule)
    per = memory.activation_bytes(model, x, y) // memory.micro_batches_in_flight(model)
    model.train_step(x, y)
    live = model.pipe.peak_live_activations[world.rank]
    assert memory.micro_batches_in_flight(model) == live
    assert live == (4 if schedule == "gpipe" else min(4, world.size - world.rank))
    assert memory.activation_bytes(model, x, y) == per * live > 0


@pytest.mark.gpu
def test_the_cupy_pool_counts_what_is_allocated(accelerator):
    if accelerator != "cuda":
        pytest.skip("the CuPy pool exists on a GPU only (the emulated device has none)")
    before = memory.pool_bytes("cuda")
    a = gp.asarray(np.zeros(1 << 20, np.float32), device="cuda")
    used, held = memory.pool_bytes("cuda")
    assert used >= before[0] + a.nbytes and held >= used
    model = ParallelGPT(nn.GPTConfig(**SHAPE), device="cuda")
    report = memory.MemoryReport.measure(model, optim.AdamW(model.parameters()), 0, 0, "cuda")
    assert report.params == 4 * _elements(model.parameters())
    assert report.pool_used >= used and report.pool_held >= report.pool_used
