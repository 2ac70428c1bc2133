"""train.py --cuda-graph: the training step as two captured CUDA graphs (gpuplan.graphs).

    graph A: forward, loss, backward, gradient clipping (norm and scale on the device)
    graph B: the AdamW step (its lr and step count read from device memory refreshed before
             each replay, so the cosine schedule goes on without recapture)

Step 0 runs eagerly (the warm-up: kernels compiled, gradients and optimizer moments
made); step 1 captures both graphs over static input buffers, and every step from then on
uploads its batch into them and replays A, reads the loss and gradient norm (the one host
read of a step, which --on-nonfinite needs), then replays B unless the step is skipped.
The weights, losses and norms are those of the eager loop, bit for bit.

What cannot be captured is refused up front (`refusal`): the host device, several ranks
(their collectives run on the host between kernels), several micro-batches (the pipeline
runner reads each micro-batch's loss on the host) and dropout (its seeds are per-step host
values a graph would freeze).
"""

from __future__ import annotations

from typing import Any


def refusal(ns: Any, world_size: int) -> str | None:
    """Why --cuda-graph cannot run with these options (one line), or None."""
    import gpuplan as gp

    device = gp.backend.default_device() if ns.device == "auto" else \
        gp.backend.resolve_device(ns.device)
    if device == "cpu":
        return ("--cuda-graph: needs a device (--device cuda, or emulated); the host runs "
                "eagerly")
    if world_size > 1:
        return (f"--cuda-graph: single-process runs only ({world_size} ranks: the MPI "
                f"collectives between their kernels run on the host, which a graph cannot "
                f"capture)")
    if ns.micro_batches > 1:
        return (f"--cuda-graph: one micro-batch per step (given --micro-batches "
                f"{ns.micro_batches}: the pipeline runner reads each micro-batch's loss on "
                f"the host)")
    attn = ns.dropout if getattr(ns, "attn_dropout", None) is None else ns.attn_dropout
    if ns.dropout > 0 or attn > 0:
        return (f"--cuda-graph: --dropout 0 and --attn-dropout 0 only (given {ns.dropout}, "
                f"{attn}: dropout seeds are per-step host values that a graph would replay "
                f"unchanged)")
    return None


class GraphedStep:
    """The Trainer's step as graphs A and B (see the module docstring)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.a = self.b = None
        self.x = self.y = self.loss = self.norm = None

    def _forward_backward(self) -> None:
        import gpuplan as gp
        from autograd import Tape
        from autograd.tensor import Tensor

        t = self.trainer
        model = t.model
        tape = Tape()
        with tape:
            loss = model.loss_fn(model.pipe.stage(0)(Tensor(self.x)), self.y)
        tape.backward(loss)
        model.finish_gradients()
        grads = [p.grad.data for p in model.parameters() if p.grad is not None]
        # With clipping the norm is the clip's (computed and applied on the device); it
        # equals dist.grad_norm's on one process.
        self.norm = (gp.functional.clip_grad_norm_(grads, t.ns.clip) if t.ns.clip > 0
                     else gp.functional.global_l2_norm(grads))
        self.loss = loss.data

    def capture(self, x: Any, y: Any) -> None:
        """Capture A and B over static copies of this step's batch (the optimizer state
        and gradients exist: step 0 ran eagerly)."""
        import gpuplan as gp

        device = self.trainer.device
        self.x, self.y = gp.to_device(x, device).copy(), gp.to_device(y, device).copy()
        stream = gp.graphs.side_stream(device)
        if stream.kind == "cuda":  # the eager steps (on the current stream) finish first
            gp.backend.synchronize()
        with gp.graphs._current(stream):
            self.trainer.opt.zero_grad()  # gradients made in A's pool, static from now on
            self.a = gp.graphs.CUDAGraph()
            with gp.graphs.graph(self.a, stream=stream):
                self._forward_backward()
            self.b = gp.graphs.CUDAGraph()
            with gp.graphs.graph(self.b, pool=self.a.pool(), stream=stream):
                self.trainer.opt.step()
        print("cuda graph: training step captured (A: forward, backward, clipping; B: AdamW); "
              "replayed from now on", flush=True)

    def forward_backward(self, x: Any, y: Any) -> tuple[float, float]:
        """Replay A on this batch; (loss, gradient norm) read back."""
        import numpy as np

        import gpuplan as gp

        if self.a is None:
            self.capture(x, y)
        stream = self.a.stream
        for dst, src in ((self.x, x), (self.y, y)):
            gp.stream.upload(stream, dst, np.asarray(gp.to_host(src)))
        self.a.replay()
        return float(gp.to_host(self.loss)), float(gp.to_host(self.norm))

    def optimizer_step(self) -> None:
        """Replay B: the AdamW step on the gradients A left."""
        self.b.replay()
