"""benchsuite/context_parallel.py at a tiny size under mpiexec: its rows, and a cp slice
keeping fewer activation bytes per rank than the whole sequence."""

from __future__ import annotations

import pytest

from benchsuite import context_parallel


@pytest.mark.mpi
def test_context_parallel_rows_under_mpiexec(capsys):
    import dist

    comm = dist.init()
    rows = [context_parallel.measure(comm, name, cp, block=8 * comm.size, n_layer=1,
                                     n_embd=16, batch=1, repeats=1)
            for name in ("gpt", "llama") for cp in (False, True)]
    assert [(r["model"], r["cp"]) for r in rows] == [
        ("gpt", 1), ("gpt", comm.size), ("llama", 1), ("llama", comm.size)]
    for one, split in (rows[0:2], rows[2:4]):
        assert 0 < split["kept"] < one["kept"] and split["peak"] > 0
        assert one["step_s"] > 0 and split["step_s"] > 0
