"""Pipeline parallelism: schedules (pure functions), stages and the runner."""

from dist.pipeline.schedules import SCHEDULES, Action, get_schedule, gpipe, one_f_one_b

_LAZY = {"PipelineStage": "dist.pipeline.stage", "PipelineParallel": "dist.pipeline.runner"}


def __getattr__(name):
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dist.pipeline' has no attribute {name!r}")
