"""scripts/train.py --model llama end to end: under mpiexec -n 2 (tensor-parallel with a K/V
head replicated on both ranks, and pipeline-parallel with --recompute block) its losses equal
the one-process run's,
its checkpoint resumes in another layout, and a mismatched model option is one line (the
option checks themselves: tests/dist/trainer/test_options_llama.py)."""

from __future__ import annotations

import json

import pytest

from tests.scripts.test_train import TINY, _errors, run_many

LLAMA = [*TINY, "--model", "llama", "--ffn-hidden", "40", "--rope-theta", "5000"]


def _history(out) -> list[dict]:
    return json.loads((out / "metrics.json").read_text())["history"]


def test_llama_runs_under_mpiexec_match_one_process_and_resume_in_another_layout(tmp_path):
    steps = ["--steps", "2", "--eval-interval", "1", "--sample-tokens", "4"]
    mqa, gqa = ["--n-kv-head", "1"], ["--n-kv-head", "2"]  # --n-head 2 (TINY)
    jobs = [(1, [*LLAMA, *mqa, *steps, "--out", str(tmp_path / "one-mqa")]),
            (2, [*LLAMA, *mqa, *steps, "--tp", "2", "--out", str(tmp_path / "tp2")]),
            (1, [*LLAMA, *gqa, *steps, "--out", str(tmp_path / "one-gqa")]),
            (2, [*LLAMA, *gqa, *steps, "--pp", "2", "--recompute", "block", "--out",
                 str(tmp_path / "pp2")])]
    results = run_many(jobs, timeout=240)
    for (_, args), res in zip(jobs, results, strict=True):
        assert res.returncode == 0, (args, res.stderr[-3000:])
    assert results[1].stdout.startswith("llama: ") and "2 heads (1 K/V)" in results[1].stdout
    assert "mesh: dp=1 pp=1 tp=2" in results[1].stdout
    assert "mesh: dp=1 pp=2 tp=1" in results[3].stdout
    for one, many in (("one-mqa", "tp2"), ("one-gqa", "pp2")):
        h_one, h_many = _history(tmp_path / one), _history(tmp_path / many)
        assert [h["step"] for h in h_many] == [1, 2]
        for a, b in zip(h_one, h_many, strict=True):  # same global batches, no dropout
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5), (one, many)
            assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5), (one, many)
    # the grouped-query run is another model than the multi-query one
    assert _history(tmp_path / "pp2")[-1]["train_loss"] != \
        _history(tmp_path / "tp2")[-1]["train_loss"]

    # The tp2 checkpoint (K/V copies on both ranks) continues as pp2 (resharded); a
    # mismatched model option is one line.
    more = [*LLAMA, *mqa, "--steps", "3", "--eval-interval", "1", "--sample-tokens", "4",
            "--out", str(tmp_path / "tp2"), "--resume"]
    (resumed,) = run_many([(2, [*more, "--pp", "2"])], timeout=240)
    assert resumed.returncode == 0 and "resumed at step 2" in resumed.stdout, \
        resumed.stderr[-3000:]
    assert [h["step"] for h in _history(tmp_path / "tp2")] == [1, 2, 3]
    (other,) = run_many([(2, [*LLAMA, "--n-kv-head", "2", "--steps", "4", "--out",
                              str(tmp_path / "tp2"), "--resume"])])
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr[-3000:]
    assert len(_errors(other)) == 1 and "the saved model has n_kv_head 1" in \
        _errors(other)[0] and "this model has n_kv_head 2" in _errors(other)[0]

