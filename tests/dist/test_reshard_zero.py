"""ZeRO checkpoints: each data-parallel rank saves its slice of the optimizer state (not the
consolidated state), with what laying the slices end to end needs; the checkpoint resumes
bit for bit in the same layout with ZeRO, as the replicated state without it, at one process
(resharded, with or without ZeRO), and a replicated checkpoint resumes into ZeRO."""

from __future__ import annotations

import numpy as np
import pytest

import dist
import gpuplan as gp
from autograd import nn, optim
from dist.checkpoint_files import read_manifest, read_shard, resolve
from dist.models import ParallelGPT
from dist.reshard import read_dense_checkpoint

CFG = nn.GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8, seed=3,
                   dtype=np.float64)
B, CLIP = 8, 0.1


def _optimizer(model, comm, zero: bool):
    groups = [{"params": [p for p in model.parameters() if p.ndim >= 2], "weight_decay": 0.1},
              {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}]
    if not zero:
        return optim.AdamW(groups, lr=1e-2)
    model.reduce_data_parallel = False  # the dp average is the optimizer's reduce-scatter
    return dist.ZeroRedundancyOptimizer(groups, comm=comm, lr=1e-2)


def _step(model, opt, step: int, dp_rank: int = 0, dp: int = 1) -> float:
    idx = np.random.default_rng([7, step]).integers(0, CFG.vocab_size, (B, CFG.block_size + 1))
    rows = slice(dp_rank * B // dp, (dp_rank + 1) * B // dp)
    loss = model.train_step(idx[rows, :-1], idx[rows, 1:])
    if isinstance(opt, dist.ZeroRedundancyOptimizer):
        opt.reduce_gradients()
        opt.clip_grad_norm_(CLIP, model)
    else:
        dist.clip_grad_norm_(model, CLIP)
    opt.step()
    opt.zero_grad()
    return loss


def _weights(model) -> list[np.ndarray]:
    return [gp.to_host(p.data).copy() for p in model.parameters()]


def _state_bits(sd) -> dict:
    return {(i, k): (np.asarray(v).tobytes() if hasattr(v, "shape") else v)
            for i, s in sd["state"].items() for k, v in s.items()}


def _root(world, tmp_path_factory) -> str:
    return world.bcast_object(str(tmp_path_factory.mktemp("zero")) if world.rank == 0
                              else None)


def _continue(model, opt, world, dp: int) -> tuple[list[float], list[np.ndarray]]:
    rank = 0 if dp == 1 else world.rank
    return [_step(model, opt, s, rank, dp) for s in (2, 3)], _weights(model)


@pytest.mark.mpi
def test_a_zero_checkpoint_is_sharded_and_resumes_with_and_without_zero(world,
                                                                       tmp_path_factory):
    n = world.size
    root = _root(world, tmp_path_factory)
    mesh = dist.ProcessMesh(dp=n, pp=1, tp=1, world=world)
    model = ParallelGPT(CFG, mesh)
    zero = _optimizer(model, mesh.dp, zero=True)
    for s in (0, 1):
        _step(model, zero, s, world.rank, n)
    dist.save_checkpoint(root, model, comm=world, optimizer=zero, step=2)
    replicated = zero.consolidated_state_dict()
    want = _continue(model, zero, world, n)

    # The shard holds this rank's slice of the moments only, and how to lay them end to end.
    step_dir = resolve(root)
    state, header = read_shard(step_dir, read_manifest(step_dir), world.rank)
    record = header["optimizer"]["zero"]
    assert (record["rank"], record["size"]) == (world.rank, n)
    saved = sum(v.nbytes for k, v in state.items() if k.startswith("optimizer/"))
    moments = sum(2 * p.data.nbytes for p in model.parameters())
    pads = sum(g["padding"] for g in record["groups"]) * 2 * 8
    assert saved <= moments / n + pads and [g["chunk"] * n - g["total"] for g in
                                            record["groups"]] == [g["padding"] for g in
                                                                  record["groups"]]

    # Same layout, ZeRO: its own shard, bit for bit.
    again = ParallelGPT(CFG, mesh)
    again_opt = _optimizer(again, mesh.dp, zero=True)
    dist.load_checkpoint(root, again, comm=world, optimizer=again_opt, reshard=True)
    got = _continue(again, again_opt, world, n)
    assert got[0] == want[0] and all(np.array_equal(a, b) for a, b in zip(got[1], want[1],
                                                                        strict=True))

    # Same layout without ZeRO: the slices of the dp group laid end to end are the
    # replicated state, bit for bit; the run continues on the same curve (bit for bit at
    # dp=2, where reduce-scatter and all-reduce add the same two values).
    plain = ParallelGPT(CFG, mesh)
    plain_opt = _optimizer(plain, mesh.dp, zero=False)
    dist.load_checkpoint(root, plain, comm=world, optimizer=plain_opt, reshard=True)
    assert _state_bits(plain_opt.state_dict()) == _state_bits(replicated)
    got = _continue(plain, plain_opt, world, n)
    if n == 2:
        assert got[0] == want[0] and all(np.array_equal(a, b) for a, b in
                                         zip(got[1], want[1], strict=True))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)

    # One process (resharded), without and with ZeRO: the same curve, to rounding (one
    # process averages the batch in another order).
    dense = read_dense_checkpoint(root, optimizer=True)
    name_of = {id(p): name for name, p in model.named_parameters()}
    names = [name_of[id(p)] for g in zero.param_groups for p in g["params"]]  # by index
    for index, entry in replicated["state"].items():
        for key, value in entry.items():
            mine = dense.optimizer[names[index]][key]
            assert np.array_equal(mine, value) if hasattr(value, "shape") else mine == value
    for use_zero in (False, True):
        solo = ParallelGPT(CFG)
        solo_opt = _optimizer(solo, None, zero=use_zero)
        dist.load_checkpoint(root, solo, optimizer=solo_opt, reshard=True)
        got = _continue(solo, solo_opt, world, 1)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
        for a, b in zip(got[1], want[1], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    world.barrier()


@pytest.mark.mpi
def test_a_replicated_checkpoint_resumes_into_zero(world, tmp_path_factory):
    n = world.size
    root = _root(world, tmp_path_factory)
    mesh = dist.ProcessMesh(dp=n, pp=1, tp=1, world=world)
    model = ParallelGPT(CFG, mesh)
    opt = _optimizer(model, mesh.dp, zero=False)
    for s in (0, 1):
        _step(model, opt, s, world.rank, n)
    dist.save_checkpoint(root, model, comm=world, optimizer=opt, step=2)
    want = _continue(model, opt, world, n)

    zeroed = ParallelGPT(CFG, mesh)
    zero = _optimizer(zeroed, mesh.dp, zero=True)
    dist.load_checkpoint(root, zeroed, comm=world, optimizer=zero, reshard=True)
    got = _continue(zeroed, zero, world, n)
    if n == 2:
        assert got[0] == want[0] and all(np.array_equal(a, b) for a, b in
                                         zip(got[1], want[1], strict=True))
    for a, b in zip(got[1], want[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    world.barrier()


@pytest.mark.mpi
def test_a_zero_checkpoint_of_tp2_resumes_as_dp_with_zero(world, tmp_path_factory):
    """dp x tp2 with ZeRO over dp saved; resumed as dp=n (tp 1) with ZeRO, resharded: each
    tp rank's dp group of slices assembled, then cut for the new layout."""
    n = world.size
    if n != 4:
        pytest.skip("needs 4 ranks")
    root = _root(world, tmp_path_factory)
    mesh = dist.ProcessMesh(dp=2, pp=1, tp=2, world=world)
    model = ParallelGPT(CFG, mesh)
    zero = _optimizer(model, mesh.dp, zero=True)
    for s in (0, 1):
        _step(model, zero, s, mesh.dp_rank, 2)
    dist.save_checkpoint(root, model, comm=world, optimizer=zero, step=2)
    want = [_step(model, zero, s, mesh.dp_rank, 2) for s in (2, 3)]

    flat = dist.ProcessMesh(dp=n, pp=1, tp=1, world=world)
    other = ParallelGPT(CFG, flat)
    other_opt = _optimizer(other, flat.dp, zero=True)
    dist.load_checkpoint(root, other, comm=world, optimizer=other_opt, reshard=True)
    got = [_step(other, other_opt, s, world.rank, n) for s in (2, 3)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.mpi
def test_a_missing_slice_is_one_line(world, tmp_path_factory):
    """A ZeRO shard whose data-parallel group holds a replicated shard: one line naming the
    checkpoint, on every rank (not a KeyError or a hang)."""
    from dist import zero_checkpoint

    n = world.size
    root = _root(world, tmp_path_factory)
    mesh = dist.ProcessMesh(dp=n, pp=1, tp=1, world=world)
    model = ParallelGPT(CFG, mesh)
    zero = _optimizer(model, mesh.dp, zero=True)
    _step(model, zero, 0, world.rank, n)
    dist.save_checkpoint(root, model, comm=world, optimizer=zero, step=1)
    step_dir = resolve(root)
    manifest = read_manifest(step_dir)
    broken = {**manifest, "shards": [dict(r) for r in manifest["shards"]]}
    broken["shards"][1]["coordinates"] = {**broken["shards"][1]["coordinates"],
                                          "mesh": {"dp": 0, "pp": 5, "tp": 0}}
    with pytest.raises(dist.CheckpointError, match=rf"the data-parallel group of shard 0: "
                                                   rf"assemble_shards: expected the shards of "
                                                   rf"ranks 0\.\.{n - 1} of {n}, given ranks "
                                                   rf"\[0[],]"):
        zero_checkpoint.replicated_from_group(step_dir, broken, 0)
    world.barrier()


def test_one_process_bf16_shard_keeps_its_f32_masters(tmp_path):
    """bf16 weights: the shard holds the slice of the f32 master weights too; it resumes bit
    for bit into ZeRO and, as the replicated state (masters included), into AdamW."""
    cfg = nn.GPTConfig(**{**CFG.__dict__, "dtype": np.float32})
    model = ParallelGPT(cfg, dtype=gp.bfloat16)
    zero = _optimizer(model, None, zero=True)
    for s in (0, 1):
        _step(model, zero, s)
    dist.save_checkpoint(tmp_path, model, optimizer=zero, step=2)
    replicated = zero.consolidated_state_dict()
    assert all("master" in entry for entry in replicated["state"].values())
    want = _continue(model, zero, None, 1)
    for use_zero in (True, False):
        again = ParallelGPT(cfg, dtype=gp.bfloat16)
        opt = _optimizer(again, None, zero=use_zero)
        dist.load_checkpoint(tmp_path, again, optimizer=opt)
        if not use_zero:
            assert _state_bits(opt.state_dict()) == _state_bits(replicated)
        got = _continue(again, opt, None, 1)
        assert got[0] == want[0] and all(np.array_equal(a, b) for a, b in
                                         zip(got[1], want[1], strict=True)), use_zero
