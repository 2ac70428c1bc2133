"""Sharded checkpoints: bit-exact round trip, step folders and `latest`, and every way a
checkpoint can be damaged giving one line naming the file (one process, and all ranks)."""

from __future__ import annotations

import errno
import hashlib
import json
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
    assert path == tmp_path / "step_000007" and shard_path(path, 0, 1).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000007"]
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "rank00000-of-00001.npz"]
    assert dist.load_checkpoint(tmp_path, dst) == {"step": 7}
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items(),
                                 strict=True):
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_steps_are_versioned_latest_moves_last_and_keep_prunes(tmp_path):
    for step in range(1, 5):
        dist.save_checkpoint(tmp_path, model(step), step=step, metadata={"s": step}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000003",
                                                          "step_000004"]
    assert (tmp_path / "latest").read_text() == "step_000004\n"
    manifest = json.loads((tmp_path / "step_000004" / "manifest.json").read_text())
    shard = manifest["shards"][0]
    assert manifest["step"] == 4 and manifest["world_size"] == 1
    assert shard["coordinates"] == {"rank": 0, "world_size": 1}
    assert [(e["name"], e["shape"]) for e in shard["entries"]][:2] == \
        [("0.weight", [4, 3]), ("0.bias", [3])]
    assert len(shard["sha256"]) == 64
    assert dist.load_checkpoint(tmp_path, model(0)) == {"s": 4}
    assert dist.load_checkpoint(tmp_path / "step_000003", model(0)) == {"s": 3}
    dist.save_checkpoint(tmp_path, model(9), step=3, metadata={"s": "again"}, keep=2)
    assert dist.load_checkpoint(tmp_path, model(0)) == {"s": "again"}  # latest: step 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _two_steps(root: Path) -> Path:
    dist.save_checkpoint(root, model(1), step=1)
    return shard_path(dist.save_checkpoint(root, model(2), step=2), 0, 1)


def _load_error(path: Path, target: nn.Module | None = None) -> dist.CheckpointError:
    with pytest.raises(dist.CheckpointError) as info:
        dist.load_checkpoint(path, target or model(0))
    assert "\n" not in str(info.value)
    return info.value


@pytest.mark.parametrize("damage,message", [
    (lambda b: b[:len(b) // 2], "bytes, the manifest says"),  # truncated: was BadZipFile
    (lambda b: b"", "0 bytes, the manifest says"),  # empty: was EOFError
    (lambda b: b[:100] + bytes([b[100] ^ 0xFF]) + b[101:], "does not match the manifest"),
])
def test_a_damaged_shard_names_the_file_and_the_older_checkpoint(tmp_path, damage, message):
    shard = _two_steps(tmp_path)
    shard.write_bytes(damage(shard.read_bytes()))
    error = _load_error(tmp_path)
    assert str(error).startswith(f"{shard}: ") and message in str(error)
    assert error.fallback == tmp_path / "step_000001"
    assert dist.load_checkpoint(error.fallback, model(0)) == {}  # the path --resume takes


@pytest.mark.parametrize("damage,message", [
    (lambda m: m.unlink(), "latest names step_000002, which is not a committed checkpoint"),
    (lambda m: m.write_text(""), "manifest.json: empty file"),
    (lambda m: m.write_text(m.read_text()[:50]), "manifest.json: not valid JSON"),
    (lambda m: m.write_text("[]"), "expected format"),
])
def test_a_missing_or_damaged_manifest_is_one_line(tmp_path, damage, message):
    shard = _two_steps(tmp_path)
    damage(shard.parent / "manifest.json")
    error = _load_error(tmp_path)
    assert message in str(error) and error.fallback == tmp_path / "step_000001"


def test_a_shard_of_another_step_is_detected(tmp_path):
    """Shards of different steps in one folder: by the digest, and by the step the shard
    itself records even when the manifest was rewritten to match it."""
    shard = _two_steps(tmp_path)
    old = shard_path(tmp_path / "step_000001", 0, 1).read_bytes()
    shard.write_bytes(old)
    assert "a shard of another step or rank" in str(_load_error(tmp_path))
    manifest_path = shard.parent / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["shards"][0].update(bytes=len(old), sha256=hashlib.sha256(old).hexdigest())
    manifest_path.write_text(json.dumps(manifest))
    assert "holds step 1, the manifest says step 2" in str(_load_error(tmp_path))


def test_wrong_names_shapes_and_coordinates_are_reported(tmp_path):
    dist.save_checkpoint(tmp_path / "a", model(1), coordinates={"tp": 1})
    error = _load_error(tmp_path / "a", nn.Sequential(nn.Linear(4, 3, seed=0)))
    assert "parameter names differ from this rank's model: missing []" in str(error)
    wrong = nn.Sequential(nn.Linear(4, 5, dtype=gp.bfloat16), nn.Linear(3, 2),
                          nn.Embedding(5, 2))
    assert "0.weight has shape (4, 3), this rank's model expects (4, 5)" in \
        str(_load_error(tmp_path / "a", wrong))
    with pytest.raises(dist.CheckpointError, match="holds the shard of tp 1, this rank "
                                                   "expects tp 0"):
        dist.load_checkpoint(tmp_path / "a", model(2), coordinates={"tp": 0})
    (tmp_path / "empty").mkdir()
    assert "no committed checkpoint" in str(_load_error(tmp_path / "empty"))
    assert "no such checkpoint folder" in str(_load_error(tmp_path / "nowhere"))


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    dist.save_checkpoint(tmp_path, model(1), step=1)

    def out_of_disk(path, payload):
        path.write_bytes(payload[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dist.checkpoint, "write_file", out_of_disk)
    with pytest.raises(dist.CheckpointError, match="step 2 not committed: rank 0: "
                                                   "rank00000-of-00001.npz: .*No space left"):
        dist.save_checkpoint(tmp_path, model(2), step=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000001"]
    target = model(0)
    dist.load_checkpoint(tmp_path, target)
    np.testing.assert_array_equal(target.state_dict()["1.weight"],
                                  model(1).state_dict()["1.weight"])


@pytest.mark.mpi
def test_each_rank_saves_and_loads_its_own_shard(world, tmp_path_factory):
    root = world.bcast_object(str(tmp_path_factory.mktemp("ckpt")) if world.rank == 0 else None)
    src = nn.Linear(3, 2, dtype=np.float64, seed=10 + world.rank)  # a different shard per rank
    path = dist.save_checkpoint(root, src, comm=world, metadata={"rank": world.rank})
    names = sorted(p.name for p in path.glob("*.npz"))
    assert names == [shard_path(root, r, world.size).name for r in range(world.size)]
    dst = nn.Linear(3, 2, dtype=np.float64, seed=0)
    assert dist.load_checkpoint(root, dst, comm=world) == {"rank": world.rank}
    np.testing.assert_array_equal(dst.weight.numpy(), src.weight.numpy())
    world.barrier()


@pytest.mark.mpi
def test_one_rank_out_of_disk_fails_the_save_on_every_rank(world, tmp_path_factory,
                                                           monkeypatch):
    root = Path(world.bcast_object(str(tmp_path_factory.mktemp("disk")) if world.rank == 0
                                   else None))
    src = nn.Linear(3, 2, dtype=np.float64, seed=10 + world.rank)
    dist.save_checkpoint(root, src, comm=world, step=1)
    if world.rank == world.size - 1:
        def out_of_disk(path, payload):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(dist.checkpoint, "write_file", out_of_disk)
    with pytest.raises(dist.CheckpointError, match=f"rank {world.size - 1}: .*No space left"):
        dist.save_checkpoint(root, nn.Linear(3, 2, dtype=np.float64, seed=0), comm=world,
                             step=2)
    monkeypatch.undo()
    dst = nn.Linear(3, 2, dtype=np.float64, seed=0)
    dist.load_checkpoint(root, dst, comm=world)
    np.testing.assert_array_equal(dst.weight.numpy(), src.weight.numpy())
    world.barrier()


@pytest.mark.mpi
@pytest.mark.parametrize("damage", ["swap", "mixed-steps", "truncate"])
def test_a_bad_shard_on_one_rank_fails_the_load_on_every_rank(world, tmp_path_factory,
                                                              damage):
    """Shards swapped between ranks (digests rewritten to match: only the shards' own
    coordinates tell), one shard of another step, one truncated shard: every rank raises the
    same one-line error naming the file and the older checkpoint, none waits forever."""
    root = Path(world.bcast_object(str(tmp_path_factory.mktemp(damage)) if world.rank == 0
                                   else None))
    src = nn.Linear(3, 2, dtype=np.float64, seed=10 + world.rank)
    dist.save_checkpoint(root, src, comm=world, step=1)
    step2 = dist.save_checkpoint(root, src, comm=world, step=2)
    if world.rank == 0:
        manifest = json.loads((step2 / "manifest.json").read_text())
        a, b = (step2 / manifest["shards"][r]["file"] for r in (0, 1))
        if damage == "swap":
            first = a.read_bytes()
            a.write_bytes(b.read_bytes())
            b.write_bytes(first)
            for key in ("bytes", "sha256"):
                s0, s1 = manifest["shards"][0], manifest["shards"][1]
                s0[key], s1[key] = s1[key], s0[key]
            (step2 / "manifest.json").write_text(json.dumps(manifest))
        elif damage == "mixed-steps":
            b.write_bytes((root / "step_000001" / b.name).read_bytes())
        else:
            b.write_bytes(b.read_bytes()[:200])
    world.barrier()
    with pytest.raises(dist.CheckpointError) as info:
        dist.load_checkpoint(root, nn.Linear(3, 2, dtype=np.float64, seed=0), comm=world)
    messages = world.all_gather_object(str(info.value))
    assert len(set(messages)) == 1 and "\n" not in messages[0]
    name = "rank00000" if damage == "swap" else "rank00001"
    assert f"step_000002/{name}-of-" in messages[0]
    if damage == "swap":
        assert "holds the shard of rank 1, the manifest lists it for rank 0" in messages[0]
    assert info.value.fallback == root / "step_000001"
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


def _rewrite_manifest(step_dir: Path, **record) -> None:
    manifest_path = step_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["shards"][0].update(record)
    manifest_path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", ["../../outside/shard.npz", "/etc/passwd", "..", "a/b.npz"])
def test_a_shard_named_outside_its_step_folder_is_refused(tmp_path, name):
    shard = _two_steps(tmp_path / "run")
    _rewrite_manifest(shard.parent, file=name)
    error = _load_error(tmp_path / "run")
    assert "'file' must be a file name in its step folder" in str(error), error


def test_a_shard_linked_outside_the_checkpoint_is_refused(tmp_path):
    """A shard replaced by a link to a file outside (same bytes, so digests agree) is not
    read through the link."""
    shard = _two_steps(tmp_path / "run")
    outside = tmp_path / "outside.npz"
    outside.write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(outside)
    error = _load_error(tmp_path / "run")
    assert "resolves outside its step folder" in str(error), error


def test_latest_naming_a_step_folder_linked_outside_is_refused(tmp_path):
    shard = _two_steps(tmp_path / "run")
    outside = tmp_path / "elsewhere"
    shard.parent.rename(outside)
    (tmp_path / "run" / "step_000002").symlink_to(outside)
    error = _load_error(tmp_path / "run")
    assert "resolves outside" in str(error) and "latest" in str(error), error


def _respin(shard: Path, edit) -> None:
    """Rewrite shard's arrays with `edit(arrays)` (header unchanged), fixing the manifest's
    size and digest, so only the entry check can notice."""
    import io
    with np.load(shard) as npz:
        arrays = {k: npz[k] for k in npz.files}
    edit(arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    payload = buf.getvalue()
    shard.write_bytes(payload)
    _rewrite_manifest(shard.parent, bytes=len(payload),
                      sha256=hashlib.sha256(payload).hexdigest())


@pytest.mark.parametrize("edit,message", [
    # 1.weight, float64 [3, 2]: one row of it (never broadcast), its bits as int64 (never
    # reinterpreted).
    (lambda a: a.update(a2=a["a2"][:1]), "is stored as float64 (1, 2)"),
    (lambda a: a.update(a2=a["a2"].view(np.int64)), "is stored as int64 (3, 2)"),
])
def test_arrays_unlike_their_entries_are_refused(tmp_path, edit, message):
    shard = _two_steps(tmp_path)
    _respin(shard, edit)
    error = _load_error(tmp_path)
    assert message in str(error) and "its entry says float64 (3, 2)" in str(error), error


def test_a_save_never_writes_through_a_planted_link(tmp_path):
    """Before: `latest` was written through a planted `.latest.tmp` link (the file outside
    overwritten), and a step folder name taken by a dangling link failed the commit."""
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    root = tmp_path / "run"
    root.mkdir()
    (root / ".latest.tmp").symlink_to(outside)
    (root / "step_000001").symlink_to(tmp_path / "nowhere")
    (root / ".tmp-step_000009-x").symlink_to(tmp_path)  # "stale staging": unlinked only
    dist.save_checkpoint(root, model(1), step=1)
    assert outside.read_text() == "keep" and (root / "latest").read_text() == "step_000001\n"
    assert not (root / "step_000001").is_symlink() and tmp_path.is_dir()
    assert dist.load_checkpoint(root, model(0)) == {}


def test_a_deeply_nested_manifest_is_one_line_naming_the_file(tmp_path):
    """Before: RecursionError, naming neither the file nor the step."""
    shard = _two_steps(tmp_path / "run")
    (shard.parent / "manifest.json").write_text("[" * 100000 + "]" * 100000)
    error = _load_error(tmp_path / "run")
    assert f"{shard.parent / 'manifest.json'}: JSON nested too deeply" in str(error), error
