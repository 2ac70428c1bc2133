"""Bytes per rank by category: parameters, gradients, optimizer state, the activations kept for
backward, and on a GPU the CuPy memory pool's (what train.py prints at start and logs).

Every figure but the pool's counts the arrays the runtime allocates (``nbytes``), not a
process's memory (Python, NumPy, compiled kernels, MPI, transients come on top):

* parameters: every local parameter's array (this rank's shards, its pipeline stage's);
* gradients: every ``.grad``, and the float32 running sums of half-precision parameters'
  gradients over micro-batches (`autograd.tape`'s ``_grad_acc``);
* optimizer: the optimizer state's arrays: AdamW's two moments (float32, float64 for
  float64 parameters) and the float32 master weights of half parameters; with ZeRO-1 this
  rank's slices of them (`dist.ZeroRedundancyOptimizer.state_bytes`);
* activations (peak): the arrays the tape keeps for backward (each array once, the
  parameters left out) after one micro-batch's forward on this rank's stage, times the most
  micro-batches the pipeline schedule holds at once on it (1 without a pipeline);
* the pool (``device="cuda"``): the bytes CuPy's default pool hands out now, and the bytes
  it holds (its high-water mark: freed blocks stay cached).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

import gpuplan as gp
from autograd import random as ag_random
from autograd.tape import Tape
from autograd.tensor import Tensor
from dist.context_parallel import take_local
from dist.pipeline.schedules import get_schedule
from dist.tensor_parallel.random import get_rng_tracker


def parameter_bytes(params: Iterable[Any]) -> int:
    """Bytes of the parameters' arrays."""
    return sum(int(p.data.nbytes) for p in params)


def gradient_bytes(params: Iterable[Any]) -> int:
    """Bytes of the parameters' gradients, with the float32 running sums of half parameters'
    gradients accumulated over micro-batches."""
    total = 0
    for p in params:
        if p.grad is not None:
            total += int(p.grad.data.nbytes)
        acc = p.__dict__.get("_grad_acc")
        if acc is not None and acc[1] is p.grad:
            total += int(acc[0].nbytes)
    return total


def optimizer_bytes(optimizer: Any) -> int:
    """Bytes of the optimizer's state on this rank (its arrays; step counts are not)."""
    if hasattr(optimizer, "state_bytes"):
        return int(optimizer.state_bytes())
    return sum(int(v.nbytes) for state in optimizer.state.values() for v in state.values()
               if hasattr(v, "nbytes"))


def kept_bytes(tape: Tape, skip: Iterable[Any] = ()) -> int:
    """Bytes of the arrays the tape's ops keep for backward, each once, but those of `skip`
    (e.g. the parameters' arrays)."""
    leave = {id(a) for a in skip}
    seen: dict[int, int] = {}
    for node in tape.nodes:
        for a in getattr(node.ctx, "saved", ()) or ():
            if hasattr(a, "nbytes") and id(a) not in leave:
                seen[id(a)] = int(a.nbytes)
    return sum(seen.values())


def micro_batches_in_flight(model: Any) -> int:
    """The most micro-batches whose activations this rank's pipeline stage holds at once
    under the model's schedule (forwards run minus backwards run, at its largest)."""
    pipe = model.pipe
    if model.num_stages == 1:
        return 1  # one micro-batch after another (ParallelModel._accumulate_micro_batches)
    actions = get_schedule(pipe.schedule_name)(model.num_stages,
                                               pipe.num_micro_batches)[model.stage_index]
    live = most = 0
    for a in actions:
        live += {"forward": 1, "backward": -1}.get(a.kind, 0)
        most = max(most, live)
    return most


def activation_bytes(model: Any, idx: Any, targets: Any) -> int:
    """Peak bytes the tape keeps for backward on this rank, of a parallel model
    (`dist.models.parallel.ParallelModel`) training on ``idx, targets`` (this data-parallel
    rank's batch): one micro-batch's forward (and loss, on the last stage) run on this rank's
    stage (a later stage's input zeros of the activation's shape), times
    `micro_batches_in_flight`. A collective over the tensor-parallel group (every rank of it
    calls it). The random state is put back: training draws what it would have."""
    rows = idx.shape[0] // model.pipe.num_micro_batches
    idx, targets = model.input_array(idx[:rows]), model.input_array(targets[:rows])
    # Context parallelism: the rank runs its slice of the sequences (loss_fn: its share).
    idx = take_local(idx, getattr(model, "cp_comm", None))
    if model.is_first_stage:
        x = idx
    else:
        weight = next(iter(model.parameters()))
        width = model.config.n_embd
        length = idx.shape[1] // (model.tp_comm.size if model.sequence_parallel else 1)
        x = Tensor(gp.asarray(np.zeros((rows, length, width), weight.dtype),
                              device=model.device), requires_grad=True)
    default, tracker = ag_random.default_generator.get_state(), get_rng_tracker().get_states()
    tape = Tape()
    try:
        with tape:
            out = model.forward_stage(x, first=model.is_first_stage, last=model.is_last_stage)
            if model.is_last_stage:
                model.loss_fn(out, targets)
        kept = kept_bytes(tape, [p.data for p in model.parameters()])
    finally:
        ag_random.default_generator.set_state(default)
        get_rng_tracker().set_states(tracker)
        for node in tape.nodes:  # now, not at the next cycle collection (nodes and tape
            node.free()          # refer to each other): the first step reuses the memory
        tape.nodes = []
    return kept * micro_batches_in_flight(model)


def pool_bytes(device: str) -> tuple[int, int] | None:
    """(bytes in use, bytes held) of CuPy's default memory pool on a GPU; None elsewhere."""
    if device != "cuda":
        return None
    pool = gp.backend.cupy_module().get_default_memory_pool()
    return int(pool.used_bytes()), int(pool.total_bytes())


@dataclass(frozen=True)
class MemoryReport:
    """Bytes per rank by category (see the module docstring); pool figures None off a GPU."""

    params: int
    grads: int
    optimizer: int
    activations: int
    pool_used: int | None = None
    pool_held: int | None = None

    @classmethod
    def measure(cls, model: Any, optimizer: Any, grads: int, activations: int,
                device: str) -> MemoryReport:
        """This rank's report: `grads` and `activations` measured by the caller
        (`gradient_bytes` before the gradients are dropped, `activation_bytes`)."""
        pool = pool_bytes(device)
        return cls(parameter_bytes(model.parameters()), int(grads), optimizer_bytes(optimizer),
                   int(activations), *(pool or (None, None)))

    def most_over(self, comm: Any) -> MemoryReport:
        """The largest value of each field over the ranks of `comm` (a collective)."""
        values = np.array([-1 if v is None else v for v in self._values()], np.int64)
        if comm is not None and comm.size > 1:
            values = comm.all_reduce(values, "max")
        return MemoryReport(*(None if v < 0 else int(v) for v in values))

    def _values(self) -> list[int | None]:
        return [getattr(self, f.name) for f in fields(self)]

    def metrics(self) -> dict[str, int | None]:
        """The metrics.jsonl fields: ``memory_<category>_bytes``."""
        return {f"memory_{f.name}_bytes": getattr(self, f.name) for f in fields(self)}

    def line(self) -> str:
        """``memory/rank: params 1.2 MiB, grads ..., optimizer ..., activations (peak) ...``
        (and on a GPU the pool's use and hold)."""
        f = format_bytes
        text = (f"memory/rank: params {f(self.params)}, grads {f(self.grads)}, optimizer "
                f"{f(self.optimizer)}, activations (peak) {f(self.activations)}")
        if self.pool_used is not None:
            text += f" | CuPy pool: {f(self.pool_used)} used, {f(self.pool_held)} held"
        return text


def format_bytes(n: int) -> str:
    """``n`` bytes in MiB (KiB below a tenth of one), three significant digits."""
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 / 10 else f"{n / 2**10:.3g} KiB"


__all__ = ["MemoryReport", "activation_bytes", "format_bytes", "gradient_bytes",
           "kept_bytes", "micro_batches_in_flight", "optimizer_bytes", "parameter_bytes",
           "pool_bytes"]
