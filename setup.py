"""setuptools' package list: gpuplan, autograd, dist, and scripts/ as gpuplan_scripts."""

from setuptools import find_packages, setup

# Metadata, dependencies and entry points are in pyproject.toml. scripts/ is a folder of
# scripts, not named as a package would be: it is installed under the name gpuplan_scripts
# (its modules import each other by bare name, from their own folder, as they do when run
# as `python scripts/train.py`).
# gpuplan/ops/include holds the CUDA headers the op families share: a data folder, listed so
# that its package data (*.cuh) is installed.
setup(packages=[*find_packages(include=["gpuplan*", "autograd*", "dist*"]), "gpuplan.ops.include",
                "gpuplan_scripts"],
      package_dir={"gpuplan_scripts": "scripts"})
