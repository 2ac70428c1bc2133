"""Plan-test helpers: gpuplan.testing, plus pytest parameter lists of dtypes."""

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.dtypes import FLOAT_DTYPES
from gpuplan.testing import *  # noqa: F403
from gpuplan.testing import __all__ as _testing_all

DTYPES = [pytest.param(d, id=gp.dtypes.short_name(d)) for d in FLOAT_DTYPES]
INDEX_DTYPES = [pytest.param(np.dtype(np.int32), id="i32"), pytest.param(np.dtype(np.int64),
                                                                          id="i64")]

__all__ = ["DTYPES", "INDEX_DTYPES", *_testing_all]
