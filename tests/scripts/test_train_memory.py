"""train.py --zero 1 and --recompute: the same losses, bit for bit, as the plain run at dp=2
with dropout on; a ZeRO checkpoint resumes without ZeRO (and the reverse) on the same curve;
the memory per rank each run reports (its first line, metrics.jsonl) shows what each saves;
the options that cannot combine are one line each."""

from __future__ import annotations

import json

from dist.memory import format_bytes
from tests.scripts.test_train import TINY, _errors, run, run_many

STEPS = ["--steps", "4", "--eval-interval", "2", "--dropout", "0.1", "--dp", "2", "--tp", "1",
         "--pp", "1"]


def _history(out) -> list[tuple]:
    hist = json.loads((out / "metrics.json").read_text())["history"]
    return [(h["step"], h["train_loss"], h["val_loss"]) for h in hist]


def _memory(out) -> dict[str, int]:
    """The memory fields of the first metrics.jsonl record, those of every later one."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    mem = [{k: v for k, v in r.items() if k.startswith("memory_") and k != "memory_mib"}
           for r in records]
    assert all(m == mem[0] for m in mem), mem
    return mem[0]


def _check_memory(tmp_path, results) -> None:
    """Per rank (the largest over the ranks): the f32 parameters and gradients, AdamW's two
    moments, halved by ZeRO at dp=2; fewer activations kept with --recompute; the line
    printed at start says the same."""
    mem = {name: _memory(tmp_path / name) for name in ("plain", "zero", "block", "attn")}
    n = json.loads((tmp_path / "plain" / "metrics.json").read_text())["params"]
    plain = mem["plain"]
    assert plain["memory_params_bytes"] == plain["memory_grads_bytes"] == 4 * n
    assert plain["memory_optimizer_bytes"] == 8 * n
    assert plain["memory_pool_used_bytes"] is None  # the host: no CuPy pool
    for name in ("zero", "attn"):
        assert 4 * n <= mem[name]["memory_optimizer_bytes"] <= 4 * n + 16, name
    assert mem["block"]["memory_optimizer_bytes"] == 8 * n
    assert mem["block"]["memory_activations_bytes"] < mem["attn"]["memory_activations_bytes"] \
        < plain["memory_activations_bytes"]
    line = next(x for x in results[0].stdout.splitlines() if x.startswith("memory/rank: "))
    text = format_bytes
    assert line == (f"memory/rank: params {text(4 * n)}, grads {text(4 * n)}, optimizer "
                    f"{text(8 * n)}, activations (peak) "
                    f"{text(plain['memory_activations_bytes'])}"), line


def test_zero_and_recompute_train_the_same_bits_and_resume_across(tmp_path):
    jobs = [(2, [*TINY, *STEPS, "--out", str(tmp_path / name), *extra]) for name, extra in
            [("plain", []), ("zero", ["--zero", "1"]), ("block", ["--recompute", "block"]),
             ("attn", ["--recompute", "attention", "--zero", "1"]),
             ("half", ["--zero", "1", "--stop-after", "2"])]]
    results = run_many(jobs, timeout=240)
    for (_, args), res in zip(jobs, results, strict=True):
        assert res.returncode == 0, (args, res.stderr[-3000:])
    _check_memory(tmp_path, results)
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
