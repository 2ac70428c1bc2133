"""PipelineParallel: runs a schedule's actions, in one process or one stage per rank."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

import autograd as ag
from autograd.nn import Module
from autograd.tape import Tape
from autograd.tensor import Tensor
from dist import trace
from dist.communicator import Communicator
from dist.pipeline.schedules import Action, get_schedule
from dist.pipeline.stage import PipelineStage
from dist.requests import PendingRecv, PendingSend
from gpuplan import backend
from gpuplan.errors import InvalidProblem, describe

_TAG_BASE = 4096  # keeps pipeline messages apart from small user tags


class _LocalTransport:
    """FIFO channels between stages of one process."""

    def __init__(self) -> None:
        self.queues: dict[tuple[int, int, str], deque] = defaultdict(deque)

    def ready(self, src: int, dst: int, kind: str) -> bool:
        return bool(self.queues[(src, dst, kind)])

    def post(self, src: int, dst: int, kind: str, m: int) -> None:
        pass  # a local message is there or not: nothing to post

    def progress(self) -> None:
        pass

    def send(self, src: int, dst: int, kind: str, m: int, array: Any) -> None:
        self.queues[(src, dst, kind)].append((m, array))

    def recv(self, src: int, dst: int, kind: str, m: int) -> Any:
        got, array = self.queues[(src, dst, kind)].popleft()
        if got != m:
            raise RuntimeError(f"pipeline: stage {dst} expected {kind} of micro-batch {m}, "
                               f"got {got}")
        return array


class _MpiTransport:
    """Point-to-point over a Communicator: non-blocking sends; receives posted ahead
    (`post`: Communicator.irecv_array, its data's receive posted by `progress` once the
    header is in) and waited at use."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self.pending: list[PendingSend] = []
        self.posted: dict[tuple[int, str, int], PendingRecv] = {}
        self._unfinished: list[PendingRecv] = []

    def ready(self, src: int, dst: int, kind: str) -> bool:
        return True  # recv blocks until the message is there

    @staticmethod
    def _tag(kind: str, m: int) -> int:
        return _TAG_BASE + 2 * m + (kind == "grad")

    def send(self, src: int, dst: int, kind: str, m: int, array: Any) -> None:
        self.pending.append(self.comm.isend_array(array, dst, self._tag(kind, m)))

    def post(self, src: int, dst: int, kind: str, m: int) -> None:
        """Post the receive of `kind` for micro-batch m from stage `src` now."""
        key = (src, kind, m)
        if key not in self.posted:
            self.posted[key] = request = self.comm.irecv_array(src, self._tag(kind, m))
            self._unfinished.append(request)

    def progress(self) -> None:
        """Post the data receives whose headers have come (no wait)."""
        if self._unfinished:
            self._unfinished = [r for r in self._unfinished if not r.progress()]

    def recv(self, src: int, dst: int, kind: str, m: int) -> Any:
        request = self.posted.pop((src, kind, m), None)
        if request is None:
            return self.comm.recv_array(src, self._tag(kind, m))
        if request in self._unfinished:
            self._unfinished.remove(request)
        return request.wait()

    def finish(self) -> None:
        for p in self.pending:
            p.wait()
        self.pending = []


def split_rows(a: Any, parts: int, what: str) -> list[Any]:
    """`parts` contiguous row blocks of a (sizes differ by at most one)."""
    n = a.shape[0]
    if n < parts:
        raise InvalidProblem(describe("PipelineParallel", what, f"at least num_micro_batches="
                                      f"{parts} rows", n))
    bounds = [i * (n // parts) + min(i, n % parts) for i in range(parts + 1)]
    return [a[bounds[i]:bounds[i + 1]] for i in range(parts)]


def _data(x: Any) -> Any:
    return x.data if isinstance(x, Tensor) else x


class _StageRun:
    """One stage executing its action list for one step (train or forward only)."""

    def __init__(self, pipe: PipelineParallel, index: int, transport: Any, inputs: list,
                 targets: list | None, loss_fn: Callable | None,
                 before_last_backward: Callable[[], Any] | None = None) -> None:
        self.module, self.index, self.transport = pipe._local[index], index, transport
        self.last = index == pipe.num_stages() - 1
        self.train = loss_fn is not None
        self.m_total = pipe.num_micro_batches
        self.inputs_0, self.targets, self.loss_fn = inputs, targets, loss_fn
        self.before_last_backward = before_last_backward
        self.x: dict[int, Tensor] = {}
        self.out: dict[int, Tensor] = {}
        self.tapes: dict[int, Tape] = {}
        self.losses: dict[int, Tensor] = {}
        self.grad_out: dict[int, Any] = {}
        self.grad_in: dict[int, Any] = {}
        self.loss_values: list[float] = []
        self.results: dict[int, Any] = {}
        self.done = 0
        self.peak_live = 0  # most micro-batches holding saved activations (tapes) at once

    def program(self, actions: list[Action]) -> Iterator[None]:
        """Runs the actions in order; yields whenever a receive has no message yet."""
        for a in actions:
            m = a.micro_batch
            if a.kind == "recv_act":
                while not self.transport.ready(self.index - 1, self.index, "act"):
                    yield
                arr = self.transport.recv(self.index - 1, self.index, "act", m)
                self.x[m] = Tensor(arr, requires_grad=self.train)
            elif a.kind == "recv_grad":
                while not self.transport.ready(self.index + 1, self.index, "grad"):
                    yield
                self.grad_out[m] = self.transport.recv(self.index + 1, self.index, "grad", m)
            elif a.kind == "forward":
                self._forward(m)
            elif a.kind == "send_act":
                self.transport.send(self.index, self.index + 1, "act", m, self.out[m].data)
                if not self.train:
                    del self.out[m]
            elif a.kind == "backward":
                self._backward(m)
            else:  # send_grad
                self.transport.send(self.index, self.index - 1, "grad", m, self.grad_in.pop(m))
            self.done += 1
            self.transport.progress()

    def _forward(self, m: int) -> None:
        with trace.span("forward", stage=self.index, micro_batch=m):
            self._forward_now(m)

    def _forward_now(self, m: int) -> None:
        x = self.x.pop(m, None) if self.index > 0 else Tensor(_data(self.inputs_0[m]))
        if not self.train:
            with ag.no_grad():
                out = self.module(x)
            if self.last:
                self.results[m] = out.data
            else:
                self.out[m] = out
            return
        if self.index > 0:
            self.x[m] = x  # its .grad is what send_grad ships
        tape = Tape()
        with tape:
            out = self.module(x)
            if self.last:
                loss = self.loss_fn(out, self.targets[m])
                self.loss_values.append(float(loss.item()))
                self.losses[m] = loss * (1.0 / self.m_total)
        self.tapes[m] = tape
        self.out[m] = out
        self.peak_live = max(self.peak_live, len(self.tapes))

    def _backward(self, m: int) -> None:
        if m == self.m_total - 1 and self.before_last_backward is not None:
            self.before_last_backward()
        with trace.span("backward", stage=self.index, micro_batch=m):
            self._backward_now(m)

    def _backward_now(self, m: int) -> None:
        tape = self.tapes.pop(m)
        out = self.out.pop(m)
        root, grad = (self.losses.pop(m), None) if self.last else (out, self.grad_out.pop(m))
        if root._node is not None:
            tape.backward(root, grad=grad)
        if self.index > 0:
            x = self.x.pop(m)
            self.grad_in[m] = (x.grad.data if x.grad is not None
                               else backend.array_namespace(x.data).zeros_like(x.data))


class PipelineParallel(Module):
    """Pipeline of stages over micro-batches, scheduled by "gpipe" or "1f1b".

    comm None (or of size 1): every stage runs in this process. comm of size num_stages:
    rank r owns stage r; `stages` may hold zero-argument callables so that a rank builds
    only its own stage. forward(x) splits x into num_micro_batches row blocks, runs them
    and returns the concatenated output (on the last stage's rank; None elsewhere).
    train_step(x, target, loss_fn) back-propagates mean_m loss_fn(out_m, target_m) into the
    parameters' .grad (no optimizer step) and returns that mean as a float on every rank;
    afterwards `peak_live_activations[stage]` is the most micro-batches whose activations
    (tapes) that stage held at once in the step (counted, not derived from the schedule).
    Messages: activations forward, gradients backward, as non-blocking sends; across ranks
    every receive of a step is posted at its start (MPI_Irecv of the header, then of the
    data once the header is in, checked between actions) and waited where the schedule
    uses it.
    """

    def __init__(self, stages: Sequence[Module | Callable[[], Module]],
                 num_micro_batches: int = 1, schedule: str = "1f1b",
                 comm: Communicator | None = None) -> None:
        super().__init__()
        if isinstance(num_micro_batches, bool) or not isinstance(num_micro_batches, int) \
                or num_micro_batches < 1:
            raise InvalidProblem(describe("PipelineParallel", "num_micro_batches",
                                          "a positive int", num_micro_batches))
        if not stages:
            raise InvalidProblem(describe("PipelineParallel", "stages", "at least one", 0))
        self._schedule = get_schedule(schedule)
        self.schedule_name = schedule
        self.num_micro_batches = num_micro_batches
        self._num_stages = len(stages)
        self.comm = comm if comm is not None and comm.size > 1 else None
        if self.comm is not None and self.comm.size != self._num_stages:
            raise InvalidProblem(describe("PipelineParallel", "comm", f"size 1 or num_stages="
                                          f"{self._num_stages}", f"size {self.comm.size}"))
        owned = range(self._num_stages) if self.comm is None else [self.comm.rank]
        self._local: dict[int, Module] = {}
        for i in owned:
            stage = stages[i]
            if not isinstance(stage, Module):
                stage = stage()
            if isinstance(stage, PipelineStage) and stage.index != i:
                raise InvalidProblem(describe("PipelineParallel", f"stages[{i}]",
                                              f"PipelineStage({i})", f"index {stage.index}"))
            self.add_module(str(i), stage)
            self._local[i] = stage

    def num_stages(self) -> int:
        return self._num_stages

    def stage(self, index: int) -> Module | None:
        """Stage `index`, or None when there is none here: an index outside
        [0, num_stages) (negative ones do not count from the end) or, on a multi-rank
        pipeline, a stage another rank owns (the seed's ``Option<&PipelineStage>``)."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"PipelineParallel.stage: index must be an int, given "
                            f"{type(index).__name__}")
        return self._local.get(int(index))

    @property
    def last_rank(self) -> int:
        return self._num_stages - 1

    def forward(self, x: Any) -> Any:
        if self.comm is None:
            # One process: differentiable split / run / concatenate (the seed behaviour).
            xs = (ag.chunk(x, self.num_micro_batches, 0) if isinstance(x, Tensor) else
                  [Tensor(p) for p in split_rows(x, self.num_micro_batches, "x")])
            outs = []
            for part in xs:
                for i in range(self._num_stages):
                    part = self._local[i](part)
                outs.append(part)
            return ag.cat(outs, 0) if len(outs) > 1 else outs[0]
        runs = self._execute(x, None, None)
        run = runs[self.comm.rank]
        if self.comm.rank != self.last_rank:
            return None
        parts = [run.results[m] for m in range(self.num_micro_batches)]
        return Tensor(backend.concatenate(parts, axis=0))

    def train_step(self, x: Any, target: Any, loss_fn: Callable[[Tensor, Any], Tensor],
                   before_last_backward: Callable[[], Any] | None = None) -> float:
        """Forward and backward over the micro-batches; returns the mean micro-batch loss.
        `before_last_backward()` runs on each stage here right before its backward of the
        last micro-batch (e.g. `OverlappedGradReducer.arm`)."""
        runs = self._execute(x, target, loss_fn, before_last_backward)
        self.peak_live_activations = {i: r.peak_live for i, r in runs.items()}
        last = runs.get(self.last_rank)
        mean = None if last is None else float(np.mean(last.loss_values))
        if self.comm is not None:
            mean = self.comm.bcast_object(mean, root=self.last_rank)
        return mean

    def _execute(self, x: Any, target: Any, loss_fn: Callable | None,
                 before_last_backward: Callable[[], Any] | None = None
                 ) -> dict[int, _StageRun]:
        m_total = self.num_micro_batches
        owned = sorted(self._local)
        inputs = split_rows(_data(x), m_total, "x") if 0 in owned else []
        targets = None
        if loss_fn is not None and self.last_rank in owned:
            targets = split_rows(_data(target), m_total, "target")
        schedule = self._schedule(self._num_stages, m_total)
        if loss_fn is None:
            keep = ("recv_act", "forward", "send_act")
            schedule = [[a for a in acts if a.kind in keep] for acts in schedule]
        transport = _LocalTransport() if self.comm is None else _MpiTransport(self.comm)
        runs = {i: _StageRun(self, i, transport, inputs, targets, loss_fn, before_last_backward)
                for i in owned}
        for i in owned:  # every receive of the step, posted now, waited at use
            for a in schedule[i]:
                if a.kind in ("recv_act", "recv_grad"):
                    src = i - 1 if a.kind == "recv_act" else i + 1
                    transport.post(src, i, a.kind[5:], a.micro_batch)
        programs = {i: runs[i].program(schedule[i]) for i in owned}
        while programs:
            before = sum(r.done for r in runs.values())
            for i in list(programs):
                try:
                    next(programs[i])
                except StopIteration:
                    del programs[i]
            if programs and sum(r.done for r in runs.values()) == before:
                raise RuntimeError(f"pipeline: schedule deadlocked at stages {sorted(programs)}")
        if isinstance(transport, _MpiTransport):
            transport.finish()
        return runs
