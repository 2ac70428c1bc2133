"""train.py --zero 1 and --recompute: the same losses, bit for bit, as the plain run at dp=2
with dropout on; a ZeRO checkpoint resumes without ZeRO (and the reverse) on the same curve;
the options that cannot combine are one line each."""

from __future__ import annotations

import json

from tests.scripts.test_train import TINY, _errors, run, run_many

STEPS = ["--steps", "4", "--eval-interval", "2", "--dropout", "0.1", "--dp", "2", "--tp", "1",
         "--pp", "1"]


def _history(out) -> list[tuple]:
    hist = json.loads((out / "metrics.json").read_text())["history"]
    return [(h["step"], h["train_loss"], h["val_loss"]) for h in hist]


def test_zero_and_recompute_train_the_same_bits_and_resume_across(tmp_path):
    jobs = [(2, [*TINY, *STEPS, "--out", str(tmp_path / name), *extra]) for name, extra in
            [("plain", []), ("zero", ["--zero", "1"]), ("block", ["--recompute", "block"]),
             ("attn", ["--recompute", "attention", "--zero", "1"]),
             ("half", ["--zero", "1", "--stop-after", "2"])]]
    results = run_many(jobs, timeout=240)
    for (_, args), res in zip(jobs, results, strict=True):
        assert res.returncode == 0, (args, res.stderr[-3000:])
    plain = _history(tmp_path / "plain")
    assert len(plain) == 3 and plain[0][1] != plain[-1][1]
    for name in ("zero", "block", "attn"):
        assert _history(tmp_path / name) == plain, name
    # The ZeRO checkpoint (the replicated optimizer's state) resumes without ZeRO.
    rest = run(2, *TINY, *STEPS, "--out", str(tmp_path / "half"), "--resume")
    assert rest.returncode == 0 and "resumed at step 2" in rest.stdout, rest.stderr[-3000:]
    assert _history(tmp_path / "half") == plain


def test_options_that_cannot_combine_are_one_line(tmp_path):
    res = run(1, *TINY, "--steps", "1", "--zero", "1", "--cuda-graph", "--out",
              str(tmp_path / "a"))
    assert res.returncode == 2 and _errors(res) == [
        "train.py: error: --zero 1 and --cuda-graph: the captured step runs the replicated "
        "optimizer; use one or the other"], res.stderr


def test_activations_that_cannot_fit_are_refused_up_front(tmp_path):
    """A lower bound of the bytes kept for backward, with the weights, over this rank's
    memory: refused before anything runs, naming the options (before: accepted, then minutes
    of silence or an out-of-memory kill)."""
    res = run(1, "--block-size", "1000000", "--batch-size", "64", "--steps", "1",
              "--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--out", str(tmp_path / "o"))
    assert res.returncode == 2, res.stderr[-2000:]
    (line,) = _errors(res)
    assert line.startswith("train.py: error: the activations do not fit: --batch-size 64 x "
                           "--block-size 1000000 over --dp 1 and --micro-batches 1 keep at "
                           "least ")
    assert "(fewer or shorter sequences, more --micro-batches, or --recompute block)" in line
    assert not (tmp_path / "o").exists()
