"""Learning-rate schedules: PyTorch's LRScheduler family (LambdaLR, StepLR,
CosineAnnealingLR, LinearLR, SequentialLR) and the main job's warm-up + cosine decay."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
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


class LRScheduler:
    """PyTorch's scheduler protocol: on construction each param group gets ``initial_lr``
    (kept if present: several schedulers on one optimizer share it), ``base_lrs`` are
    those, and the lr for epoch 0 is applied; ``step()`` (after ``optimizer.step()``)
    advances ``last_epoch`` and sets each group's lr to ``get_lr()``.

    ``get_lr`` is each schedule's closed form in ``base_lrs`` and ``last_epoch`` (torch's
    chainable forms equal it while nothing else changes the lr; a manual change of a
    group's lr is overwritten at the next step here, where torch's recursive forms of
    StepLR/CosineAnnealingLR/LinearLR would scale it). ``last_epoch=k`` resumes at epoch k
    (the groups need ``initial_lr`` then, as in torch).
    """

    def __init__(self, optimizer: Any, last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"{type(self).__name__}: param 'initial_lr' is not specified "
                                   f"in param_groups[{i}] when resuming (last_epoch="
                                   f"{last_epoch})")
        self.base_lrs = [float(g["initial_lr"]) for g in optimizer.param_groups]
        self.last_epoch = int(last_epoch)
        self.step()

    def get_lr(self) -> list[float]:
        raise NotImplementedError(f"{type(self).__name__} must implement get_lr()")

    def get_last_lr(self) -> list[float]:
        """The lr of every group as last set by this scheduler."""
        return list(self._last_lr)

    def step(self, epoch: int | None = None) -> None:
        """Advance one epoch (``epoch``: jump to that one, torch's deprecated form)."""
        self.last_epoch = self.last_epoch + 1 if epoch is None else int(epoch)
        self._last_lr = [float(lr) for lr in self.get_lr()]
        for group, lr in zip(self.optimizer.param_groups, self._last_lr, strict=True):
            group["lr"] = lr

    def state_dict(self) -> dict[str, Any]:
        """Every attribute but the optimizer (torch's rule); callables are left out."""
        return {k: v for k, v in self.__dict__.items()
                if k != "optimizer" and not callable(v) and k != "lr_lambdas"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the attributes of `state_dict` (lrs are applied at the next step, as in
        torch; ``get_last_lr`` returns the saved ones at once)."""
        self.__dict__.update(state_dict)


def _check_positive(op: str, name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{op}: {name} must be a positive integer, given {value!r}")


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(last_epoch)`` (one function, or one per param group)."""

    def __init__(self, optimizer: Any, lr_lambda: Callable[[int], float]
                 | Sequence[Callable[[int], float]], last_epoch: int = -1) -> None:
        n = len(optimizer.param_groups)
        lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(lambdas) != n or not all(callable(f) for f in lambdas):
            raise ValueError(f"LambdaLR: expected one callable or {n} callables (one per "
                             f"param group), given {lr_lambda!r}")
        self.lr_lambdas = lambdas
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * f(self.last_epoch) for base, f in
                zip(self.base_lrs, self.lr_lambdas, strict=True)]


class StepLR(LRScheduler):
    """``lr = base_lr * gamma ** (last_epoch // step_size)``."""

    def __init__(self, optimizer: Any, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        _check_positive("StepLR", "step_size", step_size)
        self.step_size, self.gamma = step_size, float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size)
                for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * last_epoch / T_max)) / 2``
    (periodic past T_max, as torch's closed form)."""

    def __init__(self, optimizer: Any, T_max: int, eta_min: float = 0.0,  # noqa: N803
                 last_epoch: int = -1) -> None:
        _check_positive("CosineAnnealingLR", "T_max", T_max)
        self.T_max, self.eta_min = T_max, float(eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        c = (1.0 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2.0
        return [self.eta_min + (base - self.eta_min) * c for base in self.base_lrs]


class LinearLR(LRScheduler):
    """``lr = base_lr * (start_factor + (end_factor - start_factor) * min(last_epoch,
    total_iters) / total_iters)``."""

    def __init__(self, optimizer: Any, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        if not 0.0 < start_factor <= 1.0 or not 0.0 <= end_factor <= 1.0:
            raise ValueError(f"LinearLR: expected 0 < start_factor <= 1 and 0 <= end_factor "
                             f"<= 1, given start_factor={start_factor}, end_factor={end_factor}")
        _check_positive("LinearLR", "total_iters", total_iters)
        self.start_factor, self.end_factor = float(start_factor), float(end_factor)
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        f = self.start_factor + (self.end_factor - self.start_factor) * min(
            self.last_epoch, self.total_iters) / self.total_iters
        return [base * f for base in self.base_lrs]


class SequentialLR(LRScheduler):
    """Runs ``schedulers[i]`` between ``milestones[i-1]`` and ``milestones[i]``; at a
    milestone the next scheduler restarts from its epoch 0 (torch's ``step(0)``)."""

    def __init__(self, optimizer: Any, schedulers: Sequence[LRScheduler],
                 milestones: Sequence[int], last_epoch: int = -1) -> None:
        schedulers = list(schedulers)
        if not schedulers or any(s.optimizer is not optimizer for s in schedulers):
            raise ValueError("SequentialLR: expected at least one scheduler, each built on "
                             "this optimizer")
        if len(milestones) != len(schedulers) - 1 or list(milestones) != sorted(milestones):
            raise ValueError(f"SequentialLR: expected {len(schedulers) - 1} increasing "
                             f"milestones (one fewer than schedulers), given "
                             f"{list(milestones)}")
        self.optimizer = optimizer
        self._schedulers = schedulers
        self._milestones = [int(m) for m in milestones]
        self.last_epoch = int(last_epoch) + 1
        for group in optimizer.param_groups:  # undo the sub-schedulers' first steps
            group["lr"] = group["initial_lr"]
        self.base_lrs = [float(g["initial_lr"]) for g in optimizer.param_groups]
        for s in schedulers:
            s.last_epoch -= 1
        schedulers[0].step()
        self._last_lr = schedulers[0].get_last_lr()

    def step(self, epoch: int | None = None) -> None:
        if epoch is not None:
            raise ValueError("SequentialLR.step: takes no epoch (as torch)")
        self.last_epoch += 1
        idx = bisect.bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler.step(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def get_lr(self) -> list[float]:
        return self.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        subs = state.pop("_schedulers")
        if len(subs) != len(self._schedulers):
            raise ValueError(f"SequentialLR.load_state_dict: expected "
                             f"{len(self._schedulers)} scheduler states, given {len(subs)}")
        self.__dict__.update(state)
        for s, sub in zip(self._schedulers, subs, strict=True):
            s.load_state_dict(sub)


_LRScheduler = LRScheduler  # torch's former name
