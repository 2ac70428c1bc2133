"""scripts/train.py --sequence-parallel: under mpiexec -n 2 (--tp 2) GPT with dropout and Llama
give the one-process run's train and validation losses; a --block-size --tp does not divide
is one line, and at --tp 1 the option changes nothing."""

from __future__ import annotations

import json

import pytest

from dist.trainer import options
from tests.scripts.test_train import TINY, run_many

STEPS = ["--steps", "2", "--eval-interval", "1", "--sample-tokens", "4"]
GPT = [*TINY, "--dropout", "0.1", *STEPS]
LLAMA = [*TINY, "--model", "llama", "--n-kv-head", "1", "--ffn-hidden", "40", *STEPS]


def _history(out) -> list[dict]:
    return json.loads((out / "metrics.json").read_text())["history"]


def test_sequence_parallel_runs_match_one_process(tmp_path):
    sp = ["--tp", "2", "--sequence-parallel"]
    jobs = [(1, [*GPT, "--out", str(tmp_path / "gpt-one")]),
            (2, [*GPT, *sp, "--out", str(tmp_path / "gpt-sp")]),
            (1, [*LLAMA, "--out", str(tmp_path / "llama-one")]),
            (2, [*LLAMA, *sp, "--out", str(tmp_path / "llama-sp")])]
    results = run_many(jobs, timeout=300)
    for (_, args), res in zip(jobs, results, strict=True):
        assert res.returncode == 0, (args, res.stderr[-3000:])
    for res in (results[1], results[3]):
        assert "mesh: dp=1 pp=1 tp=2 sequence-parallel," in res.stdout
    for one, many in (("gpt-one", "gpt-sp"), ("llama-one", "llama-sp")):
        h_one, h_many = _history(tmp_path / one), _history(tmp_path / many)
        assert [h["step"] for h in h_many] == [1, 2]
        for a, b in zip(h_one, h_many, strict=True):  # same batches, same dropout masks
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5), (one, many)
            assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5), (one, many)


def test_a_block_size_tp_does_not_divide_is_one_line():
    ns = options.parse_args([*TINY, "--block-size", "15", "--n-head", "2", "--tp", "2",
                             "--sequence-parallel"])
    with pytest.raises(options.OptionError, match=r"^--sequence-parallel: --block-size 15 is "
                                                  r"not divisible by --tp 2 \(") as info:
        options.validate(ns, 2)
    assert "\n" not in str(info.value)
    ns = options.parse_args([*TINY, "--block-size", "15", "--sequence-parallel"])
    options.validate(ns, 1)  # tp 1: nothing to split, allowed (a no-op)
    assert ns.sequence_parallel and ns.tp == 1
