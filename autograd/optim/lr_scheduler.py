"""Learning-rate schedules: linear warm-up followed by cosine decay to a floor."""

from __future__ import annotations

import math
from typing import Any


def cosine_lr(step: int, base_lr: float, warmup: int, total: int, min_lr: float = 0.0) -> float:
    """Learning rate at `step` (0-based) of a warm-up + cosine schedule.

    - ``step < warmup``: linear ramp ``base_lr * (step + 1) / warmup`` (reaches ``base_lr``
      on the last warm-up step, never 0 on the first);
    - ``warmup <= step <= total``: ``min_lr + (base_lr - min_lr) * (1 + cos(pi * t)) / 2``
      with ``t = (step - warmup) / (total - warmup)``, so ``base_lr`` at ``step == warmup``
      and ``min_lr`` at ``step == total``;
    - ``step > total``: ``min_lr``;
    - ``total == warmup`` (no decay phase): ``base_lr`` after the warm-up.
    """
    if step < 0:
        raise ValueError(f"cosine_lr: step must be >= 0, given {step}")
    if warmup < 0 or total < warmup:
        raise ValueError(f"cosine_lr: expected 0 <= warmup <= total, given warmup={warmup}, "
                         f"total={total}")
    if step < warmup:
        return base_lr * (step + 1) / warmup
    if total == warmup:
        return base_lr  # no decay phase
    if step >= total:
        return min_lr
    t = (step - warmup) / (total - warmup)
    return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))


class CosineWithWarmup:
    """Sets each param group's ``lr`` to ``cosine_lr(step, base_lr, ...)``.

    ``base_lr`` is each group's ``lr`` when the scheduler is built; the lr for step 0 is
    applied at construction, and each ``step()`` (call it after ``optimizer.step()``)
    advances one step, as with PyTorch schedulers.
    """

    def __init__(self, optimizer: Any, warmup_steps: int, total_steps: int,
                 min_lr: float = 0.0) -> None:
        if warmup_steps < 0 or total_steps < warmup_steps:
            raise ValueError("CosineWithWarmup: expected 0 <= warmup_steps <= total_steps, "
                             f"given {warmup_steps}, {total_steps}")
        self.optimizer = optimizer
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.min_lr = float(min_lr)
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.last_step = 0
        self._apply()

    def get_lr(self) -> list[float]:
        """The learning rate of every param group at the current step."""
        return [cosine_lr(self.last_step, base, self.warmup_steps, self.total_steps,
                          self.min_lr) for base in self.base_lrs]

    def get_last_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def _apply(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr

    def state_dict(self) -> dict:
        return {"last_step": self.last_step, "base_lrs": list(self.base_lrs),
                "warmup_steps": self.warmup_steps, "total_steps": self.total_steps,
                "min_lr": self.min_lr}

    def load_state_dict(self, state: dict) -> None:
        if len(state["base_lrs"]) != len(self.optimizer.param_groups):
            raise ValueError(f"CosineWithWarmup.load_state_dict: expected "
                             f"{len(self.optimizer.param_groups)} base_lrs (one per param "
                             f"group), given {len(state['base_lrs'])}")
        self.last_step = int(state["last_step"])
        self.base_lrs = [float(b) for b in state["base_lrs"]]
        self.warmup_steps = int(state["warmup_steps"])
        self.total_steps = int(state["total_steps"])
        self.min_lr = float(state["min_lr"])
        self._apply()
