"""gpuplan: kernel plans (descriptor -> selected SKU -> validated launch) over NumPy or CuPy.

Importing gpuplan never touches CUDA: kernels compile lazily, per device, on first use.
"""

from gpuplan import functional, graphs
from gpuplan.backend import (
    array_namespace,
    asarray,
    device_available,
    device_of,
    empty,
    full,
    is_device_array,
    to_device,
    to_host,
    zeros,
)
from gpuplan.dtypes import FLOAT_DTYPES, INDEX_DTYPES, bfloat16
from gpuplan.errors import (
    BufferTooSmall,
    GpuPlanError,
    InvalidProblem,
    MisalignedOperand,
    Unsupported,
    WorkspaceTooSmall,
)
from gpuplan.execute import concurrently, execute
from gpuplan.ops.activation import (
    UnaryArgs,
    UnaryBackwardArgs,
    UnaryBackwardDescriptor,
    UnaryBackwardPlan,
    UnaryDescriptor,
    UnaryPlan,
)
from gpuplan.ops.attention import (
    AttentionArgs,
    AttentionBackwardArgs,
    AttentionBackwardDescriptor,
    AttentionBackwardPlan,
    AttentionDescriptor,
    AttentionPlan,
)
from gpuplan.ops.binary import (
    BiasAddArgs,
    BiasAddDescriptor,
    BiasAddPlan,
    BinaryArgs,
    BinaryBackwardArgs,
    BinaryBackwardDescriptor,
    BinaryBackwardPlan,
    BinaryDescriptor,
    BinaryPlan,
)
from gpuplan.ops.cast import (
    CastArgs,
    CastDescriptor,
    CastPlan,
)
from gpuplan.ops.clip_grad import (
    ClipGradNormArgs,
    ClipGradNormDescriptor,
    ClipGradNormPlan,
)
from gpuplan.ops.cross_entropy import (
    CrossEntropyArgs,
    CrossEntropyBackwardArgs,
    CrossEntropyBackwardDescriptor,
    CrossEntropyBackwardPlan,
    CrossEntropyDescriptor,
    CrossEntropyFinishArgs,
    CrossEntropyFinishPlan,
    CrossEntropyPartialArgs,
    CrossEntropyPartialBackwardArgs,
    CrossEntropyPartialBackwardPlan,
    CrossEntropyPartialDescriptor,
    CrossEntropyPartialMaxArgs,
    CrossEntropyPartialMaxPlan,
    CrossEntropyPartialPlan,
    CrossEntropyPlan,
)
from gpuplan.ops.dropout import (
    DropoutArgs,
    DropoutBackwardArgs,
    DropoutBackwardDescriptor,
    DropoutBackwardPlan,
    DropoutDescriptor,
    DropoutMaskArgs,
    DropoutMaskDescriptor,
    DropoutMaskPlan,
    DropoutPlan,
)
from gpuplan.ops.embedding import (
    EmbeddingArgs,
    EmbeddingBackwardArgs,
    EmbeddingBackwardDescriptor,
    EmbeddingBackwardPlan,
    EmbeddingDescriptor,
    EmbeddingPlan,
)
from gpuplan.ops.gather import (
    GatherArgs,
    GatherDescriptor,
    GatherPlan,
    ScatterAddArgs,
    ScatterAddDescriptor,
    ScatterAddPlan,
)
from gpuplan.ops.gemm import (
    GemmArgs,
    GemmDescriptor,
    GemmPlan,
)
from gpuplan.ops.normalization import (
    LayerNormArgs,
    LayerNormBackwardArgs,
    LayerNormBackwardDescriptor,
    LayerNormBackwardPlan,
    LayerNormDescriptor,
    LayerNormPlan,
    RMSNormArgs,
    RMSNormBackwardArgs,
    RMSNormBackwardDescriptor,
    RMSNormBackwardPlan,
    RMSNormDescriptor,
    RMSNormPlan,
)
from gpuplan.ops.optimizer import (
    AdamWArgs,
    AdamWDescriptor,
    AdamWMultiTensorArgs,
    AdamWMultiTensorDescriptor,
    AdamWMultiTensorPlan,
    AdamWPlan,
    SGDArgs,
    SGDDescriptor,
    SGDPlan,
)
from gpuplan.ops.quantize import (
    DequantizePerTokenArgs,
    DequantizePerTokenBackwardArgs,
    DequantizePerTokenBackwardDescriptor,
    DequantizePerTokenBackwardPlan,
    DequantizePerTokenDescriptor,
    DequantizePerTokenPlan,
    QuantizePerTokenArgs,
    QuantizePerTokenBackwardArgs,
    QuantizePerTokenBackwardDescriptor,
    QuantizePerTokenBackwardPlan,
    QuantizePerTokenDescriptor,
    QuantizePerTokenPlan,
)
from gpuplan.ops.reduce_dim import (
    ArgSelectArgs,
    ArgSelectDescriptor,
    ArgSelectPlan,
    TopkArgs,
    TopkDescriptor,
    TopkPlan,
)
from gpuplan.ops.reduction import (
    GlobalNormArgs,
    GlobalNormDescriptor,
    GlobalNormPlan,
    ProdBackwardArgs,
    ProdBackwardDescriptor,
    ProdBackwardPlan,
    ReduceArgs,
    ReduceDescriptor,
    ReducePlan,
    VarianceArgs,
    VarianceDescriptor,
    VariancePlan,
)
from gpuplan.ops.residual_norm import (
    ResidualLayerNormArgs,
    ResidualLayerNormBackwardArgs,
    ResidualLayerNormBackwardDescriptor,
    ResidualLayerNormBackwardPlan,
    ResidualLayerNormDescriptor,
    ResidualLayerNormPlan,
)
from gpuplan.ops.rope import (
    RopeArgs,
    RopeBackwardArgs,
    RopeBackwardDescriptor,
    RopeBackwardPlan,
    RopeDescriptor,
    RopePlan,
)
from gpuplan.ops.select import (
    TriangleArgs,
    TriangleDescriptor,
    TrianglePlan,
    WhereArgs,
    WhereDescriptor,
    WherePlan,
)
from gpuplan.ops.softmax import (
    LogSoftmaxBackwardPlan,
    LogSoftmaxPlan,
    SoftmaxArgs,
    SoftmaxBackwardArgs,
    SoftmaxBackwardDescriptor,
    SoftmaxBackwardPlan,
    SoftmaxDescriptor,
    SoftmaxPlan,
)
from gpuplan.ops.swiglu import (
    SwigluArgs,
    SwigluBackwardArgs,
    SwigluBackwardDescriptor,
    SwigluBackwardPlan,
    SwigluDescriptor,
    SwigluPlan,
)
from gpuplan.plan import (
    BackendKind,
    KernelSku,
    Plan,
    PlanPreference,
    PrecisionGuarantee,
)
from gpuplan.stream import Stream, Workspace

__version__ = "0.1.0"
