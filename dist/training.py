"""Training-loop functions over a model-parallel model: global gradient norm and clipping,
evaluation and consolidation of the dense state dict.

They take a `dist.ParallelGPT` or any model shaped like it: parameters carrying a
``shard_spec`` (`dist.models.sharding.ShardSpec`), the communicators ``tp_comm``,
``pp_comm`` and ``dp_comm`` (None for size 1), ``num_stages``, ``config``, a ``forward``
that returns the output on the last stage's ranks (None elsewhere) and ``loss_fn``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import autograd as ag
import gpuplan as gp
from autograd import optim
from dist.communicator import Communicator
from dist.data_parallel import average_over
from dist.models.sharding import consolidate


def grad_norm(model: Any) -> float:
    """The dense model's global L2 gradient norm, the same on every rank.

    ``norm^2`` is the sum over the tensor- and pipeline-parallel groups of each rank's
    squared gradient norm, counting TP-sharded parameters on every TP rank, replicated ones
    on TP rank 0 only and a duplicate (the last stage's tied embedding copy) never; the
    data-parallel replicas hold the same averaged gradients. A non-finite gradient
    anywhere makes it inf or nan on every rank.

    Overflow-safe: squaring a rank's norm (1e20 f32 gradients give ~1e22) and summing the
    squares could overflow, so each group gathers its ranks' norms and takes the scaled
    L2 norm of that vector (gp.functional.global_l2_norm), identically on every rank.
    """
    tp_rank = 0 if model.tp_comm is None else model.tp_comm.rank
    counted = [p.grad for p in model.parameters() if p.grad is not None
               and not p.shard_spec.duplicate and (p.shard_spec.tensor_parallel
                                                   or tp_rank == 0)]
    return model_parallel_norm(model, optim.get_total_norm(counted))


def model_parallel_norm(model: Any, local: float) -> float:
    """The global norm from this rank's norm `local` of the gradients it counts: the scaled
    L2 norm of the tensor-parallel group's norms, then of the pipeline group's (`grad_norm`);
    `local` itself for a model without those groups (or None). The same on every rank."""
    norm = np.array([local], np.float64)
    for comm in (getattr(model, "tp_comm", None), getattr(model, "pp_comm", None)):
        if comm is not None and comm.size > 1:
            norm = gp.functional.global_l2_norm([comm.all_gather(norm)]).reshape(1)
    return float(norm[0])


def clip_grad_norm_(model: Any, max_norm: float, eps: float = 1e-6) -> float:
    """Clip by the dense model's global L2 gradient norm (`grad_norm`); returns it (before
    clipping). Every gradient is scaled as `optim.clip_grad_norm_` scales it
    (`optim.clip_grads_with_norm_`)."""
    norm = grad_norm(model)
    optim.clip_grads_with_norm_(model.parameters(), max_norm, norm, eps)
    return norm


def evaluate(model: Any, idx: Any, targets: Any) -> float:
    """The mean loss over the global batch without gradients and with dropout off; every
    rank passes its data-parallel rows ``idx, targets [B, T]`` and gets the same float."""
    was_training = model.training
    model.eval()
    try:
        with ag.no_grad():
            out = model(idx)
            loss = None if out is None else float(model.loss_fn(out, targets).item())
    finally:
        model.train(was_training)
    if model.pp_comm is not None:
        loss = model.pp_comm.bcast_object(loss, root=model.num_stages - 1)
    return average_over(model.dp_comm, loss)


def gather_dense_state_dict(model: Any,
                            world: Communicator | None) -> dict[str, np.ndarray] | None:
    """The dense model's state dict (e.g. `nn.GPT`'s) assembled on rank 0 of `world` from
    every rank's shards (host arrays; None on the other ranks). Every rank of `world` must
    call it; data-parallel replicas other than dp rank 0 send nothing."""
    dp_rank = 0 if model.dp_comm is None else model.dp_comm.rank
    mine = ([] if dp_rank else
            [(gp.to_host(p.data), p.shard_spec.to_json()) for p in model.parameters()])
    parts = [mine] if world is None or world.size == 1 else world.gather_object(mine, root=0)
    if parts is None:
        return None
    return consolidate(model.config, [x for part in parts for x in part])


__all__ = ["clip_grad_norm_", "evaluate", "gather_dense_state_dict", "grad_norm",
           "model_parallel_norm"]
