"""train.py --zero 1 saves each dp rank's slice of the optimizer state; the checkpoint of a
dp=2 run resumes as one process without ZeRO (resharded) on the uninterrupted curve; with
--no-overlap the gradients are reduce-scattered after backward, to the same bits."""

from __future__ import annotations

import json

import pytest

from dist.checkpoint_files import read_manifest, read_shard, resolve
from tests.scripts.test_train import TINY, run, run_many

STEPS = ["--steps", "4", "--eval-interval", "2", "--dropout", "0", "--tp", "1", "--pp", "1"]


def _history(out) -> list[dict]:
    return json.loads((out / "metrics.json").read_text())["history"]


def test_a_zero_checkpoint_of_dp2_resumes_as_one_process_without_zero(tmp_path):
    ref, part = run_many([(2, [*TINY, *STEPS, "--dp", "2", "--zero", "1", "--out",
                               str(tmp_path / "ref")]),
                          (2, [*TINY, *STEPS, "--dp", "2", "--zero", "1", "--stop-after", "2",
                               "--no-overlap", "--out", str(tmp_path / "part")])], timeout=240)
    assert ref.returncode == 0 and part.returncode == 0, (ref.stderr[-2000:],
                                                          part.stderr[-2000:])
    step_dir = resolve(tmp_path / "part" / "checkpoint")
    manifest = read_manifest(step_dir)
    for rank in (0, 1):  # each shard: its rank's slice, not the consolidated state
        _, header = read_shard(step_dir, manifest, rank)
        assert header["optimizer"]["zero"]["rank"] == rank
        assert header["optimizer"]["zero"]["size"] == 2
    res = run(1, *TINY, *STEPS, "--dp", "1", "--zero", "0", "--out", str(tmp_path / "part"),
              "--resume")
    assert res.returncode == 0 and "resumed at step 2" in res.stdout, res.stderr[-3000:]
    want, got = _history(tmp_path / "ref"), _history(tmp_path / "part")
    assert [h["step"] for h in got] == [h["step"] for h in want] == [1, 2, 4]
    # steps 1-2: the reduce-scatter overlapped with backward (ref) and after it (part,
    # --no-overlap) give the same bits at dp=2
    for a, b in zip(want[:2], got[:2], strict=True):
        assert (b["train_loss"], b["val_loss"]) == (a["train_loss"], a["val_loss"])
    for a, b in zip(want, got, strict=True):  # the moments came back: the same curve
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=2e-5)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=2e-5)
