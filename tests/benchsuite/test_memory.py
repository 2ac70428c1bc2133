"""scripts/bench_memory.py at a tiny size in one process: the optimizer-state table (ZeRO-1
holds what the replicated optimizer holds at dp=1) and the activation rows of GPT and Llama
in order, recomputation keeping fewer bytes."""

from __future__ import annotations

import re

import pytest

from benchsuite import memory


def test_bench_memory_one_process(capsys):
    assert memory.main(["--n-layer", "2", "--n-embd", "32", "--batch", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# optimizer state per rank, GPT n_layer=2 n_embd=32, dp=1"
    rows = {line.split()[0]: line.split() for line in out[2:4]}
    assert set(rows) == {"f32", "bf16"}
    for r in rows.values():
        assert float(r[-1]) == 1.0  # one rank holds the whole state either way
    kept = {}
    for line in out[5:11]:
        model, _, mode = line.split()[:3]
        kept[model, mode] = float(re.search(r"kept +([\d.]+) MiB", line).group(1))
    assert list(kept) == [(m, mode) for m in ("gpt", "llama")
                          for mode in ("none", "attention", "block")]
    for m in ("gpt", "llama"):
        assert kept[m, "block"] < kept[m, "attention"] < kept[m, "none"]

@pytest.mark.mpi
def test_sequence_parallel_rows_under_mpiexec():
    """At tp = the world, sequence parallelism keeps fewer activation bytes per rank."""
    import dist

    rows = memory.sequence_parallel_activations(dist.init(), n_layer=1, n_embd=16, batch=1,
                                                block=8)
    assert [(r["model"], r["sequence_parallel"]) for r in rows] == [
        ("gpt", False), ("gpt", True), ("llama", False), ("llama", True)]
    for off, on in (rows[0:2], rows[2:4]):
        assert 0 < on["kept"] < off["kept"] and on["peak"] > 0
