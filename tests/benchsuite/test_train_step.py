"""scripts/bench_train.py: every side it times runs and records what the docstring says, on
the host and on the emulated device (the code path a GPU run takes); the captured step
trains exactly as the eager one; the PyTorch sides (where torch is installed) start from
our weights; a failing torch.compile is reported without losing the other sides; bad
options are one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchsuite import train_step as bench_train

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--steps", "2", "--warmup", "1"]


def _run(tmp_path, *args: str) -> dict:
    out = tmp_path / "bench.json"
    assert bench_train.main([*TINY, *args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _check_side(r: dict, steps: int = 2, warmup: int = 1, timed_warmup: int = 1) -> None:
    assert len(r["times_ms"]) == steps and len(r["losses"]) == warmup + steps
    assert len(r["warmup_ms"]) == timed_warmup  # a capture's warm-up is in its capture_s
    assert r["step_ms_min"] <= r["step_ms"] <= r["step_ms_max"]
    assert r["tokens_per_s"] == pytest.approx(4 * 32 / (r["step_ms"] / 1e3))
    assert r["first_loss"] == r["losses"][0] and r["last_loss"] == r["losses"][-1]
    assert r["losses"][-1] < r["losses"][0]  # it trains


def test_host_run_of_ours_alone(tmp_path, capsys):
    data = _run(tmp_path, "--device", "cpu", "--no-torch")
    _check_side(data["ours"])
    assert data["info"]["device"].startswith("cpu: ") and data["info"]["tokens_per_step"] == 128
    assert data["ours"]["mfu"] is None  # no MFU on the host
    assert set(data) == {"info", "ours"}
    assert "ours " in capsys.readouterr().out


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_captured_step_trains_exactly_as_the_eager_one_on_the_emulated_device(tmp_path,
                                                                             dtype):
    data = _run(tmp_path, "--device", "emulated", "--cuda-graph", "--dtype", dtype)
    eager, graph = data["ours"], data["ours_graph"]
    _check_side(eager)
    _check_side(graph, timed_warmup=0)
    assert graph["label"] == "ours graph" and graph["capture_s"] > 0
    assert graph["losses"] == eager["losses"]  # warm-up step eager, then two replays
    assert graph["first_loss_agree"] and graph["max_loss_diff_all_steps"] == 0.0
    assert data["info"]["device"].startswith("emulated: ")
    assert "torch" not in data  # no comparison with the emulator's timings


def test_torch_sides_start_from_our_weights(tmp_path):
    pytest.importorskip("torch")
    data = _run(tmp_path, "--device", "cpu")
    _check_side(data["ours"])
    _check_side(data["torch"])
    assert data["info"]["interleaved"] and data["first_loss_agree"]
    assert data["torch"]["first_loss"] == pytest.approx(data["ours"]["first_loss"], rel=1e-5)
    assert data["ratio_ours_over_torch"] == pytest.approx(
        data["ours"]["tokens_per_s"] / data["torch"]["tokens_per_s"])
    assert set(data["paired_ratio_median"]) == {"torch/ours"}


def test_a_failing_torch_compile_is_reported_and_the_other_sides_run(tmp_path, monkeypatch,
                                                                     capsys):
    torch = pytest.importorskip("torch")

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here\nsecond line")

    monkeypatch.setattr(torch, "compile", broken)
    data = _run(tmp_path, "--device", "cpu", "--torch-compile", "--no-interleave")
    assert data["torch_compile_error"] == "RuntimeError: no compiler here"
    assert "torch_compile" not in data and "ours" in data and "torch" in data
    assert set(data["ratios"]) == {"ours/torch"}
    assert "torch.compile failed, no torch compile row" in capsys.readouterr().out


@pytest.mark.slow
def test_torch_compile_side(tmp_path):
    pytest.importorskip("torch")
    data = _run(tmp_path, "--device", "cpu", "--torch-compile")
    _check_side(data["torch_compile"])
    assert data["torch_compile"]["compile_s"] > 0
    assert data["torch_compile"]["first_loss_agree"]
    assert set(data["ratios"]) == {"ours/torch", "ours/torch_compile"}


@pytest.mark.parametrize("args, message", [
    (["--device", "cpu", "--cuda-graph"], "--cuda-graph: needs a device"),
    (["--device", "emulated", "--cuda-graph", "--warmup", "0"], "--warmup must be >= 1"),
    (["--device", "cpu", "--torch-compile", "--warmup", "0"], "--warmup must be >= 1"),
    (["--device", "emulated", "--interleave"], "--interleave is for cpu runs"),
    (["--device", "cpu", "--seq", "33"], "--seq must lie in [1, 32]"),
    (["--device", "cpu", "--steps", "0"], "--steps must be >= 1"),
])
def test_bad_options_are_one_error_line(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_train.parse_args(["--model", "tiny", *args])
    assert exc.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1 and message in err[0], err
