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


def test_per_call_is_the_mean_of_the_timer_it_is_given():
    ticks = iter([2.0, 2.6])
    calls = []
    mean = per_op.per_call(lambda: calls.append(1), 3, lambda: next(ticks))
    assert len(calls) == 3
    assert mean == pytest.approx(0.2)


def test_unknown_timer_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        per_op.main(["--timer", "sundial"])
    assert exc.value.code == 2
    assert "--timer" in capsys.readouterr().err
