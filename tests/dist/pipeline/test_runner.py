"""PipelineParallel in one process and across ranks, against the plain sequential model."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import dist
import gpuplan as gp
from autograd import nn
from gpuplan.testing import random

F64 = np.float64
WIDTHS = [5, 7, 6, 4, 3]  # stage s maps WIDTHS[s] -> WIDTHS[s + 1] (up to 4 stages)
BATCH = 12


def make_stage(s: int, num_stages: int) -> dist.PipelineStage:
    stage = dist.PipelineStage(s).add_layer(nn.Linear(WIDTHS[s], WIDTHS[s + 1], dtype=F64,
                                                      seed=100 + s))
    if s < num_stages - 1:
        stage.add_layer(nn.GELU())
    return stage


def data(num_stages: int):
    x = random((BATCH, WIDTHS[0]), F64, seed=1)
    target = np.random.default_rng(2).integers(0, WIDTHS[num_stages], BATCH)
    return x, target


def loss_fn(out, target):
    return nn.functional.cross_entropy(out, target)


def reference(num_stages: int):
    """Full-batch loss and gradients of the same layers run one after another."""
    model = nn.Sequential(*[make_stage(s, num_stages) for s in range(num_stages)])
    x, target = data(num_stages)
    loss = loss_fn(model(ag.tensor(x)), target)
    loss.backward()
    grads = [[p.grad.numpy() for p in model[s].parameters()] for s in range(num_stages)]
    return model, loss.item(), grads


def check_grads(pipe, ref_grads):
    for s in range(pipe.num_stages()):
        stage = pipe.stage(s)
        if stage is None:
            continue  # another rank's stage
        for p, g in zip(stage.parameters(), ref_grads[s], strict=True):
            np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("num_stages,micro", [(1, 3), (2, 4), (3, 4), (4, 6), (3, 1)])
def test_single_process_train_step_matches_full_batch(schedule, num_stages, micro):
    _, ref_loss, ref_grads = reference(num_stages)
    pipe = dist.PipelineParallel([make_stage(s, num_stages) for s in range(num_stages)],
                                 num_micro_batches=micro, schedule=schedule)
    x, target = data(num_stages)
    loss = pipe.train_step(x, target, loss_fn)
    assert isinstance(loss, float)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-10)
    check_grads(pipe, ref_grads)
    assert len(list(pipe.parameters())) == 2 * num_stages


def test_single_process_forward_is_differentiable_and_matches():
    model, _, _ = reference(3)
    pipe = dist.PipelineParallel([make_stage(s, 3) for s in range(3)], num_micro_batches=4)
    x, _ = data(3)
    xt = ag.tensor(x, requires_grad=True)
    out = pipe.forward(xt)
    np.testing.assert_allclose(out.numpy(), model(ag.tensor(x)).numpy(), rtol=1e-12)
    out.sum().backward()
    assert xt.grad is not None and pipe.stage(0).layers[0].weight.grad is not None
    np.testing.assert_allclose(pipe.forward(x).numpy(), out.numpy(), rtol=0)


def test_configuration_errors():
    stages = [make_stage(0, 2), make_stage(1, 2)]
    with pytest.raises(gp.InvalidProblem, match="num_micro_batches.*given 0"):
        dist.PipelineParallel(stages, num_micro_batches=0)
    with pytest.raises(ValueError, match="schedule.*'zero_bubble'"):
        dist.PipelineParallel(stages, schedule="zero_bubble")
    with pytest.raises(gp.InvalidProblem, match=r"stages\[0\].*PipelineStage\(0\).*index 1"):
        dist.PipelineParallel([stages[1], stages[0]])
    pipe = dist.PipelineParallel(stages, num_micro_batches=20)
    with pytest.raises(gp.InvalidProblem, match="'x'.*at least num_micro_batches=20.*given 12"):
        pipe.train_step(*data(2), loss_fn)


@pytest.mark.mpi
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("micro", [1, 3, 6])
def test_one_stage_per_rank_matches_single_process(world, schedule, micro):
    n = world.size
    if n > len(WIDTHS) - 1:
        pytest.skip(f"needs at most {len(WIDTHS) - 1} ranks")
    model, ref_loss, ref_grads = reference(n)
    built = []

    def builder(s):
        def build():
            built.append(s)
            return make_stage(s, n)
        return build

    pipe = dist.PipelineParallel([builder(s) for s in range(n)], num_micro_batches=micro,
                                 schedule=schedule, comm=world)
    assert built == [world.rank]  # a rank builds only its own stage
    x, target = data(n)
    mine_x = x if world.rank == 0 else None
    loss = pipe.train_step(mine_x, target, loss_fn)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-10)  # on every rank
    check_grads(pipe, ref_grads)
    # Live activations actually held (tapes alive at once), counted by the runner.
    live = pipe.peak_live_activations[world.rank]
    assert live == (micro if schedule == "gpipe" else min(n - world.rank, micro))
    out = pipe.forward(mine_x)
    if world.rank == n - 1:
        np.testing.assert_allclose(out.numpy(), model(ag.tensor(x)).numpy(), rtol=1e-12)
    else:
        assert out is None


def test_stage_returns_none_for_an_index_without_a_stage():
    stages = [make_stage(s, 3) for s in range(3)]
    pipe = dist.PipelineParallel(stages, num_micro_batches=2)
    assert pipe.num_stages() == 3
    for s in range(3):
        assert pipe.stage(s) is stages[s]
        assert pipe.stage(np.int64(s)) is stages[s]
    for index in (-1, -3, 3, 4, 100):
        assert pipe.stage(index) is None
    assert [id(p) for p in pipe.parameters()] == [
        id(p) for stage in stages for p in stage.parameters()]
    with pytest.raises(TypeError, match=r"stage: index must be an int, given str"):
        pipe.stage("0")


@pytest.mark.mpi
def test_stage_is_none_for_another_ranks_stage(world):
    n = world.size
    if n > len(WIDTHS) - 1:
        pytest.skip(f"needs at most {len(WIDTHS) - 1} ranks")
    pipe = dist.PipelineParallel([lambda s=s: make_stage(s, n) for s in range(n)], comm=world)
    assert pipe.num_stages() == n
    mine = pipe.stage(world.rank)
    assert isinstance(mine, dist.PipelineStage) and mine.index == world.rank
    for s in range(-1, n + 1):
        if s != world.rank:
            assert pipe.stage(s) is None
    assert [id(p) for p in pipe.parameters()] == [id(p) for p in mine.parameters()]


@pytest.mark.mpi
def test_communicator_size_must_match_stages(world):
    with pytest.raises(gp.InvalidProblem, match=rf"comm.*num_stages={world.size + 1}"):
        dist.PipelineParallel([make_stage(0, 2)] * (world.size + 1), comm=world)


@pytest.mark.parametrize("num_stages,micro", [(2, 4), (3, 6), (4, 8)])
def test_one_f_one_b_holds_fewer_live_activations_than_gpipe(num_stages, micro):
    x, target = data(num_stages)
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        pipe = dist.PipelineParallel([make_stage(s, num_stages) for s in range(num_stages)],
                                     num_micro_batches=micro, schedule=schedule)
        pipe.train_step(x, target, loss_fn)
        peaks[schedule] = pipe.peak_live_activations
    assert peaks["gpipe"] == {s: micro for s in range(num_stages)}
    assert peaks["1f1b"] == {s: num_stages - s for s in range(num_stages)}
    assert sum(peaks["1f1b"].values()) < sum(peaks["gpipe"].values())
