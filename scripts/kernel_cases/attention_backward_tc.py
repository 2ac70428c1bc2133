"""Fused attention backward on tensor cores (attention_backward_tc.cu: f16/bf16, head_dim 64
and 128, cp.async and scalar-copy tile loads, with and without dropout) on the emulated
device, against the float64 chain rule; the delta kernel it runs first is
attention_backward.cu's."""

from __future__ import annotations

from gpuplan.dtypes import HALF_DTYPES
from kernel_cases.attention import TC, TC_DROP, _name, drop_name
from kernel_cases.attention_backward import backward, drop_case
from kernel_cases.common import Case

CASES = ([Case(_name("attention_backward", t, *shape), lambda t=t, s=shape: backward(t, *s))
          for t in HALF_DTYPES for shape in TC]
         + [Case(drop_name("attention_backward", t, *shape),
                 lambda t=t, s=shape: drop_case(t, *s)) for t in HALF_DTYPES for shape in TC_DROP])
