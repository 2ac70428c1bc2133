"""Models built from dist's parallel layers."""

from dist.models.gpt import GPTStage, ParallelGPT, VocabParallelHead, qkv_column_order
from dist.models.sharding import ShardSpec, consolidate, dense_shapes

__all__ = ["GPTStage", "ParallelGPT", "ShardSpec", "VocabParallelHead", "consolidate",
           "dense_shapes", "qkv_column_order"]
