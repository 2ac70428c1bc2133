"""scripts/train.py --cp: under mpiexec -n 2 (--cp 2) GPT gives the one-process run's train
and validation losses, and its checkpoint resumes as one process on the same curve; what cp
cannot split or run is one line. (Dropout masks by global position at cp:
tests/dist/models/test_context_parallel.py; a resume in another layout does not carry the
dropout stream over exactly, so this run has none.)"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from dist.trainer import generate, options
from tests.scripts.test_train import TINY, run, run_here

GPT = [*TINY, "--steps", "3", "--eval-interval", "1", "--sample-tokens", "4"]


def _history(out) -> list[dict]:
    return json.loads((out / "metrics.json").read_text())["history"]


def test_cp2_run_matches_one_process_and_resumes_as_one(tmp_path):
    """Steps 1-2 at cp2 (stopped as if interrupted), step 3 resumed in one process: the
    one-process run's losses at every step (the same batches)."""
    res = run(2, *GPT, "--cp", "2", "--stop-after", "2", "--out", str(tmp_path / "cp2"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "mesh: dp=1 pp=1 cp=2 tp=1," in res.stdout
    stopped = (tmp_path / "cp2" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in stopped] == [1, 2]
    # generate.py consolidates the cp2 checkpoint (its shards are cp copies) and names cp
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert generate.main(["--checkpoint", str(tmp_path / "cp2" / "checkpoint"),
                              "--tokens", "4", "--device", "cpu"]) == 0
    assert "layout dp,pp,tp=[1, 1, 1], cp=2, cpu" in err.getvalue()
    for args in ([*GPT, "--out", str(tmp_path / "one")],
                 [*GPT, "--out", str(tmp_path / "cp2"), "--resume"]):
        res = run_here(*args)
        assert res.returncode == 0, (args, res.stderr[-3000:])
    h_one, h_cp = _history(tmp_path / "one"), _history(tmp_path / "cp2")
    assert [h["step"] for h in h_cp] == [1, 2, 3]
    for a, b in zip(h_one, h_cp, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5)


def _refused(args: list[str], world: int, pattern: str) -> None:
    ns = options.parse_args([*TINY, *args])
    with pytest.raises(options.OptionError, match=pattern) as info:
        options.validate(ns, world)
    assert "\n" not in str(info.value)


def test_what_context_parallelism_cannot_run_is_one_line():
    _refused(["--cp", "2", "--block-size", "14"], 2,
             r"^--cp 2: --block-size 14 is not divisible by 2 x --cp = 4 \(")
    _refused(["--cp", "3"], 2, r"^mesh dp=\d+ x pp=\d+ x cp=3 x tp=\d+ = \d+ does not match "
                               r"the 2 MPI ranks")
    _refused(["--cp", "0"], 1, r"^--cp must be an integer >= 1, given 0")
    _refused(["--cp", "2", "--dropout", "0.1"], 2,
             r"^--cp 2: --attn-dropout must be 0 \(ring attention does not drop attention "
             r"probabilities\), given 0.1")
    _refused(["--cp", "2", "--tp", "2", "--block-size", "10", "--sequence-parallel"], 4,
             r"^--cp 2: --block-size 10 is not divisible by 2 x --cp = 4")
    _refused(["--cp", "2", "--tp", "4", "--n-head", "4", "--block-size", "12",
              "--sequence-parallel"], 8,
             r"^--sequence-parallel: --block-size 12 / --cp 2 = 6 tokens per cp rank are not "
             r"divisible by --tp 4")


def test_cp_fills_the_layout_around_it():
    ns = options.parse_args([*TINY, "--cp", "2"])
    options.validate(ns, 8)  # 4 ranks left: the default rule gives tp 2, pp 2
    assert (ns.dp, ns.pp, ns.cp, ns.tp) == (1, 2, 2, 2)
    ns = options.parse_args([*TINY, "--cp", "2", "--tp", "1", "--pp", "1"])
    options.validate(ns, 4)
    assert (ns.dp, ns.pp, ns.cp, ns.tp) == (2, 1, 2, 1)
    ns = options.parse_args(TINY)
    options.validate(ns, 2)
    assert ns.cp == 1 and ns.dp * ns.pp * ns.tp == 2
