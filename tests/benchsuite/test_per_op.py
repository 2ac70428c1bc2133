"""scripts/bench_per_op.py: without torch in the interpreter, one line and exit 2; unknown
ops are a usage error. (The timing itself runs in a benchmark venv with torch.)"""

from __future__ import annotations

import sys

import pytest

from benchsuite import per_op


def test_without_torch_it_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(SystemExit) as exc:
        per_op.main(["--runs", "1"])
    assert exc.value.code == 2
    assert "torch is not installed in this interpreter" in capsys.readouterr().err


def test_unknown_ops_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        per_op.main(["--ops", "add,nope"])
    assert exc.value.code == 2
    assert "unknown ops ['nope']" in capsys.readouterr().err
