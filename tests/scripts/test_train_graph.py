"""train.py --cuda-graph: the captured run's losses, norms, learning rates and weights are
the eager run's bit for bit on the emulated device; what cannot be captured is one error
line (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.scripts.test_train import ENV, ROOT, SCRIPT, TINY, _errors, run_here, run_many

STEPS = ["--steps", "4", "--eval-interval", "2", "--micro-batches", "1", "--clip", "0.5"]
# (the end-of-run text sample is eager in both runs and compared by neither: none drawn; each
# token is a forward pass on the emulated device)
NO_SAMPLE = ["--sample-tokens", "0"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300, env=ENV, cwd=ROOT)


def test_cuda_graph_run_matches_the_eager_run_on_the_emulated_device(tmp_path):
    # One after the other: the captured run finds every kernel the eager run compiled for
    # the emulated device in its disk cache (at once, both would compile each missing one).
    eager = _run(*TINY, *STEPS, *NO_SAMPLE, "--device", "emulated",
                 "--out", str(tmp_path / "eager"))
    graphed = _run(*TINY, *STEPS, *NO_SAMPLE, "--device", "emulated", "--cuda-graph",
                   "--out", str(tmp_path / "graph"))
    assert eager.returncode == 0, eager.stderr
    assert graphed.returncode == 0, graphed.stderr
    assert "cuda graph: training step captured" in graphed.stdout
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text())["history"]
            for d in ("eager", "graph"))
    keys = ("step", "train_loss", "val_loss", "lr", "grad_norm")
    assert [[h[k] for k in keys] for h in b] == [[h[k] for k in keys] for h in a]
    assert len({h["lr"] for h in b}) == 3  # the schedule moved across the replays
    from safetensors.numpy import load_file

    for shard in sorted((tmp_path / "eager" / "checkpoint").glob("step_000004/*.safetensors")):
        other = tmp_path / "graph" / "checkpoint" / "step_000004" / shard.name
        x, y = load_file(str(shard)), load_file(str(other))
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_what_cannot_be_captured_is_one_error_line(tmp_path):
    cases = [(1, ["--device", "cpu"], "--cuda-graph: needs a device"),
             (1, ["--device", "emulated", "--dropout", "0.1"], "--dropout 0 and"),
             (1, ["--device", "emulated", "--attn-dropout", "0.1"], "--attn-dropout 0 only"),
             (1, ["--device", "emulated", "--micro-batches", "2"], "one micro-batch"),
             (2, ["--device", "emulated", "--tp", "2"], "single-process runs only (2 ranks")]
    jobs = [(n, [*TINY, "--steps", "2", "--cuda-graph", *extra, "--out", str(tmp_path / str(k))])
            for k, (n, extra, _) in enumerate(cases)]
    # the one-process refusals in this process; the 2-rank one launched (one line, all ranks)
    launched = iter(run_many([(n, args) for n, args in jobs if n > 1]))
    results = [run_here(*args) if n == 1 else next(launched) for n, args in jobs]
    for (n, extra, message), res in zip(cases, results, strict=True):
        assert res.returncode == 2, (extra, res.stderr)
        lines = _errors(res)
        assert len(lines) == 1 and message in lines[0], (extra, res.stderr)
        assert not Path(tmp_path / str(cases.index((n, extra, message)))).joinpath(
            "checkpoint").exists()
