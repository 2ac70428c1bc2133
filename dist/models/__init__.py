"""Models built from dist's parallel layers."""

from dist.models.gpt import (
    GPTEmbedding,
    GPTHead,
    GPTStage,
    ParallelBlock,
    ParallelGPT,
    ParallelMLP,
    ParallelSelfAttention,
    ShardSpec,
    consolidate,
)

__all__ = ["GPTEmbedding", "GPTHead", "GPTStage", "ParallelBlock", "ParallelGPT", "ParallelMLP",
           "ParallelSelfAttention", "ShardSpec", "consolidate"]
