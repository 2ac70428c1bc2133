"""docs/adding_an_op.md stays true: its code blocks, written into a temporary folder, make a
family that is discovered, compiles with NVRTC, runs its cases on the emulated device, and
matches its reference on the host."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import gpuplan.ops
from gpuplan import nvrtc
from gpuplan.dtypes import FLOAT_DTYPES
from gpuplan.testing import assert_close, random, run_plan
from tests.helpers import compile_with_enums

DOC = Path(__file__).resolve().parents[3] / "docs" / "adding_an_op.md"
_BLOCK = re.compile(r"<!-- file: (\S+) -->\n```\w+\n(.*?)```", re.S)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The doc's `scale` family written under tmp_path and put on gpuplan.ops' search path;
    everything it registered is removed afterwards."""
    blocks = _BLOCK.findall(DOC.read_text())
    assert {name for name, _ in blocks} == {"scale/scale.cu", "scale/plans.py",
                                           "scale/__init__.py", "scale/reference.py",
                                           "scale/cases.py"}
    for name, text in blocks:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(gpuplan.ops, "__path__", [*gpuplan.ops.__path__, str(tmp_path)])
    importlib.invalidate_caches()
    registered = len(nvrtc._REGISTRY)
    yield tmp_path
    del nvrtc._REGISTRY[registered:]
    for name in [m for m in sys.modules if m == "gpuplan.ops.scale"
                 or m.startswith("gpuplan.ops.scale.")]:
        del sys.modules[name]


def test_the_toy_family_is_discovered_from_its_folder(toy):
    assert "scale" not in gpuplan.ops.FAMILIES
    assert "scale" in gpuplan.ops.families()
    assert gpuplan.ops.folder("scale") == toy / "scale"
    family = importlib.import_module("gpuplan.ops.scale")
    assert family.__all__ == ["ScaleDescriptor", "ScaleArgs", "ScalePlan"]
    assert family.__functional__ == ["scale"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_the_toy_family_matches_its_reference_on_the_host(toy, dtype):
    plans = importlib.import_module("gpuplan.ops.scale.plans")
    reference = importlib.import_module("gpuplan.ops.scale.reference")
    x = random((37,), dtype, seed=3)
    y = np.zeros(37, dtype)
    run_plan(plans.ScalePlan, plans.ScaleDescriptor(37, 0.5, dtype),
             plans.ScaleArgs(x=x, y=y), "cpu")
    assert_close(y, reference.scale_reference(x, 0.5), dtype)
    assert_close(plans.scale(x.reshape(37, 1), 2.0), reference.scale_reference(x, 2.0)
                 .reshape(37, 1), dtype)


def test_the_toy_family_compiles_with_nvrtc(toy):
    plans = importlib.import_module("gpuplan.ops.scale.plans")
    compile_with_enums(str(toy / "scale" / "scale.cu"), list(plans._MODULE.name_expressions),
                       {})


def test_the_toy_family_cases_launch_every_instance_on_the_emulated_device(toy):
    cases = importlib.import_module("gpuplan.ops.scale.cases").CASES
    plans = importlib.import_module("gpuplan.ops.scale.plans")
    for case in cases:
        case.run()
    declared = {("scale.cu", n) for n in plans._MODULE.name_expressions}
    assert len(declared) == len(FLOAT_DTYPES)
    assert declared <= nvrtc.LAUNCHED
