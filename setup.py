"""setuptools' package list: gpuplan, autograd, dist (the trainer included: dist.trainer)."""

from setuptools import find_packages, setup

# Metadata, dependencies and entry points are in pyproject.toml. scripts/ is not a package:
# its entry scripts run dist.trainer, its benchmarks and checks run from a checkout.
# gpuplan/ops/include holds the CUDA headers the op families share: a data folder, listed so
# that its package data (*.cuh) is installed.
setup(packages=[*find_packages(include=["gpuplan*", "autograd*", "dist*"]), "gpuplan.ops.include"])
