"""Run under mpiexec by test_checkpoint_crash.py: commit step 1, then kill one rank at a
chosen point of the save of step 2 (or at a random instant of repeated saves).

    mpiexec -n 2 python tests/dist/checkpoint_crash_driver.py ROOT POINT RANK [SEED]

Rank r's model is nn.Linear(4, 3, float64, seed=r) plus (step - 1): the test knows every
committed step's content. The kill is SIGKILL (no clean-up, no exception handler).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

import dist
import dist.checkpoint as ckpt
from autograd import nn

_real_write, _real_atomic, _real_prune = ckpt.write_file, ckpt.atomic_write, ckpt._prune


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def half_then_die(path: Path, payload: bytes) -> None:
    with open(path, "wb") as f:
        f.write(payload[:len(payload) // 2])
    die()


def after(real, then):
    def wrapped(*args, **kwargs):
        real(*args, **kwargs)
        then()
    return wrapped


def atomic_then_die_at(name: str, half: bool):
    def wrapped(path: Path, payload: bytes) -> None:
        if path.name != name:
            return _real_atomic(path, payload)
        if half:  # the temporary file (a fresh name: see confined_write) half written
            half_then_die(path.with_name(f".{path.name}.0123456789ab.tmp"), payload)
        _real_atomic(path, payload)
        die()
    return wrapped


def prune_then_die(root: Path, keep: int, current: Path) -> None:
    for old in [p for p in ckpt.list_checkpoints(root) if p != current]:
        os.replace(old, root / f".trash-{old.name}-x")  # renamed, never deleted
        die()


POINTS = {  # name: (patched attribute of dist.checkpoint, replacement)
    "shard-half": ("write_file", half_then_die),
    "shard-written": ("write_file", after(_real_write, die)),
    "manifest-half": ("atomic_write", atomic_then_die_at(ckpt.MANIFEST, half=True)),
    "manifest-written": ("atomic_write", atomic_then_die_at(ckpt.MANIFEST, half=False)),
    "latest-half": ("atomic_write", atomic_then_die_at(ckpt.LATEST, half=True)),
    "pruning": ("_prune", prune_then_die),
}


def set_step(model: nn.Module, base: dict[str, np.ndarray], step: int) -> None:
    for name, p in model.named_parameters():
        p.data[...] = base[name] + (step - 1)


def main() -> int:
    root, point, victim = sys.argv[1], sys.argv[2], int(sys.argv[3])
    world = dist.init()
    model = nn.Linear(4, 3, dtype=np.float64, seed=world.rank)
    base = model.state_dict()
    dist.save_checkpoint(root, model, comm=world, step=1, keep=1)
    if point == "random":
        rng = random.Random(int(sys.argv[4]))
        delay = rng.uniform(0.0, 0.4)
        if world.rank == victim:
            threading.Timer(delay, die).start()
        for step in range(2, 10_000):
            set_step(model, base, step)
            dist.save_checkpoint(root, model, comm=world, step=step, keep=2)
            time.sleep(0.001)
        return 0
    set_step(model, base, 2)
    if world.rank == victim:
        attr, replacement = POINTS[point]
        setattr(ckpt, attr, replacement)
    dist.save_checkpoint(root, model, comm=world, step=2, keep=1)
    print(f"rank {world.rank}: the save of step 2 returned", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
