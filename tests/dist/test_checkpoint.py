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
