"""scripts/bench_overlap.py (benchsuite/overlap.py) at a tiny size, in process under mpiexec:
it prints both step times, their ratio, and whether the two models stayed the same bits
(they must at two ranks)."""

from __future__ import annotations

import re

import pytest

import dist
from benchsuite import overlap


@pytest.mark.mpi
def test_bench_overlap_prints_both_step_times(capsys):
    world = dist.init()
    code = overlap.main(["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--vocab", "37",
                         "--block-size", "8", "--batch-size", "2", "--steps", "2",
                         "--warmup", "1", "--bucket-mb", "0.002"])
    assert code == 0
    out = capsys.readouterr().out
    if world.rank != 0:
        assert out == ""
        return
    buckets = int(re.search(r"(\d+) buckets", out).group(1))
    assert buckets >= 2, out
    on, off, ratio = map(float, re.search(
        r"overlap ([\d.]+) ms, blocking ([\d.]+) ms, ratio ([\d.]+)", out).groups())
    assert on > 0 and off > 0 and abs(ratio - on / off) <= 0.01 * ratio + 1e-3, out
    assert re.search(r"same losses and weights: (True|False)$", out.rstrip()), out
    if world.size == 2:  # bit for bit at two ranks (dist.data_parallel.OverlappedGradReducer)
        assert out.rstrip().endswith("True"), out
