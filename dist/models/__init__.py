"""Models built from dist's parallel layers."""

from dist.models.gpt import GPTStage, ParallelGPT, VocabParallelHead, qkv_column_order
from dist.models.llama import ParallelLlama, kv_column_order
from dist.models.parallel import ModelStage, ParallelModel
from dist.models.sharding import ShardSpec, consolidate, dense_shapes

__all__ = ["GPTStage", "ModelStage", "ParallelGPT", "ParallelLlama", "ParallelModel",
           "ShardSpec", "VocabParallelHead", "consolidate", "dense_shapes",
           "kv_column_order", "qkv_column_order"]
