"""dist: multi-process parallelism over mpi4py (communicators, mesh, TP, DP, CP, pipelines).

`import dist` touches neither MPI nor CUDA; the autograd-based layers load on first use.
"""

import importlib as _importlib

from dist.communicator import BACKENDS, Communicator, PendingSend
from dist.cuda_aware import cuda_aware_mpi
from dist.mesh import MeshCoordinates, ProcessMesh, mesh_coordinates, mesh_rank
from dist.pipeline.schedules import Action, gpipe, one_f_one_b
from dist.runtime import init, is_initialized, local_rank, world

# Names whose modules import autograd: loaded lazily so `import dist` stays light.
_LAZY = {
    "TensorParallelConfig": "dist.tensor_parallel",
    "ColumnParallelLinear": "dist.tensor_parallel",
    "RowParallelLinear": "dist.tensor_parallel",
    "VocabParallelEmbedding": "dist.tensor_parallel",
    "vocab_parallel_cross_entropy": "dist.tensor_parallel",
    "copy_to_tensor_parallel_region": "dist.tensor_parallel",
    "reduce_from_tensor_parallel_region": "dist.tensor_parallel",
    "scatter_to_tensor_parallel_region": "dist.tensor_parallel",
    "gather_from_tensor_parallel_region": "dist.tensor_parallel",
    "reduce_scatter_to_sequence_parallel_region": "dist.tensor_parallel",
    "gather_from_sequence_parallel_region": "dist.tensor_parallel",
    "RNGStatesTracker": "dist.tensor_parallel",
    "TENSOR_PARALLEL_RNG": "dist.tensor_parallel",
    "get_rng_tracker": "dist.tensor_parallel",
    "model_parallel_seed": "dist.tensor_parallel",
    "PipelineStage": "dist.pipeline.stage",
    "PipelineParallel": "dist.pipeline.runner",
    "DataParallel": "dist.data_parallel",
    "allreduce_gradients": "dist.data_parallel",
    "save_checkpoint": "dist.checkpoint",
    "load_checkpoint": "dist.checkpoint",
    "verify_checkpoint": "dist.checkpoint",
    "CheckpointError": "dist.checkpoint",
    "ParallelGPT": "dist.models",
    "ParallelLlama": "dist.models",
    "clip_grad_norm_": "dist.training",
    "grad_norm": "dist.training",
    "evaluate": "dist.training",
    "gather_dense_state_dict": "dist.training",
    "ZeroRedundancyOptimizer": "dist.zero",
    "ring_attention": "dist.context_parallel",
}

__all__ = [
    "BACKENDS", "Action", "Communicator", "MeshCoordinates", "PendingSend", "ProcessMesh",
    "cuda_aware_mpi", "gpipe", "init", "is_initialized", "local_rank", "mesh_coordinates",
    "mesh_rank", "one_f_one_b", "world", *_LAZY,
]


def __getattr__(name):
    if name in _LAZY:
        return getattr(_importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dist' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
