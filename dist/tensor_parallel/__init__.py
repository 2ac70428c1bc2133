"""Tensor parallelism: TP mappings, parallel linear layers, vocab parallelism, dropout RNG."""

from dist.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelConfig,
)
from dist.tensor_parallel.mappings import (
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)
from dist.tensor_parallel.random import (
    TENSOR_PARALLEL_RNG,
    RNGStatesTracker,
    get_rng_tracker,
    model_parallel_seed,
)
from dist.tensor_parallel.vocab import (
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
    vocab_range,
)

__all__ = [
    "TENSOR_PARALLEL_RNG", "ColumnParallelLinear", "RNGStatesTracker", "RowParallelLinear",
    "TensorParallelConfig", "VocabParallelEmbedding",
    "copy_to_tensor_parallel_region", "gather_from_sequence_parallel_region",
    "gather_from_tensor_parallel_region", "get_rng_tracker", "model_parallel_seed",
    "reduce_from_tensor_parallel_region",
    "reduce_scatter_to_sequence_parallel_region", "scatter_to_tensor_parallel_region",
    "vocab_parallel_cross_entropy", "vocab_range",
]
