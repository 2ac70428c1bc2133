"""Checkpoints across layouts in the main job: a tp2 x pp2 checkpoint resumes as dp2 and as
one process on the uninterrupted loss curve; scripts/export.py writes the consolidated model
(safetensors, GPT-2 folder); --init-from starts from any of them; mismatches are one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.scripts.test_train import ENV, ROOT, TINY, _errors, run_here, run_many

STEPS = ["--steps", "6", "--eval-interval", "3"]


def _history(out):
    return json.loads((out / "metrics.json").read_text())["history"]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """(tp2 x pp2 run stopped after step 3, uninterrupted one-process run of 6 steps)."""
    tmp = tmp_path_factory.mktemp("reshard")
    part = run_many([(4, [*TINY, *STEPS, "--out", str(tmp / "part"), "--stop-after", "3"])])[0]
    ref = run_here(*TINY, *STEPS, "--out", str(tmp / "ref"))
    assert part.returncode == 0 and "stopped after step 3" in part.stdout, part.stderr
    assert ref.returncode == 0, ref.stderr
    return tmp


def test_tp2_pp2_checkpoint_resumes_as_dp2_and_as_one_process(stopped):
    for name in ("dp2", "one"):
        shutil.copytree(stopped / "part", stopped / name)
    dp2 = run_many([(2, [*TINY, *STEPS, "--out", str(stopped / "dp2"), "--resume",
                         "--dp", "2"])])[0]
    one = run_here(*TINY, *STEPS, "--out", str(stopped / "one"), "--resume")
    ref = _history(stopped / "ref")
    for res, name in ((dp2, "dp2"), (one, "one")):
        assert res.returncode == 0 and "resumed at step 3" in res.stdout, res.stderr
        got = _history(stopped / name)
        assert [h["step"] for h in got] == [1, 3, 6]
        for a, b in zip(ref, got, strict=True):  # the optimizer moments came back too
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=2e-5), name
            assert b["val_loss"] == pytest.approx(a["val_loss"], rel=2e-5), name
    meta = json.loads((stopped / "dp2" / "checkpoint" / "step_000006" / "manifest.json")
                      .read_text())
    assert meta["world_size"] == 2 and meta["metadata"]["layout"] == [2, 1, 1]


@pytest.fixture(scope="module")
def exported(stopped):
    """scripts/export.py of the stopped run's checkpoint: (model.safetensors, GPT-2 folder)."""
    out, gpt2 = stopped / "model.safetensors", stopped / "gpt2"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "export.py"), "--checkpoint",
                          str(stopped / "part" / "checkpoint"), "--out", str(out), "--gpt2",
                          str(gpt2)], capture_output=True, text=True, timeout=120, env=ENV)
    assert res.returncode == 0, res.stderr
    return out, gpt2


def test_export_and_init_from_every_source(stopped, exported):
    import autograd as ag
    from autograd import nn
    from dist.reshard import read_dense_checkpoint

    ckpt = stopped / "part" / "checkpoint"
    out, gpt2 = exported
    dense = read_dense_checkpoint(ckpt).params
    saved = ag.load(out)
    assert sorted(saved) == sorted(dense)
    assert all(np.array_equal(saved[n].numpy(), dense[n]) for n in dense)
    meta = ag.serialization.load_metadata(out)
    assert json.loads(meta["gpt_config"])["n_embd"] == 16 and meta["step"] == "3"
    model = nn.GPT.from_pretrained_gpt2(gpt2)
    assert all(np.array_equal(p.data, dense[n]) for n, p in model.named_parameters())

    one_step = [*TINY, "--steps", "2", "--eval-interval", "2"]
    runs = [run_here(*one_step, "--out", str(stopped / "i0")),
            run_here(*one_step, "--out", str(stopped / "i1"), "--init-from", str(out)),
            *run_many([(2, [*one_step, "--out", str(stopped / "i2"), "--init-from",
                            str(ckpt)])]),
            run_here(*one_step, "--out", str(stopped / "i3"), "--init-from", str(gpt2))]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert "weights from" in runs[1].stdout
    losses = [_history(stopped / f"i{i}")[0]["train_loss"] for i in range(4)]
    assert losses[2] == pytest.approx(losses[1], rel=1e-5)
    assert losses[3] == losses[1]
    assert abs(losses[0] - losses[1]) > 1e-3  # the weights did come from the source


def test_model_mismatch_is_one_line_exit_2(stopped, exported):
    shutil.copytree(stopped / "part", stopped / "wide")
    out = exported[0]
    resume = run_here(*TINY, *STEPS, "--out", str(stopped / "wide"), "--resume", "--n-embd",
                      "32")
    init = run_here(*TINY, *STEPS, "--out", str(stopped / "w2"), "--init-from", str(out),
                    "--n-embd", "32")
    tanh = run_here(*TINY, *STEPS, "--out", str(stopped / "w3"), "--init-from", str(out),
                    "--activation", "gelu_tanh")
    step_dir = stopped / "wide" / "checkpoint" / "step_000003"
    assert resume.returncode == 2 and _errors(resume) == [
        f"train.py: error: --resume: {step_dir}: the saved model has n_embd 16, this model "
        f"has n_embd 32"], resume.stderr
    assert init.returncode == 2 and _errors(init) == [
        f"train.py: error: --init-from: {out} (safetensors): the saved model has n_embd 16, "
        f"this model has n_embd 32"], init.stderr
    assert tanh.returncode == 2 and _errors(tanh)[0].endswith(
        "the saved model has activation gelu, this model has activation gelu_tanh")
    for r in (resume, init, tanh):
        assert "Traceback" not in r.stderr
    for args, message in ((["--checkpoint", str(stopped / "nowhere"), "--out", "x.st"],
                           f"{stopped / 'nowhere'}: no such checkpoint folder"),
                          (["--checkpoint", str(stopped / "part" / "checkpoint")],
                           "give --out FILE.safetensors and/or --gpt2 FOLDER")):
        res = subprocess.run([sys.executable, str(ROOT / "scripts" / "export.py"), *args],
                             capture_output=True, text=True, timeout=120, env=ENV, cwd=stopped)
        assert res.returncode == 2 and res.stderr == f"export.py: error: {message}\n"
    assert not (stopped / "x.st").exists()
