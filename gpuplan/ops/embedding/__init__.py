"""The embedding op family: row lookup (`EmbeddingPlan`) and its scatter-add gradient (atomic
and deterministic SKUs)."""

from gpuplan.ops.embedding.plans import (
    EmbeddingArgs,
    EmbeddingBackwardArgs,
    EmbeddingBackwardDescriptor,
    EmbeddingBackwardPlan,
    EmbeddingDescriptor,
    EmbeddingPlan,
    embedding,
    embedding_backward,
)

__all__ = [
    "EmbeddingDescriptor",
    "EmbeddingArgs",
    "EmbeddingPlan",
    "EmbeddingBackwardDescriptor",
    "EmbeddingBackwardArgs",
    "EmbeddingBackwardPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "embedding",
    "embedding_backward",
]
