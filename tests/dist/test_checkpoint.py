"""Sharded checkpoints: bit-exact round trip, atomic files, checksum and layout checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dist
import gpuplan as gp
from autograd import nn
from dist.checkpoint import shard_path


def model(seed: int) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3, dtype=gp.bfloat16, seed=seed),
                         nn.Linear(3, 2, dtype=np.float64, seed=seed + 1),
                         nn.Embedding(5, 2, dtype=np.float16, seed=seed + 2))


def test_round_trip_is_bit_exact_for_every_dtype(tmp_path):
    src, dst = model(1), model(2)
    path = dist.save_checkpoint(tmp_path, src, metadata={"step": 7})
    assert path == shard_path(tmp_path, 0, 1) and path.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert dist.load_checkpoint(tmp_path, dst) == {"step": 7}
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items(),
                                 strict=True):
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_corruption_missing_files_and_wrong_layout_are_reported(tmp_path):
    src = model(1)
    path = dist.save_checkpoint(tmp_path / "ok", src)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum mismatch"):
        dist.load_checkpoint(tmp_path / "ok", model(2))
    with pytest.raises(FileNotFoundError, match="rank00000-of-00001.npz"):
        dist.load_checkpoint(tmp_path / "empty", model(2))
    with pytest.raises(KeyError, match="missing keys"):
        dist.save_checkpoint(tmp_path / "small", nn.Sequential(nn.Linear(4, 3, seed=0)))
        dist.load_checkpoint(tmp_path / "small", model(2))


@pytest.mark.mpi
def test_each_rank_saves_and_loads_its_own_shard(world, tmp_path_factory):
    root = world.bcast_object(str(tmp_path_factory.mktemp("ckpt")) if world.rank == 0 else None)
    src = nn.Linear(3, 2, dtype=np.float64, seed=10 + world.rank)  # a different shard per rank
    dist.save_checkpoint(root, src, comm=world, metadata={"rank": world.rank})
    names = sorted(p.name for p in Path(root).glob("*.npz"))
    assert names == [shard_path(root, r, world.size).name for r in range(world.size)]
    dst = nn.Linear(3, 2, dtype=np.float64, seed=0)
    assert dist.load_checkpoint(root, dst, comm=world) == {"rank": world.rank}
    np.testing.assert_array_equal(dst.weight.numpy(), src.weight.numpy())
    world.barrier()


def _train(pg, opt, sched, steps, start, dp_rank, dp):
    losses = []
    for step in range(start, start + steps):
        rng = np.random.default_rng([3, step, dp_rank])
        x = rng.integers(0, 29, (4 // dp, 8))
        y = rng.integers(0, 29, (4 // dp, 8))
        losses.append(pg.train_step(x, y))
        dist.clip_grad_norm_(pg, 0.5)
        opt.step()
        opt.zero_grad()
        sched.step()
    return losses


def _resume_equality(tmp, world, layout):
    from autograd import optim
    from dist.models import ParallelGPT

    dp, pp, tp = layout
    mesh = dist.ProcessMesh(dp=dp, pp=pp, tp=tp, world=world) if world else None
    cfg = nn.GPTConfig(vocab_size=29, block_size=8, n_layer=2, n_head=2, n_embd=8,
                       dropout=0.1, dtype=np.float32, seed=4)

    def build():
        dist.model_parallel_seed(9, tp_rank=mesh.tp_rank if mesh else 0,
                                 pp_rank=mesh.pp_rank if mesh else 0)
        pg = ParallelGPT(cfg, mesh, num_micro_batches=2)
        opt = optim.AdamW(pg.parameters(), lr=1e-2, weight_decay=0.1)
        return pg, opt, optim.CosineWithWarmup(opt, 1, 4, min_lr=1e-3)

    dp_rank = mesh.dp_rank if mesh else 0
    pg, opt, sched = build()
    straight = _train(pg, opt, sched, 4, 0, dp_rank, dp)
    pg, opt, sched = build()
    first = _train(pg, opt, sched, 2, 0, dp_rank, dp)
    dist.save_checkpoint(tmp, pg, comm=world, optimizer=opt,
                         metadata={"step": 2, "scheduler": sched.state_dict()})
    _train(pg, opt, sched, 1, 2, dp_rank, dp)  # drift, so that loading must undo it
    pg, opt, sched = build()
    meta = dist.load_checkpoint(tmp, pg, comm=world, optimizer=opt)
    sched.load_state_dict(meta["scheduler"])
    resumed = _train(pg, opt, sched, 2, meta["step"], dp_rank, dp)
    assert first + resumed == straight  # bitwise: same data, masks, moments and schedule


def test_resume_gives_the_same_losses_as_an_uninterrupted_run(tmp_path):
    _resume_equality(tmp_path, None, (1, 1, 1))


def test_optimizer_state_is_required_when_asked_for(tmp_path):
    from autograd import optim

    src = model(1)
    dist.save_checkpoint(tmp_path, src)
    with pytest.raises(ValueError, match="no optimizer state"):
        dist.load_checkpoint(tmp_path, model(2), optimizer=optim.SGD(model(2).parameters(),
                                                                      lr=0.1))


@pytest.mark.mpi
def test_resume_equality_across_ranks(world, tmp_path_factory):
    root = world.bcast_object(str(tmp_path_factory.mktemp("resume")) if world.rank == 0
                              else None)
    layout = (1, 2, 2) if world.size == 4 else (1, 1, 2)
    _resume_equality(root, world, layout)
    world.barrier()
