"""Pipeline schedules as pure functions: the ordered list of actions each stage performs.

An action is one of
  forward(m)    run stage's forward on micro-batch m (after receiving its input)
  backward(m)   back-propagate micro-batch m through the stage
  recv_act(m)   receive micro-batch m's activation from stage - 1
  send_act(m)   send micro-batch m's activation to stage + 1
  recv_grad(m)  receive the gradient of micro-batch m's output from stage + 1
  send_grad(m)  send the gradient of micro-batch m's input to stage - 1
The first stage has no recv_act/send_grad, the last no send_act/recv_grad. Runners post
sends as non-blocking (MPI_Isend) and receives as blocking: under that rule both schedules
are deadlock-free (tests/dist/pipeline/test_schedules.py simulates them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

KINDS = ("forward", "backward", "send_act", "recv_act", "send_grad", "recv_grad")


@dataclass(frozen=True)
class Action:
    kind: str
    micro_batch: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Action: kind: expected one of {KINDS}, given {self.kind!r}")

    def __str__(self) -> str:
        return f"{self.kind}({self.micro_batch})"


Schedule = list[list[Action]]


def _check(name: str, num_stages: int, num_micro_batches: int) -> None:
    for arg, value in (("num_stages", num_stages), ("num_micro_batches", num_micro_batches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: {arg}: expected a positive int, given {value!r}")


def _forward(stage: int, last: int, m: int) -> list[Action]:
    acts = [] if stage == 0 else [Action("recv_act", m)]
    acts.append(Action("forward", m))
    if stage != last:
        acts.append(Action("send_act", m))
    return acts


def _backward(stage: int, last: int, m: int) -> list[Action]:
    acts = [] if stage == last else [Action("recv_grad", m)]
    acts.append(Action("backward", m))
    if stage != 0:
        acts.append(Action("send_grad", m))
    return acts


def gpipe(num_stages: int, num_micro_batches: int) -> Schedule:
    """GPipe: every stage runs all forwards, then all backwards (in micro-batch order).

    Peak live activations per stage: num_micro_batches. 3 stages, 4 micro-batches::

        stage 0: F0 F1 F2 F3 .  .  .  .  .  .  B0 B1 B2 B3
        stage 1:    F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3
        stage 2:       F0 F1 F2 F3 B0 B1 B2 B3
    """
    _check("gpipe", num_stages, num_micro_batches)
    last = num_stages - 1
    schedule = []
    for s in range(num_stages):
        acts: list[Action] = []
        for m in range(num_micro_batches):
            acts += _forward(s, last, m)
        for m in range(num_micro_batches):
            acts += _backward(s, last, m)
        schedule.append(acts)
    return schedule


def one_f_one_b(num_stages: int, num_micro_batches: int) -> Schedule:
    """1F1B (PipeDream-flush, as in Megatron-LM): warm-up forwards, then alternate.

    Stage s runs min(num_stages - s - 1, M) warm-up forwards, then one forward and one
    backward in turn, then the remaining backwards; at most min(num_stages - s, M)
    micro-batches hold activations at once. 3 stages, 4 micro-batches::

        stage 0: F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3
        stage 1:    F0 F1 .  B0 F2 B1 F3 B2 .  B3
        stage 2:       F0 B0 F1 B1 F2 B2 F3 B3
    """
    _check("one_f_one_b", num_stages, num_micro_batches)
    last = num_stages - 1
    schedule = []
    for s in range(num_stages):
        warmup = min(num_stages - s - 1, num_micro_batches)
        acts: list[Action] = []
        for m in range(warmup):
            acts += _forward(s, last, m)
        for i in range(num_micro_batches - warmup):
            acts += _forward(s, last, warmup + i)
            acts += _backward(s, last, i)
        for m in range(num_micro_batches - warmup, num_micro_batches):
            acts += _backward(s, last, m)
        schedule.append(acts)
    return schedule


SCHEDULES: dict[str, Callable[[int, int], Schedule]] = {"gpipe": gpipe, "1f1b": one_f_one_b}


def get_schedule(name: str) -> Callable[[int, int], Schedule]:
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ValueError(f"schedule: expected one of {sorted(SCHEDULES)}, given {name!r}") from None
