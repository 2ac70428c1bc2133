"""scripts/train.py end to end: bad options exit 2 with one line on every rank, non-finite
steps stop or are skipped, runs under mpiexec -n 4 match one process and resume exactly,
generate.py samples their checkpoints, the emulated device matches the host."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train.py"
TINY = ["--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "8", "--max-bytes", "200000", "--eval-batches", "1",
        "--sample-tokens", "8", "--warmup", "2", "--progress", "plain"]


def _mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec")
    return found


def _command(n: int, args) -> list[str]:
    return [sys.executable, str(SCRIPT), *args] if n == 1 else \
        [_mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", str(SCRIPT), *args]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def run(n: int, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(_command(n, args), capture_output=True, text=True, timeout=timeout,
                          env=ENV, cwd=ROOT)


def run_many(jobs: list[tuple[int, list[str]]], timeout: int = 120
             ) -> list[subprocess.CompletedProcess]:
    """run() for every (n, args) at once (short runs: mostly start-up time)."""
    procs = [(n, args, subprocess.Popen(_command(n, args), stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT))
             for n, args in jobs]
    done = []
    for n, args, proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += "\n(timed out: a hang)"
        done.append(subprocess.CompletedProcess(_command(n, args), proc.returncode, out, err))
    return done


def run_here(*args: str) -> subprocess.CompletedProcess:
    """run(1, *args) in this process: train.py's main() with its output caught (what the
    test is about is the job's logic, not its launch; the subprocess runs keep the launch
    covered). Saves the interpreter start and the imports, numba kernels and matplotlib the
    pytest process already holds (~2.5 s of CPU a run, about 10x the run itself)."""
    from dist.trainer.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["train.py", *args], code, out.getvalue(),
                                       err.getvalue())


def _errors(res: subprocess.CompletedProcess) -> list[str]:
    return [line for line in res.stderr.splitlines() if line.startswith("train.py: error:")]


def test_bad_options_exit_2_on_every_rank_with_one_line(tmp_path):
    """Each case: exit 2 (every rank), one `train.py: error:` line (rank 0 only) naming the
    option, what was expected and what was given; never a traceback. Before: tracebacks on
    every rank for --micro-batches 0, --lr -1/nan, --seed -1, --out FILE; --clip -1 ran."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "nockpt" / "checkpoint" / ".tmp-step_000002-1").mkdir(parents=True)
    cases = [
        (4, ["--tp", "3"], "does not match the 4 MPI ranks"),
        (4, ["--n-layer", "3", "--pp", "2", "--tp", "2"], "not divisible by --pp 2"),
        (2, ["--data", "/no/such/dir"], "no such file or folder"),
        (2, ["--n-head", "3", "--n-embd", "48", "--tp", "2"], "not divisible by --tp 2"),
        (2, ["--micro-batches", "0"], "--micro-batches must be an integer >= 1, given 0"),
        (2, ["--lr", "-1"], "--lr must be a finite number > 0, given -1.0"),
        (2, ["--lr", "nan"], "--lr must be a finite number > 0, given nan"),
        (2, ["--seed", "-1"], "--seed must be an integer in [0, 2**32), given -1"),
        (2, ["--out", str(tmp_path / "afile")], f"given {tmp_path / 'afile'} ("),
        (2, ["--clip", "-1"], "--clip must be a finite number >= 0, given -1.0"),
        (2, ["--lr", "fast"], "argument --lr: invalid float value: 'fast'"),
        (2, ["--out", str(tmp_path / "nockpt"), "--resume"],  # was: "layout None differs"
         "checkpoint: no committed checkpoint (no latest pointer"),
    ]
    results = run_many([(n, [*TINY, "--steps", "2", *args]) for n, args, _ in cases])
    for (_, args, message), res in zip(cases, results, strict=True):
        assert res.returncode == 2, (args, res.stderr[-3000:])
        errors = _errors(res)
        assert len(errors) == 1 and message in errors[0], (args, res.stderr[-3000:])
        assert "Traceback" not in res.stderr, args
        # a usage error every rank shares is no fault: before, MPICH's "Abort(2) on node
        # ... application called MPI_Abort" followed on every rank
        assert "Abort" not in res.stderr, (args, res.stderr[-3000:])


def test_a_non_finite_step_stops_or_is_skipped_and_never_saved(tmp_path):
    """--lr 1e6 (before: 'loss nan' for every step, exit 0, NaN weights saved): stop ends
    at the first non-finite step with exit 1 and one line; skip drops those optimizer steps
    (the checkpoints after them hold the same weights) until --max-skips in a row."""
    base = [*TINY, "--lr", "1e6", "--steps", "20", "--eval-interval", "1", "--out"]
    stop, skip = run_many([(2, [*base, str(tmp_path / "stop")]),
                           (2, [*base, str(tmp_path / "skip"), "--on-nonfinite", "skip",
                                "--max-skips", "2"])])
    assert stop.returncode == 1 and "Traceback" not in stop.stderr, stop.stderr[-3000:]
    # nan or inf: which one depends on where the overflow first shows (the float32 host
    # norms sum in float64, so their statistics outlast float32 ones).
    assert _errors(stop) in ([
        f"train.py: error: step 2: non-finite gradient norm {v}; stopped (--on-nonfinite "
        f"stop), the last checkpoint is {tmp_path / 'stop' / 'checkpoint' / 'step_000001'}"]
        for v in ("nan", "inf"))
    assert skip.returncode == 1 and "Traceback" not in skip.stderr, skip.stderr[-3000:]
    from dist.checkpoint import list_checkpoints, read_shard, verify_checkpoint

    assert _errors(skip)[0].startswith("train.py: error: step 3: non-finite") and \
        "2 consecutive steps skipped (--max-skips 2)" in _errors(skip)[0]
    assert [p.name for p in list_checkpoints(tmp_path / "skip" / "checkpoint")] == \
        ["step_000001", "step_000002"]
    shards = []
    for step in (1, 2):
        step_dir, manifest = verify_checkpoint(tmp_path / "skip" / "checkpoint" /
                                               f"step_{step:06d}")
        shards.append(read_shard(step_dir, manifest, 0)[0])
    for name, value in shards[0].items():
        assert np.isfinite(value).all(), name
        np.testing.assert_array_equal(shards[1][name], value)  # step 2 was dropped


def test_tp2_pp2_run_matches_one_process_and_resumes_exactly(tmp_path):
    steps = ["--steps", "6", "--eval-interval", "3"]
    drop = [*TINY, *steps, "--dropout", "0.1", "--out"]
    one = run_here(*TINY, *steps, "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    # The three runs that do not depend on one another start together (the start-up of
    # each rank, most of a run this small, overlaps the others' waits).
    full, ref, part = run_many([(4, [*TINY, *steps, "--out", str(tmp_path / "full")]),
                                (4, [*drop, str(tmp_path / "drop")]),
                                (4, [*drop, str(tmp_path / "resumed"), "--stop-after", "3"])],
                               timeout=240)
    assert full.returncode == 0, full.stderr + full.stdout
    assert "mesh: dp=1 pp=2 tp=2" in full.stdout
    for name in ("metrics.json", "loss.png"):
        assert (tmp_path / "full" / name).stat().st_size > 0
    ckpt = tmp_path / "full" / "checkpoint"
    assert (ckpt / "latest").read_text() == "step_000006\n"
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_000001", "step_000003",
                                                      "step_000006"]
    assert len(list((ckpt / "step_000006").glob("rank*-of-00004.npz"))) == 4
    h_one = json.loads((tmp_path / "one" / "metrics.json").read_text())["history"]
    h_full = json.loads((tmp_path / "full" / "metrics.json").read_text())["history"]
    assert [h["step"] for h in h_full] == [1, 3, 6]
    for a, b in zip(h_one, h_full, strict=True):  # same global batches, no dropout
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-4)

    # Resume, with dropout so that the RNG state must come back too.
    assert ref.returncode == 0, ref.stderr
    assert part.returncode == 0 and "stopped after step 3" in part.stdout, part.stderr
    rest = run(4, *drop, str(tmp_path / "resumed"), "--resume")
    assert rest.returncode == 0 and "resumed at step 3" in rest.stdout, rest.stderr
    h_ref, h_res = (json.loads((tmp_path / d / "metrics.json").read_text())["history"]
                    for d in ("drop", "resumed"))
    assert [(h["step"], h["train_loss"], h["val_loss"]) for h in h_res] == \
        [(h["step"], h["train_loss"], h["val_loss"]) for h in h_ref]  # bitwise
    assert h_ref[-1]["train_loss"] != h_full[-1]["train_loss"]  # dropout acted

    # Another layout is resharded (tests/scripts/test_reshard_resume.py checks the losses):
    # the finished run's checkpoint loads into dp=2 x tp=2, which then has nothing to do.
    other = run(4, *drop, str(tmp_path / "resumed"), "--resume", "--dp", "2", "--pp", "1")
    assert other.returncode == 0 and "nothing to do: the checkpoint is at step 6" in \
        other.stdout, other.stderr

    gen = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate.py"),
                          "--checkpoint", str(tmp_path / "full" / "checkpoint"),
                          "--tokens", "8", "--seed", "1"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.startswith("def ") and "step 6" in gen.stderr

    # A truncated shard in the latest checkpoint (before: BadZipFile tracebacks, or a hang
    # with shards of mixed steps): one line on --resume and in generate.py naming the file
    # and the newest older checkpoint that verifies; --resume PATH takes that one.
    resumed = tmp_path / "resumed" / "checkpoint"
    shard = resumed / "step_000006" / "rank00001-of-00004.npz"
    shard.write_bytes(shard.read_bytes()[:1000])
    bad = run(4, *drop, str(tmp_path / "resumed"), "--resume")
    gen = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate.py"),
                          "--checkpoint", str(resumed)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    fallback = resumed / "step_000003"
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-3000:]
    assert _errors(bad) == [
        f"train.py: error: --resume: {shard}: 1000 bytes, the manifest says "
        f"{_manifest_bytes(shard)} (truncated or replaced); the newest older checkpoint that "
        f"verifies is {fallback} (--resume {fallback})"]
    assert gen.returncode == 2 and gen.stderr.count("\n") == 1, gen.stderr
    assert gen.stderr.startswith(f"generate.py: error: {shard}: 1000 bytes") and \
        f"the newest older checkpoint that verifies is {fallback}" in gen.stderr
    again = run(4, *drop, str(tmp_path / "resumed"), "--resume", str(fallback))
    assert again.returncode == 0 and "resumed at step 3" in again.stdout, again.stderr
    h_again = json.loads((tmp_path / "resumed" / "metrics.json").read_text())["history"]
    assert [(h["step"], h["train_loss"]) for h in h_again] == \
        [(h["step"], h["train_loss"]) for h in h_ref]


def _manifest_bytes(shard: Path) -> int:
    manifest = json.loads((shard.parent / "manifest.json").read_text())
    return next(s["bytes"] for s in manifest["shards"] if s["file"] == shard.name)


def test_emulated_device_run_matches_the_host_run(tmp_path):
    """The main job on the emulated device (every kernel from its CUDA source, device arrays
    staged through host MPI) gives the host backend's losses, under tp=2."""
    steps = ["--steps", "3", "--eval-interval", "3", "--sample-tokens", "4"]
    host = run(2, *TINY, *steps, "--device", "cpu", "--out", str(tmp_path / "cpu"))
    assert host.returncode == 0, host.stderr
    emu = run(2, *TINY, *steps, "--device", "emulated", "--out", str(tmp_path / "emu"))
    assert emu.returncode == 0, emu.stderr + emu.stdout
    assert "emulated sm_80" in emu.stdout
    h_cpu, h_emu = (json.loads((tmp_path / d / "metrics.json").read_text())["history"]
                    for d in ("cpu", "emu"))
    assert [h["step"] for h in h_emu] == [1, 3]
    for a, b in zip(h_cpu, h_emu, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-4)


def test_a_new_run_never_takes_over_an_earlier_runs_out(tmp_path):
    """Without --resume, an --out holding another run's checkpoints is refused with one line on
    every rank (exit 2) and nothing of the earlier run changes; --resume continues it."""
    out = tmp_path / "run"
    first = run_here(*TINY, "--steps", "2", "--eval-interval", "1", "--out", str(out))
    assert first.returncode == 0, first.stderr[-3000:]
    before = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    again = run(2, *TINY, "--steps", "3", "--seed", "7", "--out", str(out))
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert _errors(again) == [
        f"train.py: error: --out {out} holds the checkpoints of an earlier run (2 committed, "
        f"the latest {out / 'checkpoint' / 'step_000002'}); continue it with --resume, or give "
        f"this run a new --out"]
    after = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert after == before
    resumed = run_here(*TINY, "--steps", "3", "--eval-interval", "1", "--resume", "--out",
                       str(out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]


def test_an_out_with_a_link_leading_outside_is_refused_before_anything_is_written(tmp_path):
    """Before: metrics.json was written through a link out of OUT at the end of the run, and
    a checkpoint folder linked outside received every checkpoint. Now: one line on every
    rank (exit 2), nothing written in OUT or outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "file").write_text("keep")
    jobs = []
    for name, target in (("metrics.json", outside / "file"), ("checkpoint", outside)):
        out = tmp_path / name
        out.mkdir()
        (out / name).symlink_to(target)
        jobs.append((2, [*TINY, "--steps", "2", "--out", str(out)]))
    for res, (name, target) in zip(run_many(jobs), (("metrics.json", outside / "file"),
                                                    ("checkpoint", outside)), strict=True):
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
        out = tmp_path / name
        assert _errors(res) == [f"train.py: error: --out: {out / name}: resolves to {target}, "
                                f"outside {out} (a link out of the folder); refused, nothing "
                                f"written"]
        assert [p.name for p in out.iterdir()] == [name]
    assert [p.name for p in outside.iterdir()] == ["file"]
    assert (outside / "file").read_text() == "keep"


@pytest.mark.parametrize("field,value,message", [
    ("scheduler", None, "metadata 'scheduler' must be an object, given None"),
    ("scheduler", {"last_step": "2"}, "metadata 'scheduler.last_step' must be an integer >= 0"),
    ("history", [{"step": 1, "train_loss": "x"}], "metadata 'history' must be a list of "
                                                  "records with an integer step"),
])
def test_resume_with_malformed_run_metadata_is_one_line(tmp_path, field, value, message):
    """Before: TypeError/KeyError tracebacks from the shard header's scheduler or history."""
    from tests.dist.trainer.test_generate import _edit_header

    out = tmp_path / "run"
    first = run_here(*TINY, "--steps", "2", "--eval-interval", "2", "--out", str(out))
    assert first.returncode == 0, first.stderr[-3000:]
    _edit_header(out / "checkpoint" / "step_000002", lambda h: h["metadata"].update({field: value}))
    res = run_here(*TINY, "--steps", "3", "--resume", "--out", str(out))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    manifest = out / "checkpoint" / "step_000002" / "manifest.json"
    errors = _errors(res)
    assert len(errors) == 1 and errors[0].startswith(
        f"train.py: error: --resume: {manifest}: {message}"), errors


def test_init_from_a_gpt2_folder_runs_in_one_launch_without_shape_options(tmp_path):
    """Before: --init-from of a Hugging Face folder failed once per differing field."""
    from autograd import nn

    nn.GPT(nn.GPTConfig(vocab_size=300, block_size=32, n_layer=1, n_head=2, n_embd=8,
                        activation="gelu_tanh")).save_pretrained_gpt2(tmp_path / "hf")
    res = run_here("--max-bytes", "200000", "--batch-size", "8", "--block-size", "16",
                   "--eval-batches", "1", "--sample-tokens", "4", "--warmup", "1", "--steps",
                   "2", "--progress", "plain", "--init-from", str(tmp_path / "hf"),
                   "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert (f"note: --init-from {tmp_path / 'hf'}: the model options not given follow its "
            f"config.json: --vocab-size 300 --n-layer 1 --n-head 2 --n-embd 8 --activation "
            f"gelu_tanh") in res.stdout
    assert "1 layers x 8 wide, 2 heads" in res.stdout


def test_resume_with_more_steps_follows_the_new_schedule_and_a_finished_run_stops(tmp_path):
    """--resume of a finished run says there is nothing to do (exit 0, nothing written);
    --resume with a larger --steps says the schedule now ends there and runs the learning
    rates of a run planned for that many steps from the start."""
    out, whole = tmp_path / "run", tmp_path / "whole"
    common = [*TINY, "--eval-interval", "1"]
    first = run_here(*common, "--steps", "2", "--out", str(out))
    full = run_here(*common, "--steps", "4", "--out", str(whole))
    assert first.returncode == 0 and full.returncode == 0, first.stderr + full.stderr
    metrics = (out / "metrics.jsonl").read_bytes()
    done = run_here(*common, "--steps", "2", "--resume", "--out", str(out))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "train.py: nothing to do: the checkpoint is at step 2, --steps 2" in done.stdout
    assert (out / "metrics.jsonl").read_bytes() == metrics
    more = run_here(*common, "--steps", "4", "--resume", "--out", str(out))
    assert more.returncode == 0, more.stderr[-3000:]
    assert "note: --steps 4 sets the schedule's end (the checkpoint's run planned 2)" \
        in more.stdout

    def lrs(folder):
        records = [json.loads(line) for line in
                   (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
        return {r["step"]: r["lr"] for r in records}

    resumed, planned = lrs(out), lrs(whole)
    assert [resumed[s] for s in (3, 4)] == [planned[s] for s in (3, 4)]
