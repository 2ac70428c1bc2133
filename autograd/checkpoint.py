"""Activation recomputation: ``ag.checkpoint(fn, *inputs)`` runs `fn` without keeping what
its ops save for backward, and runs it again, on a tape of its own, when backward reaches it
(torch.utils.checkpoint's reentrant form).

The forward runs under no_grad, so none of its ops records a node or keeps an array: only the
inputs (which the caller holds anyway) and the outputs stay alive. One node is recorded in
their place. Its backward replays `fn` on the same input arrays with the default generator
(the dropout (seed, offset) stream) set back to where the forward found it, so every dropout
inside draws the same mask; back-propagates the incoming gradients through that fresh graph
(the parameters `fn` uses receive their gradient there, in the order the plain graph would
give them); and returns the inputs' gradients to the outer backward. With deterministic
kernels the gradients equal the ones without checkpointing bit for bit.

The node is recorded when grad mode is on and an input requires grad, or `fn` is a Module (or
a Module's bound method) with a parameter that does (a plain function that only closes over
parameters needs an input that requires grad, as with torch's reentrant checkpoint).
"""

from __future__ import annotations

from typing import Any

from autograd import grad_mode, random, tensor_base
from autograd.function import Context
from autograd.tape import Node, Tape, current_tape, run_backward
from autograd.tensor_base import TensorBase
from gpuplan.dtypes import FLOAT_DTYPES


class Recompute:
    """The node class of a checkpointed call (the engine calls ``backward(ctx, *grads)``)."""

    @staticmethod
    def backward(ctx: Context, *grads: Any) -> tuple:
        args = []
        leaves = []
        for a, needs in zip(ctx.args, ctx.needs_input_grad, strict=True):
            if isinstance(a, TensorBase):
                d = tensor_base.TENSOR_CLASS(a.data)
                d.requires_grad = needs
                args.append(d)
                leaves.append(d if needs else None)
            else:
                args.append(a)
                leaves.append(None)
        gen = random.default_generator
        now = gen.get_state()
        gen.set_state(ctx.rng_state)
        inner = Tape()
        try:
            with grad_mode.enable_grad(), inner:
                out = ctx.fn(*args, **ctx.kwargs)
        finally:
            gen.set_state(now)
        outs = _as_outputs(out, "checkpoint: fn (recomputed in backward)")
        if len(outs) != len(grads):
            raise RuntimeError(f"checkpoint: fn returned {len(outs)} outputs when recomputed "
                               f"in backward, {len(grads)} in forward (it must not depend on "
                               f"anything but its inputs and parameters)")
        roots = [(o, g) for o, g in zip(outs, grads, strict=True)
                 if o.requires_grad and o.dtype in FLOAT_DTYPES]
        if roots:
            run_backward(roots, owner=inner)
        inner.nodes = []
        return tuple(None if d is None or d.grad is None else d.grad.data for d in leaves)


def _as_outputs(out: Any, where: str) -> tuple:
    outs = out if isinstance(out, tuple) else (out,)
    for i, o in enumerate(outs):
        if not isinstance(o, TensorBase):
            raise TypeError(f"{where}: expected a Tensor or a tuple of Tensors, given "
                            f"{type(o).__name__} at output {i}")
    return outs


def _module_needs_grad(fn: Any) -> bool:
    """Whether `fn`, or the object of a bound method `fn`, has a parameter needing grad."""
    params = getattr(fn, "parameters", None) or getattr(getattr(fn, "__self__", None),
                                                        "parameters", None)
    if not callable(params):
        return False
    return any(getattr(p, "requires_grad", False) for p in params())


def checkpoint(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, recomputed in backward instead of keeping its activations.

    `fn` returns a Tensor or a tuple of Tensors; tensors among `args` get gradients like any
    op's inputs; keyword arguments are passed through (not differentiated). Returns what `fn`
    returns."""
    if not callable(fn):
        raise TypeError(f"checkpoint: argument 'fn': expected a callable, given "
                        f"{type(fn).__name__}")
    needs = tuple(isinstance(a, TensorBase) and a.requires_grad for a in args)
    record = grad_mode.is_grad_enabled() and (any(needs) or _module_needs_grad(fn))
    if not record:
        return fn(*args, **kwargs)
    rng_state = random.default_generator.get_state()
    with grad_mode.no_grad():
        out = fn(*args, **kwargs)
    outs = _as_outputs(out, "checkpoint: fn")
    ctx = Context()
    ctx.fn, ctx.args, ctx.kwargs, ctx.rng_state = fn, args, kwargs, rng_state
    ctx.needs_input_grad = needs
    # The input arrays are what backward reads: the in-place check guards them.
    ctx.save_for_backward(*(a.data for a in args if isinstance(a, TensorBase)))
    parents = tuple((a if a._node is None else (a._node, a._out_index)) if n else None
                    for a, n in zip(args, needs, strict=True))
    tape = current_tape()
    node = Node(Recompute, ctx, parents, tuple((o.data.shape, o.dtype) for o in outs), tape)
    tape._record(node)
    results = []
    for k, o in enumerate(outs):
        t = tensor_base.TENSOR_CLASS(o.data)
        if o.dtype in FLOAT_DTYPES:
            t.requires_grad = True
            t._node = node
            t._out_index = k
        results.append(t)
    return tuple(results) if isinstance(out, tuple) else results[0]
